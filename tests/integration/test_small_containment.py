"""Containment, the smaller items, on the shared worker processes: lone surrogates, oversized
``structured`` values, an unreadable turn payload, a failed turn's dangling tool calls,
``after_seq`` bounds, job-id suffixes."""

from __future__ import annotations

import uuid

import orjson
import pytest

from smith_client.errors import InternalError, InvalidRequestError, ParseError
from smith_client.jobs import TurnJob
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_client.turns import submit
from smith_worker.testing import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def run(client, scenario, *replies, agent="contain"):
    key, marker = scenario(Script(*replies))
    handle = await client.submit(f"{marker} go", conversation_id=f"conv-{key}", agent=agent)
    return handle, f"conv-{key}"


async def test_a_lone_surrogate_in_a_tool_result_becomes_the_replacement_character(client, scenario):
    handle, conv = await run(client, scenario, Reply.tool_calls([("lone_surrogate", {})]), Reply.text("read"))
    assert (await handle.result(timeout=20)).content == "read"  # not 15 s of "no tool worker answered"
    [tool] = [m for m in await client.history(conv) if isinstance(m, ToolMessage)]
    assert tool.content == "before \ufffd after" and not tool.is_error
    results = [e for e in [e async for e in handle.events()] if e.type == "tool.result"]
    assert [e.data["content"] for e in results] == ["before \ufffd after"]


async def test_an_oversized_structured_value_is_dropped_but_done_is_kept(client, scenario):
    handle, _ = await run(client, scenario, Reply.tool_calls([("big_structured", {"kib": 300})]),
                          Reply.tool_calls([("big_done", {"kib": 300})]))
    assert (await handle.result(timeout=30)).content == "done big"  # _done/final_message still end the turn
    first = await client.redis.get(client.keys.tool_result(handle.turn_id, 1, 0))
    second = await client.redis.get(client.keys.tool_result(handle.turn_id, 2, 0))
    assert len(first) < 80 * 1024 and orjson.loads(first)["structured"] is None  # content: 64 KiB + marker
    assert orjson.loads(second)["structured"] == {"_done": True, "final_message": "done big"}


async def test_a_payload_the_worker_cannot_validate_fails_its_turn_and_frees_the_conversation(
        client, scenario, monkeypatch):
    key, marker = scenario(Script(Reply.text("next one ran")))
    conv = f"conv-{key}"
    newer = TurnJob(turn_id=f"new-{key}", conversation_id=conv, agent="plain",
                    message=UserMessage(content=f"{marker} from a newer client"))
    from smith_client import turns

    enqueue_call = turns.enqueue_call

    def enqueue_newer(function, payload, **kw):  # a newer client's payload shape
        return enqueue_call(function, {**payload, "stream": "when-convenient"}, **kw)

    with monkeypatch.context() as patch:
        patch.setattr(turns, "enqueue_call", enqueue_newer)
        await submit(client, newer, "enqueue")
    following = await client.submit(f"{marker} then this", conversation_id=conv, agent="plain")
    assert (await following.result(timeout=10)).content == "next one ran"  # not blocked for 24 h
    failed = client.turn(newer.turn_id)
    assert await failed.status() == "failed"
    events = [e async for e in failed.events()]
    assert [e.type for e in events] == ["turn.failed"]
    assert events[0].data["error"]["kind"] == "InvalidRequestError"


async def test_a_failed_turn_answers_its_dangling_tool_calls(client, scenario):
    handle, conv = await run(client, scenario, Reply.tool_calls([("corrupt_result", {}), ("add", {"a": 1, "b": 2})]),
                             Reply.text("never"))
    with pytest.raises((InternalError, ParseError)):
        await handle.result(timeout=30)
    history = await client.history(conv)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, ToolMessage]
    assert [m.tool_call_id for m in history[2:]] == [c.id for c in history[1].tool_calls]
    assert history[2].is_error and "the turn failed" in history[2].content
    assert history[3].content == "3" or "the turn failed" in history[3].content
    assert (await handle.status()) == "failed"


@pytest.mark.parametrize("after_seq", [2**63, 2**70, -1])
async def test_after_seq_out_of_range_is_an_invalid_request(client, after_seq):
    with pytest.raises(InvalidRequestError):
        async for _ in client.turn(f"t-{uuid.uuid4().hex[:6]}").events(after_seq=after_seq):
            pass


async def test_the_largest_after_seq_is_accepted(client, scenario):
    handle, _ = await run(client, scenario, Reply.text("hi"), agent="plain")
    await handle.result(timeout=20)
    assert [e async for e in handle.events(after_seq=2**63 - 1, timeout=2)] == []


async def test_job_id_suffixes_cannot_be_spelled_by_a_caller(client):
    keys = client.keys
    assert keys.turn_rerun_job_id("x", 1) != keys.turn_job_id("x:r1")  # a caller's own turn id "x:r1"
    assert "#" in keys.turn_rerun_job_id("x", 1) and "#" in keys.turn_kick_job_id("x")
    assert "#" in keys.turn_park_job_id("x", 5) and "#" in keys.tool_rerun_job_id("x", 1, 0, 5)
    with pytest.raises(InvalidRequestError):
        await client.submit("hi", conversation_id="c", turn_id="x#r1", agent="plain")
