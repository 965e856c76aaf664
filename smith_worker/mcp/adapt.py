"""MCP results as Smith values: tool results and prompt messages (MCP 2025-06-18, tools: https://modelcontextprotocol.io/specification/2025-06-18/server/tools).

* ``tools/call`` → :class:`ToolResult`: text blocks joined by newlines;
  embedded text resources inlined; binary content (images, audio, blobs)
  replaced by a short placeholder (messages carry text only);
  ``structuredContent`` kept as ``structured`` (and used as the content when
  there is no text); ``isError`` → an error result with the compact
  JSON error payload of tool messages.
* ``resources/read`` → :class:`ToolResult`: text contents joined, with a
  ``uri`` header line per item when there are several; blobs as placeholders.
* ``prompts/get`` → :class:`UserMessage` / :class:`AssistantMessage`; any
  non-text content raises :class:`McpError`.

Inputs are the SDK's pydantic models, read through their JSON dump
(MCP wire field names), so this module does not depend on SDK classes.
"""

from __future__ import annotations

import base64
from typing import Any

import orjson

from smith_client.errors import McpError
from smith_client.messages import AssistantMessage, UserMessage
from smith_worker.tools.function import ToolResult, error_result


def _dump(model: Any) -> dict[str, Any]:
    if isinstance(model, dict):
        return model
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _blob_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (ValueError, TypeError):
        return len(data)


def placeholder(kind: str, mime: str | None, size: int | None, uri: str | None = None) -> str:
    """``[image omitted: image/png, 1234 bytes]``-style text for content the model cannot take."""
    parts = [p for p in (mime, f"{size} bytes" if size is not None else None, uri) if p]
    return f"[{kind} omitted{': ' + ', '.join(parts) if parts else ''}]"


def resource_text(contents: dict[str, Any]) -> str:
    """One resource content item (text or blob) as text."""
    if "text" in contents:
        return str(contents["text"])
    blob = contents.get("blob", "")
    return placeholder("binary resource", contents.get("mimeType"), _blob_size(blob), contents.get("uri"))


def block_text(block: dict[str, Any]) -> str:
    """One content block of a tool result as text (see module doc)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "resource":
        return resource_text(block.get("resource") or {})
    if kind == "resource_link":
        return f"[resource link: {block.get('uri')}{' — ' + block['name'] if block.get('name') else ''}]"
    if kind in ("image", "audio"):
        return placeholder(kind, block.get("mimeType"), _blob_size(block.get("data", "")))
    return placeholder(f"{kind or 'unknown'} content", None, None)


def tool_result(result: Any) -> ToolResult:
    """A ``CallToolResult`` as a :class:`ToolResult` (see module doc)."""
    data = _dump(result)
    texts = [block_text(block) for block in data.get("content") or []]
    structured = data.get("structuredContent")
    text = "\n".join(texts)
    if not texts and structured is not None:
        text = orjson.dumps(structured).decode()
    if data.get("isError"):
        return error_result(text or "the MCP tool reported an error")
    return ToolResult(content=text, structured=structured)


def resource_result(result: Any) -> ToolResult:
    """A ``ReadResourceResult`` as a :class:`ToolResult` (see module doc)."""
    contents = _dump(result).get("contents") or []
    if len(contents) == 1:
        return ToolResult(content=resource_text(contents[0]))
    return ToolResult(content="\n\n".join(f"uri: {c.get('uri')}\n{resource_text(c)}" for c in contents))


def prompt_messages(alias: str, name: str, result: Any) -> list[UserMessage | AssistantMessage]:
    """A ``GetPromptResult`` as Smith messages. Raises :class:`McpError` on non-text content."""
    messages: list[UserMessage | AssistantMessage] = []
    for item in _dump(result).get("messages") or []:
        content = item.get("content") or {}
        if content.get("type") != "text":
            raise McpError(
                f"MCP server {alias!r}: prompt {name!r} has {content.get('type')!r} content; "
                "only text prompts are supported",
                server=alias,
            )
        cls = AssistantMessage if item.get("role") == "assistant" else UserMessage
        messages.append(cls(content=str(content.get("text", ""))))
    return messages
