"""The agent loop of one turn (seed §15.2): model steps and tool rounds.

Per step: stop checks (iterations, tree iterations, tokens, deadline) →
the system prompt and the agent's memory view (:mod:`smith_worker.memory`) → LLM call (streamed by default;
tokens and tool-call events published as they arrive) → append the assistant
message → if there are no tool calls, finish → else run every call as a tool
job, concurrently, and append the tool messages in the order of
``tool_calls`` (seed §10.4), with a ``_done`` result's final message in the
same append. A re-run resumes after the last completed step.

The turn's lifecycle around it (attempts, cancellation, terminal events) is
:mod:`smith_worker.turn`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from smith_client.errors import (
    ConfigurationError,
    TurnCancelledError,
)
from smith_client.eventlog import DEFAULT_TURN_TTL
from smith_client.events import (
    MESSAGE,
    TOKEN,
    TOOL_CALL_COMPLETED,
    TOOL_CALL_STARTED,
    TOOL_RESULT,
)
from smith_client.jobs import ToolJob, ToolOutcome, TurnJob
from smith_client.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, message_from_json
from smith_worker.app import AgentSpec
from smith_worker.history import ConversationStore
from smith_worker.hooks import fire
from smith_worker.memory import MemoryContext
from smith_worker.turn_state import StaleAttemptError, TurnAttempt
from smith_worker.llm import LlmClient
from smith_worker.llm.types import (
    LlmRequest,
    LlmResponse,
    SamplingParams,
    StreamEvent,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
    ToolSchema,
)
from smith_worker.runtime import WorkerRuntime
from smith_worker.skills import ConversationSkills
from smith_worker.tool_runner import tool_result_event
from smith_worker.tools import ToolContext, ToolRoute, error_content

logger = logging.getLogger("agent_smith.agent")


def done_message(outcomes: list[ToolOutcome]) -> AssistantMessage | None:
    """The first successful ``{"_done": true, "final_message": ...}`` result in call order (seed §15.3)."""
    for outcome in outcomes:
        data = outcome.structured
        if not outcome.is_error and isinstance(data, dict) and data.get("_done") is True:
            return AssistantMessage(content=str(data.get("final_message", "")))
    return None


class CancelRequested(Exception):
    """The turn's state asks it to stop (found between steps); ``reason`` is cancel or interrupt."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AgentLoop:
    """The steps of one attempt of one turn. ``publish`` (fenced events) comes from its
    :class:`~smith_worker.turn.TurnRunner`."""

    def __init__(
        self,
        rt: WorkerRuntime,
        job: TurnJob,
        attempt: TurnAttempt,
        store: ConversationStore,
        publish: Callable[[str, dict[str, Any]], Awaitable[int]],
    ) -> None:
        self.rt = rt
        self.job = job
        self.attempt = attempt
        self.store = store
        self.publish = publish
        self.agent_path = [job.agent]
        self._stream_calls: dict[int, ToolCall] = {}
        self.skills = ConversationSkills(rt.app.skills, rt.app.sources, rt.keys, job.conversation_id)

    async def run(self, spec: AgentSpec, start: int) -> AssistantMessage:
        """Run model steps from history position ``start`` (the turn's user message) until a final answer."""
        return await self._loop(spec, start)

    async def _loop(self, spec: AgentSpec, start: int) -> AssistantMessage:
        """Run model steps until a final answer; a re-run resumes after the last completed step."""
        cfg = spec.config
        llm = LlmClient(self.rt.settings.llm_config(spec.llm), self.rt.http)
        memory = self._memory_context(llm, start)
        deadline = None if cfg.deadline is None else time.monotonic() + cfg.deadline
        done = (await self.store.read(start + 1)).messages
        replies = [m for m in done if isinstance(m, AssistantMessage)]
        pending = done[-1] if done and isinstance(done[-1], AssistantMessage) else None
        iterations = len(replies)
        total_tokens = sum(m.usage.total for m in replies if m.usage)
        tool_rounds = sum(1 for m in replies if m.tool_calls and m is not pending)
        while True:
            if pending is None:
                tree_iterations = await self._begin_step(spec)
                iterations += 1
                self._check_limits(spec, iterations, tree_iterations, total_tokens, deadline)
                pending = (await self.rt.metrics.count_llm_request(
                    self._call_model(spec, llm, memory, tool_rounds))).message
                total_tokens += pending.usage.total if pending.usage else 0
                await self.append(spec, pending)
            message, pending = pending, None
            if not message.tool_calls:
                if await self._drain_inbox(spec, closing=True):
                    continue  # a merged user message arrived: answer it in this turn
                return message
            pending = await self._run_tools(spec, iterations, message.tool_calls)  # a `_done` final message
            tool_rounds += 1

    def _memory_context(self, llm: LlmClient, start: int) -> MemoryContext:
        """What the agent's memory may use at each step (seed §13.1): the history, a summary call, events."""

        async def summarize(messages: list[Any]) -> str:  # a model call like any other: counted in the metrics
            response = await self.rt.metrics.count_llm_request(llm.complete(LlmRequest(messages=messages)))
            return response.message.content

        return MemoryContext(store=self.store, turn_start=start, summarize=summarize, publish=self.publish,
                             redis=self.rt.redis, keys=self.rt.keys, conversation_id=self.job.conversation_id,
                             history_ttl=self.attempt.history_ttl)

    async def _drain_inbox(self, spec: AgentSpec, closing: bool) -> bool:
        """Append user messages merged into this turn (``multitask="merge"``); True if there were any."""
        return await self._announce_merged(spec, await self.attempt.drain_inbox(closing))

    async def _announce_merged(self, spec: AgentSpec, moved: list[bytes]) -> bool:
        for raw in moved:
            await self.announce(spec, message_from_json(raw))
        return bool(moved)

    async def _begin_step(self, spec: AgentSpec) -> int:
        """Before a model call, in one round trip: the cancel flag, merged messages, the tree count,
        the conversation's active skills (so an activation takes effect at the next step).

        Raises :class:`CancelRequested` when the turn's state asks it to stop.
        Merged user messages (``multitask="merge"``) join the history here, so
        the model sees them in this call. The tree counter (seed §14.2
        ``tree_state->iterations += 1``) is a Redis key per root turn
        (DESIGN.md §2), so sub-agents in other tasks or processes can share it;
        until they exist the root turn is the whole tree, and a re-run after a
        crash keeps counting on the same key (the budget errs on the safe
        side). Returns the tree's count including this step.
        """
        tree = self.rt.keys.tree_iterations(self.job.turn_id)
        async with self.rt.redis.pipeline(transaction=False) as pipe:
            pipe.hget(self.rt.keys.turn_state(self.job.turn_id), "cancel_requested")
            pipe.eval(*self.attempt.drain_inbox_args(closing=False))
            pipe.incr(tree)
            pipe.expire(tree, DEFAULT_TURN_TTL)
            self.skills.queue_read(pipe)
            cancel, moved, count, _, *skills = await pipe.execute()
        if cancel:
            raise CancelRequested(cancel.decode())
        self.skills.take(spec, skills)
        await self._announce_merged(spec, self.attempt.drained(moved))
        return int(count)

    def _check_limits(
        self, spec: AgentSpec, iterations: int, tree_iterations: int, total_tokens: int, deadline: float | None
    ) -> None:
        """Stop conditions of seed §15.3, checked before each model call (§15.2 step 4b).

        Each ends the turn with ``TurnCancelledError(operation=<limit name>)``.
        ``deadline`` is a ``time.monotonic()`` instant; it does not preempt an
        in-flight model call or tool round, it is checked between steps.
        """
        cfg = spec.config
        if iterations > cfg.max_iterations:
            raise TurnCancelledError(f"turn exceeded max_iterations={cfg.max_iterations}", "max_iterations")
        if tree_iterations > cfg.tree_max_iterations:
            raise TurnCancelledError(
                f"agent tree exceeded tree_max_iterations={cfg.tree_max_iterations}", "tree_max_iterations"
            )
        if cfg.max_total_tokens is not None and total_tokens > cfg.max_total_tokens:
            raise TurnCancelledError(
                f"turn used {total_tokens} tokens, over max_total_tokens={cfg.max_total_tokens}", "max_total_tokens"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TurnCancelledError(f"turn exceeded its deadline of {cfg.deadline:g} s", "deadline")

    async def _call_model(self, spec: AgentSpec, llm: LlmClient, memory: MemoryContext,
                          tool_rounds: int) -> LlmResponse:
        tools = await self._tool_schemas(spec)
        prompt = self.skills.system_prompt(spec.system_prompt)
        request = LlmRequest(
            messages=([SystemMessage(content=prompt)] if prompt else []) + await spec.memory.view(memory),
            tools=tools,
            sampling=self._sampling(),
            tool_choice=spec.tool_choice_for(tool_rounds) if tools else None,
        )
        stream = self.job.stream if self.job.stream is not None else spec.config.stream_default
        self._stream_calls = {}
        if stream:
            return await llm.complete_stream(request, lambda ev: self._on_stream_event(spec, ev))
        response = await llm.complete(request)
        for index, call in enumerate(response.message.tool_calls):
            await self.publish(TOOL_CALL_STARTED, {"id": call.id, "name": call.name, "index": index})
            await self.publish(TOOL_CALL_COMPLETED, self._call_data(index, call))
        return response

    def _sampling(self) -> SamplingParams | None:
        """The turn's sampling override (seed §15.1 ``AgentRequest.sampling``); a malformed one is a ConfigurationError."""
        if not self.job.sampling:
            return None
        try:
            return SamplingParams(**self.job.sampling)
        except ValidationError as exc:  # the caller's mistake, not an internal error
            raise ConfigurationError(f"invalid per-turn sampling: {exc}", setting="sampling") from exc

    async def _tool_schemas(self, spec: AgentSpec) -> list[ToolSchema]:
        """Native tools of the agent, then each of its sources' tools, in declaration order, then
        the tools of the active skills (seed §12.3)."""
        schemas = self.rt.app.tools.schemas(spec.tools)
        asking = ToolContext(call_id="", tool_name="", turn_id=self.job.turn_id,
                             conversation_id=self.job.conversation_id, agent=spec.name, worker_id=self.rt.worker_id)
        for name in spec.sources:
            schemas += await self.rt.app.sources[name].schemas(self.rt, asking)
        return await self.skills.tools(schemas, self.rt, asking)

    async def _on_stream_event(self, spec: AgentSpec, event: StreamEvent) -> None:
        """Publish stream events as they arrive (tokens, tool-call start and completion)."""
        if isinstance(event, StreamTokenDelta):
            await self.publish(TOKEN, {"text": event.text})
        elif isinstance(event, StreamToolCallStarted):
            self._stream_calls[event.index] = ToolCall(id=event.id, name=event.name)
            await self.publish(TOOL_CALL_STARTED, {"id": event.id, "name": event.name, "index": event.index})
        elif isinstance(event, StreamToolCallCompleted):
            started = self._stream_calls.get(event.index)
            call = ToolCall(
                id=event.id or (started.id if started else ""),
                name=event.name or (started.name if started else ""),
                arguments=event.arguments,
            )
            await self.publish(TOOL_CALL_COMPLETED, self._call_data(event.index, call))
        await fire("on_stream_event", event, self.rt.app.hooks, spec.hooks)

    @staticmethod
    def _call_data(index: int, call: ToolCall) -> dict[str, Any]:
        return {"id": call.id, "name": call.name, "index": index, "arguments": call.arguments}

    async def append(self, spec: AgentSpec, *messages: Any) -> None:
        """Append to the history (fenced), then announce each message."""
        await self.attempt.append(*messages)
        for message in messages:
            await self.announce(spec, message)

    async def announce(self, spec: AgentSpec, message: Any) -> None:
        """Publish a ``message`` event and fire ``on_message`` for a message now in the history."""
        await self.publish(MESSAGE, {"message": message.model_dump(mode="json")})
        await fire("on_message", message, self.rt.app.hooks, spec.hooks)

    async def _run_tools(self, spec: AgentSpec, step: int, calls: list[ToolCall]) -> AssistantMessage | None:
        """Run a step's calls; append their tool messages and, after a ``_done`` result, its final message
        in the same append, so a crash cannot fall between them (issue 13 design rule 4). Returns that
        final message, or None."""
        await self.skills.ensure(spec, self.rt.redis)  # a re-run may resume here, before any model call
        for call in calls:
            await fire("on_tool_call", call, self.rt.app.hooks, spec.hooks)
        outcomes = await asyncio.gather(*(self._run_tool(spec, step, i, c) for i, c in enumerate(calls)))
        messages = [
            ToolMessage(tool_call_id=call.id, name=call.name, content=outcome.content, is_error=outcome.is_error)
            for call, outcome in zip(calls, outcomes)
        ]
        final = done_message(list(outcomes))
        await self.append(spec, *messages, *([final] if final is not None else []))
        for message in messages:
            await fire("on_tool_result", message, self.rt.app.hooks, spec.hooks)
        return final

    async def _run_tool(self, spec: AgentSpec, step: int, index: int, call: ToolCall) -> ToolOutcome:
        job = self._tool_job(spec, step, index, call)
        route = self._route(spec, call.name)
        if route is None:
            outcome, produced_here = ToolOutcome(content=error_content(f"unknown tool: {call.name}"), is_error=True), True
        else:
            job.timeout, job.idempotent, job.skill = route.timeout, route.idempotent, route.skill
            assert self.rt.tool_waiter is not None
            outcome, produced_here = await self.rt.tool_waiter.run(job)
        if produced_here or self.attempt.attempt > 1:  # else the tool worker published it
            await self._publish_result_once(job, outcome)
        return outcome

    async def _publish_result_once(self, job: ToolJob, outcome: ToolOutcome) -> None:
        """Publish ``tool.result`` unless the tool worker already did: a result that landed while the
        turn was between attempts (its publish was refused) goes out now, exactly once."""
        once = self.rt.keys.tool_result_published(job.turn_id, job.step, job.index)
        seq = await self.rt.events.publish(job.turn_id, TOOL_RESULT, tool_result_event(job, outcome),
                                           self.agent_path, attempt=self.attempt.attempt, once_key=once)
        if seq < 0:
            raise StaleAttemptError(job.turn_id)

    def _route(self, spec: AgentSpec, tool_name: str) -> ToolRoute | None:
        """How a call of ``tool_name`` runs this step, or None when this agent may not call it.

        An active skill's tool shadows the agent's own of the same name (seed §12.3: last registered wins).
        """
        route = self.skills.route(spec, tool_name)
        if route is not None:
            return route
        tool = self.rt.app.tools.find(tool_name) if tool_name in spec.tools else None
        if tool is not None:
            return ToolRoute(tool.timeout, tool.idempotent)
        source = self.rt.app.source_for(tool_name, spec.sources)
        return ToolRoute(source.timeout_for(tool_name)) if source is not None else None

    def _tool_job(self, spec: AgentSpec, step: int, index: int, call: ToolCall) -> ToolJob:
        keys = self.rt.keys
        return ToolJob(
            turn_id=self.job.turn_id,
            conversation_id=self.job.conversation_id,
            agent=spec.name,
            agent_path=self.agent_path,
            step=step,
            index=index,
            call=call,
            timeout=spec.config.default_tool_timeout,
            reply_channel=keys.worker_replies_channel(self.rt.worker_id),
            result_key=keys.tool_result(self.job.turn_id, step, index),
            result_max_bytes=spec.config.tool_result_max_bytes,
        )

