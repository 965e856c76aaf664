"""One turn's lifecycle on a turn worker: take an attempt, run the loop, end it exactly once.

:class:`TurnExecution` begins an attempt (:mod:`smith_worker.turn.attempt`), parks
the turn while an earlier turn of its conversation is unfinished, runs
:class:`~smith_worker.agent.loop.AgentLoop`, and ends the turn with one terminal
event: ``turn.completed``, ``turn.failed`` (every failure, typed), or
``turn.cancelled`` (a caller's cancel or an ``interrupt``, with dangling tool
calls answered), or pauses it (``turn.paused``) when a step waits for a person: the job ends, and
the turn resumes as a new attempt once its calls are decided (docs/architecture.md, Pausing for a
person; a resume is not a crash). When the worker shuts down it hands the turn off instead;
when its lease was lost, or Redis failed, it stops without writing (the
sweeper resumes it). ``SMITH_TURN_JOB_TIMEOUT`` ends the turn with
``SmithTimeoutError`` (operation ``turn.job``). A turn never raises out of
:meth:`TurnExecution.run`, so the worker keeps serving.

The attempt limit counts only the attempts a turn can be blamed for, so bad luck never fails a turn
while a turn that kills its worker still stops (:meth:`TurnExecution._check_attempts`):

* a worker that died (or lost Redis past its lease) while it ran this turn alone: a crash, counted;
  ``SMITH_TURN_MAX_ATTEMPTS`` (3) of them fail the turn with ``TurnAttemptsExhausted``;
* a worker that died while running other turns too: a shared crash, not counted, except that
  :data:`SHARED_CRASH_FACTOR` x ``SMITH_TURN_MAX_ATTEMPTS`` crashes of either kind also fail the turn;
* a hand-off at a graceful shutdown, an attempt stopped by a failing Redis (its worker hands the turn
  back once Redis answers), and a lease that ran out while Redis was unreachable for the whole fleet (the
  owner renews it when Redis is back; sweepers wait for that, :mod:`smith_worker.turn.sweeper`): not counted.
  The turn's own job timeout fails it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable
from typing import Any, Literal, cast

import orjson
from redis.exceptions import RedisError

from smith_client import scripts
from smith_client import turn_record as record
from smith_client.errors import InternalError, SmithError, SmithTimeoutError, UnknownAgentError, error_from_exception
from smith_client.events import (
    EventData,
    MessageData,
    TurnCancelledData,
    TurnFailedData,
    TurnResumedData,
    TurnStartedData,
)
from smith_client.jobs import ToolOutcome, TurnJob
from smith_client.messages import AssistantMessage, ToolMessage
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.tenants import QuotaStatus
from smith_worker.agent.approvals import TurnPaused
from smith_worker.agent.context import AgentContext, CancelRequested, TurnServices
from smith_worker.agent.loop import AgentLoop
from smith_worker.agent.quota import TurnQuota
from smith_worker.app import AgentSpec
from smith_worker.hooks import HookContext, current_turn, fire
from smith_worker.memory.fencing import StaleAttemptError
from smith_worker.memory.history import ConversationStore, HistorySlice
from smith_worker.memory.pairing import REPAIR_SCAN, pending_repair
from smith_worker.ops import tracing
from smith_worker.ops.heap import collect_soon
from smith_worker.ops.redaction import redact_error, secrets_scope
from smith_worker.ops.redis_health import REDIS_DOWN_ERRORS
from smith_worker.runtime import WorkerRuntime
from smith_worker.tools.caller import CallerContext, parse_context
from smith_worker.tools.function import error_content
from smith_worker.tools.waiter import settle_call
from smith_worker.turn.attempt import FAIL_UNREAD, Head, TurnAttempt, park, queue_head, wake_head, woken

logger = logging.getLogger("agent_smith.agent")

#: Seconds after a worker's immediate stop before a turn still running is cancelled directly (hand_off_soon).
HANDOFF_CHECK = 0.1
#: Seconds a turn whose attempt Redis failed keeps trying to hand itself back, and the pause between tries.
OUTAGE_HAND_BACK = 60.0
OUTAGE_RETRY = 1.0
#: Crashes of any kind (alone or with other turns) that fail a turn: this times SMITH_TURN_MAX_ATTEMPTS.
#: Shared crashes are bad luck for all but one of the turns involved; this bounds the one that is not.
SHARED_CRASH_FACTOR = 3


class TurnExecution:
    """Runs one attempt of one :class:`TurnJob` on a turn worker (see the module docstring)."""

    #: The attempt's ``invoke_agent`` span (docs/architecture.md, Tracing), once it runs.
    _span: tracing.NoSpan = tracing.NO_SPAN

    def __init__(self, rt: WorkerRuntime, services: TurnServices, job: TurnJob, job_id: str = "") -> None:
        self.rt = rt
        self.services = services
        self.job = job
        #: The running agent's name (one list, shared with the attempt and the loop: a handoff renames it).
        self.agent_path = [job.agent]
        # reads check the history still ends where this attempt's writes left it (a failover may lose some)
        self.store = ConversationStore(
            rt.redis,
            rt.keys,
            job.conversation_id,
            expected_end=lambda: self.attempt.history_end,
            max_bytes=rt.settings.view_max_bytes,
        )
        self.attempt = TurnAttempt(
            rt.redis,
            rt.keys,
            job.turn_id,
            job.conversation_id,
            rt.worker_id,
            history_max=rt.settings.history_max_messages,
            job_id=job_id,
            events=rt.events,
            agent_path=self.agent_path,
            has_context=job.has_context,
        )
        #: What the agent loop gets (built once the agent is known).
        self.ctx: AgentContext | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancel_requested = False
        self._lease_lost = False
        self._started = time.monotonic()
        self._ending = False  # the attempt is handling its cancellation (no second cancel: hand_off_soon)
        self._context_record: Pending[bytes | None] | None = None
        #: The token quota of the turn's tenant (docs/tenants.md), read first with :meth:`_begin`.
        self.quota = TurnQuota(rt.keys, job.tenant)
        self._quota_read: Pending[QuotaStatus] | None = None
        #: The caller context's secrets, redacted from this process's logs while the attempt runs.
        self._secrets = contextlib.ExitStack()

    def request_cancel(self) -> None:
        """A caller asked to cancel (control message): stop the running step now, not at the next check."""
        self._cancel_requested = True
        if self._task is not None:
            self._task.cancel()

    def hand_off_soon(self) -> None:
        """The worker stops at once (SIGTERM): arq's cancel of the job hands the turn off. That cancel
        travels through arq's job wrapper and was seen lost under load (the turn read on until its
        model request timed out, then failed); if the turn is still running and not handing off after
        :data:`HANDOFF_CHECK` seconds, its own task is cancelled, which hands it off."""
        asyncio.get_running_loop().call_later(HANDOFF_CHECK, self._cancel_if_still_running)

    def _cancel_if_still_running(self) -> None:
        if self._task is not None and not self._task.done() and not self._ending:
            self._task.cancel()

    def _on_lease_lost(self) -> None:
        self._lease_lost = True
        if self._task is not None:
            self._task.cancel()

    async def _begin(self) -> tuple[str, Pending[HistorySlice], Pending[bytes | None] | None]:
        """The attempt's first round trip: ``begin.lua``'s outcome, the history's tail (a fresh attempt checks
        it for an earlier turn's dangling calls), and the conversation's current agent for a turn sent without
        ``agent=`` (docs/architecture.md, Handoffs; None otherwise); the caller context record and the tenant's
        quota ride along (docs/architecture.md, Caller context; docs/tenants.md)."""
        rt = RoundTrip()
        begun = self.attempt.queue_begin(rt)
        tail = self.store.queue_tail(rt, REPAIR_SCAN)
        if self.job.has_context:
            self._context_record = rt.call("get", self.rt.keys.turn_context(self.job.turn_id))
        self._quota_read = self.quota.queue_read(rt)
        current: Pending[bytes | None] | None = None
        if not self.job.agent_given:
            current = rt.call("get", self.rt.keys.conversation_agent(self.job.conversation_id))
        await rt.run(self.rt.redis)
        return begun.value, tail, current

    async def run(self) -> None:
        """Run the turn if this attempt gets it; end it with exactly one terminal event, or hand it off.
        The first round trip waits for the worker's admission (:data:`~smith_worker.agent.context.STARTING_AT_ONCE`)."""
        async with self.services.starting:
            outcome, tail, current = await self._begin()
        if outcome == "wait":
            await park(self.rt.redis, self.rt.keys, self.job.turn_id, self.job.conversation_id)
            return
        if outcome != "go":
            logger.info("turn %s not run here: %s", self.job.turn_id, outcome)
            return
        if current is not None:
            self._follow_conversation(current.value)
        self._task = asyncio.current_task()
        self.services.running_turns[self.job.turn_id] = self
        self.attempt.start_renewing(self._on_lease_lost)
        spec = self.rt.app.get_agent(self.job.agent)
        job_timeout = asyncio.timeout(self.rt.settings.turn_job_timeout)
        redis_failed = False
        ended = False  # without an exception
        self._span = tracing.attempt_span(self.job, self.attempt.attempt).__enter__()  # docs/architecture.md, Tracing
        try:
            async with job_timeout:
                await self._run_attempt(spec, tail.value)
            ended = True
        except TimeoutError as exc:
            if not job_timeout.expired():
                await self._fail(error_from_exception(exc), spec)
            else:  # the job's own bound ends the turn; it is never handed off and re-run
                budget = self.rt.settings.turn_job_timeout
                await self._fail(
                    SmithTimeoutError(
                        f"turn job ran out of its {budget:g} s (SMITH_TURN_JOB_TIMEOUT)",
                        operation="turn.job",
                        budget=budget,
                    ),
                    spec,
                )
        except RedisError as exc:
            # Redis is down or frozen: nothing can be written now. The attempt hands the turn back once
            # Redis answers (below); it resumes from its history.
            redis_failed = True
            logger.warning(
                "turn %s: attempt %d stopped, Redis failed (%s: %s); it resumes once Redis is back",
                self.job.turn_id,
                self.attempt.attempt,
                type(exc).__name__,
                exc,
            )
        except asyncio.CancelledError:
            await asyncio.shield(self._after_task_cancelled(spec))
        except CancelRequested as request:
            await self._cancelled(spec, request.reason)
        except TurnPaused as paused:
            await self._pause(spec, paused)
        except StaleAttemptError:
            logger.warning("turn %s: attempt %d was superseded; stopped", self.job.turn_id, self.attempt.attempt)
            await self.attempt.requeue_if_regressed()
        except Exception as exc:  # every failure ends as turn.failed, never as a crashed worker
            await self._fail(error_from_exception(exc), spec)
        finally:
            self.services.running_turns.pop(self.job.turn_id, None)
            self._secrets.close()
            await self.attempt.stop_renewing()
            if not ended:  # its traceback may hold the attempt's frames, request body included, in a cycle
                collect_soon()
            self._span.__exit__(None, None, None)
        if redis_failed:
            await self._hand_back_after_outage()

    def _follow_conversation(self, current: bytes | None) -> None:
        """A turn sent without ``agent=`` runs the conversation's current agent (``current``, set by its last
        handoff; docs/architecture.md, Handoffs) instead of the job's, when this app declares it."""
        name = current.decode() if current else None
        if not name or name == self.job.agent:
            return
        if name not in self.rt.app.agents:
            logger.warning(
                "turn %s: current agent %r is not declared here; runs %r", self.job.turn_id, name, self.job.agent
            )
            return
        self.job = self.job.model_copy(update={"agent": name})
        self.agent_path[0] = name

    async def _hand_back_after_outage(self) -> None:
        """Redis failed under the attempt: re-enqueue the turn as soon as Redis answers, as a hand-off, so
        an outage never counts against the attempt limit. Tries for :data:`OUTAGE_HAND_BACK` seconds; a
        longer outage leaves the turn to the sweeper (a crash, counted), as does a turn taken meanwhile."""
        deadline = time.monotonic() + OUTAGE_HAND_BACK
        while True:
            try:
                count = await self.attempt.requeue()
            except REDIS_DOWN_ERRORS:
                if time.monotonic() > deadline:
                    return
                await asyncio.sleep(OUTAGE_RETRY)
                continue
            if count:
                logger.info("turn %s handed back after a Redis failure (re-enqueue #%d)", self.job.turn_id, count)
            return

    async def _run_attempt(self, spec: AgentSpec | None, tail: HistorySlice) -> None:
        """Run the agent from the state and history ``tail`` read as the attempt began (:meth:`run`)."""
        if spec is None:
            raise UnknownAgentError(
                f"this worker does not serve agent {self.job.agent!r}",
                agent=self.job.agent,
                known=sorted(self.rt.app.agents),
            )
        caller = self._caller_context()
        self.ctx = AgentContext(
            self.job,
            spec,
            self.agent_path,
            self.job.turn_id,
            self.job.turn_id,
            self.attempt,
            self.store,
            self.publish,
            self.rt,
            self.services,
            caller=caller,
            quota=self.quota,
        )
        state = self.attempt.begun_state  # the cancel flag and whether the user message is in
        if state.get("cancel_requested"):
            raise CancelRequested(state["cancel_requested"])
        self._check_attempts(state)
        self.quota.check(self._quota_read)  # a tenant over its token quota: the turn fails before it starts
        opening: EventData = (
            TurnResumedData(attempt=self.attempt.attempt, reason=_resumed_by(state))
            if self.attempt.attempt > 1
            else TurnStartedData(
                conversation_id=self.job.conversation_id,
                agent=self.job.agent,
                trace_id=self._span.trace_id,
                tenant=self.job.tenant,
            )
        )
        if self.attempt.attempt > 1:  # the same trace goes on (the job's trace context, kept in the turn's state)
            self._span.event("smith.turn.resumed", {"smith.turn.attempt": self.attempt.attempt,
                                                    "smith.turn.resumed_by": _resumed_by(state)})  # fmt: skip
        first = "history_start" not in state  # the user message is not in yet (an earlier attempt may have added it)
        repair = pending_repair(tail) if first else None
        added = [*(repair.messages if repair else []), self.job.message] if first else []
        events = [opening, *(MessageData(message=m.model_dump(mode="json")) for m in added)]
        ctx = self.ctx
        # the user message, the opening event and its message events: one round trip
        rt = RoundTrip()
        start = self.attempt.queue_append_user(rt, self.job.message, repair)
        ctx.queue_publish(rt, events)
        if self.job.has_context:  # a pause's life ends
            rt.call("expire", self.rt.keys.turn_context(self.job.turn_id), self.rt.keys.turn_ttl)
        await rt.run(self.rt.redis)
        for message in added:
            await fire("on_message", message, self.rt.app.hooks, spec.hooks)
        await AgentLoop(self.ctx).run(start.value, fresh=first)  # its last round trip completes the turn
        await self._after_completion()

    def _caller_context(self) -> CallerContext:
        """The turn's caller context, validated into the app's ``context_type``; its secrets are redacted from
        the process's logs until the attempt ends and its hooks see it (docs/architecture.md, Caller context).
        Raises :class:`ContextValidationError` (the turn fails)."""
        raw = self._context_record.value if self._context_record is not None else None
        caller = parse_context(raw, self.rt.app.context_type, expected=self.job.has_context)
        self._secrets.enter_context(secrets_scope(caller.secrets))
        current_turn.set(HookContext(self.job.turn_id, self.job.conversation_id, self.job.agent, caller.value))
        return caller

    async def _pause(self, spec: AgentSpec | None, paused: TurnPaused) -> None:
        """The step waits for a person: pause the turn (:meth:`TurnAttempt.pause`), for the shortest
        ``approval_timeout`` of the agents whose calls wait, keeping the step's keys and the tree's counters;
        the job then ends, holding nothing (docs/architecture.md, Pausing for a person)."""
        keys, turn_id = self.rt.keys, self.job.turn_id
        kept = [
            *paused.kept_keys,
            keys.tree_iterations(turn_id),
            keys.tree_tokens(turn_id),
            keys.tree_sampled(turn_id),
            keys.turn_context(turn_id),
        ]
        try:
            await self.attempt.pause(paused.pending, kept, self._approval_timeout(spec, paused))
        except StaleAttemptError:
            logger.warning(
                "turn %s: attempt %d was superseded before it paused", self.job.turn_id, self.attempt.attempt
            )
            return
        logger.info("turn %s paused: %d call(s) wait for a person (%s)", self.job.turn_id, len(paused.pending), paused)

    def _approval_timeout(self, root: AgentSpec | None, paused: TurnPaused) -> float | None:
        """Seconds the pending calls of ``paused`` wait: the shortest ``approval_timeout`` of the agents that
        made them (the ``root`` agent's for its own calls); None when each waits forever."""
        agents = self.rt.app.agents
        specs = [agents.get(item.agent_path[-1]) if item.agent_path else root for item in paused.pending]
        timeouts = [spec.config.approval_timeout for spec in specs if spec is not None]
        finite = [timeout for timeout in timeouts if timeout is not None]
        return min(finite) if finite else None

    def _check_attempts(self, state: dict[str, str]) -> None:
        """Refuse a run after ``SMITH_TURN_MAX_ATTEMPTS`` crashes of a worker running this turn alone, or
        :data:`SHARED_CRASH_FACTOR` times that many crashes in all (see the module docstring).
        Raises :class:`InternalError` (``exception_type`` ``TurnAttemptsExhausted``)."""
        limit = self.rt.settings.turn_max_attempts
        alone = int(state.get(record.CRASHES) or 0)
        shared = int(state.get(record.SHARED_CRASHES) or 0)
        if alone >= limit or alone + shared >= SHARED_CRASH_FACTOR * limit:
            raise InternalError(
                f"turn's worker died under it {alone} times while running it alone and {shared} times with "
                f"other turns (limit SMITH_TURN_MAX_ATTEMPTS={limit} alone, {SHARED_CRASH_FACTOR * limit} in all): "
                "not started again",
                exception_type="TurnAttemptsExhausted",
            )

    async def _after_task_cancelled(self, spec: AgentSpec | None) -> None:
        """Why was the task cancelled? A caller's cancel, a lost lease, or the worker shutting down."""
        self._ending = True
        if self.attempt.completed is not None:  # cancelled after its completion (in an on_message hook)
            await self._after_completion()
            return
        if self._lease_lost:
            return  # another attempt owns the turn now; this one must not write
        if self._cancel_requested:
            reason = (await self.attempt.state()).get(record.CANCEL_REQUESTED) or "cancel"
            await self._cancelled(spec, reason)
            return
        count = await self.attempt.requeue()  # worker shutdown: hand the turn off, it resumes elsewhere
        self._span.event("smith.turn.handed_off", {"smith.turn.requeues": count})
        logger.info("turn %s handed off at shutdown (re-enqueue #%d)", self.job.turn_id, count)

    async def _cancelled(self, spec: AgentSpec | None, reason: str) -> None:
        """End the turn as cancelled: keep its completed messages, answer its dangling tool calls."""
        self._span.event("smith.turn.cancelled", {"smith.cancel.reason": reason})
        try:
            await self._repair_dangling_calls(spec, "was cancelled")
            await self._finish(record.CANCELLED, record.CANCEL_REQUESTED, reason, TurnCancelledData(reason=reason))
        except StaleAttemptError:
            pass

    async def _repair_dangling_calls(self, spec: AgentSpec | None, ending: str) -> None:
        """Give every tool call of the last assistant message a tool message (docs/architecture.md, Tool-call pairing).

        ``ending`` ("was cancelled" or "failed") says why, in the error content of calls without a result.
        """
        messages = await self._turn_messages()
        last = messages[-1] if messages else None
        if not isinstance(last, AssistantMessage) or not last.tool_calls:
            return
        step = sum(isinstance(m, AssistantMessage) for m in messages)
        outcomes = [await self._settle_call(step, index, ending) for index in range(len(last.tool_calls))]
        repaired = [
            ToolMessage(tool_call_id=call.id, name=call.name, content=o.content, is_error=o.is_error)
            for call, o in zip(last.tool_calls, outcomes, strict=True)
        ]
        if self.ctx is not None:
            await self.ctx.append(*repaired)
        else:
            await self.attempt.append(*repaired)

    async def _settle_call(self, step: int, index: int, ending: str) -> ToolOutcome:
        """One outcome for a call of a cancelled or failed turn: its real result, or (claimed first, like
        a timeout) an error saying the turn ended; then its job is stopped. A hand-off never comes here:
        it re-attaches."""
        keys, turn_id = self.rt.keys, self.job.turn_id
        started = await self.rt.redis.exists(keys.tool_started(turn_id, step, index))
        reason = (
            f"the turn {ending} while this tool call was running; it was stopped and may have partly run"
            if started
            else f"the turn {ending} before this tool call started"
        )
        ended = ToolOutcome(content=error_content(reason), is_error=True)
        return await settle_call(
            self.rt.redis, keys, keys.tool_job_id(turn_id, step, index), keys.tool_result(turn_id, step, index), ended
        )

    async def _fail(self, error: SmithError, spec: AgentSpec | None) -> None:
        """End the turn as failed: the error (secrets redacted) in its state and event, dangling calls answered."""
        error = redact_error(error)
        logger.error("turn %s failed: %r", self.job.turn_id, error)
        self._span.error(error)
        hook_sets = [self.rt.app.hooks] + ([spec.hooks] if spec else [])
        await fire("on_error", error, *hook_sets)
        try:
            await self._repair_dangling_calls(spec, "failed")
        except StaleAttemptError:
            return
        except Exception:  # the failure itself must still be recorded
            logger.warning("turn %s: answering its dangling tool calls failed", self.job.turn_id, exc_info=True)
        try:
            await self._finish(
                record.FAILED,
                record.ERROR,
                orjson.dumps(error.to_payload()).decode(),
                TurnFailedData.model_validate({"error": error.to_payload()}),
            )
        except StaleAttemptError:
            pass

    async def publish(self, data: EventData) -> int:
        """Publish an event of this turn, fenced by the attempt. Raises :class:`StaleAttemptError`."""
        seq = await self.rt.events.publish(self.job.turn_id, data, self.agent_path, attempt=self.attempt.attempt)
        if seq < 0:
            raise StaleAttemptError(self.job.turn_id)
        return seq

    async def _finish(self, status: str, field: str, value: str, data: EventData) -> None:
        """The terminal event and the final state, in one transaction, fenced by the attempt."""

        rt = RoundTrip(transaction=True)
        seq = self.rt.events.publish_in(rt, self.job.turn_id, data, self.agent_path, self.attempt.attempt)
        finished = self.attempt.queue_finish(rt, status, field, value)
        head = queue_head(rt, self.rt.keys, self.job.conversation_id)  # the conversation's next turn may run now
        await rt.run(self.rt.redis)
        if seq.value < 0 or not finished.value:
            raise StaleAttemptError(self.job.turn_id)
        await self._ended(status, head.value)

    async def _after_completion(self) -> None:
        """The turn completed in the agent loop's last round trip (:meth:`TurnAttempt.queue_close`)."""
        completed = self.attempt.completed
        if completed is None:  # the loop returns only once its close completed the turn
            raise InternalError("the agent loop returned before the turn completed")
        await self._ended(record.COMPLETED, completed.head)

    async def _ended(self, status: str, head: Head | None) -> None:
        """After the terminal event: count the turn and wake its conversation's next turn (``head``)."""
        self.rt.metrics.record_turn(self.job.agent, status, time.monotonic() - self._started, self.job.tenant)
        await woken(self.rt.redis, self.rt.keys, head)

    async def _turn_messages(self) -> list[Any]:
        """This turn's messages: the history from its user message on."""
        start = (await self.attempt.state()).get(record.HISTORY_START)
        return (await self.store.read(int(start))).messages if start is not None else []


def _resumed_by(state: dict[str, str]) -> Literal["restart", "decision"]:
    """Why an attempt after the first starts: the state's ``resumed_by`` as it began (turn_record.RESUMED_BY)."""
    return "decision" if state.get(record.RESUMED_BY) == "decision" else "restart"


async def fail_unreadable_turn(rt: WorkerRuntime, turn_id: str, error: SmithError) -> bool:
    """Fail a turn whose payload this worker cannot validate (e.g. sent by a newer client), at once.

    In one transaction, unless the turn already ended: ``turn.failed`` is
    published, the state becomes ``failed`` with ``error``, and the turn leaves
    its conversation's queue, whose next turn is then woken, so the
    conversation is not blocked. Returns False when the turn had ended (or
    does not exist).
    """
    keys, redis = rt.keys, rt.redis
    state_key = keys.turn_state(turn_id)
    await scripts.load_all(redis)  # a rare path: a NOSCRIPT inside the transaction would apply it in part
    async with redis.pipeline(transaction=True) as pipe:
        await pipe.watch(state_key)
        read = pipe.hmget(state_key, [record.STATUS, record.CONVERSATION_ID])
        status, conversation = await cast("Awaitable[list[bytes | None]]", read)
        if status is None or record.is_terminal(status):
            return False
        conversation_id = conversation.decode() if conversation else ""
        pipe.multi()
        fail = RoundTrip(transaction=True)
        rt.events.publish_in(fail, turn_id, TurnFailedData.model_validate({"error": error.to_payload()}))
        script_keys = [
            state_key,
            keys.running,
            keys.conversation_turns(conversation_id),
            keys.conversation_statuses(conversation_id),
        ]
        fail.script(FAIL_UNREAD, script_keys, [turn_id, orjson.dumps(error.to_payload()).decode(), keys.turn_ttl])
        await fail.run_on(pipe)
    logger.error("turn %s failed: %r", turn_id, error)
    if conversation_id:
        await wake_head(redis, keys, conversation_id)
    return True
