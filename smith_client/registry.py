"""Which workers are alive and which agents they serve (read-only: workers write their registration,
:mod:`smith_worker.ops.registration`).

Each worker process writes ``{p}:worker:{id}`` (JSON: queue, agents, skills,
tools, pid, host) with a short TTL and refreshes it on a heartbeat; ``{p}:workers`` is a
ZSET of worker id → expiry (epoch milliseconds) so clients find live workers
without SCAN. The client uses :func:`live_agents` to reject an agent no live
worker serves (when no worker is registered at all the turn is enqueued and
waits); the skills they serve are read the same way (``read_served(keys, "skills")``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis

from smith_client.keys import Keys, now_ms
from smith_client.protocol import Operation, call
from smith_client.roundtrip import RoundTrip
from smith_client.runners import AsyncRunner


def read_live_workers(keys: Keys) -> Operation[list[dict[str, Any]]]:
    """Operation: the registrations of the workers whose heartbeat has not expired."""
    ids: list[bytes] = yield from call("zrangebyscore", keys.workers, now_ms(), "+inf")
    if not ids:
        return []
    names = [keys.worker(i.decode() if isinstance(i, bytes) else i) for i in ids]
    raws: list[bytes | None] = yield from call("mget", names)
    return [orjson.loads(raw) for raw in raws if raw]


def read_served(keys: Keys, field: str) -> Operation[set[str] | None]:
    """Operation: the union of a registration list ``field`` (``agents``, ``skills``) over live turn
    workers; ``None`` when no turn worker is registered."""
    turn_workers = [w for w in (yield from read_live_workers(keys)) if w.get("queue") == "turns"]
    if not turn_workers:
        return None
    return {name for worker in turn_workers for name in worker.get(field, [])}


#: Seconds a client trusts the agents it saw served before reading the registrations again.
SERVED_CACHE_SECONDS = 5.0


class ServedAgents:
    """A client's recent view of the agents live turn workers serve, so a turn does not re-read the
    registrations (two round trips) each time.

    Only a positive answer is kept (the agent was served ``max_age`` seconds
    ago or less): an agent missing from it, or no turn worker registered, is
    read again, so a worker that just started is seen at once and the
    refusal or warning is as without the cache. Thread-safe (one tuple swapped whole).
    """

    def __init__(self, max_age: float = SERVED_CACHE_SECONDS) -> None:
        self.max_age = max_age
        self._seen: tuple[float, frozenset[str]] = (float("-inf"), frozenset())

    def read(self, keys: Keys, agent: str) -> Operation[set[str] | None]:
        """Operation: :func:`read_served` of ``agents``, or the kept set when it is fresh and holds ``agent``."""
        at, served = self._seen
        if agent in served and time.monotonic() - at <= self.max_age:
            return set(served)
        fresh = yield from read_served(keys, "agents")
        if fresh is not None:
            self._seen = (time.monotonic(), frozenset(fresh))
        return fresh


async def live_workers(redis: Redis, keys: Keys) -> list[dict[str, Any]]:
    """Registrations of the workers whose heartbeat has not expired."""
    return await AsyncRunner(redis).run(read_live_workers(keys))


async def live_agents(redis: Redis, keys: Keys) -> set[str] | None:
    """Agents served by live turn workers, or ``None`` when no turn worker is registered."""
    return await AsyncRunner(redis).run(read_served(keys, "agents"))


@dataclass
class QueueStatus:
    """One arq queue: ``queued``, its jobs due now (score at or before now: ready, or running, which arq keeps in
    its queue until they end) plus, on the turns queue, the jobs waiting for admission; ``deferred``, its jobs due
    later (score in the future: a parked turn's recheck, a retry after its backoff), as the claim tells them apart
    (``smith_worker/queue/lua/claim.lua``); the live workers serving it and, on the turns queue, the jobs waiting
    for admission per tenant (``""``: no tenant; docs/architecture.md, Fair pickup)."""

    queued: int
    deferred: int = 0
    workers: list[dict[str, Any]] = field(default_factory=list)
    waiting: dict[str, int] = field(default_factory=dict)


@dataclass
class FleetStatus:
    """What ``smith status`` prints: the two queues by name, the number of running turns (live leases in
    ``{p}:running``) and of paused turns (``{p}:paused``: waiting for a person, docs/architecture.md, Pausing for
    a person)."""

    queues: dict[str, QueueStatus]
    running_turns: int
    paused_turns: int


async def fleet_status(redis: Redis, keys: Keys) -> FleetStatus:
    """Queued and deferred jobs (:class:`QueueStatus`), running turns (``{p}:running``), paused turns
    (``{p}:paused``) and live workers per queue of one prefix."""
    now = now_ms()
    rt = RoundTrip()
    due = {queue: rt.call("zcount", queue, "-inf", now, parse=int) for queue in (keys.turns_queue, keys.tools_queue)}
    later = {queue: rt.call("zcount", queue, f"({now}", "+inf", parse=int) for queue in due}
    running = rt.call("zcount", keys.running, now, "+inf", parse=int)
    paused = rt.call("zcard", keys.paused, parse=int)
    tenants = rt.call(
        "zrange", Keys.tenant_ring(keys.turns_queue), 0, -1, parse=lambda names: [n.decode() for n in names]
    )
    await rt.run(redis)
    waiting = await _waiting_per_tenant(redis, keys, tenants.value)
    workers = await live_workers(redis, keys)
    turns_workers = [w for w in workers if w.get("queue") == "turns"]
    turns, tools = keys.turns_queue, keys.tools_queue
    queues = {
        turns: QueueStatus(due[turns].value + sum(waiting.values()), later[turns].value, turns_workers, waiting),
        tools: QueueStatus(due[tools].value, later[tools].value, [w for w in workers if w.get("queue") == "tools"]),
    }
    return FleetStatus(queues, running.value, paused.value)


async def _waiting_per_tenant(redis: Redis, keys: Keys, tenants: list[str]) -> dict[str, int]:
    """How many turn jobs wait for admission per tenant of ``tenants`` (the ring's), in one round trip."""
    rt = RoundTrip()
    counts = [rt.call("zcard", Keys.tenant_waiting(keys.turns_queue, tenant), parse=int) for tenant in tenants]
    if tenants:
        await rt.run(redis)
    return {tenant: count.value for tenant, count in zip(tenants, counts, strict=True) if count.value}
