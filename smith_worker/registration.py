"""A worker's registration in Redis (the workers write it; clients only read it, :mod:`smith_client.registry`).

Each worker process writes ``{p}:worker:{id}`` (JSON: queue, agents, skills,
tools, pid, host, and ``instance``, a token unique to the process start) with
:data:`~smith_client.keys.REGISTRATION_TTL` and refreshes it on a heartbeat;
``{p}:workers`` is a ZSET of worker id → expiry (epoch ms), pruned here, so
clients find live workers without SCAN.

The registration is also the claim of the worker id: it is written only when
nobody holds the id or the same process instance does (``lua/register.lua``),
so two live processes never share an id (the turn side takes a tool worker for
dead when its registration is gone; a twin would keep it alive).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from redis.asyncio import Redis

from smith_client import scripts
from smith_client.keys import REGISTRATION_TTL, WORKERS_TTL, Keys, now_ms


@dataclass(frozen=True)
class Holder:
    """Another process holding a worker id: its ``registration`` (the JSON as a dict, ``{}`` when unreadable)
    and ``ttl_ms``, the milliseconds its registration has left (Redis ``PTTL``: -1 without a TTL)."""

    registration: dict[str, Any]
    ttl_ms: int

    def describe(self) -> str:
        """``pid 12 on host h, queue tools``, for messages."""
        info = self.registration
        return f"pid {info.get('pid', '?')} on host {info.get('host', '?')}, queue {info.get('queue', '?')}"


async def register_worker(
    redis: Redis, keys: Keys, worker_id: str, info: dict[str, Any], ttl: int = REGISTRATION_TTL
) -> Holder | None:
    """Claim or renew ``worker_id`` for the process instance ``info["instance"]``; the registration ``info``
    (JSON-able) lives ``ttl`` seconds.

    Returns None when this instance holds the id now, else the :class:`Holder` of the id (nothing written).
    """
    script_keys = [keys.worker(worker_id), keys.workers]
    args = [worker_id, orjson.dumps(info), info["instance"], ttl, now_ms(), WORKERS_TTL]
    held = await scripts.REGISTER(redis, script_keys, args)
    if held is None:
        return None
    raw, ttl_ms = held
    try:
        registration = orjson.loads(raw)
    except orjson.JSONDecodeError:
        registration = {}
    return Holder(registration if isinstance(registration, dict) else {}, int(ttl_ms))


async def unregister_worker(redis: Redis, keys: Keys, worker_id: str, instance: str) -> None:
    """Remove a worker's registration (at graceful shutdown), unless another process instance holds the id."""
    await scripts.UNREGISTER(redis, [keys.worker(worker_id), keys.workers], [worker_id, instance])
