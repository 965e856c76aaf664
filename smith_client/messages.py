"""The message model (seed §7) and its OpenAI chat-completions wire form.

Four message kinds, discriminated by ``role``: :class:`SystemMessage`,
:class:`UserMessage`, :class:`AssistantMessage`, :class:`ToolMessage`.
Two JSON forms exist:

* the *stored* form (``model_dump(mode="json")``) keeps every field, including
  ``ToolMessage.is_error`` and ``AssistantMessage.usage``; it is what history
  and events carry;
* the *wire* form (:func:`to_openai`) is what a chat-completions server gets:
  standard fields only, ``is_error`` never appears, tool-call arguments are a
  JSON string (https://platform.openai.com/docs/api-reference/chat/create).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from smith_client.errors import ParseError


class TokenUsage(BaseModel):
    """Server-reported token counts (seed §7.2): prompt, completion, total (tokens)."""

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
    """A user's message (text only; seed §7.2)."""

    role: Literal["user"] = "user"
    content: str


class AssistantMessage(BaseModel):
    """The model's answer: text and/or tool calls, with usage when reported."""

    role: Literal["assistant"] = "assistant"
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: TokenUsage | None = None


class ToolMessage(BaseModel):
    """A tool's result for one tool call.

    ``is_error`` is internal: it is stored and published in events but never
    sent on the wire (seed §10.4); errors are encoded in ``content`` as compact
    JSON ``{"error":true,"message":...}``.
    """

    role: Literal["tool"] = "tool"
    tool_call_id: str
    name: str = ""
    content: str
    is_error: bool = False


Message = Annotated[
    Union[SystemMessage, UserMessage, AssistantMessage, ToolMessage],
    Field(discriminator="role"),
]

_message_adapter: TypeAdapter[Any] = TypeAdapter(Message)
_message_list_adapter: TypeAdapter[list[Any]] = TypeAdapter(list[Message])


def message_from_dict(data: dict[str, Any]) -> SystemMessage | UserMessage | AssistantMessage | ToolMessage:
    """Validate a stored-form dict into its message class.

    Raises :class:`~smith_client.errors.ParseError` on a bad shape.
    """
    try:
        return _message_adapter.validate_python(data)
    except ValueError as exc:
        raise ParseError(f"invalid message: {exc}") from exc


def message_to_json(message: BaseModel) -> bytes:
    """The stored form of one message as JSON bytes."""
    return orjson.dumps(message.model_dump(mode="json"))


def parse_json_object(raw: bytes | str, what: str) -> dict[str, Any]:
    """Parse JSON that must be an object; ``what`` names it in the :class:`ParseError` (with the offset)."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON in {what}: {exc.msg}", offset=exc.pos) from exc
    if not isinstance(data, dict):
        raise ParseError(f"{what} is not a JSON object")
    return data


def message_from_json(raw: bytes | str) -> SystemMessage | UserMessage | AssistantMessage | ToolMessage:
    """Parse stored-form JSON bytes. Raises ``ParseError``."""
    return message_from_dict(parse_json_object(raw, "message"))


def to_openai(message: BaseModel) -> dict[str, Any]:
    """Convert one message to the chat-completions wire JSON (seed §7.3). Total.

    Assistant tool calls become ``{"id","type":"function","function":{"name","arguments":<JSON string>}}``.
    ``content`` is always a string (``""`` beside tool calls): llama-cpp-python's
    server rejects ``null`` there, and OpenAI accepts both.
    """
    if isinstance(message, AssistantMessage):
        out: dict[str, Any] = {"role": "assistant", "content": message.content}
        if message.tool_calls:
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": orjson.dumps(call.arguments).decode()},
                }
                for call in message.tool_calls
            ]
        return out
    if isinstance(message, ToolMessage):
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    if isinstance(message, (SystemMessage, UserMessage)):
        return {"role": message.role, "content": message.content}
    raise TypeError(f"not a message: {type(message).__name__}")


def parse_arguments(raw: Any, *, tool_name: str = "") -> dict[str, Any]:
    """Parse a tool call's ``arguments`` as the wire gives them.

    Accepts a JSON string (``""`` means ``{}``), an object already decoded, or
    ``None``. Raises ``ParseError`` (with the offset) for malformed JSON or a
    non-object value.
    """
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise ParseError(f"tool call {tool_name!r}: arguments must be a JSON object, got {type(raw).__name__}")
    if raw.strip() == "":
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ParseError(f"tool call {tool_name!r}: malformed arguments JSON: {exc.msg}", offset=exc.pos) from exc
    if not isinstance(value, dict):
        raise ParseError(f"tool call {tool_name!r}: arguments must be a JSON object")
    return value


def usage_from_openai(raw: Any) -> TokenUsage | None:
    """Read an OpenAI ``usage`` object (``prompt_tokens``, ``completion_tokens``, ``total_tokens``)."""
    if not isinstance(raw, dict):
        return None
    prompt = int(raw.get("prompt_tokens") or 0)
    completion = int(raw.get("completion_tokens") or 0)
    total = int(raw.get("total_tokens") or (prompt + completion))
    return TokenUsage(prompt=prompt, completion=completion, total=total)


def assistant_from_openai(choice_message: Any, usage: Any = None) -> AssistantMessage:
    """Build an :class:`AssistantMessage` from a non-streamed ``choices[0].message``.

    Raises ``ParseError`` on a shape mismatch (the payload is untrusted, seed §7.3).
    """
    if not isinstance(choice_message, dict):
        raise ParseError("choices[0].message is not an object")
    content = choice_message.get("content") or ""
    if not isinstance(content, str):
        raise ParseError("choices[0].message.content is not a string")
    calls: list[ToolCall] = []
    for position, raw_call in enumerate(choice_message.get("tool_calls") or []):
        if not isinstance(raw_call, dict) or not isinstance(raw_call.get("function"), dict):
            raise ParseError(f"tool_calls[{position}] has no function object")
        function = raw_call["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ParseError(f"tool_calls[{position}] has no function name")
        calls.append(
            ToolCall(
                id=str(raw_call.get("id") or ""),
                name=name,
                arguments=parse_arguments(function.get("arguments"), tool_name=name),
            )
        )
    return AssistantMessage(content=content, tool_calls=calls, usage=usage_from_openai(usage))


def messages_from_json_list(items: list[bytes]) -> list[Any]:
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
    "assistant_from_openai",
    "message_from_dict",
    "message_from_json",
    "message_to_json",
    "messages_from_json_list",
    "parse_arguments",
    "to_openai",
    "usage_from_openai",
]
