"""Shared fixtures: a private redis-server, the scripted LLM server, and real worker processes (smith_worker.testing).

Everything here is session-scoped so the whole suite shares one set of worker
processes (keeps `make test` fast on 2 cores); tests isolate themselves by
scenario key and conversation id.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from smith_client import SmithClient
from smith_worker.testing import ScriptedLlmServer, start_redis_server, worker_env, worker_pair

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


@pytest.fixture(scope="session")
async def workers(redis_url, prefix, scripted_llm):
    """One turn worker and one tool worker serving ``tests.support.app:app``."""
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    async with worker_pair("tests.support.app:app", redis_url, prefix, env, log_dir=LOGS) as procs:
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
