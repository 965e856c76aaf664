"""arq's ``enqueue_job`` as one script call that also wakes the queue's workers (issue 18).

Every enqueuer of the runtime (both clients, tool dispatch, turn re-runs,
parking and waking) goes through :func:`enqueue_job` or, on a blocking
client, :func:`enqueue_call`: the ``enqueue`` script (``lua/enqueue.lua``)
writes arq 0.28's job record exactly as ``ArqRedis.enqueue_job`` does, adds
the job to the queue and pushes a token on the queue's wake-up list
(:meth:`Keys.wake_list`) in the same round trip, so an idle worker blocked
on that list starts the job at once instead of at its next poll.
"""

from __future__ import annotations

from typing import Any

from arq.constants import expires_extra_ms
from arq.jobs import serialize_job

from smith_client import scripts
from smith_client.keys import WAKE_CAP, WAKE_TTL, Keys, now_ms
from smith_client.serialization import job_serializer


def enqueue_call(
    function: str, payload: Any, *, job_id: str, queue: str, defer: float | None = None
) -> tuple[list[str], list[Any]]:
    """The ``KEYS`` and ``ARGV`` of the ``enqueue`` script for one job.

    ``payload`` is the job function's one argument; ``defer`` (seconds) delays
    the job as arq's ``_defer_by`` does (score = now + defer, job record kept
    that much longer). Enqueue time and score are epoch ms of the local clock, as in arq.
    """
    now = now_ms()
    score = now + round(defer * 1000) if defer else now
    job = serialize_job(function, (payload,), {}, None, now, serializer=job_serializer)
    keys = [Keys.arq_job(job_id), Keys.arq_result(job_id), queue, Keys.wake_list(queue)]
    return keys, [score - now + expires_extra_ms, job, score, job_id, WAKE_TTL, WAKE_CAP]


async def enqueue_job(
    redis: Any, function: str, payload: Any, *, job_id: str, queue: str, defer: float | None = None
) -> bool:
    """Enqueue ``function(payload)`` as arq job ``job_id`` on ``queue`` (asyncio redis-py client).

    Returns False, enqueueing nothing, when arq already has that job id queued,
    running or holding a result (arq's own rule). Raises redis-py's errors.
    """
    keys, args = enqueue_call(function, payload, job_id=job_id, queue=queue, defer=defer)
    return bool(await scripts.ENQUEUE(redis, keys, args))
