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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from redis.asyncio import Redis

from smith_client.keys import Keys, now_ms
from smith_client.protocol import Operation, call
from smith_client.roundtrip import Pending, RoundTrip
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


#: The oldest due jobs of a queue whose arq in-progress key a count checks (one ``EXISTS`` each), so a queue holding
#: many running jobs stays cheap to read; the due jobs past them are told neither ready nor running
#: (:attr:`QueueCounts.unchecked`).
DUE_SCAN_LIMIT = 1000


@dataclass(frozen=True)
class QueueCounts:
    """The jobs of one arq queue at one moment, as ``smith status`` and the worker's ``smith_queue_length`` and
    ``smith_queue_wait_seconds`` gauges read them (:func:`read_queue_counts`; docs/architecture.md, Fair pickup):

    * ``ready``: due (score at or before now) and not picked up: no arq in-progress key;
    * ``running``: due and holding arq's in-progress key (arq keeps a running job on its queue until it ends);
    * ``unchecked``: the due jobs past the :data:`DUE_SCAN_LIMIT` oldest ones, told neither ready nor running;
    * ``deferred``: due later (score in the future: a parked turn's recheck, a retry after its backoff);
    * ``waiting``: turn jobs waiting for admission per tenant (``""``: no tenant), on their tenant's waiting ZSET
      and not on the queue yet (:meth:`Keys.tenant_waiting`); tenants with none are left out;
    * ``oldest``: the score (epoch ms: enqueue time, or the due time of a job that was deferred) of the oldest job
      not picked up, ready (among the checked ones) or waiting for admission; None when there is none.
    """

    ready: int
    running: int
    unchecked: int
    deferred: int
    waiting: dict[str, int]
    oldest: float | None

    @property
    def queued(self) -> int:
        """Jobs to be picked up: the ready ones and those waiting for admission."""
        return self.ready + sum(self.waiting.values())

    @property
    def length(self) -> int:
        """Every job of the queue (ready, running, unchecked, deferred) and those waiting for admission to it."""
        return self.ready + self.running + self.unchecked + self.deferred + sum(self.waiting.values())

    def wait_seconds(self, now: int) -> float:
        """Seconds the oldest job not picked up has waited at ``now`` (epoch ms); 0 when there is none."""
        return 0.0 if self.oldest is None else max(0.0, (now - self.oldest) / 1000)


async def read_queue_counts(
    redis: Redis, queues: Sequence[str], now: int, also: RoundTrip | None = None
) -> dict[str, QueueCounts]:
    """The :class:`QueueCounts` of each arq queue of ``queues`` at ``now`` (epoch ms), by queue name, in two round
    trips whatever the number of queues; the first also sends ``also``'s commands (the caller's reads of the same
    moment: their handles are resolved on return). Per queue, the first reads the number of due and deferred jobs,
    the :data:`DUE_SCAN_LIMIT` oldest due ones and the tenant ring (:meth:`Keys.tenant_ring`, empty on a queue
    without fair pickup); the second checks each of those due jobs' in-progress key (``EXISTS``) and reads each
    tenant's number of waiting jobs and its oldest one (``ZCARD``, ``ZRANGE key 0 0 WITHSCORES``). Raises
    redis-py's errors."""
    first = also if also is not None else RoundTrip()
    reads = {queue: _QueueRead(first, queue, now) for queue in queues}
    await first.run(redis)
    second = RoundTrip()
    for read in reads.values():
        read.check(second)
    if len(second):
        await second.run(redis)
    return {queue: read.counts() for queue, read in reads.items()}


class _QueueRead:
    """The reads of one queue for :func:`read_queue_counts`: its first round trip's commands on creation, its
    second's in :meth:`check`, the counts of both in :meth:`counts`."""

    def __init__(self, rt: RoundTrip, queue: str, now: int) -> None:
        self.queue = queue
        self.due = rt.call("zcount", queue, "-inf", now, parse=int)
        self.later = rt.call("zcount", queue, f"({now}", "+inf", parse=int)
        self.oldest_due: Pending[list[tuple[bytes, float]]] = rt.call(
            "zrangebyscore", queue, "-inf", now, start=0, num=DUE_SCAN_LIMIT, withscores=True
        )
        self.tenants = rt.call("zrange", Keys.tenant_ring(queue), 0, -1, parse=lambda ns: [n.decode() for n in ns])
        self.checked: list[tuple[float, Pending[bool]]] = []
        self.waiting: dict[str, Pending[int]] = {}
        self.heads: list[Pending[list[tuple[bytes, float]]]] = []

    def check(self, rt: RoundTrip) -> None:
        """Add the second reads to ``rt``: per checked due job (the oldest first) its score and whether its
        in-progress key exists, per tenant of the ring its number of waiting jobs and its oldest one."""
        self.checked = [
            (score, rt.call("exists", Keys.arq_in_progress(job_id.decode()), parse=bool))
            for job_id, score in self.oldest_due.value
        ]
        for tenant in self.tenants.value:
            waiting = Keys.tenant_waiting(self.queue, tenant)
            self.waiting[tenant] = rt.call("zcard", waiting, parse=int)
            self.heads.append(rt.call("zrange", waiting, 0, 0, withscores=True))

    def counts(self) -> QueueCounts:
        """The counts, once both round trips ran."""
        ready = [score for score, runs in self.checked if not runs.value]  # the oldest first, as read
        heads = [head.value[0][1] for head in self.heads if head.value]
        return QueueCounts(
            ready=len(ready),
            running=len(self.checked) - len(ready),
            unchecked=max(0, self.due.value - DUE_SCAN_LIMIT) if len(self.checked) == DUE_SCAN_LIMIT else 0,
            deferred=self.later.value,
            waiting={tenant: count.value for tenant, count in self.waiting.items() if count.value},
            oldest=min(ready[:1] + heads, default=None),
        )


@dataclass
class QueueStatus:
    """One arq queue in ``smith status``: its jobs (:class:`QueueCounts`) and the live workers serving it."""

    counts: QueueCounts
    workers: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FleetStatus:
    """What ``smith status`` prints: the two queues by name, the number of running turns (live leases in
    ``{p}:running``) and of paused turns (``{p}:paused``: waiting for a person, docs/architecture.md, Pausing for
    a person)."""

    queues: dict[str, QueueStatus]
    running_turns: int
    paused_turns: int


async def fleet_status(redis: Redis, keys: Keys) -> FleetStatus:
    """The jobs of both queues (:func:`read_queue_counts`) and their live workers, the running turns
    (``{p}:running``) and the paused turns (``{p}:paused``) of one prefix. Raises redis-py's errors."""
    now = now_ms()
    rt = RoundTrip()
    running = rt.call("zcount", keys.running, now, "+inf", parse=int)
    paused = rt.call("zcard", keys.paused, parse=int)
    served = {keys.turns_queue: "turns", keys.tools_queue: "tools"}
    counts = await read_queue_counts(redis, list(served), now, rt)
    workers = await live_workers(redis, keys)
    queues = {
        queue: QueueStatus(counts[queue], [w for w in workers if w.get("queue") == role])
        for queue, role in served.items()
    }
    return FleetStatus(queues, running.value, paused.value)
