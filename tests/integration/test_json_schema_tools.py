"""json_schema tool calling end to end, against a scripted server that refuses native tool fields."""

from __future__ import annotations

import json

import pytest

from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.testing import Reply, Script, native_tool_fields, without_native_tools

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

ANSWER = 'The sum is "40"\n— done ✓'


async def test_json_schema_turn_against_a_server_without_native_tools(client, scenario, scripted_llm):
    key, marker = scenario(without_native_tools(Script(
        Reply.text(json.dumps({"tool_call": {"name": "add", "arguments": {"a": 17, "b": 23}}}, indent=2), chunk_size=4),
        Reply.text(json.dumps({"answer": ANSWER}), chunk_size=3),
    )))
    events = [e async for e in client.stream(f"{marker} what is 17+23?", conversation_id=f"conv-{key}", agent="json_tools")]

    assert events[-1].type == "turn.completed", events[-1].data
    types = [e.type for e in events]
    assert types.index("tool_call.started") < types.index("tool_call.completed") < types.index("tool.result")
    call = next(e.data for e in events if e.type == "tool_call.completed")
    assert call["name"] == "add" and call["arguments"] == {"a": 17, "b": 23}
    result = next(e.data for e in events if e.type == "tool.result")
    assert result["content"] == "40" and result["is_error"] is False and ":tools:" in result["worker"]
    tokens = "".join(e.data["text"] for e in events if e.type == "token")
    assert tokens == ANSWER == events[-1].final_message().content  # the answer's text, no JSON around it

    history = await client.history(f"conv-{key}")
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    assert history[1].tool_calls[0].name == "add" and history[2].tool_call_id == history[1].tool_calls[0].id

    first, second = scripted_llm.requests_for(key)
    assert not native_tool_fields(first) and not native_tool_fields(second)  # nothing was refused
    schema = first.body["response_format"]["json_schema"]["schema"]
    assert {"tool_call", "tool_calls", "answer"} == {next(iter(s["properties"])) for s in schema["anyOf"]}
    assert "add:" in first.messages[0]["content"] and first.messages[0]["role"] == "system"
    wire = second.messages
    assert json.loads(wire[-2]["content"]) == {"tool_call": {"name": "add", "arguments": {"a": 17, "b": 23}}}
    assert wire[-2]["role"] == "assistant"
    assert wire[-1] == {"role": "user", "content": json.dumps({"tool_results": [{"name": "add", "content": "40"}]},
                                                                separators=(",", ":"))}


async def test_the_refusing_server_refuses_native_fields(client, scenario):
    """The scripted server really refuses native tool calling: the same script fails in native mode."""
    _, marker = scenario(without_native_tools(Script(Reply.text("never reached"))))
    events = [e async for e in client.stream(f"{marker} hi", conversation_id="conv-native-refused")]
    assert events[-1].type == "turn.failed"
    assert "unsupported: tools" in events[-1].data["error"]["message"]
