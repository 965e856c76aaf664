"""arq's ``enqueue_job`` as one script call that also wakes the queue's workers (docs/architecture.md, Process roles).

Every enqueuer of the runtime (both clients, tool dispatch, turn re-runs,
parking and waking) goes through :func:`enqueue_job` or, on a blocking
client, :func:`enqueue_call`: the ``enqueue`` script (``lua/enqueue.lua``)
writes arq 0.28's job record exactly as ``ArqRedis.enqueue_job`` does, adds
the job to the queue and pushes a token on the queue's wake-up list
(:meth:`Keys.wake_list`) in the same round trip, so an idle worker blocked
on that list starts the job at once instead of at its next poll. A tool
dispatch asks, in the same round trip, whether the call is answered already
(:func:`enqueue_unless`).

A job may name what it ``requires`` to run (a turn job its agent, a tool job
its tool: ``smith_worker/routing.py``): in a fleet whose workers serve
different things (a rolling deploy: v1 and v2 workers live), only a worker
whose capability set holds it claims it, and its wake-up token goes only to
such workers (``lua/lib.lua``). A tool dispatch also asks to be refused when
live workers exist but none serves the tool (:attr:`Enqueued.UNSERVED`).
"""

from __future__ import annotations

import enum
from typing import Any

from arq.constants import expires_extra_ms
from arq.jobs import serialize_job

from smith_client import scripts
from smith_client.keys import WAKE_CAP, WAKE_TTL, Keys, now_ms
from smith_client.serialization import job_serializer


class Enqueued(enum.Enum):
    """What :func:`enqueue_unless` did (the ``enqueue`` script's reply)."""

    #: the job is on the queue now
    NEW = 1
    #: nothing enqueued: arq already has that job id queued, running or holding a result
    EXISTING = 0
    #: nothing enqueued: the skip key exists
    SKIPPED = -1
    #: nothing enqueued: live workers exist, but none serves what the job requires
    UNSERVED = -2


def enqueue_call(
    function: str,
    payload: Any,
    *,
    job_id: str,
    queue: str,
    defer: float | None = None,
    skip_key: str | None = None,
    requires: str = "",
    refuse_unserved: bool = False,
    fair: bool = False,
    tenant: str | None = None,
    since_ms: float | None = None,
) -> tuple[list[str], list[Any]]:
    """The ``KEYS`` and ``ARGV`` of the ``enqueue`` script for one job.

    ``payload`` is the job function's one argument; ``defer`` (seconds) delays
    the job as arq's ``_defer_by`` does (score = now + defer, job record kept
    that much longer). Enqueue time and score are epoch ms of the local clock, as in arq.
    With ``skip_key``, nothing is enqueued when that key exists (see :class:`Enqueued`).
    ``requires`` ("" for nothing) is what a worker must serve to claim the job; with
    ``refuse_unserved``, nothing is enqueued when live workers exist but none serves it.
    With ``fair`` (a turn job due now), the job waits on ``tenant``'s waiting list until the claim admits it
    in its tenant's turn (:meth:`Keys.tenant_ring`; docs/architecture.md, Fair pickup); a deferred job
    (``defer``) is never: it was admitted once already (a parked turn's recheck). ``since_ms`` (epoch ms with
    its fraction, within the current millisecond at most: else now) is a fair job's place in its tenant's line,
    oldest first: a turn's submit passes its ``created_at`` to the microsecond, so turns sent within one
    millisecond keep their order, and a turn run again (its worker died or stopped, docs/architecture.md, Fair
    pickup) passes the same time, keeping its place; default now.
    """
    now = now_ms()
    score: float = now + round(defer * 1000) if defer else now
    fair = fair and not defer
    if fair and since_ms is not None and since_ms < now + 1:
        score = since_ms
    job = serialize_job(function, (payload,), {}, None, now, serializer=job_serializer)
    keys = [Keys.arq_job(job_id), Keys.arq_result(job_id), queue, Keys.wake_list(queue),
            Keys.job_requirements(queue), Keys.capability_sets(queue)]  # fmt: skip
    if skip_key is not None:
        keys.append(skip_key)
    expiry_ms = round(max(score - now, 0)) + expires_extra_ms  # a line's place in the past does not shorten it
    args = [expiry_ms, job, score, job_id, WAKE_TTL, WAKE_CAP, requires, int(refuse_unserved), now,
            *Keys.capability_prefixes(queue), int(fair), tenant or "", Keys.tenant_prefixes(queue)[0],
            Keys.tenant_ring(queue)]  # fmt: skip
    return keys, args


async def enqueue_job(
    redis: Any,
    function: str,
    payload: Any,
    *,
    job_id: str,
    queue: str,
    defer: float | None = None,
    requires: str = "",
    fair: bool = False,
    tenant: str | None = None,
    since_ms: float | None = None,
) -> bool:
    """Enqueue ``function(payload)`` as arq job ``job_id`` on ``queue`` (asyncio redis-py client), for a
    worker that serves ``requires`` ("" for any worker); ``fair``, ``tenant`` and ``since_ms`` as
    :func:`enqueue_call`'s.

    Returns False, enqueueing nothing, when arq already has that job id queued,
    running or holding a result (arq's own rule). Raises redis-py's errors.
    """
    keys, args = enqueue_call(
        function,
        payload,
        job_id=job_id,
        queue=queue,
        defer=defer,
        requires=requires,
        fair=fair,
        tenant=tenant,
        since_ms=since_ms,
    )
    return bool(await scripts.ENQUEUE(redis, keys, args))


async def enqueue_unless(
    redis: Any, function: str, payload: Any, *, job_id: str, queue: str, skip_key: str, requires: str = ""
) -> Enqueued:
    """:func:`enqueue_job`, unless ``skip_key`` exists or no live worker serves ``requires`` (checked in the
    same script call, one round trip; with no worker registered at all the job is enqueued and waits).

    A tool dispatch passes the call's result key, so an answered call is not run again and the
    turn learns it is answered without a read of its own. Raises redis-py's errors.
    """
    keys, args = enqueue_call(
        function, payload, job_id=job_id, queue=queue, skip_key=skip_key, requires=requires, refuse_unserved=True
    )
    return Enqueued(int(await scripts.ENQUEUE(redis, keys, args)))
