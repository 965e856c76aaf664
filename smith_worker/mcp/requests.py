"""What an MCP server asks of us during a tool call: ``sampling/createMessage`` and ``elicitation/create``
(MCP 2025-06-18, client features; docs/architecture.md, MCP and Pausing for a person).

The pooled session serves every call of this process and a stdio server's request names no call, so a
request is matched to the calls in flight on the server (:class:`InFlight`): the only one, or several of
the same turn tree and agent (the same model, budget and person to ask). Anything else (no call, calls of
several turns) is refused (sampling) or declined (elicitation), and logged.

* **Sampling** (``sampling=True``, :meth:`ClientRequests.sample`): the request's ``systemPrompt``, its
  ``messages`` (text; other content becomes a placeholder, as in tool results), ``maxTokens``, ``temperature``
  and ``stopSequences`` make one chat-completions request with the calling agent's model settings
  (:attr:`~smith_worker.tools.source.SourceContext.llm_config`; the request's fields over the agent's
  defaults). The reply becomes the ``CreateMessageResult``; its reported tokens are added to the turn tree's
  counter (``Keys.tree_tokens``), which the tree's budget (``tree_max_total_tokens``) reads before every model
  call, and to the calling agent's count in ``Keys.tree_sampled``, which its loop reads with each step
  (``max_total_tokens``, the turn's ``usage`` on ``turn.completed``). The call goes through the endpoint's
  fleet-wide rate limit as the agent loops' calls do (the process's gates, ``SourceContext.rate_limits``;
  docs/architecture.md, Model rate limits): its waits are ``llm.waiting`` events on the turn, bounded by the tool
  call's deadline. A failed model call answers with a JSON-RPC error. Off, the capability is not declared and
  the SDK refuses the request. With ``sampling_needs_approval`` a person is asked first, as for an elicitation
  (the item's ``method`` is ``sampling/createMessage``, its schema an empty object); anything but ``accept``
  answers the server with an error (:data:`DECLINED`).
* **Elicitation** (:meth:`ClientRequests.elicit`, form mode): the request becomes a pending item of kind
  ``input`` in ``Keys.turn_inputs`` (listed by ``client.pending``) and an ``input.requested`` event on the
  turn; the turn is not paused, its tool job waits here. The answer (``client.respond``,
  :mod:`smith_client.inputs`) is popped from ``Keys.turn_input_reply`` in slices of :data:`POP_SLICE`
  seconds until the call's waiting allowance (``elicitation_timeout``, shared by its waits) runs out or the
  call ends; then it is ``decline``. The item goes and ``input.answered`` is published either way. While a
  person is asked the call's request clock stands still (:class:`~smith_worker.mcp.server.CallClock`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from smith_client.errors import SmithError
from smith_client.eventlog import WHILE_RUNNING
from smith_client.events import InputAnsweredData, InputRequestedData, PendingItem
from smith_client.inputs import SAMPLING_METHOD, InputResponse
from smith_client.keys import INPUT_GRACE
from smith_client.messages import AssistantMessage, Message, SystemMessage, TokenUsage, UserMessage
from smith_client.roundtrip import RoundTrip
from smith_client.usage import AgentUsage
from smith_worker.llm.rate_limit import RateGate
from smith_worker.llm.types import LlmClientConfig, LlmRequest, LlmResponse, SamplingParams
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.server import CallClock, block_text
from smith_worker.ops.usage import queue_count
from smith_worker.tools.function import ToolContext
from smith_worker.tools.source import SourceContext

logger = logging.getLogger("agent_smith.mcp")

#: Seconds of one blocking pop for an elicitation's answer: under the Redis client's socket timeout, and
#: how late the end of the call is noticed at most.
POP_SLICE = 2.0

#: The JSON-RPC error of a sampling a person did not approve (MCP 2025-06-18, sampling: error handling).
DECLINED = (-1, "the user declined the sampling request")

#: Characters of the sampling request shown to the person asked to approve it.
PREVIEW_CHARS = 200

#: ``method`` of a pending ``input`` item: what the server asked.
ELICITATION, SAMPLING = "elicitation/create", SAMPLING_METHOD


@dataclass(eq=False)
class Caller:
    """One tool call in flight on the server: its context, its arguments, its request ``clock`` (stopped while a
    person is asked), and ``ended`` (set when it returns)."""

    ctx: ToolContext
    arguments: dict[str, Any]
    clock: CallClock
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def tree(self) -> tuple[str, str]:
        """(root turn id, agent): calls alike in this are served the same way."""
        return self.ctx.turn_id, self.ctx.agent


class InFlight:
    """The tool calls in flight on one server of this process (see the module doc)."""

    def __init__(self, allowance: float) -> None:
        self._calls: set[Caller] = set()
        self._allowance = allowance

    @contextlib.contextmanager
    def track(self, ctx: ToolContext, arguments: dict[str, Any]) -> Iterator[Caller]:
        """Count call ``ctx`` as in flight for the body's duration; its clock may wait ``allowance`` seconds in all
        for a person (the server's ``elicitation_timeout``)."""
        caller = Caller(ctx, arguments, CallClock(self._allowance))
        self._calls.add(caller)
        try:
            yield caller
        finally:
            self._calls.discard(caller)
            caller.ended.set()

    def match(self) -> Caller | None:
        """The call a server's request serves: one of the calls in flight when all are of one turn tree and
        agent (and of a turn); None otherwise."""
        trees = {caller.tree for caller in self._calls}
        if len(trees) != 1 or not next(iter(trees))[0]:
            return None
        return next(iter(self._calls))


class ClientRequests:
    """The session callbacks of one server (see the module doc); ``context()`` is the worker's
    :class:`SourceContext` (None before the source started)."""

    def __init__(self, config: ServerConfig, context: Callable[[], SourceContext | None]) -> None:
        self.config = config
        self.inflight = InFlight(config.elicitation_timeout)
        self._context = context

    def callbacks(self) -> dict[str, Any]:
        """The ``ClientSession`` keyword arguments: the elicitation callback, and the sampling one when on."""
        found: dict[str, Any] = {"elicitation_callback": self.elicit}
        if self.config.sampling:
            found["sampling_callback"] = self.sample
        return found

    async def sample(self, context: Any, params: Any) -> Any:
        """Answer ``sampling/createMessage`` (SDK ``SamplingFnT``): a ``CreateMessageResult`` or ``ErrorData``."""
        import mcp_types as types

        from smith_worker.llm.client import LlmClient  # the model's HTTP stack: only when a server samples

        caller, ctx = self._caller(SAMPLING)
        if caller is None or ctx is None or ctx.llm_config is None:
            return types.ErrorData(code=types.INVALID_REQUEST, message="no tool call of this client to sample for")
        try:
            config = ctx.llm_config(caller.ctx.agent)
            request = sampling_request(params)
        except (SmithError, ValidationError) as exc:
            message = exc.message if isinstance(exc, SmithError) else f"invalid sampling request: {exc}"
            return types.ErrorData(code=types.INTERNAL_ERROR, message=message)
        if self.config.sampling_needs_approval:
            asking = f"MCP server {self.config.alias!r} asks to sample the model: {preview(request)}"
            answer = await self._ask(ctx, caller, asking, {"type": "object", "properties": {}}, SAMPLING)
            if answer.action != "accept":
                return types.ErrorData(code=DECLINED[0], message=DECLINED[1])
        try:
            async with LlmClient(config, gate=self._gate(ctx, caller, config)) as llm:
                response = await self._complete(ctx, caller, llm.complete(request))
        except SmithError as exc:
            return types.ErrorData(code=types.INTERNAL_ERROR, message=exc.message)
        await self._count_tokens(ctx, caller, response)
        return create_message_result(response, config.model)

    async def elicit(self, context: Any, params: Any) -> Any:
        """Answer ``elicitation/create`` (SDK ``ElicitationFnT``) with a person's ``ElicitResult``."""
        import mcp_types as types

        caller, ctx = self._caller(ELICITATION)
        data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        schema = data.get("requestedSchema")
        if caller is None or ctx is None or not isinstance(schema, dict):  # URL mode (a later revision): not offered
            return types.ElicitResult(action="decline")
        answer = await self._ask(ctx, caller, str(data.get("message", "")), schema, ELICITATION)
        return types.ElicitResult(action=answer.action, content=answer.content)

    def _caller(self, method: str) -> tuple[Caller | None, SourceContext | None]:
        caller = self.inflight.match()
        if caller is None:
            logger.warning(
                "MCP server %r sent %s with no tool call of a single turn in flight here; refused",
                self.config.alias,
                method,
            )
        return caller, self._context()

    def _gate(self, ctx: SourceContext, caller: Caller, config: LlmClientConfig) -> RateGate | None:
        """The gate of ``config``'s endpoint for one sampling (None: the endpoint has no limit, or the process no
        gates): its waits are announced on the calling agent's turn and may not pass the tool call's deadline."""
        if ctx.rate_limits is None:
            return None
        call = caller.ctx
        return ctx.rate_limits.gate(config, lambda data: self._publish(ctx, call, data), lambda: call.deadline or None)

    @staticmethod
    async def _complete(ctx: SourceContext, caller: Caller, call: Awaitable[LlmResponse]) -> LlmResponse:
        """Await the sampling's model call, counted in the process's metrics for the calling agent when it
        has them."""
        if ctx.metrics is None:
            return await call
        return await ctx.metrics.count_llm_request(call, caller.ctx.agent, caller.ctx.tenant)

    async def _count_tokens(self, ctx: SourceContext, caller: Caller, response: LlmResponse) -> None:
        """One round trip: the sampling's tokens in the tree's counts (the budget, the turn's ``usage``), and
        the call with its tokens in the deployment's usage buckets for the calling agent
        (:mod:`smith_client.usage`)."""
        usage = response.message.usage
        used = usage.total if usage else 0
        rt = RoundTrip()
        used_here = AgentUsage(requests=1).plus(usage or TokenUsage())
        queue_count(rt, ctx.keys, caller.ctx.agent, used_here, tenant=caller.ctx.tenant)
        if usage is not None and used > 0:
            key = ctx.keys.tree_tokens(caller.ctx.turn_id)
            sampled, position = ctx.keys.tree_sampled(caller.ctx.turn_id), caller.ctx.position
            rt.call("incrby", key, used)
            rt.call("expire", key, ctx.keys.turn_ttl)
            rt.call("hincrby", sampled, f"prompt:{position}", usage.prompt)
            rt.call("hincrby", sampled, f"completion:{position}", usage.completion)
            rt.call("hincrby", sampled, f"total:{position}", used)
            rt.call("expire", sampled, ctx.keys.turn_ttl)
        await rt.run(ctx.redis)

    async def _ask(
        self, ctx: SourceContext, caller: Caller, message: str, schema: dict[str, Any], method: str
    ) -> InputResponse:
        """List the request, announce it, wait for the answer (declined when none comes within what is left of
        the call's waiting allowance), then take it off. The call's request clock stands still meanwhile."""
        call, keys = caller.ctx, ctx.keys
        if caller.clock.left() <= 0:  # the call's waits spent its allowance: nobody is asked
            return InputResponse(action="decline")
        item = PendingItem(
            call_id="/".join([*call.call_path, call.call_id]),
            tool=call.tool_name,
            arguments=caller.arguments,
            agent_path=call.agent_path,
            call_path=call.call_path,
            kind="input",
            parameters=schema,
            request_id=uuid.uuid4().hex[:16],
            message=message,
            method=method,
            step=call.step,
            index=call.index,
        )
        inputs, timeout = keys.turn_inputs(call.turn_id), self.config.elicitation_timeout
        answer = InputResponse(action="decline")
        with caller.clock.waiting() as left:
            rt = RoundTrip()
            rt.call("hset", inputs, item.request_id, item.model_dump_json())
            rt.call("expire", inputs, int(timeout) + INPUT_GRACE)
            await rt.run(ctx.redis)
            if await self._publish(ctx, call, InputRequestedData(item=item)) > 0:  # the turn still runs
                reply = keys.turn_input_reply(call.turn_id, item.request_id)
                answer = await self._wait(ctx, caller, reply, min(timeout, left)) or answer
            await ctx.redis.hdel(inputs, item.request_id)
            await self._publish(ctx, call, InputAnsweredData(request_id=item.request_id, action=answer.action))
        return answer

    @staticmethod
    async def _publish(ctx: SourceContext, call: ToolContext, data: Any) -> int:
        return await ctx.events.publish(
            call.turn_id, data, call.agent_path, attempt=WHILE_RUNNING, call_path=call.call_path
        )

    @staticmethod
    async def _wait(ctx: SourceContext, caller: Caller, key: str, timeout: float) -> InputResponse | None:
        """The answer pushed on ``key`` within ``timeout`` seconds, None when none came or the call ended."""
        deadline = time.monotonic() + timeout
        while not caller.ended.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            popped = await ctx.redis.blpop([key], timeout=max(0.01, min(POP_SLICE, left)))
            if popped is not None:
                return InputResponse.model_validate_json(popped[1])
        return None


def sampling_request(params: Any) -> LlmRequest:
    """A ``CreateMessageRequestParams`` as a chat-completions request (see the module doc). Raises
    ``ValidationError`` for sampling values out of range (a temperature over 2)."""
    data = params.model_dump(by_alias=True, mode="json", exclude_none=True)
    messages: list[Message] = [SystemMessage(content=data["systemPrompt"])] if data.get("systemPrompt") else []
    for item in data.get("messages") or []:
        content = item.get("content")
        blocks = content if isinstance(content, list) else [content or {}]
        text = "\n".join(block_text(block) for block in blocks)
        messages.append(
            AssistantMessage(content=text) if item.get("role") == "assistant" else UserMessage(content=text)
        )
    sampling = SamplingParams(
        max_tokens=data.get("maxTokens"), temperature=data.get("temperature"), stop=data.get("stopSequences") or []
    )
    return LlmRequest(messages=messages, sampling=sampling)


def preview(request: LlmRequest) -> str:
    """The last message of a sampling request, cut to :data:`PREVIEW_CHARS` characters (what a person approves)."""
    text = " ".join(str(request.messages[-1].content).split()) if request.messages else ""
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def create_message_result(response: LlmResponse, model: str) -> Any:
    """The model's reply as a ``CreateMessageResult`` (text; ``stopReason`` ``maxTokens`` when cut at the
    token limit, else ``endTurn``)."""
    import mcp_types as types

    stop = "maxTokens" if response.finish_reason == "length" else "endTurn"
    text = types.TextContent(type="text", text=response.message.content or "")
    return types.CreateMessageResult(role="assistant", content=text, model=model, stop_reason=stop)
