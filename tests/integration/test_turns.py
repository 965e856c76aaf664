"""A real turn end to end: SmithClient → Redis → turn worker → scripted LLM → tool job → events."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from arq.constants import in_progress_key_prefix, job_key_prefix

from smith_client import ParseError, SmithClient
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.testing import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def collect(client: SmithClient, text: str, conversation_id: str, **kw) -> list:
    return [event async for event in client.stream(text, conversation_id=conversation_id, **kw)]


def assert_gap_free(events: list) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert len({e.turn_id for e in events}) == 1


def of_type(events: list, type_: str) -> list:
    return [e for e in events if e.type == type_]


@pytest.mark.parametrize("style", ["openai", "llama_cpp"])
async def test_streamed_turn_with_a_tool_job(client, scenario, scripted_llm, style):
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 17, "b": 23})], style=style, split=4),
                                  Reply.text("The answer is 40.", chunk_size=4)))
    events = await collect(client, f"{marker} what is 17+23?", f"conv-{key}")

    assert_gap_free(events)
    types = [e.type for e in events]
    assert types[0] == "turn.started" and types[-1] == "turn.completed"
    assert types.index("tool_call.started") < types.index("tool_call.completed") < types.index("tool.result")
    assert of_type(events, "tool_call.completed")[0].data["arguments"] == {"a": 17, "b": 23}
    result = of_type(events, "tool.result")[0].data
    assert result["content"] == "40" and result["is_error"] is False
    assert ":tools:" in result["worker"]  # ran in the tool worker process, not the turn worker
    assert "".join(e.data["text"] for e in of_type(events, "token")) == "The answer is 40."
    assert events[-1].final_message().content == "The answer is 40."
    assert all(e.agent_path == ["default"] and e.v == 1 for e in events)

    history = await client.history(f"conv-{key}")
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    assert history[1].tool_calls[0].arguments == {"a": 17, "b": 23}
    assert history[2].tool_call_id == history[1].tool_calls[0].id
    # the model's second request carried the tool result, without is_error on the wire
    second = scripted_llm.requests_for(key)[1].messages
    assert second[-1] == {"role": "tool", "tool_call_id": history[2].tool_call_id, "content": "40"}


async def test_a_normal_turn_logs_no_per_job_or_per_request_info_line(client, scenario, workers):
    """At the default INFO level the workers log neither arq's job start/end lines nor httpx's
    ``HTTP Request:`` line (test_secrets.py shows both at DEBUG); other INFO lines stay."""
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    assert (await client.send(f"{marker} 1+2?", conversation_id=f"conv-{key}")).content == "3"
    logs = "\n".join(proc.log_path.read_text(errors="replace") for proc in workers)
    assert "started on queue turns" in logs and "started on queue tools" in logs
    assert "HTTP Request:" not in logs and ":run_turn(…)" not in logs and ":run_tool(…)" not in logs
    assert " ● " not in logs


async def test_send_returns_the_final_message(client, scenario):
    _, marker = scenario(Script(Reply.text("hello there")))
    reply = await client.send(f"{marker} hi", conversation_id="conv-send", agent="plain")
    assert reply == AssistantMessage(content="hello there", usage=reply.usage, finish_reason="stop")
    assert reply.usage is not None and reply.usage.total > 0


async def test_tool_past_its_timeout_is_aborted_and_turn_completes(client, scenario, redis_url, prefix):
    key, marker = scenario(Script(Reply.tool_calls([("sleepy", {"seconds": 30})]), Reply.text("gave up")))
    started = time.monotonic()
    events = await collect(client, f"{marker} nap", f"conv-{key}")
    elapsed = time.monotonic() - started

    assert events[-1].type == "turn.completed" and events[-1].final_message().content == "gave up"
    result = of_type(events, "tool.result")[0].data
    assert result["is_error"] is True
    assert orjson.loads(result["content"])["message"] == "tool 'sleepy' timed out after 1 s"
    assert elapsed < 15  # the 30 s tool was not waited for (timeout 1 s, generous ceiling)
    turn_id = events[0].turn_id
    markers = await client.redis.lrange(f"{prefix}:test:sleepy:{turn_id}", 0, -1)
    assert markers == [b"started", b"cancelled"]  # the tool's task was cancelled on the tool worker
    job_id = client.keys.tool_job_id(turn_id, 1, 0)
    assert not await client.redis.exists(in_progress_key_prefix + job_id, job_key_prefix + job_id)
    assert await client.redis.zscore(client.keys.tools_queue, job_id) is None


async def test_failing_unknown_and_forbidden_tools_become_error_messages(client, scenario):
    key, marker = scenario(Script(
        Reply.tool_calls([("boom", {"reason": "bad day"}), ("nope", {}), ("add", {"a": "x", "b": 1})]),
        Reply.text("handled"),
    ))
    events = await collect(client, f"{marker} go", f"conv-{key}")
    assert events[-1].type == "turn.completed"
    history = await client.history(f"conv-{key}")
    tool_messages = [m for m in history if isinstance(m, ToolMessage)]
    assert [m.name for m in tool_messages] == ["boom", "nope", "add"]  # the order of tool_calls
    assert all(m.is_error for m in tool_messages)
    assert orjson.loads(tool_messages[0].content) == {"error": True, "message": "RuntimeError: bad day"}
    assert orjson.loads(tool_messages[1].content) == {"error": True, "message": "unknown tool: nope"}


async def test_a_tool_raising_tool_error_tells_the_model_its_own_message(client, scenario, scripted_llm):
    key, marker = scenario(Script(
        Reply.tool_calls([("out_of_quota", {"retryable": True}), ("out_of_quota_in_process", {})]),
        Reply.text("handled"),
    ))
    events = await collect(client, f"{marker} go", f"conv-{key}")
    results = [orjson.loads(e.data["content"]) for e in of_type(events, "tool.result")]
    assert all(e.data["is_error"] for e in of_type(events, "tool.result"))
    expected = [
        {"error": True, "message": "the quota is used up", "kind": "ToolError", "tool_name": "out_of_quota",
         "retryable": True},
        {"error": True, "message": "the quota is used up", "kind": "ToolError", "tool_name": "quota",
         "retryable": False},
    ]
    assert sorted(results, key=lambda r: r["tool_name"]) == sorted(expected, key=lambda r: r["tool_name"])
    tool_messages = [m for m in await client.history(f"conv-{key}") if isinstance(m, ToolMessage)]
    assert [orjson.loads(m.content) for m in tool_messages] == expected and all(m.is_error for m in tool_messages)
    sent = scripted_llm.requests_for(key)[1].messages  # what the model saw
    assert [orjson.loads(m["content"]) for m in sent if m["role"] == "tool"] == expected


async def test_parallel_tool_calls_run_concurrently_and_keep_order(client, scenario):
    key, marker = scenario(Script(
        Reply.tool_calls([("add", {"a": 1, "b": 1}), ("whoami", {}), ("add", {"a": 2, "b": 2})]),
        Reply.text("ok"),
    ))
    await client.send(f"{marker} many", conversation_id=f"conv-{key}")
    tool_messages = [m for m in await client.history(f"conv-{key}") if isinstance(m, ToolMessage)]
    assert [m.content for m in (tool_messages[0], tool_messages[2])] == ["2", "4"]
    assert ":tools:" in orjson.loads(tool_messages[1].content)["worker"]


async def test_done_sentinel_ends_the_turn(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.tool_calls([("finish", {"answer": "all done"}), ("add", {"a": 1, "b": 2})]),
                                  Reply.text("never asked")))
    reply = await client.send(f"{marker} finish", conversation_id=f"conv-{key}")
    assert reply.content == "all done"
    assert len(scripted_llm.requests_for(key)) == 1
    tool_messages = [m for m in await client.history(f"conv-{key}") if isinstance(m, ToolMessage)]
    assert [m.content for m in tool_messages][1] == "3"  # every result recorded before finishing


async def test_two_conversations_run_concurrently_without_mixing(client, scenario):
    key_a, marker_a = scenario(Script(Reply.text("alpha " * 20, chunk_size=6, delay=0.05)))
    key_b, marker_b = scenario(Script(Reply.text("bravo " * 20, chunk_size=6, delay=0.05)))
    events_a, events_b = await asyncio.gather(
        collect(client, f"{marker_a} a", f"conv-{key_a}"), collect(client, f"{marker_b} b", f"conv-{key_b}")
    )
    for events, word in ((events_a, "alpha"), (events_b, "bravo")):
        assert_gap_free(events)
        assert "".join(e.data["text"] for e in of_type(events, "token")) == f"{word} " * 20
    # both ran at the same time on the one turn worker: each started before the other ended
    assert events_a[0].ts < events_b[-1].ts and events_b[0].ts < events_a[-1].ts


async def test_invalid_llm_json_fails_the_turn_and_worker_keeps_serving(client, scenario):
    _, marker = scenario(Script(Reply.raw([b'data: {"choices": [{"delta": {"content": "hi"}}\n\n'])))
    with pytest.raises(ParseError):
        await client.send(f"{marker} break", conversation_id="conv-broken", agent="plain")
    _, marker_ok = scenario(Script(Reply.text("still here")))
    reply = await client.send(f"{marker_ok} again", conversation_id="conv-after-broken", agent="plain")
    assert reply.content == "still here"


async def test_max_iterations_stops_the_turn(client, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 1})])))
    events = await collect(client, f"{marker} loop", "conv-limit", agent="limited")
    failed = events[-1]
    assert failed.type == "turn.failed"
    error = failed.error()
    assert error.kind == "TurnCancelledError" and error.operation == "max_iterations"
