"""The agent loop of one turn (seed §15.2), run by the ``run_turn`` job.

Per step: stop checks (iterations, tokens, deadline) → memory snapshot with
the system prompt → LLM call (streamed by default; tokens and tool-call
events published as they arrive) → append the assistant message → if there
are no tool calls, finish → else run every call as a tool job, concurrently,
and append the tool messages in the order of ``tool_calls`` (seed §10.4).

A turn never raises out of :meth:`TurnRunner.run`: a failure becomes a
``turn.failed`` event with the typed error, and the worker keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from smith_client.errors import SmithError, TurnCancelledError, UnknownAgentError, error_from_exception
from smith_client.eventlog import DEFAULT_TURN_TTL
from smith_client.events import (
    MESSAGE,
    TOKEN,
    TOOL_CALL_COMPLETED,
    TOOL_CALL_STARTED,
    TOOL_RESULT,
    TURN_COMPLETED,
    TURN_FAILED,
    TURN_STARTED,
)
from smith_client.jobs import ToolJob, ToolOutcome, TurnJob
from smith_client.messages import AssistantMessage, ToolCall, ToolMessage
from smith_worker.app import AgentSpec
from smith_worker.history import ConversationStore
from smith_worker.hooks import fire
from smith_worker.lease import ConversationLease
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
from smith_worker.tool_runner import tool_result_event
from smith_worker.tools import error_content

logger = logging.getLogger("agent_smith.agent")


def done_message(outcomes: list[ToolOutcome]) -> AssistantMessage | None:
    """The first successful ``{"_done": true, "final_message": ...}`` result in call order (seed §15.3)."""
    for outcome in outcomes:
        data = outcome.structured
        if not outcome.is_error and isinstance(data, dict) and data.get("_done") is True:
            return AssistantMessage(content=str(data.get("final_message", "")))
    return None


class TurnRunner:
    """Runs one :class:`TurnJob` on a turn worker."""

    def __init__(self, rt: WorkerRuntime, job: TurnJob) -> None:
        self.rt = rt
        self.job = job
        self.store = ConversationStore(rt.redis, rt.keys, job.conversation_id)
        self.agent_path = [job.agent]
        self._stream_calls: dict[int, ToolCall] = {}

    async def run(self) -> None:
        """Run the turn under the conversation's lease; publish its terminal event."""
        spec = self.rt.app.get_agent(self.job.agent)
        lease = ConversationLease(
            self.rt.redis, self.rt.keys.conversation_lease(self.job.conversation_id), self.job.turn_id
        )
        try:
            async with lease:
                await self._set_state("running")
                await self.publish(TURN_STARTED, {"conversation_id": self.job.conversation_id, "agent": self.job.agent})
                if spec is None:
                    raise UnknownAgentError(f"this worker does not serve agent {self.job.agent!r}", agent=self.job.agent,
                                            known=sorted(self.rt.app.agents))
                final = await self._loop(spec)
                await self._set_state("completed", result=final.model_dump_json())
                await self.publish(TURN_COMPLETED, {"message": final.model_dump(mode="json")})
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure ends as turn.failed, never as a crashed worker
            await self._fail(error_from_exception(exc), spec)

    async def _fail(self, error: SmithError, spec: AgentSpec | None) -> None:
        logger.error("turn %s failed: %r", self.job.turn_id, error)
        hook_sets = [self.rt.app.hooks] + ([spec.hooks] if spec else [])
        await fire("on_error", error, *hook_sets)
        await self._set_state("failed", error=error.to_payload())
        await self.publish(TURN_FAILED, {"error": error.to_payload()})

    async def publish(self, type: str, data: dict[str, Any]) -> int:
        return await self.rt.events.publish(self.job.turn_id, type, data, self.agent_path)

    async def _set_state(self, status: str, **fields: Any) -> None:
        key = self.rt.keys.turn_state(self.job.turn_id)
        mapping = {"status": status, "conversation_id": self.job.conversation_id, "agent": self.job.agent,
                   "updated_at": time.time()}
        mapping.update({k: v if isinstance(v, str) else str(v) for k, v in fields.items()})
        async with self.rt.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=mapping)
            pipe.expire(key, DEFAULT_TURN_TTL)
            await pipe.execute()

    # ---- the loop -------------------------------------------------------

    async def _loop(self, spec: AgentSpec) -> AssistantMessage:
        cfg = spec.config
        llm = LlmClient(self.rt.settings.llm_config(spec.llm), self.rt.http)
        deadline = None if cfg.deadline is None else time.monotonic() + cfg.deadline
        await self._append(spec, self.job.message)
        iterations = total_tokens = tool_rounds = 0
        while True:
            iterations += 1
            self._check_limits(spec, iterations, total_tokens, deadline)
            response = await self._call_model(spec, llm, tool_rounds)
            message = response.message
            if message.usage is not None:
                total_tokens += message.usage.total
            await self._append(spec, message)
            if not message.tool_calls:
                return message
            outcomes = await self._run_tools(spec, iterations, message.tool_calls)
            final = done_message(outcomes)
            if final is not None:
                return final
            tool_rounds += 1

    def _check_limits(self, spec: AgentSpec, iterations: int, total_tokens: int, deadline: float | None) -> None:
        """Stop conditions of seed §15.3; each ends the turn with ``TurnCancelledError(operation=<limit>)``."""
        cfg = spec.config
        if iterations > cfg.max_iterations:
            raise TurnCancelledError(f"turn exceeded max_iterations={cfg.max_iterations}", "max_iterations")
        if cfg.max_total_tokens is not None and total_tokens > cfg.max_total_tokens:
            raise TurnCancelledError(
                f"turn used {total_tokens} tokens, over max_total_tokens={cfg.max_total_tokens}", "max_total_tokens"
            )
        if deadline is not None and time.monotonic() > deadline:
            raise TurnCancelledError(f"turn exceeded its deadline of {cfg.deadline:g} s", "deadline")

    async def _call_model(self, spec: AgentSpec, llm: LlmClient, tool_rounds: int) -> LlmResponse:
        tools = await self._tool_schemas(spec)
        request = LlmRequest(
            messages=await self.store.snapshot(spec.system_prompt),
            tools=tools,
            sampling=SamplingParams(**self.job.sampling) if self.job.sampling else None,
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

    async def _tool_schemas(self, spec: AgentSpec) -> list[ToolSchema]:
        """Native tools of the agent, then each of its sources' tools, in declaration order."""
        schemas = self.rt.app.tools.schemas(spec.tools)
        for name in spec.sources:
            schemas += await self.rt.app.sources[name].schemas(self.rt)
        return schemas

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

    async def _append(self, spec: AgentSpec, *messages: Any) -> None:
        """Append to the history, publish a ``message`` event and fire ``on_message`` for each."""
        await self.store.append(*messages)
        for message in messages:
            await self.publish(MESSAGE, {"message": message.model_dump(mode="json")})
            await fire("on_message", message, self.rt.app.hooks, spec.hooks)

    # ---- tools ------------------------------------------------------------

    async def _run_tools(self, spec: AgentSpec, step: int, calls: list[ToolCall]) -> list[ToolOutcome]:
        for call in calls:
            await fire("on_tool_call", call, self.rt.app.hooks, spec.hooks)
        outcomes = await asyncio.gather(*(self._run_tool(spec, step, i, c) for i, c in enumerate(calls)))
        messages = [
            ToolMessage(tool_call_id=call.id, name=call.name, content=outcome.content, is_error=outcome.is_error)
            for call, outcome in zip(calls, outcomes)
        ]
        await self._append(spec, *messages)
        for message in messages:
            await fire("on_tool_result", message, self.rt.app.hooks, spec.hooks)
        return list(outcomes)

    async def _run_tool(self, spec: AgentSpec, step: int, index: int, call: ToolCall) -> ToolOutcome:
        job = self._tool_job(spec, step, index, call)
        timeout = self._timeout_for(spec, call.name)
        if timeout is None:
            outcome, produced_here = ToolOutcome(content=error_content(f"unknown tool: {call.name}"), is_error=True), True
        else:
            job.timeout = timeout
            assert self.rt.tool_waiter is not None
            outcome, produced_here = await self.rt.tool_waiter.run(job)
        if produced_here:  # otherwise the tool worker published it
            await self.publish(TOOL_RESULT, tool_result_event(job, outcome))
        return outcome

    def _timeout_for(self, spec: AgentSpec, tool_name: str) -> float | None:
        """The budget (seconds) of a tool this agent may call, or None when it may not call it."""
        tool = self.rt.app.tools.find(tool_name) if tool_name in spec.tools else None
        if tool is not None:
            return tool.timeout
        source = self.rt.app.source_for(tool_name, spec.sources)
        return source.timeout_for(tool_name) if source is not None else None

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
