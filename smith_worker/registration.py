"""A worker's registration in Redis (the workers write it; clients only read it, :mod:`smith_client.registry`).

Each worker process writes ``{p}:worker:{id}`` (JSON: queue, agents, skills,
tools, capability set, pid, host) with :data:`~smith_client.keys.REGISTRATION_TTL` and refreshes
it on a heartbeat; ``{p}:workers`` is a ZSET of worker id → expiry (epoch ms),
pruned here, so clients find live workers without SCAN.

The same transaction renews the worker's capability set (what it serves,
:mod:`smith_worker.routing`): a SET named by its digest, shared by the workers
of one app version and living as long as the last of their registrations, and
the queue's ZSET of live sets (digest → expiry), which the enqueue script
reads to wake only workers that can run a job. A set outlives its last worker
by :data:`~smith_client.keys.REGISTRATION_TTL` at most (a stopping worker
cannot tell whether others share it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from smith_client.keys import REGISTRATION_TTL, WORKERS_TTL, Keys, now_ms


@dataclass(frozen=True)
class CapabilitySet:
    """What the workers of one app version serve on ``queue`` (an arq queue name): ``names`` (sorted,
    :func:`smith_worker.routing.capabilities`) and their ``digest``
    (:func:`~smith_worker.routing.capability_digest`)."""

    queue: str
    digest: str
    names: Sequence[str]


async def register_worker(
    redis: Redis,
    keys: Keys,
    worker_id: str,
    info: dict[str, Any],
    capability_set: CapabilitySet,
    ttl: int = REGISTRATION_TTL,
) -> None:
    """Write or refresh one worker's registration (``info`` must be JSON-able) and its capability set;
    both live ``ttl`` seconds."""
    now = now_ms()
    capsets = Keys.capability_sets(capability_set.queue)
    members = Keys.capability_set(capability_set.queue, capability_set.digest)
    async with redis.pipeline(transaction=True) as pipe:
        pipe.set(keys.worker(worker_id), orjson.dumps(info), ex=ttl)
        pipe.zadd(keys.workers, {worker_id: now + ttl * 1000})
        pipe.zremrangebyscore(keys.workers, "-inf", now)
        pipe.expire(keys.workers, WORKERS_TTL)
        if capability_set.names:  # an empty set is no key: it holds nothing, and claims nothing that needs one
            pipe.sadd(members, *capability_set.names)
            pipe.expire(members, ttl)
        pipe.zadd(capsets, {capability_set.digest: now + ttl * 1000}, gt=True)
        pipe.zremrangebyscore(capsets, "-inf", now)
        pipe.expire(capsets, WORKERS_TTL)
        await pipe.execute()


async def unregister_worker(redis: Redis, keys: Keys, worker_id: str) -> None:
    """Remove a worker's registration (at graceful shutdown)."""
    async with redis.pipeline(transaction=True) as pipe:
        pipe.delete(keys.worker(worker_id))
        pipe.zrem(keys.workers, worker_id)
        await pipe.execute()
