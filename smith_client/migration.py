"""Moving a deployment from a single Redis to a Redis Cluster: ``smith migrate-to-cluster`` (docs/cluster.md,
Moving a deployment from a single Redis to a cluster).

On a cluster every name starts with the prefix as a hash tag (``smith:conv:c1:history`` becomes
``{smith}:conv:c1:history``, :meth:`~smith_client.keys.Keys.moved`), so the data is copied key by key under the
new names, once the fleet is stopped and drained (:func:`drain_blockers` says what is still there):

* :func:`plan_copy` ``SCAN``\\ s the source's keys of the prefix and sorts them by kind
  (:func:`key_kind`): the keys that only concern live processes or that the fleet writes again by itself
  (:attr:`~smith_client.keys.Keys.fleet_key_patterns`: worker registrations, worker-turns sets, MCP tool-schema
  caches, the queues and their routing keys, the abort requests) are left out, every other key is copied
  (conversations, finished turns' records and tool results, tenant limits and quota counters, usage buckets,
  model rate limits, tree counters, and keys of kinds this version does not know); it also lists the copied
  names that exist on the target already (conflicts);
* :func:`copy_keys` copies them with ``DUMP`` + ``RESTORE``, each with its remaining TTL (``PTTL``; none stays
  none), :data:`BATCH` keys per round trip each way. arq's per-job keys (``arq:job:<p>:…``, those of queued and
  finished jobs) are not copied: a drained deployment has no queued job, and no reader needs a finished job's.

Names inside values: the only value of a copied key that holds a name of the prefix is a turn state's ``job_id``
(the arq job of its last attempt, :data:`~smith_client.turn_record.JOB_ID`, which the sweeper reads when that
attempt's worker died); the copy writes it renamed, so the record stays true on the cluster. Queue members,
requirement and admission entries and abort requests hold job ids too, but are not copied; conversation FIFOs,
the running and paused ZSETs hold turn ids, which do not change.

The source is left as it was: the operator deletes its keys once the fleet runs on the cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from redis.asyncio import Redis

from smith_client import turn_record as record
from smith_client.keys import Keys, now_ms
from smith_client.registry import live_workers, read_queue_counts
from smith_client.roundtrip import Pending, RoundTrip

#: Keys per round trip of the conflict check and of the copy (a ``PTTL`` and a ``DUMP`` each on the source, a
#: ``RESTORE`` on the target): a round trip carries at most this many values.
BATCH = 500
#: The kind of a key of the prefix that neither table of :class:`~smith_client.keys.Keys` names (a later version's
#: key, an application's own key under the prefix): copied, as the deployment's data.
OTHER_KIND = "other keys of the prefix"
#: Names a report lists at most (conflicts, paused turns), then how many more there are.
LISTED = 10


def key_kind(keys: Keys, name: str) -> tuple[str, bool]:
    """The kind of key ``name`` of ``keys``'s prefix and whether a copy of the deployment takes it: a kind of
    :attr:`~smith_client.keys.Keys.fleet_key_patterns` (left out), else of
    :attr:`~smith_client.keys.Keys.data_key_patterns`, else :data:`OTHER_KIND` (both copied)."""
    for kind, patterns, copied in _kinds(keys):
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            return kind, copied
    return OTHER_KIND, True


@functools.lru_cache(maxsize=4)
def _kinds(keys: Keys) -> tuple[tuple[str, tuple[str, ...], bool], ...]:
    """The kinds of :func:`key_kind` in their order, each with its patterns and whether a copy takes it, then
    :data:`OTHER_KIND` (no pattern); built once per :class:`Keys` (a plan classifies every key of the prefix)."""
    tables = ((keys.fleet_key_patterns, False), (keys.data_key_patterns, True))
    kinds = [(kind, tuple(patterns), copied) for table, copied in tables for kind, patterns in table.items()]
    return (*kinds, (OTHER_KIND, (), True))


async def drain_blockers(redis: Redis, keys: Keys) -> list[str]:
    """What keeps the deployment of ``keys`` on ``redis`` from being moved, one line each; empty when it is
    stopped and drained: live workers (their heartbeat has not expired), jobs on a queue (queued, running,
    deferred or waiting for admission: :func:`~smith_client.registry.read_queue_counts`), running turns (every
    entry of ``{p}:running``, an expired lease too: its turn waits for a worker's sweeper) and paused turns.
    Raises redis-py's errors."""
    rt = RoundTrip()
    zsets = {"running": keys.running, "paused": keys.paused}
    sizes = {what: rt.call("zcard", name, parse=int) for what, name in zsets.items()}
    first: dict[str, Pending[list[bytes]]] = {
        what: rt.call("zrange", name, 0, LISTED - 1) for what, name in zsets.items()
    }
    counts = await read_queue_counts(redis, [keys.turns_queue, keys.tools_queue], now_ms(), rt)
    lines = [
        f"worker {w.get('id')} on the {w.get('queue')} queue (host {w.get('host')}, pid {w.get('pid')})"
        for w in await live_workers(redis, keys)
    ]
    lines += [
        f"{queue}: {jobs.length} job(s): {jobs.queued} queued (waiting for admission included), {jobs.running} "
        f"running, {jobs.deferred} deferred"
        for queue, jobs in counts.items()
        if jobs.length
    ]
    for what, size in sizes.items():
        if size.value:
            lines.append(f"{size.value} {what} turn(s): {_listed([t.decode() for t in first[what].value], size.value)}")
    return lines


@dataclass
class KindTotal:
    """The keys of one kind that a copy wrote, and the bytes of their ``DUMP`` payloads."""

    keys: int = 0
    bytes: int = 0


@dataclass
class CopyPlan:
    """What a copy takes: the source names to copy by kind (in :func:`key_kind`'s order), how many keys of each
    kind it leaves out, and the copied keys' target names that exist already (conflicts)."""

    copied: dict[str, list[str]] = field(default_factory=dict)
    left_out: dict[str, int] = field(default_factory=dict)
    conflicts: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        """Every source name to copy."""
        return [name for names in self.copied.values() for name in names]


async def plan_copy(source: Redis, keys: Keys, target: Redis, to: Keys) -> CopyPlan:
    """The :class:`CopyPlan` of the keys of ``keys``'s prefix on ``source`` to ``to``'s names on ``target``: one
    ``SCAN`` of the prefix's keys (its names only: arq's per-job keys are not taken), then ``EXISTS`` of each target
    name, :data:`BATCH` per round trip. Raises redis-py's errors."""
    grouped: dict[str, dict[str, None]] = {}  # kind → names (a dict: SCAN may return a name twice)
    async for raw in source.scan_iter(match=keys.all_pattern, count=1000):
        name = raw.decode()
        grouped.setdefault(key_kind(keys, name)[0], {})[name] = None
    plan = CopyPlan()
    for kind, _, copied in _kinds(keys):
        names = list(grouped.get(kind, ()))
        if names and copied:
            plan.copied[kind] = names
        elif names:
            plan.left_out[kind] = len(names)
    for batch in _batches(plan.names):
        rt = RoundTrip()
        found = [(name, rt.call("exists", keys.moved(name, to), parse=bool)) for name in batch]
        await rt.run(target)
        plan.conflicts += [keys.moved(name, to) for name, exists in found if exists.value]
    return plan


@dataclass
class CopyReport:
    """What :func:`copy_keys` copied, by kind, and how many keys expired between the plan and their copy."""

    copied: dict[str, KindTotal] = field(default_factory=dict)
    expired: int = 0


async def copy_keys(
    source: Redis, keys: Keys, target: Redis, to: Keys, plan: CopyPlan, *, replace: bool = False
) -> CopyReport:
    """Copy the keys of ``plan`` from ``source`` to ``to``'s names on ``target``: ``DUMP`` + ``RESTORE`` with the
    remaining TTL (``PTTL``, read in the same round trip; a key without one gets none), replacing a key of the
    target only with ``replace``; a turn state's ``job_id`` is renamed as the key is (module docstring). A key gone
    since the plan (expired) is counted, not copied. The source is not changed. Raises redis-py's errors, a
    ``BUSYKEY`` error reply for a target key that appeared since the plan without ``replace``."""
    report = CopyReport()
    kind_of = {name: kind for kind, names in plan.copied.items() for name in names}
    for batch in _batches(plan.names):
        rt = RoundTrip()
        reads: list[tuple[str, Pending[int], Pending[bytes | None], Pending[Any] | None]] = [
            (name, rt.call("pttl", name), rt.call("dump", name), _job_id(rt, keys, name)) for name in batch
        ]
        await rt.run(source)
        writes = RoundTrip()
        for name, ttl, payload, job_id in reads:
            if payload.value is None or ttl.value in (0, -2):  # gone, or expiring now (RESTORE's 0 is no TTL)
                report.expired += 1
                continue
            moved = keys.moved(name, to)
            writes.call("restore", moved, max(ttl.value, 0), payload.value, replace=replace)
            renamed = _renamed_job_id(keys, to, job_id)
            if renamed is not None:
                writes.call("hset", moved, record.JOB_ID, renamed)  # HSET keeps the key's TTL
            total = report.copied.setdefault(kind_of[name], KindTotal())
            total.keys += 1
            total.bytes += len(payload.value)
        if len(writes):
            await writes.run(target)
    return report


def _job_id(rt: RoundTrip, keys: Keys, name: str) -> Pending[Any] | None:
    """The read of a turn state's ``job_id`` field, added to ``rt``; None for a key that is no turn state."""
    return rt.call("hget", name, record.JOB_ID) if fnmatchcase(name, keys.turn_state("*")) else None


def _renamed_job_id(keys: Keys, to: Keys, job_id: Pending[Any] | None) -> str | None:
    """A turn state's ``job_id`` under ``to``'s names; None when there is nothing to rename (no turn state, an
    empty ``job_id``: an attempt outside arq, or a value that is no job id of the prefix)."""
    if job_id is None or not job_id.value:
        return None
    try:
        return keys.moved(job_id.value.decode(), to)
    except ValueError:
        return None


def _batches(names: list[str]) -> Iterable[list[str]]:
    """``names`` in slices of :data:`BATCH`, in order."""
    for start in range(0, len(names), BATCH):
        yield names[start : start + BATCH]


def _listed(names: list[str], total: int) -> str:
    """``names`` (the first :data:`LISTED` of ``total``), comma-separated, then ``and N more`` when there are more."""
    more = f" and {total - LISTED} more" if total > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def plan_lines(plan: CopyPlan) -> list[str]:
    """``smith migrate-to-cluster``'s report of a plan: the keys to copy per kind, then those left out per kind."""
    lines = [f"keys to copy: {len(plan.names)}"]
    lines += [f"  {kind:<28} {len(names):>9}" for kind, names in plan.copied.items()]
    lines.append(
        f"keys left out (the fleet writes them again, or they concern live processes): {sum(plan.left_out.values())}"
    )
    lines += [f"  {kind:<28} {count:>9}" for kind, count in plan.left_out.items()]
    return lines


def conflict_line(plan: CopyPlan) -> str:
    """The report of a plan's conflicts: how many copied keys exist on the target already, the first of them."""
    return f"{len(plan.conflicts)} key(s) exist on the target already: {_listed(plan.conflicts, len(plan.conflicts))}"


def report_lines(report: CopyReport) -> list[str]:
    """``smith migrate-to-cluster``'s summary of a copy: keys and ``DUMP`` bytes per kind, their sum, and the keys
    that expired before their copy."""
    keys = sum(total.keys for total in report.copied.values())
    size = sum(total.bytes for total in report.copied.values())
    lines = [f"copied {keys} key(s), {size} bytes of DUMP payloads:"]
    lines += [f"  {kind:<28} {t.keys:>9} {t.bytes:>12} bytes" for kind, t in report.copied.items()]
    if report.expired:
        lines.append(f"  {report.expired} key(s) expired before their copy (not copied)")
    return lines
