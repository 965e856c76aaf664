"""Turn side of tool calls: one ``run_tool`` job per call, waited for without polling arq.

Each call of a step becomes a job on the tools queue (job id from prefix +
turn id + step + position) and all of a step's calls are awaited
concurrently (docs/architecture.md, Tool calls). Waiting does not use arq's ``Job.result()``, which
polls every 0.5 s: the tool worker stores the outcome
under the call's result key and publishes that key, with the outcome when it
is small (:func:`~smith_client.jobs.parse_reply`), on the turn worker's reply
channel; one :class:`WorkerSubscription` per process wakes the waiter, which reads
the key only when the message did not carry the outcome. The waiter also
re-reads the key every ``recheck_interval`` seconds, which covers a lost
pub/sub message (docs/architecture.md, Events). The key stays the durable record: the
enqueue itself says when the call is answered already (a resumed turn), and
the waiter reads the outcome from it then.

When a job has not answered ``timeout + pickup_grace`` seconds after it was
enqueued (no tool worker, or a stuck one), the turn records a timeout error
for the call and aborts the job. A call whose tool worker died while running
it becomes an error tool message; an idempotent one is re-run once first.

A job names the tool it requires (its route's ``requires``, :mod:`smith_worker.routing`),
so only a tool worker serving that tool takes it (a fleet in a rolling deploy
runs tool workers of two app versions); when live tool workers exist but none
serves it, the enqueue refuses the job and the call's answer is an unknown-tool
error at once, as a tool worker without the tool would have given.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis

from smith_client.enqueue import Enqueued, enqueue_unless
from smith_client.jobs import RUN_TOOL, ToolJob, ToolOutcome, parse_reply
from smith_client.keys import ABORT_ENTRY_TTL, Keys, now_ms
from smith_client.roundtrip import RoundTrip
from smith_client.scripts import LuaScript
from smith_worker.ops.redis_health import REDIS_DOWN_ERRORS, RedisHealth
from smith_worker.ops.tasks import cancel_and_wait
from smith_worker.tools.function import error_content

#: The script of this module, in ``lua/`` beside it.
ABORT = LuaScript("abort", __package__)

logger = logging.getLogger("agent_smith.tool")

#: Re-runs of an idempotent tool call whose tool worker died while running it (docs/architecture.md, Fault model).
MAX_IDEMPOTENT_RERUNS = 1
#: Longest single wait for a pub/sub message, seconds; the socket timeout does not apply to it.
LISTEN_BOUND = 5.0


class Reply:
    """The wake-up of one waiter of a tool call (see :meth:`WorkerSubscription.register`)."""

    def __init__(self) -> None:
        self._announced = asyncio.Event()
        self._outcome: bytes | None = None

    def deliver(self, outcome: bytes | None) -> None:
        """The call's result key was announced, with its outcome JSON or None (then it is read from the key)."""
        self._outcome = outcome or self._outcome
        self._announced.set()

    async def wait(self) -> None:
        """Return once the result key has been announced (at once when it was already)."""
        await self._announced.wait()

    def outcome(self) -> ToolOutcome | None:
        """The outcome the announcement carried; None when none did (not announced yet, or over the size cap)."""
        return ToolOutcome.model_validate_json(self._outcome) if self._outcome else None


class WorkerSubscription:
    """One pub/sub subscription per turn-worker process.

    It wakes the waiters of finished tool jobs (messages on ``channel`` name a
    result key, see :func:`~smith_client.jobs.parse_reply`) and passes control
    messages (on ``control_channel``, a turn id to cancel) to ``on_control``.
    """

    def __init__(
        self,
        redis: Redis,
        channel: str,
        control_channel: str | None = None,
        on_control: Callable[[str], None] | None = None,
        *,
        health: RedisHealth | None = None,
    ) -> None:
        self._redis = redis
        self._health = health or RedisHealth()
        self.channel = channel
        self._control_channel = control_channel
        self._on_control = on_control
        self._waiters: dict[str, Reply] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def _channels(self) -> list[str]:
        return [self.channel] + ([self._control_channel] if self._control_channel else [])

    async def start(self) -> None:
        """Subscribe (before returning, so no reply is missed; waiting while Redis is down) and start dispatching."""
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._health.until_ok("the reply channel", lambda: pubsub.subscribe(*self._channels))
        self._task = asyncio.create_task(self._run(pubsub))

    async def stop(self) -> None:
        """Unsubscribe and stop dispatching."""
        await cancel_and_wait(self._task)

    def register(self, result_key: str) -> Reply:
        """The wake-up of ``result_key``'s waiter, delivered when the key is announced on the channel."""
        return self._waiters.setdefault(result_key, Reply())

    def discard(self, result_key: str) -> None:
        """Forget the waiter of ``result_key``."""
        self._waiters.pop(result_key, None)

    async def _run(self, pubsub: Any) -> None:
        try:
            while True:
                try:
                    message = await pubsub.get_message(timeout=LISTEN_BOUND)
                except REDIS_DOWN_ERRORS as exc:  # connection lost: waiters fall back to re-checks meanwhile
                    await asyncio.sleep(self._health.failed("the reply channel", exc))
                    await self._resubscribe(pubsub)
                    continue
                if message and message.get("type") == "message":
                    self._dispatch(message["channel"].decode(), message["data"])
        finally:
            with contextlib.suppress(*REDIS_DOWN_ERRORS):
                await pubsub.aclose()

    async def _resubscribe(self, pubsub: Any) -> None:
        """Subscribe again on a fresh connection, for as long as Redis is down (never gives up)."""

        async def subscribe() -> None:
            await pubsub.aclose()  # drops the broken connection; the next subscribe opens a new one
            await pubsub.subscribe(*self._channels)

        await self._health.until_ok("the reply channel", subscribe)
        logger.info("reply channel %s subscribed again", self.channel)

    def _dispatch(self, channel: str, data: bytes) -> None:
        if channel == self._control_channel:
            if self._on_control is not None:
                self._on_control(data.decode())
            return
        result_key, outcome = parse_reply(data)
        waiter = self._waiters.get(result_key)
        if waiter is not None:
            waiter.deliver(outcome)


async def abort_job(redis: Redis, keys: Keys, job_id: str) -> None:
    """Abort an arq job of the tools queue whether it is queued or running, in one round trip (``lua/abort.lua``).

    A running job is cancelled by its worker at its next poll (worker
    ``allow_abort_jobs``), so the tool workers are told to poll now (:attr:`Keys.tool_aborts_channel`);
    a queued one is removed from the queue so it never starts. The request goes in the prefix's
    :attr:`~smith_client.keys.Keys.abort_set`, not arq's global one. Old abort entries
    are pruned, since arq never does (#485) and a stale entry would cancel a later
    job with the same id; the set itself expires
    :data:`~smith_client.keys.ABORT_ENTRY_TTL` seconds after the last abort.
    """
    script_keys = [
        keys.abort_set,
        keys.arq_in_progress(job_id),
        keys.tools_queue,
        keys.arq_job(job_id),
        keys.tool_aborts_channel,
        keys.job_requirements(keys.tools_queue),
    ]
    await ABORT(redis, script_keys, [job_id, now_ms(), ABORT_ENTRY_TTL])


async def settle_call(redis: Redis, keys: Keys, job_id: str, result_key: str, ended: ToolOutcome) -> ToolOutcome:
    """The one outcome of a tool call the turn side stops waiting for (first writer wins).

    ``ended`` is stored under ``result_key`` unless a result is there already
    (``SET NX``, ``keys.turn_ttl`` seconds); when it is, the stored one is
    returned (the tool finished first; an unreadable one counts as none).
    When ``ended`` won, the call's job (``job_id``; "" for none) is aborted.
    """
    if await redis.set(result_key, ended.model_dump_json(), nx=True, ex=keys.turn_ttl):
        if job_id:
            await abort_job(redis, keys, job_id)
        return ended
    try:
        return ToolOutcome.model_validate_json(await redis.get(result_key) or b"")
    except ValueError:
        return ended


class ToolJobWaiter:
    """Enqueue one tool job and wait for its outcome (see the module docstring).

    ``pickup_grace`` and ``recheck_interval`` are seconds.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        subscription: WorkerSubscription,
        *,
        pickup_grace: float = 10.0,
        recheck_interval: float = 1.0,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._subscription = subscription
        self._grace = pickup_grace
        self._recheck = recheck_interval

    async def run(self, job: ToolJob, requires: str = "") -> tuple[ToolOutcome, bool]:
        """Return ``(outcome, produced_here)``; ``produced_here`` is True when this side wrote the outcome (a
        timeout, or an unknown-tool error when no live tool worker serves ``requires``, "" for any worker)."""
        reply = self._subscription.register(job.result_key)
        job_id = self._keys.tool_job_id(job.turn_id, job.step, job.index, job.position)
        try:
            enqueued = await self._enqueue(job, job_id, requires)
            if enqueued is Enqueued.UNSERVED:
                content = error_content(f"unknown tool: {job.call.name} (no live tool worker serves it)")
                return ToolOutcome(content=content, is_error=True), True
            if enqueued is not Enqueued.SKIPPED:
                outcome, job_id = await self._wait(job, job_id, reply, requires)
            else:  # answered already (a resumed turn): the key has the outcome
                outcome = await self._stored(job.result_key)
            if outcome is not None:
                return outcome, False
            reason = (
                "interrupted: the tool worker running it stopped"
                if job_id == ""
                else (
                    f"timed out: no tool worker answered within {job.timeout + self._grace:g} s "
                    f"(its timeout {job.timeout:g} s + {self._grace:g} s for a tool worker to take it)"
                )
            )
            return await self._give_up(job, job_id, reason)
        finally:
            self._subscription.discard(job.result_key)

    async def _enqueue(self, job: ToolJob, job_id: str, requires: str) -> Enqueued:
        """Enqueue the call's job for a tool worker serving ``requires``, unless the call is answered or no
        live tool worker serves it (see :class:`Enqueued`). Enqueues nothing either when this job id is
        still queued or running: a re-run turn re-attaches to it."""
        return await enqueue_unless(
            self._redis,
            RUN_TOOL,
            job.model_dump(mode="json"),
            job_id=job_id,
            queue=self._keys.tools_queue,
            skip_key=job.result_key,
            requires=requires,
        )

    async def _wait(self, job: ToolJob, job_id: str, reply: Reply, requires: str) -> tuple[ToolOutcome | None, str]:
        """Wait for the outcome; returns ``(None, "")`` when the call was lost with its tool worker."""
        deadline = time.monotonic() + job.timeout + self._grace
        while (remaining := deadline - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(reply.wait(), min(self._recheck, remaining))
            outcome = reply.outcome()
            if outcome is None:  # not announced (a lost message: the re-check), or announced without it
                outcome = await self._stored(job.result_key)
            if outcome is not None:
                return outcome, job_id
            if await self._tool_worker_died(job):
                if not job.idempotent or not await self._may_rerun(job):
                    return None, ""  # never silently re-run a call that may have had effects
                job_id = self._keys.tool_rerun_job_id(job.turn_id, job.step, job.index, now_ms(), job.position)
                if await self._enqueue(job, job_id, requires) is Enqueued.UNSERVED:
                    return None, ""  # no live tool worker serves it any more: lost with its worker
                deadline = time.monotonic() + job.timeout + self._grace
        return None, job_id

    async def _may_rerun(self, job: ToolJob) -> bool:
        """Count a re-run of an idempotent call; False past :data:`MAX_IDEMPOTENT_RERUNS`.

        A call that killed its worker twice would go on killing workers. The count is kept
        in Redis, so a resumed turn (another attempt, another worker) does not start over.
        """
        counter = self._keys.tool_reruns(job.turn_id, job.step, job.index, job.position)
        rt = RoundTrip(transaction=True)
        reruns = rt.call("incr", counter, parse=int)
        rt.call("expire", counter, self._keys.turn_ttl)
        await rt.run(self._redis)
        return reruns.value <= MAX_IDEMPOTENT_RERUNS

    async def _tool_worker_died(self, job: ToolJob) -> bool:
        """True when the call was started by a tool worker whose registration has expired (it died)."""
        started = self._keys.tool_started(job.turn_id, job.step, job.index, job.position)
        worker = await self._redis.get(started)
        if worker is None or await self._redis.exists(self._keys.worker(worker.decode())):
            return False
        await self._redis.delete(started)
        return True

    async def _give_up(self, job: ToolJob, job_id: str, reason: str) -> tuple[ToolOutcome, bool]:
        ended = ToolOutcome(content=error_content(f"tool {job.call.name!r} {reason}"), is_error=True)
        outcome = await settle_call(self._redis, self._keys, job_id, job.result_key, ended)
        return outcome, outcome is ended

    async def _stored(self, result_key: str) -> ToolOutcome | None:
        raw = await self._redis.get(result_key)
        return ToolOutcome.model_validate_json(raw) if raw else None
