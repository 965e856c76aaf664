"""Stream events: one envelope for every event of a turn (docs/architecture.md, Events).

Envelope fields: ``v`` (protocol version, :data:`PROTOCOL_VERSION`), ``turn_id``,
``seq`` (1, 2, 3 … gap-free per turn, assigned in Redis), ``ts`` (float epoch
seconds, the Redis server's clock as the event is logged: non-decreasing in ``seq``
order), ``agent_path`` (agent names, root first), ``call_path``, ``type`` and ``data``.

``call_path`` tells apart the events of parallel calls of one sub-agent (a
sub-agent tool may be called several times in one step): the ids of the sub-agent
tool calls along ``agent_path``, root first, so ``agent_path[i + 1]`` runs for
``agent_path[i]``'s call ``call_path[i]`` and the last id is the parent's
``tool_call_id`` of this child (the ``id`` of its ``tool_call.*`` and the
``tool_call_id`` of its ``tool.result``). It is absent (read as ``[]``) on the
root agent's events. The ids are the model server's, as in the parent's own
``tool_call.*`` events.

Event types and their ``data``:

======================  ==========================================================
``turn.started``        ``{conversation_id, agent, trace_id}``
``token``               ``{text}``: a piece of the assistant's content, as it streams
``reasoning``           ``{text}``: a piece of the model's reasoning (``reasoning_content``), as it streams
``tool_call.started``   ``{id, name, index}``: the model began a tool call
``tool_call.completed`` ``{id, name, index, arguments}``: its arguments, parsed
``tool.result``         ``{tool_call_id, name, content, is_error, worker}``
``message``             ``{message}``: a message appended to the history (stored form)
``turn.completed``      ``{message, output}``: the final :class:`AssistantMessage` (stored form) and, for an
                        agent with an ``output_type``, its validated output as JSON (else null)
``turn.failed``         ``{error: {kind, message, fields}}``
``mcp.event``           ``{alias, kind, message, fields}``: an MCP server's lifecycle event
                        (``connected``, ``disconnected``, ``reconnecting``, ``reconnect_failed``)
                        or notification (``kind`` ``notification``, ``fields`` ``{method, params}``)
``turn.cancelled``      ``{reason}``: cancelled by a caller (``cancel``) or by a newer turn (``interrupt``)
``turn.resumed``        ``{attempt}``: a re-run after a worker crash or shutdown took the turn over
``memory.summary_failed`` ``{error: {kind, message, fields}}``: ``SummaryMemory``'s summary call failed;
                        that step used its rolling window instead
``turn.paused``         ``{pending: [PendingItem]}``: the turn waits for a person (not terminal)
``tool_call.decided``   ``{id, name, index, action, arguments, message}``: how a paused call was decided,
                        published as the resumed step takes it (``arguments``: those that run)
``input.requested``     ``{item: PendingItem}`` (kind ``input``): an MCP server asks a person for input during a
                        tool call (elicitation); the turn keeps running, its tool job waits for ``respond``
``input.answered``      ``{request_id, action}``: that request was answered (``accept``, ``decline``,
                        ``cancel``), or declined when its wait ran out or its call ended
``handoff``             ``{from_agent, to_agent, tool_call_id}``: the agent answering the turn (and the
                        conversation's next turns sent without ``agent=``) changed (docs/architecture.md, Handoffs)
``llm.waiting``         ``{endpoint, model, reason, wait_s}``: the next model request waits ``wait_s`` seconds for
                        the endpoint's fleet-wide rate limit (``reason`` ``rate_limit``) or for the end of a
                        pause a ``429`` with ``Retry-After`` started (``retry_after``); not terminal
======================  ==========================================================
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from smith_client.errors import ParseError, SmithError, error_from_payload
from smith_client.jobs import ToolJob, ToolOutcome
from smith_client.messages import AssistantMessage, TokenUsage

PROTOCOL_VERSION = 1

TURN_STARTED = "turn.started"
TOKEN = "token"
REASONING = "reasoning"
TOOL_CALL_STARTED = "tool_call.started"
TOOL_CALL_COMPLETED = "tool_call.completed"
TOOL_RESULT = "tool.result"
MESSAGE = "message"
TURN_COMPLETED = "turn.completed"
TURN_FAILED = "turn.failed"
MCP_EVENT = "mcp.event"
TURN_CANCELLED = "turn.cancelled"
TURN_RESUMED = "turn.resumed"
MEMORY_SUMMARY_FAILED = "memory.summary_failed"
TURN_PAUSED = "turn.paused"
TOOL_CALL_DECIDED = "tool_call.decided"
INPUT_REQUESTED = "input.requested"
INPUT_ANSWERED = "input.answered"
HANDOFF = "handoff"
LLM_WAITING = "llm.waiting"

#: Types after which a turn publishes nothing more.
TERMINAL_TYPES = frozenset({TURN_COMPLETED, TURN_FAILED, TURN_CANCELLED})


class EventData(BaseModel):
    """The ``data`` of one event type; ``event_type`` is the event's ``type`` on the wire.

    Fields a newer worker adds are kept (``extra="allow"``), so an older client
    still reads the ones it knows.
    """

    model_config = ConfigDict(extra="allow")
    event_type: ClassVar[str] = ""

    def to_wire(self) -> dict[str, Any]:
        """The JSON-able ``data`` as published."""
        return self.model_dump(mode="json")


class TurnStartedData(EventData):
    """``turn.started``: the first attempt of a turn began. ``trace_id``: the turn's OpenTelemetry trace id
    (32 hex digits; "" when its worker does not trace or the turn is not sampled: docs/architecture.md, Tracing).
    ``tenant``: the turn's (``send(..., tenant=)``; None when it has none: docs/architecture.md, Tenants)."""

    event_type: ClassVar[str] = TURN_STARTED
    conversation_id: str
    agent: str
    trace_id: str = ""
    tenant: str | None = None


class TokenData(EventData):
    """``token``: a piece of the assistant's content, as it streams."""

    event_type: ClassVar[str] = TOKEN
    text: str


class ReasoningData(EventData):
    """``reasoning``: a piece of the model's reasoning (a streamed ``reasoning_content`` delta); not in the
    stored message unless the agent keeps it (docs/architecture.md, Events)."""

    event_type: ClassVar[str] = REASONING
    text: str


class ToolCallStartedData(EventData):
    """``tool_call.started``: the model began tool call ``index`` (0-based position in its ``tool_calls``)."""

    event_type: ClassVar[str] = TOOL_CALL_STARTED
    id: str
    name: str
    index: int


class ToolCallCompletedData(ToolCallStartedData):
    """``tool_call.completed``: the call's arguments, parsed (a JSON object)."""

    event_type: ClassVar[str] = TOOL_CALL_COMPLETED
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolResultData(EventData):
    """``tool.result``: a call's outcome; ``worker`` is the tool worker's id (None when the turn side wrote it:
    an unknown tool, a timeout, an ended turn)."""

    event_type: ClassVar[str] = TOOL_RESULT
    tool_call_id: str
    name: str
    index: int
    content: str
    is_error: bool
    worker: str | None = None


class MessageData(EventData):
    """``message``: a message appended to the history, in its stored form (see :mod:`smith_client.messages`)."""

    event_type: ClassVar[str] = MESSAGE
    message: dict[str, Any]


class TurnCompletedData(EventData):
    """``turn.completed``: the final assistant message; ``output``, for an agent declared with an ``output_type``,
    the answer validated against it as JSON (the message's ``content`` is its text; docs/architecture.md,
    Structured output), None otherwise; ``usage``, the tokens of the turn's root agent: its model calls' (as the
    server reported them) and those MCP servers sampled for its tool calls (None from a worker that does not
    count them)."""

    event_type: ClassVar[str] = TURN_COMPLETED
    message: AssistantMessage
    output: Any = None
    usage: TokenUsage | None = None

    def to_wire(self) -> dict[str, Any]:
        """The JSON-able ``data``; ``output`` only when there is one (an agent without an ``output_type``)."""
        data = super().to_wire()
        if data.get("output") is None:
            data.pop("output", None)
        return data


class ErrorData(BaseModel):
    """A typed error on the wire (:meth:`~smith_client.errors.SmithError.to_payload`)."""

    model_config = ConfigDict(extra="allow")
    kind: str
    message: str
    fields: dict[str, Any] = Field(default_factory=dict)


class FailureData(EventData):
    """The data of an event reporting a failure: its typed ``error``."""

    error: ErrorData


class TurnFailedData(FailureData):
    """``turn.failed``: the error that ended the turn."""

    event_type: ClassVar[str] = TURN_FAILED


class MemorySummaryFailedData(FailureData):
    """``memory.summary_failed``: ``SummaryMemory``'s summary call failed; that step used its rolling window."""

    event_type: ClassVar[str] = MEMORY_SUMMARY_FAILED


class McpEventData(EventData):
    """``mcp.event``: an MCP server's lifecycle event (``connected``, ``disconnected``, ``reconnecting``,
    ``reconnect_failed``) or notification (``kind`` ``notification``, ``fields`` ``{method, params}``)."""

    event_type: ClassVar[str] = MCP_EVENT
    alias: str
    kind: str
    message: str
    fields: dict[str, Any] = Field(default_factory=dict)


class TurnCancelledData(EventData):
    """``turn.cancelled``: ``reason`` is ``cancel`` (a caller) or ``interrupt`` (a newer turn)."""

    event_type: ClassVar[str] = TURN_CANCELLED
    reason: str


class TurnResumedData(EventData):
    """``turn.resumed``: attempt ``attempt`` (2, 3, …) took the turn over. ``reason``: ``restart`` after a
    worker crash or shutdown (the unfinished step runs again, its reply streams again), ``decision`` after
    the calls the turn paused on were decided (it goes on where it stopped; docs/architecture.md, Pausing
    for a person)."""

    event_type: ClassVar[str] = TURN_RESUMED
    attempt: int
    reason: Literal["restart", "decision"] = "restart"


#: What a pending item waits for: a person's approval, the result of a tool run outside (an external tool), or
#: a person's input to an MCP server's elicitation during a running tool call.
PendingKind = Literal["approval", "external", "input"]


class PendingItem(BaseModel):
    """One call a paused turn waits on (docs/architecture.md, Pausing for a person).

    ``call_id`` is what the client decides by: the model's call id for the root agent's call, and for a
    sub-agent's call that id behind the ids of ``call_path`` (``"<call_path[0]>/…/<id>"``), so it cannot
    collide with another agent's; ``tool`` its tool name; ``arguments`` the model's arguments; ``agent_path``
    the agent that made the call (root first); ``call_path`` the ids of the sub-agent calls along it (as on
    events; ``[]`` for the root agent's calls); ``kind`` ``approval`` (approve or reject it) or ``external``
    (submit its result) or ``input`` (an MCP server's elicitation during the running call: answer it with
    ``respond(turn_id, request_id, ...)``); ``parameters`` the tool's JSON Schema, which edited arguments must
    satisfy (for ``input``: the server's ``requestedSchema``, which accepted content must satisfy); ``step``
    and ``index`` where the call is in its agent's run; ``request_id`` and ``message`` (``input`` only) the
    request's id and the server's message to the person; ``method`` (``input`` only) the MCP request asking:
    ``elicitation/create``, or ``sampling/createMessage`` for a sampling that waits for a person's approval
    (accept or decline, no content).
    """

    model_config = ConfigDict(extra="allow")
    call_id: str
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    agent_path: list[str] = Field(default_factory=list)
    call_path: list[str] = Field(default_factory=list)
    kind: PendingKind
    parameters: dict[str, Any] = Field(default_factory=dict)
    step: int = 0
    index: int = 0
    request_id: str = ""
    message: str = ""
    method: str = ""


class TurnPausedData(EventData):
    """``turn.paused``: the turn's step waits for a person's decisions on ``pending`` (its other calls ran)."""

    event_type: ClassVar[str] = TURN_PAUSED
    pending: list[PendingItem]


class ToolCallDecidedData(EventData):
    """``tool_call.decided``: paused call ``index`` (id ``id``, tool ``name``) as decided: ``action``
    ``approve`` (it runs with ``arguments``), ``reject`` (``message`` is its error) or ``result`` (an
    external tool's result was given)."""

    event_type: ClassVar[str] = TOOL_CALL_DECIDED
    id: str
    name: str
    index: int
    action: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    message: str = ""


class InputRequestedData(EventData):
    """``input.requested``: an MCP server's elicitation waits for a person's answer (``item``, kind ``input``)."""

    event_type: ClassVar[str] = INPUT_REQUESTED
    item: PendingItem


#: How a person answers an MCP elicitation (MCP spec 2025-06-18, elicitation: the result's ``action``).
InputAction = Literal["accept", "decline", "cancel"]


class InputAnsweredData(EventData):
    """``input.answered``: elicitation ``request_id`` got ``action`` (``accept``, ``decline``, ``cancel``)."""

    event_type: ClassVar[str] = INPUT_ANSWERED
    action: InputAction
    request_id: str


class HandoffData(EventData):
    """``handoff``: ``from_agent`` called ``transfer_to_<to_agent>`` (call ``tool_call_id``); ``to_agent`` answers
    the rest of the turn and, for the root agent, the conversation's next turns sent without ``agent=``
    (docs/architecture.md, Handoffs). Published in the round trip that appends the call's tool message."""

    event_type: ClassVar[str] = HANDOFF
    from_agent: str
    to_agent: str
    tool_call_id: str


class LlmWaitingData(EventData):
    """``llm.waiting``: the agent's next model request waits ``wait_s`` seconds (float) before it is sent, for
    the fleet-wide rate limit of its endpoint (``reason`` ``"rate_limit"``) or for the end of the pause a
    ``429`` with ``Retry-After`` started for every worker (``"retry_after"``); docs/architecture.md, Model rate
    limits. ``endpoint``: the chat-completions URL; ``model``: the model name sent. The turn goes on after the
    wait (or fails typed when the wait would pass its deadline)."""

    event_type: ClassVar[str] = LLM_WAITING
    endpoint: str
    model: str
    reason: Literal["rate_limit", "retry_after"]
    wait_s: float


class UnknownData(EventData):
    """The ``data`` of an event type this client does not know (a newer worker): every field kept."""


#: The data model of each known event type.
DATA_MODELS: dict[str, type[EventData]] = {
    model.event_type: model
    for model in (
        TurnStartedData,
        TokenData,
        ReasoningData,
        ToolCallStartedData,
        ToolCallCompletedData,
        ToolResultData,
        MessageData,
        TurnCompletedData,
        TurnFailedData,
        McpEventData,
        TurnCancelledData,
        TurnResumedData,
        MemorySummaryFailedData,
        TurnPausedData,
        ToolCallDecidedData,
        InputRequestedData,
        InputAnsweredData,
        HandoffData,
        LlmWaitingData,
    )
}


class Event(BaseModel):
    """One stream event (see the module docstring for types and data).

    ``data`` is the wire dict; :attr:`payload` is the same data as its typed model.
    """

    v: int = PROTOCOL_VERSION
    turn_id: str
    seq: int
    ts: float
    agent_path: list[str] = Field(default_factory=list)
    call_path: list[str] = Field(default_factory=list)
    type: str
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        """True for ``turn.completed`` / ``turn.failed`` / ``turn.cancelled``."""
        return self.type in TERMINAL_TYPES

    @property
    def payload(self) -> EventData:
        """``data`` as the model of :attr:`type` (:data:`DATA_MODELS`); :class:`UnknownData` for a type this
        client does not know. Raises ``ParseError`` when the data of a known type does not fit its model."""
        model = DATA_MODELS.get(self.type, UnknownData)
        try:
            return model.model_validate(self.data)
        except ValidationError as exc:
            raise ParseError(f"invalid data of a {self.type!r} event: {exc}") from exc

    @property
    def paused(self) -> bool:
        """True for ``turn.paused``: the turn waits for a person; more events follow once it resumes."""
        return self.type == TURN_PAUSED

    def final_message(self) -> AssistantMessage:
        """The final message of a ``turn.completed`` event. Raises ``ParseError`` otherwise."""
        payload = self.payload
        if not isinstance(payload, TurnCompletedData):
            raise ParseError(f"event {self.type!r} carries no final message")
        return payload.message

    def error(self) -> SmithError:
        """The typed error of a ``turn.failed`` event. Raises ``ParseError`` otherwise."""
        if self.type != TURN_FAILED:
            raise ParseError(f"event {self.type!r} carries no error")
        return error_from_payload(self.data.get("error") or {})


def tool_result_data(job: ToolJob, outcome: ToolOutcome) -> ToolResultData:
    """The ``tool.result`` data of ``job``'s call with ``outcome`` (published by whichever side produced it)."""
    return ToolResultData(
        tool_call_id=job.call.id,
        name=job.call.name,
        index=job.index,
        content=outcome.content,
        is_error=outcome.is_error,
        worker=outcome.worker,
    )


def event_from_json(raw: bytes | str) -> Event:
    """Parse one event as published. Raises ``ParseError`` on a bad payload."""
    try:
        return Event.model_validate(orjson.loads(raw))
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise ParseError(f"invalid event payload: {exc}") from exc
