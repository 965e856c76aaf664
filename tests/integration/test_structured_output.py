"""Structured output end to end (docs/architecture.md, Structured output): real worker processes serving
``tests.support.output_app``, a real Redis, the scripted chat-completions server recording the requests."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from smith_client import (
    AssistantMessage,
    OutputMessage,
    OutputValidationError,
    SmithClient,
    SyncSmithClient,
    ToolMessage,
    UserMessage,
)
from smith_worker.agent.output import OUTPUT_TOOL, RETRY_HEADER
from smith_worker.testing import Reply, Script, native_tool_fields, without_native_tools, worker_env, worker_pair
from tests.conftest import LOGS
from tests.support.output_app import City

pytestmark = pytest.mark.integration

PARIS = {"name": "Paris", "population": 2102650}
NAMED_OUTPUT_TOOL = {"type": "function", "function": {"name": OUTPUT_TOOL}}


@pytest.fixture(scope="module")
async def output_prefix(redis_url, scripted_llm):
    prefix = f"out{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    async with worker_pair("tests.support.output_app:app", redis_url, prefix, env, log_dir=LOGS):
        yield prefix


@pytest.fixture
async def client(redis_url, output_prefix):
    async with SmithClient.from_url(redis_url, prefix=output_prefix) as c:
        yield c


def by_attempt(*replies: Reply):
    """A handler answering the scenario's n-th request with ``replies[n - 1]`` (the last one repeating): a retry
    sent as a user message starts a new step 0, so steps cannot tell the answers apart."""
    return lambda request: replies[min(request.attempt, len(replies)) - 1]


async def turn_events(client, turn_id):
    return [e async for e in client.follow(turn_id, timeout=30)]


async def test_response_format_answer_parses_into_the_callers_model(client, scenario, scripted_llm, redis_url):
    key, marker = scenario(Script(Reply.text(json.dumps(PARIS), chunk_size=5)))
    turn_id = f"turn-{key}"
    message = await client.send(
        f"{marker} The capital of France?", conversation_id=f"conv-{key}", agent="city_rf", turn_id=turn_id,
        output_type=City, timeout=30,
    )
    assert isinstance(message, OutputMessage) and message.output == City(**PARIS)
    assert json.loads(message.content) == PARIS

    (request,) = scripted_llm.requests_for(key)
    assert request.body["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "City", "schema": City.model_json_schema()},
    }
    assert "tools" not in request.body
    events = await turn_events(client, turn_id)
    assert events[-1].type == "turn.completed" and events[-1].data["output"] == PARIS

    def send_sync():  # the blocking client parses alike
        with SyncSmithClient.from_url(redis_url, prefix=client.keys.prefix) as sync:
            return sync.send(f"{marker} Again?", conversation_id=f"conv-{key}", agent="city_rf", output_type=City)

    again = await asyncio.to_thread(send_sync)
    assert isinstance(again, OutputMessage) and again.output == City(**PARIS)
    plain = await client.send(f"{marker} Once more?", conversation_id=f"conv-{key}", agent="city_rf", timeout=30)
    assert type(plain) is AssistantMessage and json.loads(plain.content) == PARIS  # no output_type: the message
    later = await client.turn(turn_id).result(timeout=30, output_type=City)  # from the turn's state
    assert isinstance(later, OutputMessage) and later.output == City(**PARIS)


async def test_tool_path_ends_the_turn_without_a_tool_job(client, scenario, scripted_llm):
    key, marker = scenario(Script(
        Reply.tool_calls([("add", {"a": 2, "b": 3})]),
        Reply.tool_calls([(OUTPUT_TOOL, {"name": "Paris", "population": 2102650})]),
    ))
    turn_id = f"turn-{key}"
    message = await client.send(
        f"{marker} Paris?", conversation_id=f"conv-{key}", agent="city_tool", turn_id=turn_id, output_type=City,
        timeout=30,
    )
    assert message.output == City(**PARIS) and not message.tool_calls

    first, second = scripted_llm.requests_for(key)
    tools = {tool["function"]["name"]: tool["function"] for tool in first.body["tools"]}
    assert set(tools) == {"add", OUTPUT_TOOL} and tools[OUTPUT_TOOL]["parameters"] == City.model_json_schema()
    assert first.body["tool_choice"] == second.body["tool_choice"] == "required"
    assert "response_format" not in first.body

    events = await turn_events(client, turn_id)
    assert events[-1].data["output"] == PARIS
    assert [e.data["name"] for e in events if e.type == "tool_call.completed"] == ["add"]  # final_result: no event
    assert [e.data["name"] for e in events if e.type == "tool.result"] == ["add"]  # and no tool job
    history = await client.history(f"conv-{key}")
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    assert json.loads(history[-1].content) == PARIS and not history[-1].tool_calls


async def test_an_invalid_answer_is_sent_back_with_its_errors(client, scenario, scripted_llm):
    key, marker = scenario(by_attempt(
        Reply.text(json.dumps({"name": "Paris", "population": "lots"})),
        Reply.text(json.dumps(PARIS)),
    ))
    message = await client.send(
        f"{marker} Paris?", conversation_id=f"conv-{key}", agent="city_rf", output_type=City, timeout=30
    )
    assert message.output == City(**PARIS)

    first, second = scripted_llm.requests_for(key)
    invalid, feedback = second.messages[-2:]
    assert invalid == {"role": "assistant", "content": json.dumps({"name": "Paris", "population": "lots"})}
    assert feedback["role"] == "user" and feedback["content"].startswith(RETRY_HEADER)
    assert "population: Input should be a valid integer" in feedback["content"]
    assert second.body["response_format"] == first.body["response_format"]
    history = await client.history(f"conv-{key}")
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]


async def test_an_invalid_final_result_call_gets_an_error_tool_message(client, scenario, scripted_llm):
    key, marker = scenario(Script(
        Reply.tool_calls([(OUTPUT_TOOL, {"name": "Paris"})]),
        Reply.tool_calls([(OUTPUT_TOOL, PARIS)]),
    ))
    message = await client.send(
        f"{marker} Paris?", conversation_id=f"conv-{key}", agent="city_tool", output_type=City, timeout=30
    )
    assert message.output == City(**PARIS)
    _, second = scripted_llm.requests_for(key)
    answer = second.messages[-1]
    assert answer["role"] == "tool" and answer["tool_call_id"] == second.messages[-2]["tool_calls"][0]["id"]
    error = json.loads(answer["content"])
    assert error["error"] is True and "population: Field required" in error["message"]


async def test_the_turn_fails_typed_after_output_retries(client, scenario, scripted_llm):
    key, marker = scenario(by_attempt(Reply.text("Paris, about two million people.")))
    with pytest.raises(OutputValidationError) as failed:
        await client.send(f"{marker} Paris?", conversation_id=f"conv-{key}", agent="city_rf", timeout=30)
    assert failed.value.retries == 2 and failed.value.errors[0].startswith("<root>: the answer is not JSON")
    assert scripted_llm.attempts(key) == 3  # the answer, then output_retries (2) retries
    assert all(r.messages[-1]["content"].startswith(RETRY_HEADER) for r in scripted_llm.requests_for(key)[1:])

    key, marker = scenario(by_attempt(Reply.text('{"answer": "forty-two"}')))  # a JSON Schema, one retry
    with pytest.raises(OutputValidationError) as failed:
        await client.send(f"{marker} 6*7?", conversation_id=f"conv-{key}", agent="answer_prompted", timeout=30)
    assert failed.value.retries == 1 and failed.value.errors == ["answer: 'forty-two' is not of type 'integer'"]
    assert scripted_llm.attempts(key) == 2


async def test_prompted_json_schema_output(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text('```json\n{"answer": 42}\n```')))
    turn_id = f"turn-{key}"
    message = await client.send(
        f"{marker} 6*7?", conversation_id=f"conv-{key}", agent="answer_prompted", turn_id=turn_id, timeout=30
    )
    assert message.content == '{"answer":42}'
    (request,) = scripted_llm.requests_for(key)
    assert request.messages[0]["role"] == "system" and '"answer":{"type":"integer"}' in request.messages[0]["content"]
    assert "response_format" not in request.body and "tools" not in request.body
    assert (await turn_events(client, turn_id))[-1].data["output"] == {"answer": 42}


async def test_json_schema_tool_calling_with_the_output_tool(client, scenario, scripted_llm):
    key, marker = scenario(without_native_tools(Script(
        Reply.text(json.dumps({"tool_call": {"name": "add", "arguments": {"a": 1, "b": 2}}})),
        Reply.text(json.dumps({"tool_call": {"name": OUTPUT_TOOL, "arguments": PARIS}})),
    )))
    message = await client.send(
        f"{marker} Paris?", conversation_id=f"conv-{key}", agent="city_json_tools", output_type=City, timeout=30
    )
    assert message.output == City(**PARIS)
    first, second = scripted_llm.requests_for(key)
    assert not native_tool_fields(first) and not native_tool_fields(second)
    schema = first.body["response_format"]["json_schema"]["schema"]
    forms = {next(iter(s["properties"])) for s in schema["anyOf"]}
    assert forms == {"tool_call", "tool_calls"}  # tool_choice "required": no plain answer
    names = {c["properties"]["name"]["const"] for c in schema["anyOf"][0]["properties"]["tool_call"]["anyOf"]}
    assert names == {"add", OUTPUT_TOOL}


async def test_tool_path_not_streamed(client, scenario, scripted_llm):
    """A non-streamed reply's final_result call publishes no tool_call event either."""
    key, marker = scenario(Script(Reply.tool_calls([(OUTPUT_TOOL, PARIS)])))
    turn_id = f"turn-{key}"
    message = await client.send(
        f"{marker} Paris?", conversation_id=f"conv-{key}", agent="city_tool", turn_id=turn_id, stream=False,
        output_type=City, timeout=30,
    )
    assert message.output == City(**PARIS)
    (request,) = scripted_llm.requests_for(key)
    assert request.body["stream"] is False
    events = await turn_events(client, turn_id)
    assert [e.type for e in events] == ["turn.started", "message", "message", "turn.completed"]
