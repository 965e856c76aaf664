"""The agent loop of one turn (docs/architecture.md, Agent loop and stop conditions): model steps and tool rounds.

Per step: stop checks (iterations, tree iterations, tokens, deadline) →
the system prompt and the agent's memory view (:mod:`smith_worker.memory`) → LLM call (streamed by default;
tokens and tool-call events published as they arrive) → append the assistant
message → if there are no tool calls, finish → else run every call as a tool
job, concurrently, and append the tool messages in the order of
``tool_calls`` (docs/architecture.md, Tool calls), with a ``_done`` result's final message in the
same append. A re-run resumes after the last completed step.

A sub-agent call (docs/architecture.md, Sub-agents) runs here too, as a nested loop with a child
context (:mod:`smith_worker.agent.subagents`); the tree's budget (model calls and
tokens) lives in Redis under the root turn.

The turn's lifecycle around it (attempts, cancellation, terminal events) is
:mod:`smith_worker.turn.lifecycle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from smith_client import turn_record as record
from smith_client.errors import (
    ConfigurationError,
    TurnCancelledError,
)
from smith_client.events import (
    EventData,
    ReasoningData,
    TokenData,
    ToolCallCompletedData,
    ToolCallStartedData,
    tool_result_data,
)
from smith_client.jobs import ToolJob, ToolOutcome
from smith_client.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    TokenUsage,
    ToolCall,
    ToolMessage,
    message_from_json,
)
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.tenants import QuotaStatus
from smith_client.usage import AgentUsage
from smith_worker.agent.approvals import CallPlan, TurnPaused, decision_id, plan_calls
from smith_worker.agent.context import AgentContext, CancelRequested
from smith_worker.agent.event_batch import EventBatcher
from smith_worker.agent.handoffs import HandoffTools, handed_to
from smith_worker.agent.output import Accepted, Rejected, StructuredOutput, structured_output
from smith_worker.agent.overrides import for_turn
from smith_worker.agent.subagents import SubAgentTools
from smith_worker.agent.toolset import ToolRoute, Toolset, step_toolset
from smith_worker.app import AgentSpec
from smith_worker.hooks import fire
from smith_worker.llm import EncodedRequest, LlmClient
from smith_worker.llm.types import (
    LlmRequest,
    LlmResponse,
    SamplingParams,
    StreamEvent,
    StreamReasoningDelta,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
    ToolChoice,
    ToolSchema,
)
from smith_worker.memory import MemoryContext
from smith_worker.memory.fencing import StaleAttemptError
from smith_worker.ops import tracing
from smith_worker.ops.usage import queue_count
from smith_worker.skills import ConversationSkills
from smith_worker.tools.function import ToolContext, corrections_in
from smith_worker.tools.source import SUBAGENTS

logger = logging.getLogger("agent_smith.agent")


def done_message(outcomes: list[ToolOutcome]) -> AssistantMessage | None:
    """The first successful ``{"_done": true, "final_message": ...}`` result in call order.

    It ends the turn with that message (docs/architecture.md, Tool calls).
    """
    for outcome in outcomes:
        data = outcome.structured
        if not outcome.is_error and isinstance(data, dict) and data.get("_done") is True:
            return AssistantMessage(content=str(data.get("final_message", "")))
    return None


def _reply_of(response: LlmResponse, *, keep_reasoning: bool) -> AssistantMessage:
    """The message to store for a model reply: with the server's ``finish_reason``, and its
    ``reasoning_content`` when the agent keeps it (``AgentConfig.keep_reasoning``; docs/architecture.md, Events)."""
    reasoning = response.reasoning_content if keep_reasoning and response.reasoning_content else None
    return response.message.model_copy(
        update={"finish_reason": response.finish_reason or None, "reasoning_content": reasoning}
    )


@dataclass(frozen=True)
class StepReads:
    """What a step reads before its model call, in one round trip: the root turn's ``cancel`` request
    (None: none), the merged user messages ``moved`` into the history, the tree's model calls
    ``tree_calls`` (this one included) and reported ``tree_tokens``, the tokens MCP servers' ``sampled`` for
    this agent's tool calls (``Keys.tree_sampled``), the conversation's active ``skills``,
    the ``memory`` context the step's view is computed with (its first read sent with these), and the tenant's
    ``quota`` (None: not read; :mod:`smith_worker.agent.quota`)."""

    cancel: Pending[str | None]
    moved: Pending[list[bytes]]
    tree_calls: Pending[int]
    tree_tokens: Pending[int]
    sampled: Pending[TokenUsage]
    skills: Pending[list[str]]
    memory: MemoryContext
    quota: Pending[QuotaStatus] | None


def _text_or_none(reply: bytes | None) -> str | None:
    return None if reply is None else reply.decode()


def _int_or_zero(reply: bytes | None) -> int:
    return int(reply or 0)


def _usage(reply: list[bytes | None]) -> TokenUsage:
    prompt, completion, total = (int(value or 0) for value in reply)
    return TokenUsage(prompt=prompt, completion=completion, total=total)


def add_usage(*usages: TokenUsage | None) -> TokenUsage:
    """The sum of ``usages`` (None counts as nothing)."""
    found = [u for u in usages if u is not None]
    return TokenUsage(
        prompt=sum(u.prompt for u in found),
        completion=sum(u.completion for u in found),
        total=sum(u.total for u in found),
    )


def _completed_data(index: int, call: ToolCall) -> ToolCallCompletedData:
    return ToolCallCompletedData(id=call.id, name=call.name, index=index, arguments=call.arguments)


async def gather_all(coros: list[Any]) -> list[Any]:
    """Run ``coros`` concurrently and return their results in order; the first failure cancels the
    others (waiting for them to stop) and is raised as itself, not as an exception group."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(coro) for coro in coros]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


@dataclass
class _Progress:
    """How far one agent got in its turn: its model calls, the tokens they used (``usage``, ``total_tokens`` its
    total), its tool rounds, and the tokens MCP servers ``sampled`` for its tool calls (as of its last step)."""

    iterations: int
    total_tokens: int
    tool_rounds: int
    usage: TokenUsage = TokenUsage()
    sampled: TokenUsage = TokenUsage()

    def turn_usage(self) -> TokenUsage:
        """The agent's tokens in this turn: its model calls' and its tool calls' sampling."""
        return add_usage(self.usage, self.sampled)


class AgentLoop:
    """The steps of one agent in one attempt of one turn; everything it uses comes from ``ctx``
    (:class:`~smith_worker.agent.context.AgentContext`), and it never calls back into the turn lifecycle."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        self.rt = ctx.runtime
        self.job = ctx.job
        self.attempt = ctx.attempt
        self.store = ctx.store
        self.publish = ctx.publish
        self.agent_path = ctx.agent_path
        self._stream_calls: dict[int, ToolCall] = {}
        #: The last model call's stream events not published yet: they go ahead of its reply's append.
        self._unpublished: list[EventData] = []
        #: The next step's reads when they rode along with a tool round's append.
        self._next_step: StepReads | None = None
        self.skills = ConversationSkills(self.rt.app.skills, self.rt.keys, ctx.job.conversation_id)
        self.subagents = SubAgentTools(ctx, lambda child: AgentLoop(child).run(0))
        #: The agent's ``transfer_to_<agent>`` tools (docs/architecture.md, Handoffs).
        self.handoffs = HandoffTools(ctx)
        #: The tool names the turn allows (its ``tools`` override; None: all), and whether a handoff happened.
        self._allowed: frozenset[str] | None = None
        self._handed_off = False
        #: The step's toolset, built once its active skills are known (None: not built yet this step).
        self._toolset: Toolset | None = None
        #: The agent's tokens in this turn as of its last model call (:meth:`_Progress.turn_usage`).
        self._usage = TokenUsage()
        #: What the agent's memory strategy uses (:meth:`_memory_context`; set by :meth:`run`).
        self._memory: MemoryContext
        #: The agent's structured output (:mod:`smith_worker.agent.output`; set by :meth:`run`; None: none).
        self._output: StructuredOutput | None = None
        #: Per tool name, the corrections in a row it asked of the model this attempt (:meth:`_count_corrections`).
        self._corrections: dict[str, int] = {}
        #: Model calls (replies, summaries) not yet counted in the usage buckets: the next append counts them.
        self._uncounted = AgentUsage()
        #: The turn's deadline (a ``time.monotonic()`` instant; None: none), which also bounds rate-limit waits.
        self._deadline: float | None = None

    async def run(self, start: int, *, fresh: bool = False) -> AssistantMessage:
        """Run model steps from history position ``start`` (the turn's user message) until a final answer;
        a re-run resumes after the last completed step.

        ``fresh``: the caller has just appended that message, so nothing of the turn follows it yet
        and the read of completed steps (a re-run's resume point) is skipped.
        """
        progress, pending, done = await self._resume(start, fresh)
        handed = handed_to(done, self.rt.app.agents)
        self._handed_off = handed is not None
        if handed is not None:
            await self.handoffs.restore(handed)
        spec, llm = self._run_as(self.rt.app.agents[handed] if handed else self.ctx.spec, start)
        if self._output is not None:
            self._output.seen(done)  # the output retries this turn already used
        self._corrections = corrections_in(done)  # and its tools' corrections in a row (RetryWithMessage)
        deadline = None if spec.config.deadline is None else time.monotonic() + spec.config.deadline
        self._deadline = deadline
        while True:
            merged: list[bytes] | None = None  # the close, when it rode along with the reply's append
            if pending is None:
                pending, merged = await self._model_step(spec, llm, progress, deadline)
                if pending is None:
                    continue  # an answer that failed output validation: the model answers again
            message, pending = pending, None
            if not message.tool_calls:
                if await self._took_merged(message, merged):
                    continue  # a merged user message arrived: answer it in this turn
                return message
            pending = await self._run_tools(spec, progress.iterations, message.tool_calls)  # a `_done` final message
            progress.tool_rounds += 1
            target = self.handoffs.take()
            if target is not None:  # the target answers the rest of the turn (docs/architecture.md, Handoffs)
                self._handed_off = True
                spec, llm = self._run_as(target, start)

    def _run_as(self, spec: AgentSpec, start: int) -> tuple[AgentSpec, LlmClient]:
        """Run ``spec`` from here on: the agent the turn starts with, the turn's overrides applied (the root
        agent's loop only, docs/architecture.md, Per-turn overrides), or a handoff's target, as declared, whose
        name the loop's events then carry. Returns the agent as run and its model client.

        Raises :class:`ConfigurationError` for an override the worker does not know
        (:func:`~smith_worker.agent.overrides.for_turn`)."""
        overrides = None if self.ctx.position or self._handed_off else self.job.overrides
        turn = for_turn(self.rt.app, self.rt.settings, spec, overrides)
        self.ctx.spec = turn.spec
        self.ctx.agent_path[-1] = spec.name
        self._allowed, self._toolset = turn.allowed, None
        gate = self.ctx.services.rate_limits.gate(turn.llm, self.publish, lambda: self._deadline)
        llm = LlmClient(turn.llm, self.ctx.services.http, gate=gate)
        self._memory = self._memory_context(llm, start)
        self._output = structured_output(turn.spec, llm.config)
        return turn.spec, llm

    async def _resume(self, start: int, fresh: bool) -> tuple[_Progress, AssistantMessage | None, list[Message]]:
        """The counts of the steps this turn completed before (none when ``fresh``), its last model
        reply when nothing followed it yet (its tool round, or its end, is next; None: a model call is),
        and those steps' messages (where a handoff or an output retry is found)."""
        done = [] if fresh else (await self.store.read(start + 1)).messages
        replies = [m for m in done if isinstance(m, AssistantMessage)]
        pending = done[-1] if done and isinstance(done[-1], AssistantMessage) else None
        progress = _Progress(
            iterations=len(replies),
            total_tokens=sum(m.usage.total for m in replies if m.usage),
            tool_rounds=sum(1 for m in replies if m.tool_calls and m is not pending),
            usage=add_usage(*(m.usage for m in replies)),
        )
        return progress, pending, done

    async def _model_step(
        self, spec: AgentSpec, llm: LlmClient, progress: _Progress, deadline: float | None
    ) -> tuple[AssistantMessage | None, list[bytes] | None]:
        """One model step: begin it (:meth:`_begin_step`), check the stop conditions, call the model and
        append its reply. Returns the reply and, for a final answer, the user messages the close
        merged into the turn (:meth:`_append_reply`; None for a reply with tool calls). With a structured
        output (:mod:`smith_worker.agent.output`) a valid answer is returned as its final message, and an
        invalid one is appended with its errors for the model: (None, None), the model answers again."""
        tree, memory, progress.sampled = await self._begin_step(spec)
        progress.iterations += 1
        total = progress.total_tokens + progress.sampled.total
        self._check_limits(spec, progress.iterations, tree, total, deadline)
        call = self._call_model(spec, llm, memory, progress.tool_rounds)
        response = await self.rt.metrics.count_llm_request(call, spec.name, self.job.tenant)
        reply = _reply_of(response, keep_reasoning=spec.config.keep_reasoning)
        self._uncounted = self._uncounted.plus(reply.usage or TokenUsage(), requests=1)
        used = reply.usage.total if reply.usage else 0
        progress.total_tokens += used
        progress.usage = add_usage(progress.usage, reply.usage)
        self._usage = progress.turn_usage()
        judged = self._output.judge(reply) if self._output is not None else None
        if isinstance(judged, Rejected):
            await self._append_rejected(judged.messages, used)
            return None, None
        if isinstance(judged, Accepted):
            return judged.message, await self._append_reply(judged.message, used, judged.output)
        return reply, await self._append_reply(reply, used)

    async def _took_merged(self, final: AssistantMessage, merged: list[bytes] | None) -> bool:
        """After the answer ``final``: close the run (:meth:`~smith_worker.memory.fencing.AttemptWrites.queue_close`;
        unless ``merged``, its outcome, came with the answer's append already) and announce the user
        messages merged into the turn instead; True when there were some, which this turn then answers too."""
        if merged is None:
            rt = RoundTrip()
            output = self._output.output_of(final) if self._output is not None else None
            closed = self.attempt.queue_close(rt, final, output, self._usage)
            await rt.run(self.rt.redis)
            merged = closed.value
        return await self._announce_merged(merged)

    def _memory_context(self, llm: LlmClient, start: int) -> MemoryContext:
        """What the agent's memory may use at each step: the history, a summary call, events.

        See docs/architecture.md, Memory.
        """

        async def summarize(messages: list[Any]) -> str:  # a model call like any other: counted in the metrics
            agent = self.ctx.spec.name
            response = await self.rt.metrics.count_llm_request(
                llm.complete(LlmRequest(messages=messages)), agent, self.job.tenant
            )
            self._uncounted = self._uncounted.plus(response.message.usage or TokenUsage(), requests=1)
            return response.message.content

        return MemoryContext(
            store=self.store,
            turn_start=start,
            summarize=summarize,
            publish=self.publish,
            redis=self.rt.redis,
            keys=self.rt.keys,
            conversation_id=self.ctx.memory_scope,
            history_ttl=self.rt.keys.turn_ttl if self.ctx.position else self.rt.keys.history_ttl,
        )

    async def _announce_merged(self, moved: list[bytes]) -> bool:
        for raw in moved:
            await self.ctx.announce(message_from_json(raw))
        return bool(moved)

    async def _begin_step(self, spec: AgentSpec) -> tuple[tuple[int, int], MemoryContext, TokenUsage]:
        """Before a model call, in one round trip: the cancel flag, merged messages, the tree counts,
        the conversation's active skills (so an activation takes effect at the next step), and the
        memory's first read (:meth:`~smith_worker.memory.Memory.prefetch`).

        Raises :class:`CancelRequested` when the turn's state asks it to stop, :class:`QuotaExceededError` when
        the turn's tenant used up its token quota (:mod:`smith_worker.agent.quota`). Merged user messages
        (``multitask="merge"``) join the history here, so the model sees them in this call. The tree's
        model-call counter is a Redis key per root turn (``ctx.tree_counter``; docs/architecture.md, Keys),
        so sub-agents in other tasks or processes share it, as they share the root turn's cancel flag
        (``ctx.cancel_state``); a re-run after a crash keeps counting on the
        same key (the budget errs on the safe side). Returns the tree's model
        calls including this step and the tokens its earlier calls reported, the step's memory context, and the
        tokens MCP servers sampled for this agent's tool calls so far.
        After a tool round, its round trip was the tool messages' append (:meth:`_run_tools`).
        """
        reads, self._next_step = self._next_step, None
        if reads is None:
            rt = RoundTrip()
            reads = self._queue_step(spec, rt)
            await rt.run(self.rt.redis)
        if reads.cancel.value:
            raise CancelRequested(reads.cancel.value)
        self.ctx.quota.check(reads.quota)  # raises QuotaExceededError: no model call past the tenant's quota
        self.skills.take(spec, reads.skills.value)
        self._toolset = None  # a new step: its active skills may differ
        await self._announce_merged(reads.moved.value)
        return (reads.tree_calls.value, reads.tree_tokens.value), reads.memory, reads.sampled.value

    def _queue_step(self, spec: AgentSpec, rt: RoundTrip) -> StepReads:
        """Add the reads and counts of :meth:`_begin_step` to ``rt``; the memory's read comes after the
        drain, so it sees the merged messages."""
        tree = self.ctx.tree_counter
        cancel = rt.call("hget", self.ctx.cancel_state, record.CANCEL_REQUESTED, parse=_text_or_none)
        moved = self.attempt.queue_drain_inbox(rt)
        calls = rt.call("incr", tree, parse=int)
        rt.call("expire", tree, self.rt.keys.turn_ttl)
        tokens = rt.call("get", self.ctx.tree_tokens, parse=_int_or_zero)
        fields = [f"{kind}:{self.ctx.position}" for kind in ("prompt", "completion", "total")]
        sampled = rt.call("hmget", self.rt.keys.tree_sampled(self.ctx.root_turn_id), *fields, parse=_usage)
        skills = self.skills.queue_read(rt)
        memory = spec.memory.prefetch(self._memory, rt)
        return StepReads(cancel, moved, calls, tokens, sampled, skills, memory, self.ctx.quota.queue_read(rt))

    async def _append_reply(self, message: AssistantMessage, used: int, output: Any = None) -> list[bytes] | None:
        """Append a model reply and, in the same round trip, add its ``used`` tokens to the tree's
        counter (read by the next step of any agent) and, for a final answer, close the run (for the
        root agent: complete the turn; :meth:`~smith_worker.memory.fencing.AttemptWrites.queue_close`).

        Returns the user messages merged into the turn that the close moved into the
        history instead (``multitask="merge"``), or None when ``message`` has tool calls. ``output``: the
        answer's structured output, for ``turn.completed``. Raises :class:`StaleAttemptError`.
        """
        rt = RoundTrip()
        if used > 0:
            rt.call("incrby", self.ctx.tree_tokens, used)
            rt.call("expire", self.ctx.tree_tokens, self.rt.keys.turn_ttl)
        self._queue_usage(rt)
        merged = None if message.tool_calls else self.attempt.queue_close(rt, message, output, self._usage)
        preceding, self._unpublished = self._unpublished, []
        await self.ctx.append(message, preceding=preceding, rt=rt)
        return None if merged is None else merged.value

    async def _append_rejected(self, messages: list[Any], used: int) -> None:
        """Append an answer that failed output validation and the messages telling the model its errors
        (:class:`~smith_worker.agent.output.Rejected`), adding its ``used`` tokens as :meth:`_append_reply` does."""
        rt = RoundTrip()
        if used > 0:
            rt.call("incrby", self.ctx.tree_tokens, used)
            rt.call("expire", self.ctx.tree_tokens, self.rt.keys.turn_ttl)
        self._queue_usage(rt)
        preceding, self._unpublished = self._unpublished, []
        await self.ctx.append(*messages, preceding=preceding, rt=rt)

    def _queue_usage(self, rt: RoundTrip) -> None:
        """Count the agent's model calls since the last append in the deployment's usage buckets, in ``rt`` (the
        reply's append: no round trip of its own; :mod:`smith_worker.ops.usage`, docs/architecture.md, Token usage).
        Counted even when the append turns out stale: the tokens were spent."""
        counted, self._uncounted = self._uncounted, AgentUsage()
        queue_count(rt, self.rt.keys, self.ctx.spec.name, counted, tenant=self.job.tenant)

    def _check_limits(
        self, spec: AgentSpec, iterations: int, tree: tuple[int, int], total_tokens: int, deadline: float | None
    ) -> None:
        """The stop conditions, checked before each model call (docs/architecture.md, Agent loop and stop conditions).

        Each raises ``TurnCancelledError(operation=<limit name>)``. ``tree`` is
        the agent tree's (model calls, tokens), bounded by the root agent's
        ``tree_max_iterations`` / ``tree_max_total_tokens``; the
        other limits are this agent's own. ``deadline`` is a ``time.monotonic()``
        instant; it does not preempt an in-flight model call or tool round, it
        is checked between steps.
        """
        cfg, root = spec.config, self.ctx.limits
        tree_iterations, tree_tokens = tree
        if iterations > cfg.max_iterations:
            raise TurnCancelledError(f"turn exceeded max_iterations={cfg.max_iterations}", "max_iterations")
        if tree_iterations > root.tree_max_iterations:
            raise TurnCancelledError(
                f"agent tree exceeded tree_max_iterations={root.tree_max_iterations}", "tree_max_iterations"
            )
        if root.tree_max_total_tokens is not None and tree_tokens > root.tree_max_total_tokens:
            raise TurnCancelledError(
                f"agent tree used {tree_tokens} tokens, over tree_max_total_tokens={root.tree_max_total_tokens}",
                "tree_max_total_tokens",
            )
        if cfg.max_total_tokens is not None and total_tokens > cfg.max_total_tokens:
            raise TurnCancelledError(
                f"turn used {total_tokens} tokens, over max_total_tokens={cfg.max_total_tokens}", "max_total_tokens"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TurnCancelledError(f"turn exceeded its deadline of {cfg.deadline:g} s", "deadline")

    async def _call_model(
        self, spec: AgentSpec, llm: LlmClient, memory: MemoryContext, tool_rounds: int
    ) -> LlmResponse:
        """One model call over the memory's view. Only the encoded body outlives this frame's first lines:
        the parsed view is freed before the model is awaited, so a turn waiting for its model holds one
        copy of its prompt (bytes), not the parsed messages too."""
        tools = await self._tool_schemas(spec)
        prompt = self.skills.system_prompt(spec.system_prompt)
        stream = self.job.stream if self.job.stream is not None else spec.config.stream_default
        request = self._encode(
            llm,
            LlmRequest(
                messages=([SystemMessage(content=prompt)] if prompt else []) + await spec.memory.view(memory),
                tools=tools,
                sampling=self._sampling(),
                tool_choice=spec.tool_choice_for(tool_rounds) if tools else None,
            ),
            stream=stream,
            agent_choice=spec.tool_choice_for(tool_rounds),
        )
        self._stream_calls, self._unpublished = {}, []
        if stream:
            return await self._stream_model(spec, llm, request)
        response = await llm.complete(request)
        for index, call in enumerate(response.message.tool_calls):  # published with the reply's append
            if self._output is not None and self._output.hides(call.name):
                continue
            self._unpublished += [ToolCallStartedData(id=call.id, name=call.name, index=index)]
            self._unpublished += [_completed_data(index, call)]
        return response

    def _encode(self, llm: LlmClient, request: LlmRequest, *, stream: bool, agent_choice: ToolChoice) -> EncodedRequest:
        """``request`` encoded, asking for the agent's structured output if it has one
        (:mod:`smith_worker.agent.output`; ``agent_choice``: the agent's ``tool_choice`` for the step)."""
        return llm.encode(request if self._output is None else self._output.shape(request, agent_choice), stream=stream)

    def _sampling(self) -> SamplingParams | None:
        """The turn's sampling override (docs/architecture.md, Model requests).

        Raises :class:`ConfigurationError` for a malformed one.
        """
        if not self.job.sampling:
            return None
        try:
            return SamplingParams(**self.job.sampling)
        except ValidationError as exc:  # the caller's mistake, not an internal error
            raise ConfigurationError(f"invalid per-turn sampling: {exc}", setting="sampling") from exc

    async def _tool_schemas(self, spec: AgentSpec) -> list[ToolSchema]:
        """The schemas of the step's toolset (:mod:`smith_worker.agent.toolset`), discovery reported to this turn."""
        asking = ToolContext(
            call_id="",
            tool_name="",
            turn_id=self.ctx.turn_id,
            conversation_id=self.job.conversation_id,
            agent=spec.name,
            worker_id=self.rt.worker_id,
            context=self.ctx.caller.value,
            tenant=self.job.tenant,
        )
        return await self._step_toolset(spec).schemas(asking)

    def _step_toolset(self, spec: AgentSpec) -> Toolset:
        """This step's toolset: the agent's tools, its sources, its sub-agents, the active skills' tools."""
        if self._toolset is None:
            app = self.rt.app
            self._toolset = step_toolset(
                app,
                spec,
                self.skills.active or [],
                self.subagents,
                self._run_job,
                app.skills.warn_once,
                handoffs=self.handoffs,
                allowed=self._allowed,
            )
        return self._toolset

    async def _run_job(self, job: ToolJob, route: ToolRoute) -> tuple[ToolOutcome, bool]:
        """Run ``job`` on a tool worker serving ``route.requires`` and wait for its outcome."""
        return await self.ctx.services.tool_waiter.run(job, route.requires)

    async def _stream_model(self, spec: AgentSpec, llm: LlmClient, request: EncodedRequest) -> LlmResponse:
        """A streamed model call whose events are published behind the stream (:class:`EventBatcher`).
        The events not sent when it returns wait in :attr:`_unpublished` for the reply's append;
        those that arrived before a failed call are published."""
        batcher = EventBatcher(self.ctx.submit_publish, self.rt.settings.token_coalesce)
        try:
            response = await llm.complete_stream(request, lambda event: self._on_stream_event(spec, event, batcher))
            self._unpublished = await batcher.detach()
            return response
        except Exception:
            with contextlib.suppress(Exception):  # the call's own error is the one to raise
                await batcher.flush()
            raise
        finally:
            await batcher.aclose()  # a publish still in flight when the call was cancelled

    async def _on_stream_event(self, spec: AgentSpec, event: StreamEvent, batcher: EventBatcher) -> None:
        """Publish stream events as they arrive (tokens, tool-call start and completion), then fire
        ``on_stream_event``."""
        hidden = self._output.hides if self._output is not None else None  # the output tool's calls: not published
        if isinstance(event, StreamTokenDelta):
            batcher.add(TokenData(text=event.text))
        elif isinstance(event, StreamReasoningDelta):
            batcher.add(ReasoningData(text=event.text))
        elif isinstance(event, StreamToolCallStarted):
            self._stream_calls[event.index] = ToolCall(id=event.id, name=event.name)
            if hidden is None or not hidden(event.name):
                batcher.add(ToolCallStartedData(id=event.id, name=event.name, index=event.index))
        elif isinstance(event, StreamToolCallCompleted):
            started = self._stream_calls.get(event.index)
            call = ToolCall(
                id=event.id or (started.id if started else ""),
                name=event.name or (started.name if started else ""),
                arguments=event.arguments,
            )
            if hidden is None or not hidden(call.name):
                batcher.add(_completed_data(event.index, call))
        await fire("on_stream_event", event, self.rt.app.hooks, spec.hooks)

    async def _run_tools(self, spec: AgentSpec, step: int, calls: list[ToolCall]) -> AssistantMessage | None:
        """Run a step's calls; append their tool messages and, after a ``_done`` result, its final message
        in the same append, so a crash cannot fall between them (docs/architecture.md, Tool calls). Returns that
        final message, or None.

        Calls that wait for a person (:mod:`smith_worker.agent.approvals`) do not run: once the others did,
        :class:`~smith_worker.agent.approvals.TurnPaused` is raised and nothing is appended; a sub-agent call
        whose child paused makes this step pause too, its child's pending calls joined to its own. A resumed
        step ends its pause with its append (:meth:`_queue_resumed`).
        """
        await self.skills.ensure(spec, self.rt.redis)  # a re-run may resume here, before any model call
        toolset = self._step_toolset(spec)
        for call in calls:
            await fire("on_tool_call", call, self.rt.app.hooks, spec.hooks)
        routes = [toolset.route(c.name) for c in calls]
        plans = await plan_calls(self.ctx, toolset, step, calls, routes)
        await self._announce_decisions(step, plans)
        outcomes = await gather_all([self._run_planned(toolset, spec, step, i, p) for i, p in enumerate(plans)])
        children = [outcome for outcome in outcomes if isinstance(outcome, TurnPaused)]
        pending = [plan.pending for plan in plans if plan.pending is not None]
        if pending or children:
            raise TurnPaused.joined(pending, self._kept_keys(step, routes), children)
        answered = [outcome for outcome in outcomes if isinstance(outcome, ToolOutcome)]  # all of them
        messages = [
            ToolMessage(tool_call_id=call.id, name=call.name, content=outcome.content, is_error=outcome.is_error)
            for call, outcome in zip(calls, answered, strict=True)
        ]
        self._count_corrections(calls, answered)
        final = done_message(answered)
        rt = RoundTrip()
        if self.attempt.attempt > 1:  # a resumed step (or a re-run after a crash, where this changes nothing)
            self._queue_resumed(rt, step, routes, plans)
        self.handoffs.queue_record(rt)  # a transfer's event and the conversation's agent ride along
        if final is not None:
            await self.ctx.append(*messages, final, rt=rt)
        elif self.handoffs.pending:  # the next step is the target's: its memory's reads go with its own step
            await self.ctx.append(*messages, rt=rt)
        else:  # the next step follows at once: its round trip is this append's
            next_step = self._queue_step(spec, rt)
            await self.ctx.append(*messages, rt=rt)
            self._next_step = next_step
        for message in messages:
            await fire("on_tool_result", message, self.rt.app.hooks, spec.hooks)
        return final

    def _count_corrections(self, calls: list[ToolCall], outcomes: list[ToolOutcome]) -> None:
        """Count the corrections each tool of a step asked of the model
        (:class:`~smith_worker.tools.function.RetryWithMessage`): one more when a call of it asked for one
        this step, none again when its calls did not (as pydantic-ai counts a tool's retries); what the next
        calls' jobs carry as ``retry`` (docs/architecture.md, Tool calls). A resumed attempt starts from the
        stored messages' counts (:func:`~smith_worker.tools.function.corrections_in`)."""
        asked = {call.name for call, outcome in zip(calls, outcomes, strict=True) if outcome.retry_requested}
        for name in {call.name for call in calls}:
            self._corrections[name] = self._corrections.get(name, 0) + 1 if name in asked else 0

    async def _announce_decisions(self, step: int, plans: list[CallPlan]) -> None:
        """Publish the ``tool_call.decided`` event of each decided call of step ``step`` (its ``plans``) once per
        call, in one round trip, fenced by the attempt: each publish sets the call's marker
        (:meth:`~smith_client.keys.Keys.tool_call_decided_published`) in the same script, so a step planned again
        (a re-run after a crash before its append, a step that paused again) announces no decision twice
        (docs/architecture.md, Pausing for a person). Raises :class:`StaleAttemptError` when fenced off."""
        keys, turn_id, position = self.rt.keys, self.ctx.turn_id, self.ctx.position
        rt = RoundTrip()
        published = [
            self.rt.events.publish_in(
                rt,
                turn_id,
                plan.decided,
                self.agent_path,
                attempt=self.attempt.attempt,
                once_key=keys.tool_call_decided_published(turn_id, step, index, position),
                call_path=self.ctx.call_path,
            )
            for index, plan in enumerate(plans)
            if plan.decided is not None
        ]
        if not published:
            return
        await rt.run(self.rt.redis)
        if any(seq.value < 0 for seq in published):
            raise StaleAttemptError(turn_id)

    def _kept_keys(self, step: int, routes: list[ToolRoute | None]) -> list[str]:
        """The keys step ``step`` (its calls' ``routes``) needs when it resumes after a pause: each call's tool
        result, its ``tool.result`` and ``tool_call.decided`` markers, and the checkpoint of each sub-agent it
        called."""
        keys, turn_id, position = self.rt.keys, self.ctx.turn_id, self.ctx.position
        kept: list[str] = []
        for index, route in enumerate(routes):
            kept += [keys.tool_result(turn_id, step, index, position)]
            kept += [keys.tool_result_published(turn_id, step, index, position)]
            kept += [keys.tool_call_decided_published(turn_id, step, index, position)]
            if route is not None and route.source == SUBAGENTS:
                kept += self.subagents.checkpoint(step, index)
        return kept

    def _queue_resumed(self, rt: RoundTrip, step: int, routes: list[ToolRoute | None], plans: list[CallPlan]) -> None:
        """Add to ``rt`` (a resumed step's append) the end of its pause: the step's kept keys live ``turn_ttl``
        again (the pause kept them as long as itself), and its decisions go: the root agent's step, the last
        to end, deletes the turn's pending calls and decisions; a sub-agent's only those of its ``plans``
        (a sibling sub-agent may still be reading the others)."""
        keys = self.rt.keys
        decided = [decision_id(self.ctx, plan.call) for plan in plans if plan.decided is not None]
        pending, decisions = keys.turn_pending(self.ctx.root_turn_id), keys.turn_decisions(self.ctx.root_turn_id)
        if not self.ctx.position:
            rt.call("delete", pending, decisions)
        elif decided:
            rt.call("hdel", pending, *decided)
            rt.call("hdel", decisions, *decided)
        for key in self._kept_keys(step, routes):
            rt.call("expire", key, keys.turn_ttl)

    async def _run_planned(
        self, toolset: Toolset, spec: AgentSpec, step: int, index: int, plan: CallPlan
    ) -> ToolOutcome | TurnPaused | None:
        """Run one planned call (None for a pending one; the pause of a sub-agent that waits for a person);
        an outcome the plan holds is published here."""
        if plan.pending is not None:
            return None
        route = toolset.route(plan.call.name)
        job = self._tool_job(spec, step, index, plan.call, route)
        if plan.outcome is not None:
            await self._publish_result_once(job, plan.outcome)
            return plan.outcome
        try:
            outcome, produced_here = await toolset.run(job, route)
        except TurnPaused as paused:  # kept, not raised: the step's other calls go on
            return paused
        if produced_here or self.attempt.attempt > 1:  # else the tool worker published it
            await self._publish_result_once(job, outcome)
        return outcome

    async def _publish_result_once(self, job: ToolJob, outcome: ToolOutcome) -> None:
        """Publish ``tool.result`` unless the tool worker already did: a result that landed while the
        turn was between attempts (its publish was refused) goes out now, exactly once."""
        once = self.rt.keys.tool_result_published(job.turn_id, job.step, job.index, job.position)
        seq = await self.rt.events.publish(
            job.turn_id,
            tool_result_data(job, outcome),
            self.agent_path,
            attempt=self.attempt.attempt,
            once_key=once,
            call_path=job.call_path,
        )
        if seq < 0:
            raise StaleAttemptError(job.turn_id)

    def _tool_job(self, spec: AgentSpec, step: int, index: int, call: ToolCall, route: ToolRoute | None) -> ToolJob:
        """The call's job, complete: the source running it, its budget and idempotency are ``route``'s
        (None, a tool this agent does not have: no source, the agent's default budget; never enqueued)."""
        keys = self.rt.keys
        route = route or ToolRoute(source="", timeout=spec.config.default_tool_timeout)
        return ToolJob(
            turn_id=self.ctx.turn_id,
            conversation_id=self.job.conversation_id,
            agent=spec.name,
            agent_path=self.agent_path,
            call_path=self.ctx.call_path,
            position=self.ctx.position,
            step=step,
            index=index,
            call=call,
            source=route.source,
            skill=route.skill,
            timeout=route.timeout,
            idempotent=route.idempotent,
            reply_channel=keys.worker_replies_channel(self.rt.worker_id),
            result_key=keys.tool_result(self.ctx.turn_id, step, index, self.ctx.position),
            result_max_bytes=spec.config.tool_result_max_bytes,
            retry=self._corrections.get(call.name, 0),
            tool_retries=spec.config.tool_retries,
            trace=tracing.inject(),  # the calling agent's span (docs/architecture.md, Tracing)
            tenant=self.job.tenant,
        )
