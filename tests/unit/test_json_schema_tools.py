"""json_schema tool calling: request rewriting, the incremental answer scanner, reply mapping."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_client.errors import ConfigurationError, ParseError
from smith_client.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from smith_worker.llm.client import LlmClient
from smith_worker.llm.json_schema_tools import AnswerScanner, JsonReplyReader, decode_reply, reply_schema, wire_messages
from smith_worker.llm.types import (
    LlmClientConfig,
    LlmRequest,
    SamplingParams,
    StreamFinished,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
    ToolSchema,
)
from smith_worker.testing import Reply, ScriptedLlmServer, native_tool_fields, without_native_tools

ADD = ToolSchema(name="add", description="Add.", parameters={"type": "object", "properties": {"a": {"type": "integer"}}})
NOW = ToolSchema(name="now", description="The time.")


def forms(schema: dict) -> list[str]:
    return [next(iter(s["properties"])) for s in schema.get("anyOf", [schema])]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", ["tool_call", "tool_calls", "answer"]),
        (None, ["tool_call", "tool_calls", "answer"]),
        ("required", ["tool_call", "tool_calls"]),
        ("none", ["answer"]),
        ({"type": "function", "function": {"name": "now"}}, ["tool_call"]),
    ],
)
def test_tool_choice_selects_the_reply_forms(choice, expected):
    schema = reply_schema([ADD, NOW], choice)
    assert forms(schema) == expected
    if isinstance(choice, dict):  # exactly one call of the named tool
        assert schema["properties"]["tool_call"]["properties"]["name"] == {"const": "now"}
    elif "tool_call" in expected:
        calls = schema["anyOf"][0]["properties"]["tool_call"]["anyOf"]
        assert [c["properties"]["name"]["const"] for c in calls] == ["add", "now"]
        assert calls[0]["properties"]["arguments"] == ADD.parameters


def test_named_tool_choice_must_name_an_offered_tool():
    with pytest.raises(ConfigurationError):
        reply_schema([ADD], {"type": "function", "function": {"name": "missing"}})


def test_history_goes_out_without_tool_fields():
    history = [
        SystemMessage(content="sys"),
        UserMessage(content="hi"),
        AssistantMessage(tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1}), ToolCall(id="c2", name="now")]),
        ToolMessage(tool_call_id="c1", name="add", content="1"),
        ToolMessage(tool_call_id="c2", name="now", content="boom", is_error=True),
        AssistantMessage(content="done"),
    ]
    out = wire_messages(history, "TOOLS")
    assert out[0] == SystemMessage(content="sys\n\nTOOLS")
    assert json.loads(out[2].content) == {"tool_calls": [{"name": "add", "arguments": {"a": 1}},
                                                        {"name": "now", "arguments": {}}]}
    assert isinstance(out[3], UserMessage)
    assert json.loads(out[3].content) == {"tool_results": [{"name": "add", "content": "1"},
                                                          {"name": "now", "content": "boom", "is_error": True}]}
    assert out[4] == AssistantMessage(content="done") and len(out) == 5
    assert isinstance(wire_messages([UserMessage(content="x")], "T")[0], SystemMessage)


def test_body_has_no_tools_and_one_response_format():
    client = LlmClient(LlmClientConfig(base_url="http://127.0.0.1:9/v1", model="m", tool_calling="json_schema"))
    body = client.build_body(LlmRequest(messages=[UserMessage(content="q")], tools=[ADD], tool_choice="required"),
                             stream=True)
    assert "tools" not in body and "tool_choice" not in body
    assert body["response_format"]["type"] == "json_schema"
    assert forms(body["response_format"]["json_schema"]["schema"]) == ["tool_call", "tool_calls"]
    conflicting = LlmRequest(messages=[UserMessage(content="q")], tools=[ADD],
                             sampling=SamplingParams(response_format={"type": "json_object"}))
    with pytest.raises(ConfigurationError):
        client.build_body(conflicting, stream=False)


def scan(pieces: list[str]) -> str:
    scanner = AnswerScanner()
    return "".join(scanner.feed(piece) for piece in pieces)


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]


@settings(max_examples=300, deadline=None)
@given(answer=st.text(), ascii_only=st.booleans(), indent=st.sampled_from([None, 2]),
       cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_scanner_streams_exactly_the_answer_text_at_any_chunking(answer, ascii_only, indent, cuts):
    raw = json.dumps({"answer": answer}, ensure_ascii=ascii_only, indent=indent)
    assert scan(split(raw, cuts)) == answer == decode_reply(raw).content


def test_scanner_ignores_strings_elsewhere_in_the_reply():
    raw = '{"tool_call": {"name": "answer", "arguments": {"answer": "no \\" leak"}}}'
    assert scan(list(raw)) == ""
    assert scan([' {"note": "x", "answer": "ok\\u00e9\\ud83d\\ude00"}']) == "oké😀"


def test_plain_text_replies_pass_through():
    assert scan(["  Hello", " {world}"]) == "  Hello {world}"
    assert decode_reply("  Hello") .content == "  Hello"


def test_decode_reply_maps_calls_and_rejects_malformed_replies():
    one = decode_reply('{"tool_call": {"name": "add", "arguments": {"a": 2}}}')
    assert [(c.name, c.arguments) for c in one.tool_calls] == [("add", {"a": 2})] and one.tool_calls[0].id
    many = decode_reply('{"tool_calls": [{"name": "add", "arguments": "{\\"a\\": 1}"}, {"name": "now"}]}')
    assert [(c.name, c.arguments) for c in many.tool_calls] == [("add", {"a": 1}), ("now", {})]
    for bad in ('{"tool_call": {"arguments": {}}}', '{"other": 1}', '{"tool_call": '):
        with pytest.raises(ParseError):
            decode_reply(bad)


def test_an_answer_cut_short_keeps_the_streamed_text():
    scanner = AnswerScanner()
    raw = '{"answer": "partial ans'
    assert scanner.feed(raw) == "partial ans"
    assert decode_reply(raw, scanner).content == "partial ans"


@pytest.fixture(scope="module")
def refusing_server():
    with ScriptedLlmServer() as server:
        yield server


@pytest.mark.parametrize("stream", [True, False])
async def test_client_maps_a_json_reply_to_tool_calls_streamed_and_not(refusing_server, stream):
    refusing_server.add_scenario("calls", without_native_tools(lambda _request: Reply.text(
        '{"tool_calls": [{"name": "add", "arguments": {"a": 1}}, {"name": "now", "arguments": {}}]}', chunk_size=5)))
    config = LlmClientConfig(base_url=refusing_server.base_url, model="m", tool_calling="json_schema", max_retries=0)
    request = LlmRequest(messages=[UserMessage(content="[[scenario:calls]] go"),
                                   AssistantMessage(tool_calls=[ToolCall(id="c0", name="now")]),
                                   ToolMessage(tool_call_id="c0", name="now", content="noon")], tools=[ADD, NOW])
    events: list = []
    async with LlmClient(config) as client:
        response = await (client.complete_stream(request, events.append) if stream else client.complete(request))
    assert not native_tool_fields(refusing_server.requests_for("calls")[-1])
    calls = response.message.tool_calls
    assert [c.name for c in calls] == ["add", "now"] and response.finish_reason == "tool_calls"
    assert response.message.content == ""
    if stream:
        assert not [e for e in events if isinstance(e, StreamTokenDelta)]
        assert [type(e) for e in events] == [StreamToolCallStarted] * 2 + [StreamToolCallCompleted] * 2 + [StreamFinished]
        assert [e.id for e in events[:2]] == [c.id for c in calls]  # the events and the response agree
        assert events[-1].finish_reason == "tool_calls" and events[-1].usage is not None


async def test_reader_without_tools_in_the_request_is_not_used(refusing_server):
    refusing_server.add_scenario("plain", without_native_tools(lambda _request: Reply.text('{"answer": "raw"}')))
    config = LlmClientConfig(base_url=refusing_server.base_url, model="m", tool_calling="json_schema")
    async with LlmClient(config) as client:  # no tools offered: the text is the model's own, JSON or not
        response = await client.complete(LlmRequest(messages=[UserMessage(content="[[scenario:plain]]")]))
    assert response.message.content == '{"answer": "raw"}'
    assert "response_format" not in refusing_server.requests_for("plain")[-1].body
    assert JsonReplyReader().finish(response).message.content == "raw"
