"""A worker's registration in Redis (the workers write it; clients only read it, :mod:`smith_client.registry`).

Each worker process writes ``{p}:worker:{id}`` (JSON: queue, agents, skills,
tools, capability set, pid, host, and ``instance``, a token unique to the process
start) with :data:`~smith_client.keys.REGISTRATION_TTL` and refreshes it on a
heartbeat; ``{p}:workers`` is a ZSET of worker id → expiry (epoch ms), pruned
here, so clients find live workers without SCAN.

The registration is also the claim of the worker id: it is written only when
nobody holds the id or the same process instance does (``lua/register.lua``),
so two live processes never share an id (the turn side takes a tool worker for
dead when its registration is gone; a twin would keep it alive).

With it the worker renews its capability set (what it serves,
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
from smith_client.roundtrip import RoundTrip
from smith_client.scripts import LuaScript

#: The scripts of this module, in ``lua/`` beside it.
REGISTER = LuaScript("register", __package__)
UNREGISTER = LuaScript("unregister", __package__)


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
) -> Holder | None:
    """Claim or renew ``worker_id`` for the process instance ``info["instance"]``; the registration ``info``
    (JSON-able) and the worker's ``capability_set`` live ``ttl`` seconds.

    Returns None when this instance holds the id now, else the :class:`Holder` of the id (nothing written).
    """
    script_keys = [keys.worker(worker_id), keys.workers]
    args = [worker_id, orjson.dumps(info), info["instance"], ttl, now_ms(), WORKERS_TTL]
    held = await REGISTER(redis, script_keys, args)
    if held is not None:
        raw, ttl_ms = held
        try:
            registration = orjson.loads(raw)
        except orjson.JSONDecodeError:
            registration = {}
        return Holder(registration if isinstance(registration, dict) else {}, int(ttl_ms))
    await _renew_capability_set(redis, capability_set, ttl)
    return None


async def _renew_capability_set(redis: Redis, capability_set: CapabilitySet, ttl: int) -> None:
    """Write or refresh ``capability_set`` and its entry in the queue's ZSET of live sets, for ``ttl`` seconds."""
    now = now_ms()
    capsets = Keys.capability_sets(capability_set.queue)
    members = Keys.capability_set(capability_set.queue, capability_set.digest)
    rt = RoundTrip(transaction=True)
    if capability_set.names:  # an empty set is no key: it holds nothing, and claims nothing that needs one
        rt.call("sadd", members, *capability_set.names)
        rt.call("expire", members, ttl)
    rt.call("zadd", capsets, {capability_set.digest: now + ttl * 1000}, gt=True)
    rt.call("zremrangebyscore", capsets, "-inf", now)
    rt.call("expire", capsets, WORKERS_TTL)
    await rt.run(redis)


async def unregister_worker(redis: Redis, keys: Keys, worker_id: str, instance: str) -> None:
    """Remove a worker's registration (at graceful shutdown), unless another process instance holds the id."""
    await UNREGISTER(redis, [keys.worker(worker_id), keys.workers], [worker_id, instance])
