"""MCP results → Smith values, on the SDK's own result types."""

from __future__ import annotations

import base64

import mcp_types as types
import orjson
import pytest

from smith_client.errors import McpError
from smith_client.messages import AssistantMessage, UserMessage
from smith_worker.mcp.server import prompt_messages, resource_result, tool_result

BLOB = base64.b64encode(b"\x00" * 10).decode()


def text(value: str) -> types.TextContent:
    return types.TextContent(type="text", text=value)


def test_text_and_structured_results():
    plain = tool_result(types.CallToolResult(content=[text("a"), text("b")]))
    assert (plain.content, plain.is_error, plain.structured) == ("a\nb", False, None)
    both = tool_result(types.CallToolResult(content=[text('{"n": 1}')], structured_content={"n": 1}))
    assert (both.content, both.structured) == ('{"n": 1}', {"n": 1})
    only_structured = tool_result(types.CallToolResult(content=[], structured_content={"n": 2}))
    assert (only_structured.content, only_structured.structured) == ('{"n":2}', {"n": 2})


def test_is_error_becomes_an_error_result():
    result = tool_result(types.CallToolResult(content=[text("disk full")], is_error=True))
    assert result.is_error and orjson.loads(result.content) == {"error": True, "message": "disk full"}


def test_embedded_resources_and_binary_content():
    result = tool_result(types.CallToolResult(content=[
        text("see"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(uri="r://n", text="body")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="r://b", blob=BLOB, mime_type="application/octet-stream")),
        types.ImageContent(type="image", data=BLOB, mime_type="image/png"),
        types.ResourceLink(type="resource_link", uri="r://l", name="link"),
    ]))
    assert result.content.splitlines() == [
        "see", "body", "[binary resource omitted: application/octet-stream, 10 bytes, r://b]",
        "[image omitted: image/png, 10 bytes]", "[resource link: r://l — link]",
    ]


def test_resource_contents_are_joined_with_uri_headers():
    one = resource_result(types.ReadResourceResult(contents=[types.TextResourceContents(uri="r://1", text="x")]))
    assert one.content == "x"
    two = resource_result(types.ReadResourceResult(contents=[
        types.TextResourceContents(uri="r://1", text="x"),
        types.BlobResourceContents(uri="r://2", blob=BLOB, mime_type="image/png"),
    ]))
    assert two.content == "uri: r://1\nx\n\nuri: r://2\n[binary resource omitted: image/png, 10 bytes, r://2]"


def test_prompts_become_messages_and_non_text_raises():
    result = types.GetPromptResult(messages=[
        types.PromptMessage(role="user", content=text("hi")),
        types.PromptMessage(role="assistant", content=text("hello")),
    ])
    assert prompt_messages("s", "p", result) == [UserMessage(content="hi"), AssistantMessage(content="hello")]
    image = types.GetPromptResult(messages=[types.PromptMessage(
        role="user", content=types.ImageContent(type="image", data=BLOB, mime_type="image/png"))])
    with pytest.raises(McpError) as info:
        prompt_messages("s", "p", image)
    assert info.value.server == "s"
