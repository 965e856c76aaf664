"""A private fleet for one benchmark: its own redis-server, the scripted chat-completions server, and worker
processes serving one app, with a client (``async with fleet(app, queues) as f``)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from bench import LOGS
from smith_client import SmithClient
from smith_worker import testing
from smith_worker.local.processes import ManagedProcess, start_redis_server


@dataclass
class Fleet:
    """What :func:`fleet` started: ``client`` (under ``prefix``), the scripted model ``llm``, the worker
    processes ``procs`` (in start order), and the ``redis_url`` and worker ``env`` to start more."""

    client: SmithClient
    llm: testing.ScriptedLlmServer
    redis_url: str
    prefix: str
    env: dict[str, str]
    app: str
    procs: list[ManagedProcess] = field(default_factory=list)

    def start(self, queues: Sequence[str]) -> list[ManagedProcess]:
        """Start one more worker per entry of ``queues`` (``"turns"`` / ``"tools"``); stopped with the fleet."""
        started = testing.start_workers(self.app, self.env, queues, self.prefix, log_dir=LOGS)
        self.procs += started
        return started


@contextlib.asynccontextmanager
async def fleet(app: str, queues: Sequence[str], **settings: str) -> AsyncIterator[Fleet]:
    """Start a fleet whose workers (one per entry of ``queues``) serve ``app`` (``"module:attribute"``), with
    ``settings`` (``SMITH_*`` variables) in their environment, and return once they registered; everything stops
    on exit, the workers before the model server they use. Raises ``TimeoutError`` when the workers do not
    register within 60 s."""
    redis_proc, redis_url = start_redis_server()
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    try:
        with testing.ScriptedLlmServer() as llm:
            env = testing.worker_env(redis_url, prefix, llm.base_url, **settings)
            async with SmithClient.from_url(redis_url, prefix=prefix) as client:
                running = Fleet(client, llm, redis_url, prefix, env, app)
                try:
                    running.start(queues)
                    await testing.wait_for_workers(redis_url, prefix, len(queues))
                    yield running
                finally:
                    for proc in running.procs:
                        proc.stop()
    finally:
        redis_proc.stop()
