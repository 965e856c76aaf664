"""Real worker processes for a test: their environment, their start, and the wait until they serve.

The workers are ``python -m smith_worker APP --queue QUEUE`` processes on this
interpreter (:func:`smith_worker.local.processes.worker_argv`), configured only
through their environment, as in production: :func:`worker_env` points them at
a Redis, a key prefix and a chat-completions server (usually a
:class:`~smith_worker.testing.ScriptedLlmServer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from smith_client import SmithClient
from smith_client.registry import live_workers
from smith_client.settings import ClientSettings
from smith_worker.local.processes import ManagedProcess, worker_argv

#: The model name the workers ask for (``SMITH_LLM_MODEL``); the scripted server answers any.
SCRIPTED_MODEL = "scripted"


def worker_env(
    redis_url: str,
    prefix: str,
    llm_base_url: str,
    *,
    pythonpath: Sequence[str | os.PathLike[str]] | None = None,
    **extra: str,
) -> dict[str, str]:
    """This process's environment with the worker settings of a test.

    Sets ``SMITH_REDIS_URL``, ``SMITH_PREFIX``, ``SMITH_LLM_BASE_URL`` (e.g.
    :attr:`ScriptedLlmServer.base_url`, ending in ``/v1``) and
    ``SMITH_LLM_MODEL="scripted"``, then ``extra`` (any other ``SMITH_*``
    setting, as strings, e.g. ``SMITH_TOOL_TIMEOUT="2"``). ``PYTHONPATH``
    starts with ``pythonpath`` (default: the current directory) so the
    workers import the app module as this process does.
    """
    paths = [os.fspath(path) for path in pythonpath] if pythonpath is not None else [os.getcwd()]
    env = dict(os.environ)
    env.update(
        SMITH_REDIS_URL=redis_url,
        SMITH_PREFIX=prefix,
        SMITH_LLM_BASE_URL=llm_base_url,
        SMITH_LLM_MODEL=SCRIPTED_MODEL,
        PYTHONPATH=os.pathsep.join([*paths, env.get("PYTHONPATH", "")]),
    )
    env.update(extra)
    return env


def start_workers(
    app: str, env: dict[str, str], queues: Sequence[str], tag: str = "worker", *, log_dir: Path | None = None
) -> list[ManagedProcess]:
    """Start one worker process per entry of ``queues`` (``"turns"`` or ``"tools"``) serving ``app``.

    ``app`` is ``"module:attribute"`` naming a :class:`~smith_worker.SmithApp`;
    ``env`` usually comes from :func:`worker_env`. Each process's output goes
    to ``log_dir / f"{tag}-{queue}-{index}.log"`` (``log_dir`` is created), or
    to this process's own stdout and stderr when ``log_dir`` is ``None``.
    Returns at once, before the workers registered (see :func:`wait_for_workers`);
    stop each with :meth:`ManagedProcess.stop` (SIGTERM, then SIGKILL after 15 s).
    """
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for index, queue in enumerate(queues):
        log = log_dir / f"{tag}-{queue}-{index}.log" if log_dir is not None else None
        procs.append(ManagedProcess(worker_argv(app, queue), env=env, log_path=log, grace=15.0).start())
    return procs


async def wait_for_workers(
    redis_url: str, prefix: str, count: int, timeout: float = 60.0, *, cluster: bool = False
) -> None:
    """Return once at least ``count`` workers are registered under ``prefix`` (``cluster``: ``redis_url`` names
    a Redis Cluster node, as ``SMITH_REDIS_CLUSTER``).

    Raises ``TimeoutError`` after ``timeout`` seconds (a worker that failed to
    start says why in its log).
    """
    client = SmithClient.from_url(redis_url, prefix=prefix, cluster=cluster)
    try:
        async with asyncio.timeout(timeout):
            # A registration is a Redis key with no notification to wait on: poll.
            while True:
                if len(await live_workers(client.redis, client.keys)) >= count:
                    return
                await asyncio.sleep(0.1)
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def worker_pair(
    app: str, redis_url: str, prefix: str, env: dict[str, str], *, log_dir: Path | None = None
) -> AsyncIterator[list[ManagedProcess]]:
    """A turn worker and a tool worker for ``app``, registered before the body runs, stopped after it.

    Yields the two processes (turn worker first); the log files are named
    after ``prefix`` (see :func:`start_workers`). Raises ``TimeoutError`` when
    they do not register within 60 s.
    """
    procs = start_workers(app, env, ["turns", "tools"], prefix, log_dir=log_dir)
    try:
        cluster = ClientSettings.from_env(env, only=("redis_cluster",)).redis_cluster
        await wait_for_workers(redis_url, prefix, len(procs), cluster=cluster)
        yield procs
    finally:
        for proc in procs:
            proc.stop()
