"""The OpenAI chat-completions wire form of messages, used only by the LLM client.

The shapes are those of https://platform.openai.com/docs/api-reference/chat/create.

The stored form (:mod:`smith_client.messages`) keeps every field; the wire
form is what a chat-completions server gets: standard fields only,
``is_error`` never appears, tool-call arguments are a JSON string
(https://platform.openai.com/docs/api-reference/chat/create).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from smith_client.errors import ParseError
from smith_client.messages import (
    AssistantMessage,
    SystemMessage,
    TokenUsage,
    ToolCall,
    ToolMessage,
    UserMessage,
    parse_json_object,
)


def to_openai(message: BaseModel) -> dict[str, Any]:
    """Convert one message to the chat-completions wire JSON. Total.

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
    return parse_json_object(raw, f"the arguments of tool call {tool_name!r}")


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

    Raises ``ParseError`` on a shape mismatch (the payload is untrusted).
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
