"""arq workers for the two queues: ``turns`` (the agent loop) and ``tools`` (tool calls).

Turns and tools are separate queues served by separate processes, so a turn
waiting on its tools never holds the slots its tools need (docs/architecture.md,
Process roles). arq settings are chosen deliberately:

* pickup by wake-up (:mod:`smith_worker.queue.pickup`): arq only polls (its 0.5 s
  default adds half a second per hop, a short one costs hundreds of idle
  commands per second); here an idle worker blocks on its queue's wake-up
  list between polls, with a slow fallback poll (``SMITH_FALLBACK_POLL``);
* ``queue_read_limit`` well above the fleet's concurrency, so idle workers are
  not blinded by running jobs at the head of the queue;
* ``allow_abort_jobs`` on tool workers only, so timed-out or cancelled tool jobs can be
  aborted; turns are cancelled through their own state, and the abort check costs
  a read each time it runs;
* ``health_check_interval`` 10 s instead of an hour;
* ``max_tries`` 1 for tools: a tool call is never silently re-run after a
  crash; 3 for turns.

A tool worker whose overrunning sync-tool threads reach their limit
(:mod:`smith_worker.tools.isolation`) stops taking jobs and drains like at a
signal; ``smith-worker`` then re-executes itself.

:class:`SmithWorker` is arq's ``Worker`` made to outlive Redis (docs/architecture.md, Fault model): arq
lets a ``ConnectionError`` out of its poll loop, which ends the process. Here
start-up waits for Redis, and a failed poll iteration backs off with jitter
and polls again; the process exits only on a signal or a configuration error.

Its poll claims jobs in one round trip (:mod:`smith_worker.queue.claim`)
instead of arq's six per job, and on tool workers runs arq's abort check
only when an abort was announced or once per fallback poll, not every poll.
Its abort requests are the prefix's (:attr:`~smith_client.keys.Keys.abort_set`), not arq's global
``arq:abort``, which every prefix of a database would share: it overrides the arq methods that name that set
(the abort check, ``finish_job``, ``finish_failed_job``; the claim answers ``run_job``'s use of it), so no
process of this project touches it.
It claims only the jobs its capability set serves (:mod:`smith_worker.routing`):
a fleet in a rolling deploy runs workers of two app versions on one queue.
On the turns queue, where a job due now waits for admission (docs/architecture.md, Fair pickup), it reads
the queue's own ready jobs (re-runs, deferred jobs come due, lapsed claims) only once per fallback poll, when
a deferred job is due, after a Redis failure, or while the last read filled its free slots: that read walks
every turn running on the queue (bench/in_flight.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import signal
import uuid
from typing import Any, cast

from arq.connections import ArqRedis, log_redis_info
from arq.utils import to_ms
from arq.worker import Worker, func

from smith_client.keys import Keys, now_ms
from smith_client.roundtrip import RoundTrip
from smith_client.serialization import job_deserializer, job_serializer
from smith_worker.app import SmithApp
from smith_worker.config import Settings, parse_tenant_weights
from smith_worker.ops.redis_health import REDIS_DOWN_ERRORS, RedisHealth
from smith_worker.queue.arq_internals import check_arq
from smith_worker.queue.claim import ClaimedJob, claim_jobs, confirm_claims, hand_over, take_handed_over
from smith_worker.queue.pickup import POP_MARGIN, Pickup
from smith_worker.runtime import Queue, WorkerRole, WorkerRuntime
from smith_worker.tool_worker.role import ToolRole
from smith_worker.turn.role import TurnRole

logger = logging.getLogger("agent_smith.worker")

#: Minimum ``queue_read_limit``: at least twice the fleet's concurrency on the queue
#: (docs/architecture.md, Process roles).
MIN_QUEUE_READ_LIMIT = 1000
#: Seconds the shutdown's Redis work may take in all (:meth:`SmithWorker.close`): well inside a 30 s grace period
#: with a tool worker's 10 s wait for its running tool calls before it.
SHUTDOWN_REDIS_SECONDS = 10.0
#: Seconds :meth:`SmithWorker.close` gives a job task past the deadline to end after a cancel, before the next.
CANCEL_WAIT = 0.5
#: The role of a worker on each queue.
ROLES: dict[Queue, type[WorkerRole]] = {"turns": TurnRole, "tools": ToolRole}


class SmithWorker(Worker):
    """arq's :class:`~arq.worker.Worker` that survives Redis interruptions (see the module docstring).

    ``health`` is the process's :class:`RedisHealth` (its readiness), updated
    by every poll iteration; ``keys`` names the queue's keys; ``capset`` is the digest of the worker's
    capability set (:mod:`smith_worker.routing`). Never in burst mode. What it overrides and drives of arq's
    ``Worker`` is listed in :mod:`smith_worker.queue.arq_internals`.
    """

    def __init__(
        self,
        *args: Any,
        health: RedisHealth,
        pickup: Pickup,
        keys: Keys,
        capset: str,
        tenant_weights: dict[str, float] | None = None,
        admitted: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.tenant_weights = tenant_weights or {}
        self.admitted = admitted
        self.health = health
        self.pickup = pickup
        self.keys = keys
        self.capset = capset
        self._ended: list[str] = []  # ids of this worker's jobs that ended since its last claim
        self._finished: list[tuple[str, asyncio.Task[None]]] = []  # job tasks done since the last reap
        self._next_due: float | None = None  # the queue's next deferred job (epoch ms), as the last claim read it
        self._read_queue_at = 0.0  # loop time from which a claim reads the queue's own ready jobs (admitted jobs)
        self._abort_check_at = 0.0  # loop time of the next abort check without an announced abort
        # each claim's marker names its claimer: this worker object and a counter (smith_worker/queue/claim.py)
        self._claimer = f"{uuid.uuid4().hex[:12]}:{{}}"
        self._claims = itertools.count()
        self.stopping = False
        #: True once SIGTERM / SIGINT stopped the worker: a drain in progress then ends the process, no re-exec.
        self.terminated = False
        self.on_stop = self._on_stop  # arq calls it after cancelling the main task on SIGTERM / SIGINT

    def _on_stop(self, _signum: signal.Signals) -> None:
        # The main task's cancellation can be lost inside redis-py's reads (Python 3.11's
        # asyncio.timeout may turn a pending cancel into a TimeoutError that redis-py treats as
        # "no data"; seen as a worker polling on after SIGTERM): the flag ends the loops anyway.
        self.stopping = self.health.stopping = True
        self.pickup.stop()

    def handle_sig(self, signum: signal.Signals) -> None:
        """arq's immediate stop (turn workers' SIGTERM / SIGINT), noting a termination; every running
        turn is then sure to be handed off (:meth:`~smith_worker.turn.lifecycle.TurnExecution.hand_off_soon`)."""
        self._note_signal(signum)
        super().handle_sig(signum)
        runtime = self.ctx.get("runtime")
        if runtime is not None:
            runtime.role.stop_now()

    def handle_sig_wait_for_completion(self, signum: signal.Signals) -> None:
        """arq's stop after running jobs (tool workers' SIGTERM / SIGINT, and the drain), noting a termination."""
        self._note_signal(signum)
        super().handle_sig_wait_for_completion(signum)

    def _note_signal(self, signum: signal.Signals) -> None:
        self.terminated = self.terminated or signum in (signal.SIGTERM, signal.SIGINT)

    async def main(self) -> None:
        """arq's ``main`` (never in burst mode here), waiting for Redis first instead of exiting, and
        waiting for a wake-up between polls instead of arq's fixed ``poll_delay`` (:class:`Pickup`)."""
        await self.health.until_ok("start-up", lambda: log_redis_info(self.pool, logger.info))
        self.ctx["redis"] = self.pool
        if self.on_startup:
            await self.on_startup(self.ctx)
        try:
            while not self.stopping:
                self.pickup.before_poll()
                await self._poll_iteration()
                if self.health.failures == 0 and not self.stopping:  # a failed poll has backed off already
                    await self.pickup.wait(self._free_slots, self._next_due)
        finally:
            self.pickup.stop()  # also ends its tool-aborts subscription
            await self.pickup.close()

    def _free_slots(self) -> int:
        """How many more jobs this worker can take now (0 when full or draining)."""
        return self.max_jobs - self.job_counter if self.allow_pick_jobs else 0

    def _release_sem_dec_counter_on_complete(self) -> None:
        super()._release_sem_dec_counter_on_complete()
        self.pickup.job_finished()  # a slot is free: take the next queued job now, not at the next poll

    async def close(self) -> None:
        """arq's ``close``, but a Redis that is down at shutdown does not skip ``on_shutdown``, and the shutdown's
        Redis work (the running jobs' hand-off, the health key, the registration: ``ctx["shutdown_deadline"]``)
        ends within :data:`SHUTDOWN_REDIS_SECONDS`, so a worker stops within its grace period (deploy/README.md,
        Shutdown) even when Redis does not answer; a turn not handed off is run again once its lease ends."""
        if not self._handle_signals:
            self.handle_sig(signal.SIGUSR1)
        if not self._pool:
            return
        deadline = self.ctx["shutdown_deadline"] = asyncio.get_running_loop().time() + SHUTDOWN_REDIS_SECONDS
        await self._end_jobs(deadline)
        with contextlib.suppress(*REDIS_DOWN_ERRORS, TimeoutError):
            async with asyncio.timeout_at(deadline):
                await self.pool.delete(self.health_check_key)
        if self.on_shutdown:
            await self.on_shutdown(self.ctx)
        await self.pool.close(close_connection_pool=True)
        self._pool = None

    async def _end_jobs(self, deadline: float) -> None:
        """Wait for the job tasks (cancelled by now: handing off or ending) until ``deadline`` (loop time), then
        cancel those still waiting on Redis until they end: a cancel ends one wait (the hand-off's), and arq then
        finishes the job in ``asyncio.shield`` (another Redis round trip), which a further cancel leaves behind."""
        tasks = list(self.tasks.values())
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
        while late:
            for task in late:
                task.cancel()
            _, late = await asyncio.wait(late, timeout=CANCEL_WAIT)

    @property
    def pool(self) -> ArqRedis:
        """arq's client, except at the first use by a claimed job's ``run_job``: the claim's answers then
        (:func:`~smith_worker.queue.claim.take_handed_over`; a stand-in for that one transaction, not an
        ``ArqRedis``)."""
        return cast(ArqRedis, take_handed_over() or self._pool)

    async def _poll_iteration(self) -> None:
        """arq's poll in fewer round trips: claim the ready jobs (one script), start them as arq's
        ``start_jobs`` does, run arq's abort check when due, then arq's heartbeat. A Redis failure
        backs off (:class:`RedisHealth`) instead of ending the worker."""
        self._reap_finished_jobs()
        try:
            await self._claim_jobs()
            if self.allow_abort_jobs and (self.pickup.take_abort() or self.loop.time() >= self._abort_check_at):
                self._abort_check_at = 0.0  # a check that fails is due again at the next poll
                await self._cancel_aborted_jobs()
                self._abort_check_at = self.loop.time() + self.pickup.fallback
            await self.heart_beat()
        except REDIS_DOWN_ERRORS as exc:
            self._read_queue_at = 0.0  # a claim whose reply was lost lapses: its jobs are claimable again
            await asyncio.sleep(self.health.failed("the job poll", exc))
        else:
            self.health.ok()

    def _reap_finished_jobs(self) -> None:
        """Drop the job tasks that finished since the last poll, logging the error of one that failed.

        arq re-raises such an error from its poll loop (``t.result()``); the error of a job that
        could not record its end during an outage must not count as a failure of the poll now. Only the
        finished tasks are visited (each task's done callback lists it), never all of them: a worker with
        thousands of turns in flight polls at every job end (bench/in_flight.py).
        """
        finished, self._finished = self._finished, []
        for job_id, task in finished:
            if self.tasks.get(job_id) is task:
                del self.tasks[job_id]
            self._ended.append(job_id)
            if not task.cancelled() and task.exception() is not None:
                logger.warning("job %s could not record its end: %r", job_id, task.exception())

    def _job_done(self, job_id: str, task: asyncio.Task[None]) -> None:
        """A job task's done callback: list it for :meth:`_reap_finished_jobs`, free its slot."""
        self._finished.append((job_id, task))
        self._release_sem_dec_counter_on_complete()

    async def _claim_jobs(self) -> None:
        """Claim up to the free slots' worth of ready jobs and start each as arq's ``start_jobs`` does.

        A slot is taken (counter and semaphore) only for a job the claim returned and the worker then
        confirmed (:func:`~smith_worker.queue.claim.confirm_claims`), so a Redis failure can never leak one
        and a claim whose reply was lost is never run. ``_next_due`` is the next deferred job's score for
        the wait (``None`` when the worker is full and did not look). The claim is told which of the
        worker's jobs ended since the last one, so it forgets their requirements. On a queue of admitted
        jobs it reads the queue's own ready jobs only when :meth:`_reads_queue` says so.
        """
        free = self._free_slots()
        read_queue = self._reads_queue()
        self._next_due = None
        if free <= 0:
            return
        in_progress_ms = int(self.in_progress_timeout_s * 1000)
        claim = await claim_jobs(
            self.pool,
            self.keys,
            self.queue_name,
            free=free,
            read_limit=self.queue_read_limit,
            in_progress_ms=in_progress_ms,
            tokens_held=self.pickup.take_tokens(),
            take_aborts=self.allow_abort_jobs,
            claimer=self._claimer.format(next(self._claims)),
            capset=self.capset,
            ended=self._ended,
            weights=self.tenant_weights,
            scan_queue=read_queue,
        )
        self._ended = []
        self._next_due = claim.next_due
        if read_queue:
            self._read_queue_at = 0.0 if claim.more_ready else self.loop.time() + self.pickup.fallback
        # jobs only end meanwhile: the slots counted in `free` are still free
        for job in await confirm_claims(self.pool, claim, in_progress_ms):
            await self.sem.acquire()  # never blocks: job_counter < max_jobs leaves the semaphore >= 2
            self.job_counter += 1
            task = self.loop.create_task(self._run_claimed(job))
            task.add_done_callback(functools.partial(self._job_done, job.job_id))
            self.tasks[job.job_id] = task

    def _reads_queue(self) -> bool:
        """Whether the next claim reads the queue's own ready jobs: always on a queue whose jobs join it (tools);
        on one whose jobs due now wait for admission (turns), once per fallback poll, when the deferred job
        the last claim saw is due, or after a Redis failure or a read that filled every free slot."""
        if not self.admitted or self.loop.time() >= self._read_queue_at:
            return True
        return self._next_due is not None and self._next_due <= now_ms()

    async def _run_claimed(self, job: ClaimedJob) -> None:
        """arq's ``run_job`` for a claimed job, its first transaction answered by the claim (in this task only)."""
        hand_over(job, self.keys, self.allow_abort_jobs)
        await self.run_job(job.job_id, job.score)

    # arq 0.28's methods that name its global abort set, on the prefix's (Keys.abort_set) instead.

    async def _cancel_aborted_jobs(self) -> None:
        """arq's abort check: cancel this worker's running jobs that have an abort request and take those
        requests (arq's ``run_job`` then ends each as aborted, not to be retried: ``aborting_tasks``). One read
        instead of arq's transaction, whose pruning removes nothing (#485): ``abort.lua`` prunes the set."""
        requested = {raw.decode() for raw in await self.pool.zrange(self.keys.abort_set, 0, -1)}
        aborted = requested & self.job_tasks.keys()
        for job_id in aborted:
            self.job_tasks[job_id].cancel()
        if aborted:
            self.aborting_tasks.update(aborted)
            await self.pool.zrem(self.keys.abort_set, *aborted)

    async def finish_job(
        self,
        job_id: str,
        finish: bool,
        result_data: bytes | None,
        result_timeout_s: float | None,
        keep_result_forever: bool,
        incr_score: int | None,
        keep_in_progress: float | None,
    ) -> None:
        """arq's ``finish_job``, the same commands in one transaction: a finished job's result is stored and its
        keys, queue entry and abort request go; a job to run again stays queued (``incr_score`` defers it)."""
        rt = RoundTrip(transaction=True)
        in_progress = Keys.arq_in_progress(job_id)
        delete = [in_progress] if keep_in_progress is None else []
        if keep_in_progress is not None:
            rt.call("pexpire", in_progress, to_ms(keep_in_progress))
        if finish:
            if result_data:
                expire = None if keep_result_forever else result_timeout_s
                rt.call("set", Keys.arq_result(job_id), result_data, px=to_ms(expire))
            delete += [Keys.arq_retry(job_id), Keys.arq_job(job_id)]
            self._leave_queue(rt, job_id)
        elif incr_score:
            rt.call("zincrby", self.queue_name, incr_score, job_id)
        if delete:
            rt.call("delete", *delete)
        await rt.run(self.pool)

    async def finish_failed_job(self, job_id: str, result_data: bytes | None) -> None:
        """arq's ``finish_failed_job`` (a job that failed before it ran: expired, aborted, out of tries), the same
        commands in one transaction: its keys, queue entry and abort request go, its result is stored."""
        rt = RoundTrip(transaction=True)
        rt.call("delete", Keys.arq_retry(job_id), Keys.arq_in_progress(job_id), Keys.arq_job(job_id))
        self._leave_queue(rt, job_id)
        if result_data is not None and (self.keep_result_forever or self.keep_result_s > 0):
            # as arq: "forever" would send PX 0, which Redis refuses (build_worker never keeps results forever)
            expire = 0 if self.keep_result_forever else self.keep_result_s
            rt.call("set", Keys.arq_result(job_id), result_data, px=to_ms(expire))
        await rt.run(self.pool)

    def _leave_queue(self, rt: RoundTrip, job_id: str) -> None:
        """Add to ``rt`` the removal of a job that ended: its abort request, then its queue entry (arq's order)."""
        rt.call("zrem", self.keys.abort_set, job_id)
        rt.call("zrem", self.queue_name, job_id)


def build_worker(app: SmithApp, queue: Queue, settings: Settings | None = None, **overrides: Any) -> SmithWorker:
    """A :class:`SmithWorker` serving ``queue`` for ``app``, in the role of that queue (:data:`ROLES`).
    ``overrides`` go to ``Worker(...)``.

    Raises :class:`~smith_client.errors.ConfigurationError` for an arq other than the one its internals
    were read from (:func:`~smith_worker.queue.arq_internals.check_arq`), for an agent's bad ``subagents``
    and for settings the role cannot run with (:meth:`~smith_worker.runtime.WorkerRole.check`: a turn worker's
    LLM settings), so the worker exits at start rather than failing every job. Logs a warning when the app
    gives the role nothing to serve.
    """
    check_arq()
    app.resolve_subagents()
    settings = settings or app.settings
    role = ROLES[queue]()
    role.check(app, settings)
    redis = settings.connect_redis()
    runtime = WorkerRuntime(app=app, role=role, settings=settings, redis=redis)
    job = role.job(settings, runtime.keys)

    async def on_startup(ctx: dict[str, Any]) -> None:
        ctx["runtime"] = runtime
        await runtime.start()

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        await runtime.stop(ctx.get("shutdown_deadline"))

    # the blocking pop's own connection: its socket timeout outlasts the longest pop
    pickup = Pickup(
        functools.partial(
            settings.connect_redis, socket_timeout=settings.redis_socket_timeout + settings.fallback_poll + POP_MARGIN
        ),
        runtime.queue_name,
        settings.fallback_poll,
        runtime.health,
        job.aborts_channel,
        capset=runtime.capability_set.digest,
    )
    options: dict[str, Any] = {
        "functions": [
            func(job.function, name=job.name, timeout=job.timeout, max_tries=job.max_tries, keep_result=job.keep_result)
        ],
        "queue_name": runtime.queue_name,
        "redis_pool": redis,
        "on_startup": on_startup,
        "on_shutdown": on_shutdown,
        "max_jobs": job.max_jobs,
        "poll_delay": settings.fallback_poll,  # arq's own use left: its cron window
        "queue_read_limit": max(MIN_QUEUE_READ_LIMIT, 4 * job.max_jobs),
        "allow_abort_jobs": job.aborts_channel is not None,
        "health_check_interval": 10,
        "job_completion_wait": job.completion_wait,
        "job_serializer": job_serializer,
        "job_deserializer": job_deserializer,
    }
    options.update(overrides)
    worker = SmithWorker(
        ctx={"runtime": runtime},
        health=runtime.health,
        pickup=pickup,
        keys=runtime.keys,
        capset=runtime.capability_set.digest,
        tenant_weights=parse_tenant_weights(settings.tenant_weights),
        admitted=job.admitted,
        **options,
    )
    # stop polling, let running jobs finish (job_completion_wait), then end run(): the drain before a restart
    runtime.stop_taking_jobs = functools.partial(worker.handle_sig_wait_for_completion, signal.SIGUSR1)
    return worker
