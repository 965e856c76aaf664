"""Per-process state of a worker: Redis, the event log, the HTTP client, identity.

Created at worker start-up and closed at shutdown (DESIGN.md §2: one
``httpx.AsyncClient`` per worker process). Job functions find it in the arq
context as ``ctx["runtime"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from arq.connections import ArqRedis
from redis.exceptions import ResponseError

from smith_client.eventlog import EventLog
from smith_client.keys import Keys
from smith_client.registry import DEFAULT_REGISTRATION_TTL, register_worker, unregister_worker
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.dispatch import ReplyListener, ToolJobWaiter
from smith_worker.redis_health import RedisHealth
from smith_worker.sweeper import sweep_forever

logger = logging.getLogger("agent_smith.worker")

Queue = Literal["turns", "tools"]


def new_worker_id(queue: str) -> str:
    """``<host>:<pid>:<queue>:<random>``: unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{queue}:{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerRuntime:
    """Everything one worker process shares between its jobs."""

    app: SmithApp
    queue: Queue
    settings: Settings
    redis: ArqRedis
    worker_id: str = ""
    http: httpx.AsyncClient | None = None
    replies: ReplyListener | None = None
    tool_waiter: ToolJobWaiter | None = None
    #: Readiness: whether Redis answers this process now (issue 8).
    health: RedisHealth = field(default_factory=RedisHealth)
    #: Turns running in this process, by turn id; their runners take cancel requests.
    running_turns: dict[str, Any] = field(default_factory=dict)
    _background: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.keys = Keys(self.settings.prefix)
        self.events = EventLog(self.redis, self.keys)
        self.worker_id = self.worker_id or new_worker_id(self.queue)

    def on_control(self, turn_id: str) -> None:
        """A control message: cancel ``turn_id`` if it runs here (its state says why)."""
        runner = self.running_turns.get(turn_id)
        if runner is not None:
            runner.request_cancel()

    async def start(self) -> None:
        """Open the HTTP client and reply channel (turn workers) and register this worker.

        Waits (backing off) while Redis does not answer, instead of failing.
        """
        await self.health.until_ok("start-up", self._warn_on_eviction)
        if self.queue == "turns":
            self.http = httpx.AsyncClient(timeout=None)
            self.replies = ReplyListener(
                self.redis, self.keys.worker_replies_channel(self.worker_id), self.keys.control_channel,
                self.on_control, health=self.health,
            )  # fmt: skip
            await self.replies.start()
            self.tool_waiter = ToolJobWaiter(self.redis, self.keys, self.replies)
            self._background.append(asyncio.create_task(sweep_forever(self.redis, self.keys)))
        await self.health.until_ok("registration", self._register)
        self._background.append(asyncio.create_task(self._heartbeat_loop()))
        logger.info("worker %s started on queue %s", self.worker_id, self.queue)

    async def stop(self) -> None:
        """Unregister and close what :meth:`start` opened."""
        for task in self._background:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(Exception):
            await unregister_worker(self.redis, self.keys, self.worker_id)
        for source in self.app.sources.values():
            try:
                await source.close()
            except Exception:  # one failing source must not keep the others open
                logger.warning("closing tool source %s failed", source.name, exc_info=True)
        if self.replies is not None:
            await self.replies.stop()
        if self.http is not None:
            await self.http.aclose()
        logger.info("worker %s stopped", self.worker_id)

    async def _warn_on_eviction(self) -> None:
        """Warn unless Redis's ``maxmemory-policy`` is ``noeviction``: evicting a turn's keys loses the turn."""
        try:
            reply = await self.redis.config_get("maxmemory-policy")
        except ResponseError:  # CONFIG is disabled on some managed Redis services
            logger.info("could not read Redis maxmemory-policy (CONFIG GET refused); make sure it is noeviction")
            return
        policy = next(iter(reply.values()), b"noeviction")
        policy = policy.decode() if isinstance(policy, bytes) else policy
        if policy != "noeviction":
            logger.warning("Redis maxmemory-policy is %r, not 'noeviction': under memory pressure Redis may evict "
                           "turn state and queued jobs (such turns fail with TurnNotFoundError)", policy)

    async def _register(self) -> None:
        info = {
            "id": self.worker_id,
            "queue": self.queue,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "agents": sorted(self.app.agents) if self.queue == "turns" else [],
            "tools": self.app.tools.names() if self.queue == "tools" else [],
        }
        await register_worker(self.redis, self.keys, self.worker_id, info, DEFAULT_REGISTRATION_TTL)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(DEFAULT_REGISTRATION_TTL / 3)
            try:
                await self._register()
            except Exception as exc:  # Redis blip: the next beat retries (it re-registers after a Redis restart)
                self.health.failed("the worker heartbeat", exc)
            else:
                self.health.ok()
