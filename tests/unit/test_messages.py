"""The message model and its OpenAI wire form."""

import orjson
import pytest

from smith_client.errors import ParseError
from smith_client.messages import (
    AssistantMessage,
    SystemMessage,
    TokenUsage,
    ToolCall,
    ToolMessage,
    UserMessage,
    message_from_json,
    message_to_json,
)
from smith_worker.llm.wire import assistant_from_openai, parse_arguments, to_openai


def test_tool_message_is_error_never_on_the_wire():
    wire = to_openai(ToolMessage(tool_call_id="c1", name="add", content='{"error":true}', is_error=True))
    assert wire == {"role": "tool", "tool_call_id": "c1", "content": '{"error":true}'}


def test_assistant_tool_calls_wire_form_has_json_string_arguments():
    msg = AssistantMessage(tool_calls=[ToolCall(id="c1", name="add", arguments={"a": 1, "b": 2})])
    wire = to_openai(msg)
    assert wire["content"] == ""  # not null: llama-cpp-python rejects null
    call = wire["tool_calls"][0]
    assert call["type"] == "function"
    assert orjson.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}


@pytest.mark.parametrize(
    "message",
    [
        SystemMessage(content="sys"),
        UserMessage(content="héllo"),
        AssistantMessage(content="x", tool_calls=[ToolCall(id="1", name="n", arguments={"k": [1]})],
                         usage=TokenUsage(prompt=1, completion=2, total=3)),
        ToolMessage(tool_call_id="1", name="n", content="r", is_error=True),
    ],
)
def test_stored_form_round_trips(message):
    assert message_from_json(message_to_json(message)) == message


def test_assistant_from_openai_parses_calls_and_usage():
    msg = assistant_from_openai(
        {"content": None, "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
        {"prompt_tokens": 3, "completion_tokens": 4},
    )
    assert msg.tool_calls == [ToolCall(id="a", name="f", arguments={"x": 1})]
    assert msg.usage == TokenUsage(prompt=3, completion=4, total=7)


@pytest.mark.parametrize(
    "payload",
    [None, {"content": 3}, {"tool_calls": [{"id": "a"}]}, {"tool_calls": [{"function": {"arguments": "{}"}}]}],
)
def test_assistant_from_openai_rejects_bad_shapes(payload):
    with pytest.raises(ParseError):
        assistant_from_openai(payload)


def test_parse_arguments_rules():
    assert parse_arguments("") == {}
    assert parse_arguments(None) == {}
    assert parse_arguments({"a": 1}) == {"a": 1}
    with pytest.raises(ParseError) as err:
        parse_arguments('{"a": ', tool_name="f")
    assert err.value.offset > 0
    with pytest.raises(ParseError):
        parse_arguments("[1]")
    with pytest.raises(ParseError):
        parse_arguments(5)


def test_message_from_json_rejects_garbage():
    with pytest.raises(ParseError):
        message_from_json(b"not json")
    with pytest.raises(ParseError):
        message_from_json(b"[1]")
    with pytest.raises(ParseError):
        message_from_json(b'{"role": "robot", "content": "x"}')
