"""The message model; its OpenAI chat-completions wire form is :mod:`smith_worker.llm.wire`.

Four message kinds, discriminated by ``role``: :class:`SystemMessage`,
:class:`UserMessage`, :class:`AssistantMessage`, :class:`ToolMessage`.
Two JSON forms exist:

* the *stored* form (``model_dump(mode="json")``) keeps every field, including
  ``ToolMessage.is_error`` and ``AssistantMessage.usage``; it is what history
  and events carry;
* the *wire* form (``smith_worker.llm.wire.to_openai``) is what a chat-completions server gets:
  standard fields only, ``is_error`` never appears, tool-call arguments are a
  JSON string (https://platform.openai.com/docs/api-reference/chat/create).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from smith_client.errors import ParseError


class TokenUsage(BaseModel):
    """Server-reported token counts: prompt, completion, total (tokens)."""

    model_config = ConfigDict(frozen=True)

    prompt: int = 0
    completion: int = 0
    total: int = 0


class ToolCall(BaseModel):
    """One function call requested by the model.

    ``id`` is the server's opaque id (may be empty or repeated by some
    servers); ``arguments`` is the already-parsed JSON object.
    """

    id: str = ""
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class SystemMessage(BaseModel):
    """A system prompt."""

    role: Literal["system"] = "system"
    content: str


class UserMessage(BaseModel):
    """A user's message (text only)."""

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(BaseModel):
    """The model's answer: text and/or tool calls, with usage when reported.

    ``finish_reason`` is the server's for the reply's choice (``stop``, ``length``, ``tool_calls``,
    ``content_filter``, …; None when none was sent, or for a message the runtime wrote itself);
    ``reasoning_content`` the model's reasoning, kept only when the agent sets ``keep_reasoning``
    (docs/architecture.md, Model requests). Neither is sent back to a server.
    """

    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: TokenUsage | None = None
    finish_reason: str | None = None
    reasoning_content: str | None = None


class ToolMessage(BaseModel):
    """A tool's result for one tool call.

    ``is_error`` is internal: it is stored and published in events but never
    sent on the wire (docs/architecture.md, Tool calls); errors are encoded in ``content`` as compact
    JSON ``{"error":true,"message":...}``.
    """

    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str = ""
    content: str
    is_error: bool = False


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage,
    Field(discriminator="role"),
]

_message_adapter: TypeAdapter[Any] = TypeAdapter(Message)
_message_list_adapter: TypeAdapter[list[Any]] = TypeAdapter(list[Message])


def message_from_dict(data: dict[str, Any]) -> SystemMessage | UserMessage | AssistantMessage | ToolMessage:
    """Validate a stored-form dict into its message class.

    Raises :class:`~smith_client.errors.ParseError` on a bad shape.
    """
    try:
        message: SystemMessage | UserMessage | AssistantMessage | ToolMessage = _message_adapter.validate_python(data)
        return message
    except ValueError as exc:
        raise ParseError(f"invalid message: {exc}") from exc


def message_to_json(message: BaseModel) -> bytes:
    """The stored form of one message as JSON bytes."""
    return orjson.dumps(message.model_dump(mode="json"))


def parse_json_object(raw: bytes | str, what: str, *, offset: int | None = None) -> dict[str, Any]:
    """Parse JSON that must be an object: the one parser of untrusted JSON objects (stored messages,
    chat completions, stream frames, tool-call arguments).

    ``what`` names it in the :class:`ParseError`, whose ``offset`` is ``offset``
    (e.g. the byte offset of a stream frame) or else the position of the error.
    """
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ParseError(
            f"invalid JSON in {what} (position {exc.pos}): {exc.msg}", offset=exc.pos if offset is None else offset
        ) from exc
    if not isinstance(data, dict):
        raise ParseError(f"{what} is not a JSON object", offset=offset or 0)
    return data


def message_from_json(raw: bytes | str) -> SystemMessage | UserMessage | AssistantMessage | ToolMessage:
    """Parse stored-form JSON bytes. Raises ``ParseError``."""
    return message_from_dict(parse_json_object(raw, "message"))


def messages_from_json_list(items: list[bytes]) -> list[Message]:
    """Parse a list of stored-form JSON messages (e.g. a Redis list)."""
    return [message_from_json(item) for item in items]


__all__ = [
    "AssistantMessage",
    "Message",
    "SystemMessage",
    "TokenUsage",
    "ToolCall",
    "ToolMessage",
    "UserMessage",
    "message_from_dict",
    "message_from_json",
    "message_to_json",
    "messages_from_json_list",
]
