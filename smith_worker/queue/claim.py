"""Claiming an arq queue's ready jobs in one round trip, and handing what it read to arq's ``run_job``.

See docs/architecture.md, Process roles.

Per job, arq 0.28 sends a poll (``ZRANGEBYSCORE``), four round trips in
``start_jobs`` to mark the job in progress (``WATCH``, ``EXISTS``,
``ZSCORE``, ``MULTI PSETEX EXEC``) and, as ``run_job`` starts, a
transaction that reads the job record and counts the try (``GET``,
``INCRBY``, ``EXPIRE`` and, on workers that abort jobs, ``ZREM`` of its abort
request); the wait between polls read the next deferred job's score in one
more. :func:`claim_jobs` does all of it in one atomic script
(``lua/claim.lua``), which also pops the wake-up tokens of the jobs it
claims (:mod:`smith_worker.queue.pickup`) and leaves a job whose requirement the
worker's capability set does not hold to the workers that serve it
(:mod:`smith_worker.routing`).

The hand-over relies on arq 0.28.0's ``run_job`` (pinned in pyproject.toml; the commands are listed in
:mod:`smith_worker.queue.arq_internals`):
its first use of ``self.pool`` is ``pipeline(transaction=True)``, into which it
queues exactly ``get(job key)``, ``incr(retry key)``, ``expire(retry key,
88400)`` and, with ``allow_abort_jobs``, ``zrem(arq's abort set, job id)``, then
``execute()`` (the claim took that abort request from the prefix's own abort set,
:attr:`~smith_client.keys.Keys.abort_set`, which stands in for arq's).
:class:`~smith_worker.queue.worker.SmithWorker` starts a claimed job's ``run_job`` with
:func:`hand_over` in the job's own task, and its ``pool`` gives that first use
:func:`take_handed_over`'s stand-in, whose ``execute()`` returns what the script read, so
that transaction is never sent. A stand-in used any other way raises
:class:`ClaimHandOverError` (the job fails, its try is never counted twice);
``tests/unit/test_claim.py`` runs a job through arq's ``run_job`` so an arq upgrade
that breaks this fails a test.
"""

from __future__ import annotations

import contextvars
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from smith_client.keys import ARQ_RETRY_TTL, Keys, now_ms
from smith_client.scripts import LuaScript
from smith_client.tenants import LIMIT_RANGES
from smith_worker.queue.arq_internals import RUN_JOB_ABORT_COMMAND, RUN_JOB_FIRST_TRANSACTION

#: The fields of a tenant's limits hash (:meth:`~smith_client.keys.Keys.tenant_limits`) the claim reads: its weight
#: and its ``max_running`` cap, each passed with its range (a stored value out of it is read as the nearest bound).
LIMIT_FIELDS = ("weight", "max_running")
_LIMIT_ARGUMENTS = tuple(item for field in LIMIT_FIELDS for item in (field, *LIMIT_RANGES[field]))

#: The scripts of this module, in ``lua/`` beside it.
CLAIM = LuaScript("claim", __package__)
CONFIRM_CLAIMS = LuaScript("confirm_claims", __package__)

#: How long a claim waits for its worker's confirmation, milliseconds, before its jobs are claimable again.
#: A worker confirms as soon as the claim's reply arrives (a loopback round trip); this bounds how long a
#: claim whose reply was lost keeps its jobs from running.
CLAIM_LEASE_MS = 5_000


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """One job :func:`claim_jobs` claimed: marked in progress, its try counted.

    ``score`` is its queue score (epoch ms, arq's ``run_job`` argument); ``record`` its arq job
    record (``None``: it expired, and arq fails the job); ``job_try`` its try counter after this
    try; ``aborted`` whether an abort request for it was taken (arq fails it before it starts).
    """

    job_id: str
    score: int
    record: bytes | None
    job_try: int
    aborted: bool


@dataclass(frozen=True, slots=True)
class Claim:
    """What one :func:`claim_jobs` call got: the ``jobs`` claimed (queue order), ``next_due``, the
    epoch ms score of the queue's next deferred job (``None``: there is none), ``marker``, the
    value of the jobs' in-progress keys until :func:`confirm_claims` confirms them, and ``more_ready``:
    the queue's ready jobs were read and filled every free slot, so more may be ready."""

    jobs: list[ClaimedJob]
    next_due: float | None
    marker: str
    more_ready: bool = False


@dataclass(frozen=True, slots=True)
class HeldTokens:
    """Wake-up tokens a worker's wait popped since its last claim: from the queue's list (``queue``) and from
    its capability set's list (``own``, :meth:`~smith_client.keys.Keys.wake_list` with a digest)."""

    queue: int = 0
    own: int = 0


async def claim_jobs(
    redis: Any,
    keys: Keys,
    queue: str,
    *,
    free: int,
    read_limit: int,
    in_progress_ms: int,
    tokens_held: HeldTokens,
    take_aborts: bool,
    claimer: str,
    capset: str | None,
    ended: Sequence[str] = (),
    weights: Mapping[str, float] | None = None,
    scan_queue: bool = True,
) -> Claim:
    """Claim up to ``free`` ready jobs of arq queue ``queue`` (score <= now) in one round trip.

    As arq's ``start_jobs``: a job whose in-progress key exists is skipped, a claimed one gets that
    key for ``in_progress_ms``; as the start of arq's ``run_job``: its record is read, its try
    counted, and with ``take_aborts`` its abort request removed from :attr:`~smith_client.keys.Keys.abort_set`
    and reported. ``read_limit`` is how many ready jobs are looked at (arq's ``queue_read_limit``). A job that
    requires something (:mod:`smith_worker.routing`) is claimed only when capability set ``capset`` (a digest) holds it;
    ``None`` claims any job (a claimer outside the fleet, e.g. a test). ``tokens_held`` are the wake-up
    tokens the worker's wait has popped already: one more is popped for each job claimed beyond those,
    from the list its token went to. A worker holding tokens claims no more jobs than those plus the
    tokens still listed (the rest went to other idle workers: a burst is spread over them); holding
    none (the fallback poll, a deferred job due, a slot freed) it claims up to ``free``. The claim is a
    lease of :data:`CLAIM_LEASE_MS` held by ``claimer`` (a unique string per claim call, e.g. the worker
    id and a counter) until :func:`confirm_claims`; a job whose earlier claim lapsed unconfirmed is
    claimed again without counting its try. ``ended`` are the ids of the worker's jobs that ended since
    its last claim (their requirements are forgotten once they left the queue). Raises what the Redis
    client raises (a claim that Redis ran anyway lapses unconfirmed).

    Turn jobs waiting for admission (:meth:`~smith_client.keys.Keys.tenant_ring`) fill the slots the queue's
    ready jobs leave, tenant by tenant in proportion to their weights (docs/architecture.md, Fair pickup):
    ``weights`` are the defaults (tenant → weight > 0; ``""`` is no tenant) for tenants whose limits hash
    sets none (``SMITH_TENANT_WEIGHTS``).

    Without ``scan_queue`` the queue's own ready jobs are not read, only the waiting turn jobs are admitted
    (and a job of ``ended`` still queued reads them anyway): reading them walks every job running on the
    queue, one ``GET`` each (``lua/claim.lua``), so a turn worker does it only now and then
    (:class:`~smith_worker.queue.worker.SmithWorker`).
    """
    now = now_ms()
    marker = f"claim:{now + CLAIM_LEASE_MS}:{claimer}"
    requirements = Keys.job_requirements(queue)
    wake = Keys.wake_list(queue)
    if capset is None:  # no set of its own: its list and members are never read
        own_wake, members = wake, requirements
    else:
        own_wake, members = Keys.wake_list(queue, capset), Keys.capability_set(queue, capset)
    script_keys = [queue, wake, own_wake, requirements, members, keys.abort_set, Keys.tenant_ring(queue)]
    args = [now, free, read_limit, in_progress_ms, ARQ_RETRY_TTL, tokens_held.queue, tokens_held.own,
            int(take_aborts), int(capset is not None), marker, *Keys.arq_claim_prefixes(),
            *Keys.tenant_prefixes(queue), *keys.tenant_limits_affixes(), json.dumps(weights or {}), *_LIMIT_ARGUMENTS,
            int(scan_queue), *ended]  # fmt: skip
    reply = await CLAIM(redis, script_keys, args)
    jobs = [
        ClaimedJob(job_id.decode(), int(float(score)), record, int(job_try), bool(aborted))
        for job_id, score, record, job_try, aborted in zip(*[iter(reply[2:])] * 5, strict=True)
    ]
    return Claim(jobs, None if reply[0] is None else float(reply[0]), marker, bool(reply[1]))


async def confirm_claims(redis: Any, claim: Claim, in_progress_ms: int) -> list[ClaimedJob]:
    """Confirm ``claim``'s jobs in one round trip and return those still held by it, to run now.

    A confirmed job's in-progress key becomes arq's (``"1"``, for ``in_progress_ms``); a job whose
    lease ended and that another claim took is left out and must not run. Raises what the Redis
    client raises: then nothing may run, and the claim lapses after its lease.
    """
    if not claim.jobs:
        return []
    in_progress_prefix = Keys.arq_claim_prefixes()[0]
    args = [claim.marker, in_progress_ms, in_progress_prefix, *(job.job_id for job in claim.jobs)]
    confirmed = await CONFIRM_CLAIMS(redis, [], args)
    return [job for job, held in zip(claim.jobs, confirmed, strict=True) if held]


class ClaimHandOverError(RuntimeError):
    """arq's ``run_job`` did not use the claimed job's values as arq 0.28.0 does (see the module docstring)."""


_HANDED_OVER: contextvars.ContextVar[PrefetchedPool | None] = contextvars.ContextVar("smith_claimed_job", default=None)


def hand_over(job: ClaimedJob, keys: Keys, take_aborts: bool) -> None:
    """Give ``job``'s values to the next :func:`take_handed_over` of the current task (call it in the
    job's own task, right before arq's ``run_job``); ``take_aborts`` is the worker's ``allow_abort_jobs``."""
    _HANDED_OVER.set(PrefetchedPool(job, keys, take_aborts))


def take_handed_over() -> PrefetchedPool | None:
    """The stand-in client :func:`hand_over` left in this task, once (``None`` after, and in any other task)."""
    pool = _HANDED_OVER.get()
    if pool is not None:
        _HANDED_OVER.set(None)
    return pool


class PrefetchedPool:
    """Stands in for arq's client at ``run_job``'s first use of it: only ``pipeline()``."""

    def __init__(self, job: ClaimedJob, keys: Keys, take_aborts: bool) -> None:
        self._job = job
        self._keys = keys
        self._take_aborts = take_aborts

    def pipeline(self, transaction: bool = True) -> PrefetchedPipeline:
        """A pipeline whose ``execute()`` returns the claimed job's values (see :class:`PrefetchedPipeline`)."""
        return PrefetchedPipeline(self._job, self._keys, self._take_aborts, transaction)

    def __getattr__(self, name: str) -> Any:
        raise ClaimHandOverError(f"arq's run_job used {name!r} first, not the pipeline claim.lua replaces")


class PrefetchedPipeline:
    """arq's first ``run_job`` transaction, answered from the claim: commands are recorded, not sent, and
    ``execute()`` checks they are the ones the claim ran (:class:`ClaimHandOverError` otherwise)."""

    def __init__(self, job: ClaimedJob, keys: Keys, take_aborts: bool, transaction: bool) -> None:
        self._job = job
        self._take_aborts = take_aborts
        self._queued: list[tuple[Any, ...]] = [("transaction", transaction)]
        retry = keys.arq_retry(job.job_id)
        arguments = [(keys.arq_job(job.job_id),), (retry,), (retry, ARQ_RETRY_TTL)]
        self._expected: list[tuple[Any, ...]] = [
            ("transaction", True),
            *((command, *args) for command, args in zip(RUN_JOB_FIRST_TRANSACTION, arguments, strict=True)),
        ]
        if take_aborts:
            # arq names its global abort set; the claim took the request from the prefix's (Keys.abort_set)
            self._expected.append((RUN_JOB_ABORT_COMMAND, Keys.arq_abort_set(), job.job_id))

    async def __aenter__(self) -> PrefetchedPipeline:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __getattr__(self, command: str) -> Callable[..., PrefetchedPipeline]:
        def queue(*args: Any, **kwargs: Any) -> PrefetchedPipeline:
            self._queued.append((command, *args, *sorted(kwargs.items())))
            return self

        return queue

    async def execute(self) -> list[Any]:
        """The replies of the queued commands, as Redis would have given them when the claim ran."""
        if self._queued != self._expected:
            raise ClaimHandOverError(f"arq's run_job queued {self._queued!r}, claim.lua ran {self._expected!r}")
        replies: list[Any] = [self._job.record, self._job.job_try, True]  # GET, INCRBY, EXPIRE
        return [*replies, int(self._job.aborted)] if self._take_aborts else replies  # ZREM: how many removed
