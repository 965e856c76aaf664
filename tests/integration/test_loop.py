"""The loop's contract end to end (docs/architecture.md, Agent loop and stop conditions): stop conditions,
hooks, per-turn sampling and stream, tool_choice control, ``message`` events and turn-level LLM errors.

Every test runs a real turn: SmithClient → Redis → the session's turn worker
(``tests.support.app:app``) → the scripted LLM server → tool jobs on the tool worker.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.testing import Reply, Script
from tests.integration.test_turns import collect, of_type

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

ADD = ("add", {"a": 1, "b": 1})


# -- stop conditions ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "agent, reply, operation, model_calls",
    [
        # tree_max_iterations=2 < max_iterations=8: the third step is refused by the tree budget
        ("tree_limited", Reply.tool_calls([ADD]), "tree_max_iterations", 2),
        # 80 + 40 server-reported tokens > max_total_tokens=100: the second step is refused
        ("token_limited", Reply.tool_calls([ADD], usage=(80, 40)), "max_total_tokens", 1),
        # ~0.7 s of streaming (7 frames, 0.1 s apart) > deadline=0.4 s: checked before the second step
        ("deadline_limited", Reply.tool_calls([ADD], delay=0.1), "deadline", 1),
    ],
)
async def test_stop_condition_fails_the_turn_with_turn_cancelled_error(
    client, scenario, scripted_llm, agent, reply, operation, model_calls
):
    key, marker = scenario(Script(reply))  # the same tool-calling reply at every step: only a limit ends it
    events = await collect(client, f"{marker} loop", f"conv-{key}", agent=agent)

    failed = events[-1]
    assert failed.type == "turn.failed"
    error = failed.error()
    assert error.kind == "TurnCancelledError" and error.operation == operation
    assert len(scripted_llm.requests_for(key)) == model_calls
    # limits are checked between steps: the last step's tool round finished and was recorded first
    history = await client.history(f"conv-{key}")
    assert isinstance(history[-1], ToolMessage) and history[-1].content == "2"


async def test_tree_iteration_counter_lives_in_redis_with_a_ttl(client, scenario):
    key, marker = scenario(Script(Reply.tool_calls([ADD])))
    events = await collect(client, f"{marker} loop", f"conv-{key}", agent="tree_limited")
    key = client.keys.tree_iterations(events[0].turn_id)
    assert int(await client.redis.get(key)) == 3  # two model calls plus the refused third step
    assert 0 < await client.redis.ttl(key) <= 24 * 3600


async def test_token_limit_allows_a_turn_within_budget(client, scenario):
    key, marker = scenario(Script(Reply.tool_calls([ADD], usage=(30, 10)), Reply.text("fine", usage=(40, 10))))
    reply = await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="token_limited")
    assert reply.content == "fine"  # 40 tokens before the second step: under the 100-token budget


# -- hooks ----------------------------------------------------------------------------------


async def hook_calls(client) -> Counter:
    return Counter(v.decode() for v in await client.redis.lrange(f"{client.keys.prefix}:test:hooks", 0, -1))


async def test_raising_sync_and_async_hooks_do_not_break_a_turn(client, scenario):
    await client.redis.delete(f"{client.keys.prefix}:test:hooks")
    key, marker = scenario(Script(Reply.tool_calls([ADD]), Reply.text("hooks survived")))
    reply = await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="hooked")

    assert reply.content == "hooks survived"
    # the final answer's on_message fires once its append (which also completes the turn) is done
    deadline = time.monotonic() + 10
    while (calls := await hook_calls(client))["on_message"] < 4 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    # every hook ran (and raised): user + assistant + tool + final assistant messages, one call, one result
    assert calls["on_message"] == 4 and calls["on_tool_call"] == 1 and calls["on_tool_result"] == 1
    assert calls["on_stream_event"] > 0 and calls["on_error"] == 0


async def test_raising_on_error_hook_does_not_hide_the_failure(client, scenario):
    key, marker = scenario(Script(Reply.error(400)))
    events = await collect(client, f"{marker} go", f"conv-{key}", agent="hooked")
    assert events[-1].type == "turn.failed" and events[-1].error().kind == "LlmApiError"
    assert (await hook_calls(client))["on_error"] >= 1


# -- per-turn sampling and stream override ---------------------------------------------------


async def test_per_turn_sampling_and_stream_reach_the_server(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text("sampled")))
    sampling = {"temperature": 0.3, "top_p": 0.9, "max_tokens": 77, "stop": ["END"], "extra": {"top_k": 5}}
    reply = await client.send(f"{marker} hi", conversation_id=f"conv-{key}", agent="plain",
                              sampling=sampling, stream=False)

    assert reply.content == "sampled"
    body = scripted_llm.requests_for(key)[0].body
    assert {k: body[k] for k in ("temperature", "top_p", "max_tokens", "stop", "top_k")} == {
        "temperature": 0.3, "top_p": 0.9, "max_tokens": 77, "stop": ["END"], "top_k": 5,
    }
    assert body["stream"] is False and "stream_options" not in body


async def test_streaming_is_the_default(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text("streamed")))
    events = await collect(client, f"{marker} hi", f"conv-{key}", agent="plain")
    assert scripted_llm.requests_for(key)[0].body["stream"] is True
    assert "".join(e.data["text"] for e in of_type(events, "token")) == "streamed"


@pytest.mark.parametrize(
    "sampling",
    [{"extra": {"model": "someone-else"}}, {"extra": {"stream": False}}, {"temprature": 0.1}],
    ids=["reserved-model", "reserved-stream", "unknown-field"],
)
async def test_bad_sampling_is_refused_by_the_client_and_by_the_worker(client, scenario, scripted_llm, sampling):
    from smith_client import InvalidRequestError
    from smith_client.jobs import TurnJob
    from smith_client.messages import UserMessage
    from smith_client.turns import submit

    key, marker = scenario(Script(Reply.text("never")))
    with pytest.raises(InvalidRequestError) as refused:  # the client checks before enqueueing
        await client.send(f"{marker} hi", conversation_id=f"conv-{key}", agent="plain", sampling=sampling)
    assert refused.value.field == "sampling"
    # a producer that skips the client's checks: the worker refuses it, typed, before any model call
    job = TurnJob(turn_id=f"raw-{key}", conversation_id=f"conv-{key}", agent="plain",
                  message=UserMessage(content=f"{marker} hi"), sampling=sampling)
    await submit(client, job, "enqueue")
    with pytest.raises(Exception) as failed:
        await client.turn(job.turn_id).result(timeout=30)
    assert failed.value.kind == "ConfigurationError" and failed.value.setting.startswith("sampling")
    assert scripted_llm.requests_for(key) == []  # refused before any request was sent


# -- tool_choice control --------------------------------------------------------------------


async def test_named_tool_choice_is_reset_to_auto_after_a_tool_round(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.tool_calls([ADD]), Reply.text("done")))
    await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="named_choice")
    first, second = (request.body for request in scripted_llm.requests_for(key))
    assert first["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert second["tool_choice"] == "auto"


async def test_agent_without_tool_choice_leaves_it_to_the_server(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text("ok")))
    await client.send(f"{marker} go", conversation_id=f"conv-{key}")
    assert "tools" in scripted_llm.requests_for(key)[0].body
    assert "tool_choice" not in scripted_llm.requests_for(key)[0].body


# -- message events -------------------------------------------------------------------------


async def test_every_appended_message_is_published_as_a_message_event(client, scenario):
    key, marker = scenario(Script(Reply.tool_calls([ADD, ("add", {"a": 2, "b": 3})]), Reply.text("2 and 5")))
    events = await collect(client, f"{marker} go", f"conv-{key}")

    published = [e.data["message"] for e in of_type(events, "message")]
    assert [m["role"] for m in published] == ["user", "assistant", "tool", "tool", "assistant"]
    history = await client.history(f"conv-{key}")
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, ToolMessage, AssistantMessage]
    assert published == [m.model_dump(mode="json") for m in history]


# -- LLM errors at the turn level ------------------------------------------------------------


@pytest.mark.parametrize(
    "reply, kind",
    [
        # the stream ends (EOF) before any finish_reason
        (Reply.raw([b'data: {"choices": [{"index": 0, "delta": {"content": "hal"}}]}\n\n']), "ParseError"),
        # an error object inside an HTTP 200 stream
        (Reply.raw([b'data: {"error": {"message": "overloaded", "code": 503}}\n\n']), "LlmApiError"),
        (Reply.raw([b'event: error\ndata: {"message": "bad things"}\n\n']), "LlmApiError"),
        # a non-retried status
        (Reply.error(400), "LlmApiError"),
    ],
    ids=["eof-before-finish", "error-frame", "event-error", "http-400"],
)
async def test_llm_failures_end_the_turn_with_their_typed_error(client, scenario, reply, kind):
    key, marker = scenario(Script(reply))
    events = await collect(client, f"{marker} go", f"conv-{key}", agent="plain")
    assert events[-1].type == "turn.failed" and events[-1].error().kind == kind
