"""Stream events: one envelope for every event of a turn (DESIGN.md §5).

Envelope fields: ``v`` (protocol version, :data:`PROTOCOL_VERSION`), ``turn_id``,
``seq`` (1, 2, 3 … gap-free per turn, assigned in Redis), ``ts`` (float epoch
seconds), ``agent_path`` (agent names, root first), ``type`` and ``data``.

Event types and their ``data``:

======================  ==========================================================
``turn.started``        ``{conversation_id, agent}``
``token``               ``{text}``: a piece of the assistant's content, as it streams
``tool_call.started``   ``{id, name, index}``: the model began a tool call
``tool_call.completed`` ``{id, name, index, arguments}``: its arguments, parsed
``tool.result``         ``{tool_call_id, name, content, is_error, worker}``
``message``             ``{message}``: a message appended to the history (stored form)
``turn.completed``      ``{message}``: the final :class:`AssistantMessage` (stored form)
``turn.failed``         ``{error: {kind, message, fields}}``
``mcp.event``           ``{alias, kind, message, fields}``: an MCP server's lifecycle event
                        (``connected``, ``disconnected``, ``reconnecting``, ``reconnect_failed``)
                        or notification (``kind`` ``notification``, ``fields`` ``{method, params}``)
``turn.cancelled``      ``{reason}``: cancelled by a caller (``cancel``) or by a newer turn (``interrupt``)
``turn.resumed``        ``{attempt}``: a re-run after a worker crash or shutdown took the turn over
``memory.summary_failed`` ``{error: {kind, message, fields}}``: ``SummaryMemory``'s summary call failed;
                        that step used its rolling window instead
======================  ==========================================================
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, Field

from smith_client.errors import ParseError, SmithError, error_from_payload
from smith_client.messages import AssistantMessage

PROTOCOL_VERSION = 1

TURN_STARTED = "turn.started"
TOKEN = "token"
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

#: Types after which a turn publishes nothing more.
TERMINAL_TYPES = frozenset({TURN_COMPLETED, TURN_FAILED, TURN_CANCELLED})


class Event(BaseModel):
    """One stream event (see the module docstring for types and data)."""

    v: int = PROTOCOL_VERSION
    turn_id: str
    seq: int
    ts: float
    agent_path: list[str] = Field(default_factory=list)
    type: str
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        """True for ``turn.completed`` / ``turn.failed`` / ``turn.cancelled``."""
        return self.type in TERMINAL_TYPES

    def final_message(self) -> AssistantMessage:
        """The final message of a ``turn.completed`` event. Raises ``ParseError`` otherwise."""
        if self.type != TURN_COMPLETED:
            raise ParseError(f"event {self.type!r} carries no final message")
        return AssistantMessage.model_validate(self.data["message"])

    def error(self) -> SmithError:
        """The typed error of a ``turn.failed`` event. Raises ``ParseError`` otherwise."""
        if self.type != TURN_FAILED:
            raise ParseError(f"event {self.type!r} carries no error")
        return error_from_payload(self.data.get("error") or {})


def event_from_json(raw: bytes | str) -> Event:
    """Parse one event as published. Raises ``ParseError`` on a bad payload."""
    try:
        return Event.model_validate(orjson.loads(raw))
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise ParseError(f"invalid event payload: {exc}") from exc
