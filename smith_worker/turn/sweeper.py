"""Crash recovery: re-enqueue turns whose worker stopped renewing their lease; and approval timeouts.

Every turn worker runs :func:`sweep_forever`. One pass is one
``ZRANGEBYSCORE`` on ``{p}:running`` (turn id → lease expiry); only expired
entries cost more, and the re-enqueue script takes each turn at most once
(docs/architecture.md, Fault model: arq alone would wait for the job's in-progress key,
job timeout + 10 s).

After Redis was unreachable to the sweeper, it leaves expired leases alone
for :data:`SETTLE` seconds once Redis answers again: a fleet-wide outage
(a restart, a freeze, a partition) let every lease run out, and the owners
that are alive renew theirs when Redis is back (``lua/renew.lua`` renews a
lease nobody took over), so their turns go on without a re-run.

A re-enqueued turn's dead attempt leaves its arq job in the turns queue with
its in-progress key (arq removes a job only when it finishes), which would count
as queued until arq's own timeout and then run once more for nothing; the sweep
removes that job (:func:`drop_dead_job`).

Each pass also resumes the paused turns whose calls waited past their agent's ``approval_timeout``
(:func:`expire_paused`, docs/architecture.md, Pausing for a person).
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from smith_client import approvals
from smith_client import turn_record as record
from smith_client.keys import Keys, now_ms
from smith_client.roundtrip import RoundTrip
from smith_client.runners import AsyncRunner
from smith_worker.ops.redis_health import REDIS_DOWN_ERRORS
from smith_worker.turn.attempt import DEFAULT_LEASE, requeue_turn

logger = logging.getLogger("agent_smith.worker")

#: Seconds between sweeps.
SWEEP_INTERVAL = 2.0
#: Seconds a sweeper leaves expired leases to their owners once Redis answers again after an outage:
#: a lease's life, within which a live owner renews (every third of it).
SETTLE = DEFAULT_LEASE


async def sweep_once(redis: Any, keys: Keys) -> list[str]:
    """Re-enqueue every turn whose lease has expired; return their ids."""
    expired = await redis.zrangebyscore(keys.running, "-inf", now_ms())
    taken = []
    for raw in expired:
        turn_id = raw.decode()
        fields = [record.CONVERSATION_ID, record.JOB_ID, record.WORKER]
        conversation, job_id, worker = await redis.hmget(keys.turn_state(turn_id), fields)
        if conversation is not None and await requeue_turn(
            redis, keys, turn_id, conversation.decode(), (worker or b"").decode()
        ):
            if job_id:
                await drop_dead_job(redis, keys, job_id.decode())
            taken.append(turn_id)
        else:  # finished or already taken meanwhile: drop a stale entry
            status = await redis.hget(keys.turn_state(turn_id), record.STATUS)
            if status != record.RUNNING.encode():
                await redis.zrem(keys.running, turn_id)
    return taken


async def expire_paused(redis: Any, keys: Keys) -> list[str]:
    """Reject the undecided calls of every paused turn past its deadline (its agent's ``approval_timeout``)
    with "approval timed out" and enqueue it (docs/architecture.md, Pausing for a person); return their ids.
    One ``ZRANGEBYSCORE`` on ``{p}:paused`` when none is due."""
    due = await redis.zrangebyscore(keys.paused, "-inf", now_ms())
    runner = AsyncRunner(redis)
    return [raw.decode() for raw in due if await runner.run(approvals.expire(keys, raw.decode()))]


async def drop_dead_job(redis: Any, keys: Keys, job_id: str) -> None:
    """Remove arq job ``job_id`` of a turn attempt whose lease expired from the turns queue, with its
    payload, in-progress and retry keys and its requirement, in one transaction (no other worker can
    take it in between).

    Safe even if that attempt's worker is not dead but only cut off: its writes are fenced by the
    attempt (docs/architecture.md, Fault model), and arq's own clean-up when its job ends finds nothing left to remove.
    """
    rt = RoundTrip(transaction=True)
    rt.call("zrem", keys.turns_queue, job_id)
    rt.call("delete", keys.arq_job(job_id), keys.arq_in_progress(job_id), keys.arq_retry(job_id))
    rt.call("hdel", keys.job_requirements(keys.turns_queue), job_id)
    await rt.run(redis)


async def sweep_forever(redis: Any, keys: Keys, interval: float = SWEEP_INTERVAL, settle: float = SETTLE) -> None:
    """Run :func:`sweep_once` every ``interval`` seconds until cancelled, except for ``settle`` seconds after
    Redis answers again following an outage (only a ``PING`` then); errors are logged, never raised."""
    loop = asyncio.get_running_loop()
    resume_at = 0.0  # loop time from which expired leases are taken; inf while Redis is unreachable
    while True:
        await asyncio.sleep(interval)
        try:
            if loop.time() < resume_at:
                await redis.ping()
                if resume_at == math.inf:
                    resume_at = loop.time() + settle
                    logger.info("Redis answers again: expired leases are left to their owners for %g s", settle)
                continue
            recovered = await sweep_once(redis, keys)
            if recovered:
                logger.warning("re-enqueued turns whose worker stopped: %s", recovered)
            timed_out = await expire_paused(redis, keys)
            if timed_out:
                logger.info("paused turns whose approval timed out, resumed: %s", timed_out)
        except REDIS_DOWN_ERRORS as exc:  # an outage, reported once a poll by the worker: one line, no traceback
            resume_at = math.inf
            logger.warning("sweep skipped, Redis unavailable (%s: %s)", type(exc).__name__, exc)
        except Exception:
            logger.warning("sweep failed", exc_info=True)
