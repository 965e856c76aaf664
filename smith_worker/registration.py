"""A worker's registration in Redis (the workers write it; clients only read it, :mod:`smith_client.registry`).

Each worker process writes ``{p}:worker:{id}`` (JSON: queue, agents, skills,
tools, pid, host) with :data:`~smith_client.keys.REGISTRATION_TTL` and refreshes
it on a heartbeat; ``{p}:workers`` is a ZSET of worker id → expiry (epoch ms),
pruned here, so clients find live workers without SCAN.
"""

from __future__ import annotations

from typing import Any

import orjson
from redis.asyncio import Redis

from smith_client.keys import REGISTRATION_TTL, WORKERS_TTL, Keys, now_ms


async def register_worker(
    redis: Redis, keys: Keys, worker_id: str, info: dict[str, Any], ttl: int = REGISTRATION_TTL
) -> None:
    """Write or refresh one worker's registration (``info`` must be JSON-able); it lives ``ttl`` seconds."""
    now = now_ms()
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.worker(worker_id), orjson.dumps(info), ex=ttl)
        pipe.zadd(keys.workers, {worker_id: now + ttl * 1000})
        pipe.zremrangebyscore(keys.workers, "-inf", now)
        pipe.expire(keys.workers, WORKERS_TTL)
        await pipe.execute()


async def unregister_worker(redis: Redis, keys: Keys, worker_id: str) -> None:
    """Remove a worker's registration (at graceful shutdown)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.worker(worker_id))
        pipe.zrem(keys.workers, worker_id)
        await pipe.execute()
