"""Shared fixtures: a private redis-server, the scripted LLM server, and real worker processes.

Everything here is session-scoped so the whole suite shares one set of worker
processes (keeps `make test` fast on 2 cores); tests isolate themselves by
scenario key and conversation id.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import uuid
from pathlib import Path

import pytest

from smith_client import SmithClient
from smith_client.keys import Keys
from smith_client.registry import live_workers
from smith_worker.local.processes import ManagedProcess, start_redis_server
from tests.support.scripted_llm import ScriptedLlmServer

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / ".pytest_cache" / "worker-logs"


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    """A private, diskless redis-server on a free port, for this test run only."""
    proc, url = start_redis_server(log_path=tmp_path_factory.mktemp("redis") / "redis.log")
    yield url
    proc.stop()


@pytest.fixture(scope="session")
def scripted_llm():
    with ScriptedLlmServer() as server:
        yield server


@pytest.fixture(scope="session")
def prefix():
    return f"t{uuid.uuid4().hex[:8]}"


def worker_env(redis_url: str, prefix: str, llm_base_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        SMITH_REDIS_URL=redis_url,
        SMITH_PREFIX=prefix,
        SMITH_LLM_BASE_URL=llm_base_url,
        SMITH_LLM_MODEL="scripted",
        PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    )
    env.update(extra)
    return env


def start_workers(app: str, env: dict[str, str], queues: list[str], tag: str) -> list[ManagedProcess]:
    LOGS.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, queue in enumerate(queues):
        argv = [sys.executable, "-m", "smith_worker", app, "--queue", queue]
        log = LOGS / f"{tag}-{queue}-{i}.log"
        procs.append(ManagedProcess(argv, env=env, log_path=log, grace=15.0).start())
    return procs


async def wait_for_workers(redis_url: str, prefix: str, count: int, timeout: float = 60.0) -> None:
    client = SmithClient.from_url(redis_url, prefix=prefix)
    try:
        async with asyncio.timeout(timeout):
            while len(await live_workers(client.redis, Keys(prefix))) < count:
                await asyncio.sleep(0.1)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def worker_pair(app: str, redis_url: str, prefix: str, env: dict[str, str]):
    """A turn worker and a tool worker for ``app``, registered before the body runs, stopped after it."""
    procs = start_workers(app, env, ["turns", "tools"], prefix)
    try:
        await wait_for_workers(redis_url, prefix, len(procs))
        yield procs
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="session")
async def workers(redis_url, prefix, scripted_llm):
    """One turn worker and one tool worker serving ``tests.support.app:app``."""
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    async with worker_pair("tests.support.app:app", redis_url, prefix, env) as procs:
        yield procs


@pytest.fixture
async def client(redis_url, prefix):
    async with SmithClient.from_url(redis_url, prefix=prefix) as c:
        yield c


@pytest.fixture
def scenario(scripted_llm):
    """Register a scripted scenario under a fresh key; returns (key, marker text to put in the prompt)."""

    def register(handler):
        key = uuid.uuid4().hex[:12]
        scripted_llm.add_scenario(key, handler)
        return key, f"[[scenario:{key}]]"

    return register
