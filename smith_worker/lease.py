"""The per-conversation turn slot: a Redis lease renewed while a turn runs.

Turns of one conversation never run at the same time (DESIGN.md §4 step 2).
The lease is ``SET key <turn_id> NX PX ttl``; its holder renews it every
``ttl / 3`` seconds and deletes it only if it still holds it (compare and
delete in Lua), so a stalled worker cannot release another turn's slot. A
worker that dies leaves a lease that expires after ``ttl`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from redis.asyncio import Redis

logger = logging.getLogger("agent_smith.worker")

_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class ConversationLease:
    """Async context manager holding one conversation's slot for one turn.

    ``ttl`` and ``retry_interval`` are seconds.
    """

    def __init__(self, redis: Redis, key: str, holder: str, ttl: float = 30.0, retry_interval: float = 0.05) -> None:
        self._redis = redis
        self._key = key
        self._holder = holder
        self._ttl_ms = int(ttl * 1000)
        self._retry = retry_interval
        self._renewer: asyncio.Task[None] | None = None
        self._renew = redis.register_script(_RENEW_LUA)
        self._release = redis.register_script(_RELEASE_LUA)

    async def acquire(self) -> None:
        """Wait until the slot is free, then take it (FIFO is not guaranteed)."""
        while not await self._redis.set(self._key, self._holder, nx=True, px=self._ttl_ms):
            if await self._redis.get(self._key) == self._holder.encode():
                break  # a re-run of the same turn already holds it
            await asyncio.sleep(self._retry)
        self._renewer = asyncio.create_task(self._keep_alive())

    async def _keep_alive(self) -> None:
        while True:
            await asyncio.sleep(self._ttl_ms / 3000)
            try:
                if not await self._renew(keys=[self._key], args=[self._holder, self._ttl_ms]):
                    logger.warning("lease %s lost by %s", self._key, self._holder)
                    return
            except Exception:  # a Redis hiccup: try again at the next interval
                logger.warning("lease %s renewal failed", self._key, exc_info=True)

    async def release(self) -> None:
        """Stop renewing and free the slot if this holder still has it."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self._release(keys=[self._key], args=[self._holder])

    async def __aenter__(self) -> "ConversationLease":
        await self.acquire()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await asyncio.shield(self.release())
