"""Turn lifecycle with the shared workers: idempotent turns, replay, multitask policies, cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator

import orjson
import pytest
from redis.asyncio import Redis

from smith_client import SmithClient, TurnCancelledError
from smith_client.errors import ConflictError, ConversationBusyError, EventsTrimmedError
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.testing import Reply, Script
from tests.support.queues import turn_queue_keys

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


def uid(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


async def test_same_turn_id_ten_times_runs_one_turn(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text("only once", chunk_size=3, delay=0.01)))
    turn_id, conv = uid("turn"), uid("conv")
    replies = await asyncio.gather(*(
        client.send(f"{marker} hi", conversation_id=conv, agent="plain", turn_id=turn_id) for _ in range(10)
    ))
    assert {r.content for r in replies} == {"only once"}
    assert len(scripted_llm.requests_for(key)) == 1  # one model call: one turn ran
    history = await client.history(conv)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage]
    # the same id again, after the end: attaches to the result, runs nothing
    again = await client.send(f"{marker} hi", conversation_id=conv, agent="plain", turn_id=turn_id)
    assert again.content == "only once" and len(scripted_llm.requests_for(key)) == 1
    with pytest.raises(ConflictError):
        await client.send(f"{marker} something else", conversation_id=conv, agent="plain", turn_id=turn_id)


async def test_late_and_reconnecting_subscribers_get_every_event_once(client, scenario):
    gate = threading.Event()
    _, marker = scenario(Script(Reply.text("one two three four five", chunk_size=4, gate=gate)))
    handle = await client.submit(f"{marker} count", conversation_id=uid("conv"), agent="plain")
    seen = []
    events = handle.events()
    async for event in events:
        seen.append(event)
        if event.type == "turn.started":
            break  # disconnect mid-turn (the model is held at its first chunk by the gate)
    await events.aclose()
    gate.set()
    async for event in client.turn(handle.turn_id).events(after_seq=seen[-1].seq):  # reconnect
        seen.append(event)
    assert (await handle.result()).content == "one two three four five"
    late = [e async for e in client.turn(handle.turn_id).events()]  # after the end
    for events in (seen, late):
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert events[-1].type == "turn.completed"
    assert [e.model_dump() for e in seen] == [e.model_dump() for e in late]
    assert await handle.status() == "completed"


async def test_trimmed_events_raise_a_typed_error(client, scenario):
    _, marker = scenario(Script(Reply.text("short")))
    handle = await client.submit(f"{marker} x", conversation_id=uid("conv"), agent="plain")
    await handle.result()
    await client.redis.xtrim(client.keys.turn_log(handle.turn_id), minid="0-3", approximate=False)  # as the cap would
    with pytest.raises(EventsTrimmedError) as err:
        async for _ in handle.events():
            pass
    assert err.value.first_seq == 3
    assert [e.seq for e in await client.events.read(handle.turn_id, after_seq=2)][0] == 3


async def test_enqueue_policy_runs_turns_of_a_conversation_one_after_another(client, scenario):
    conv = uid("conv")
    _, first = scenario(Script(Reply.text("first answer", chunk_size=2, delay=0.03)))
    _, second = scenario(Script(Reply.text("second answer")))
    h1 = await client.submit(f"{first} one", conversation_id=conv, agent="plain")
    h2 = await client.submit(f"{second} two", conversation_id=conv, agent="plain")
    assert (await h2.result(timeout=30)).content
    e1 = [e async for e in h1.events()]
    e2 = [e async for e in h2.events()]
    assert e1[-1].ts <= e2[0].ts  # the second turn started only after the first ended
    history = await client.history(conv)
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[1].content == "first answer"


async def test_reject_policy_refuses_a_second_turn(client, scenario):
    conv = uid("conv")
    gate = threading.Event()
    _, marker = scenario(Script(Reply.text("slow answer", chunk_size=2, gate=gate)))
    h1 = await client.submit(f"{marker} one", conversation_id=conv, agent="plain")
    with pytest.raises(ConversationBusyError) as err:
        await client.submit("two", conversation_id=conv, agent="plain", multitask="reject")
    assert err.value.active_turn_id == h1.turn_id
    gate.set()
    await h1.result(timeout=30)
    ok = await client.submit("three", conversation_id=conv, agent="plain", multitask="reject")
    await ok.result(timeout=30)


async def test_interrupt_policy_cancels_the_running_turn_and_repairs_its_tool_calls(client, scenario):
    conv = uid("conv")
    _, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 20})]), Reply.text("never")))
    h1 = await client.submit(f"{marker} long", conversation_id=conv, agent="durable")
    async for event in h1.events():
        if event.type == "tool_call.completed":
            break
    await asyncio.sleep(0.3)  # let the tool job start
    h2 = await client.submit("new question", conversation_id=conv, agent="plain", multitask="interrupt")
    with pytest.raises(TurnCancelledError) as err:
        await h1.result(timeout=15)
    assert err.value.operation == "interrupt"
    await h2.result(timeout=30)
    history = await client.history(conv)
    # the interrupted turn kept its step and got an answer for its dangling call; then the new turn
    assert [m.role for m in history[:4]] == ["user", "assistant", "tool", "user"]
    assert history[3].content == "new question" and history[-1].role == "assistant"
    assert history[2].is_error and "cancelled" in orjson.loads(history[2].content)["message"]


async def test_merge_policy_steers_the_running_turn(client, scenario, scripted_llm):
    conv = uid("conv")
    gate = threading.Event()
    tool_round, answer = Reply.tool_calls([("add", {"a": 1, "b": 2})], gate=gate), Reply.text("merged reply")
    # by model calls so far (Script counts from the last user message, which the merge moves)
    key, marker = scenario(lambda req: answer if any(m["role"] == "assistant" for m in req.messages) else tool_round)
    h1 = await client.submit(f"{marker} start", conversation_id=conv, agent="default")
    assert await scripted_llm.wait_until_async(lambda: len(scripted_llm.requests_for(key)) == 1, 10)
    h2 = await client.submit("also, say hello", conversation_id=conv, agent="default", multitask="merge")
    assert h2.turn_id == h1.turn_id  # joined the running turn
    gate.set()
    assert (await h1.result(timeout=30)).content == "merged reply"
    second_request = scripted_llm.requests_for(key)[1].messages
    assert {"role": "user", "content": "also, say hello"} in second_request
    assert [m.role for m in await client.history(conv)] == ["user", "assistant", "tool", "user", "assistant"]


async def test_cancel_mid_stream_closes_the_model_connection(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text("tick " * 200, chunk_size=5, delay=0.05)))
    handle = await client.submit(f"{marker} go on", conversation_id=uid("conv"), agent="plain")
    async for event in handle.events():
        if event.type == "token":
            break
    started = time.monotonic()
    assert await handle.cancel() == "cancelling"
    events = [e async for e in handle.events(timeout=10)]
    assert events[-1].type == "turn.cancelled" and events[-1].data["reason"] == "cancel"
    assert time.monotonic() - started < 5  # acceptance: within 1 s; generous ceiling here
    assert await scripted_llm.wait_until_async(lambda: scripted_llm.requests_for(key)[0].closed_early, 5)
    assert await handle.status() == "cancelled"
    with pytest.raises(TurnCancelledError):
        await handle.result()


@contextlib.asynccontextmanager
async def monitored(redis_url: str) -> AsyncIterator[list[str]]:
    """The commands every client and script sends the server meanwhile (MONITOR), as ``NAME arg …`` strings,
    complete once the block has ended."""
    seen: list[str] = []
    end = uid("end-of-monitor")
    redis = Redis.from_url(redis_url)
    try:
        async with redis.monitor() as monitor:

            async def collect() -> None:
                while end not in (command := (await monitor.next_command())["command"]):
                    name, _, rest = command.partition(" ")
                    seen.append(f"{name.upper()} {rest}")

            collecting = asyncio.create_task(collect())
            yield seen
            await redis.echo(end)  # the last command the monitor collects
            await asyncio.wait_for(collecting, 30)
    finally:
        await redis.aclose()


async def test_cancel_mid_tool_aborts_the_tool_job(client, scenario, prefix, redis_url):
    _, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 20})]), Reply.text("never")))
    conv = uid("conv")
    handle = await client.submit(f"{marker} wait", conversation_id=conv, agent="durable")
    marker_key = f"{prefix}:test:slow:{handle.turn_id}"
    for _ in range(100):
        if await client.redis.lrange(marker_key, 0, -1):
            break
        await asyncio.sleep(0.05)
    async with monitored(redis_url) as seen:
        started = time.monotonic()
        await handle.cancel()
        events = [e async for e in handle.events(timeout=10)]
        assert events[-1].type == "turn.cancelled"
        assert time.monotonic() - started < 5
        for _ in range(100):  # the tool worker cancels the job's task at its next poll
            if await client.redis.lrange(marker_key, 0, -1) == [b"started", b"cancelled"]:
                break
            await asyncio.sleep(0.05)
    assert await client.redis.lrange(marker_key, 0, -1) == [b"started", b"cancelled"]
    history = await client.history(conv)
    assert [m.role for m in history] == ["user", "assistant", "tool"]  # no half-written step
    # the abort went through the prefix's abort set (abort.lua's ZADD, the tool worker's check reading it);
    # arq's global one, which every prefix of the database would share, was never named
    requests = {command.split(" ")[0] for command in seen if command.split(" ")[1:2] == [client.keys.abort_set]}
    assert {"ZADD", "ZRANGE", "ZREM"} <= requests, requests
    assert [command for command in seen if Keys.arq_abort_set() in command] == []
    assert not await client.redis.exists(Keys.arq_abort_set())


async def test_cancelling_a_queued_turn_never_runs_it(redis_url):
    async with SmithClient.from_url(redis_url, prefix=uid("idle")) as lonely:  # no worker serves this prefix
        handle = await lonely.submit("later", conversation_id="c", agent="any")
        assert await handle.cancel() == "cancelled_queued"
        assert [e.type for e in await lonely.events.read(handle.turn_id)] == ["turn.cancelled"]
        assert await handle.cancel() == "cancelled"
        await lonely.redis.delete(*turn_queue_keys(lonely.keys))


async def test_a_queued_turn_whose_job_was_lost_is_enqueued_again(client, scenario, monkeypatch):
    from smith_client.jobs import TurnJob
    from smith_client.messages import UserMessage as Msg
    from smith_client.turns import submit

    conv = uid("conv")
    _, lost_marker = scenario(Script(Reply.text("first, recovered")))
    lost = TurnJob(turn_id=uid("lost"), conversation_id=conv, agent="plain", message=Msg(content=f"{lost_marker} a"))
    # the turn exists but its job is lost (a client before the submit script enqueued it died between its two
    # steps, or the job record was flushed): enqueue it on a queue no worker serves, then drop the record
    from smith_client import turns
    from smith_client.keys import Keys

    nowhere = f"{client.keys.turns_queue}:nowhere"

    def to_nowhere(*args, **kwargs):
        return real_enqueue_call(*args, **{**kwargs, "queue": nowhere})

    real_enqueue_call = turns.enqueue_call
    with monkeypatch.context() as patch:
        patch.setattr(turns, "enqueue_call", to_nowhere)
        await submit(client, lost, "enqueue")
    lost_wait = Keys.tenant_waiting(nowhere, None)  # where a turn job waits for admission (fair pickup)
    assert await client.redis.zcard(lost_wait) == 1
    await client.redis.delete(
        Keys.arq_job(client.keys.turn_job_id(lost.turn_id)), lost_wait, Keys.tenant_ring(nowhere), Keys.wake_list(nowhere)
    )
    second = await client.submit("b", conversation_id=conv, agent="plain")
    assert (await second.result(timeout=40)).content == "first, recovered"  # same conversation, same script
    assert (await client.turn(lost.turn_id).result(timeout=5)).content == "first, recovered"


async def test_a_long_queue_on_one_conversation_does_not_block_others(client, scenario):
    gate = threading.Event()
    _, hot_marker = scenario(Script(Reply.text("slow", chunk_size=2, gate=gate)))
    _, cold_marker = scenario(Script(Reply.text("cold answer")))
    hot = uid("hot")
    first = await client.submit(f"{hot_marker} first", conversation_id=hot, agent="plain")
    waiting = await asyncio.gather(*(
        client.submit(f"more {i}", conversation_id=hot, agent="plain") for i in range(150)
    ))  # more than the turn worker's 100 job slots
    await asyncio.sleep(1.0)  # let the worker take (and park) the waiting turns
    reply = await client.send(f"{cold_marker} hi", conversation_id=uid("cold"), agent="plain", timeout=20)
    assert reply.content == "cold answer"
    assert {await h.status() for h in waiting[:20]} == {"queued"}  # parked, not holding slots
    for handle in waiting:
        await handle.cancel()
    gate.set()
    assert (await first.result(timeout=30)).content == "slow"


async def test_cancel_racing_a_finishing_tool_keeps_history_and_result_in_agreement(client, scenario):
    """A cancel that lands as a tool finishes: one outcome wins, and history, result key and events agree."""
    conversations = []

    async def one(i: int) -> None:
        label = uuid.uuid4().hex[:8]
        key, marker = scenario(Script(Reply.tool_calls([("counted", {"label": label, "seconds": 0.35})]),
                                      Reply.text("after")))
        conv = f"conv-{key}"
        handle = await client.submit(f"{marker} go", conversation_id=conv, agent="durable")
        async for event in handle.events():
            if event.type == "tool_call.completed":
                break
        await asyncio.sleep(0.25 + 0.01 * i)  # around the moment the tool finishes
        await handle.cancel()
        conversations.append((conv, handle.turn_id))

    await asyncio.gather(*(one(i) for i in range(20)))
    for conv, turn_id in conversations:
        events = [e async for e in client.turn(turn_id).events(timeout=30)]
        assert events[-1].terminal and [e.type for e in events].count(events[-1].type) == 1
        logged = await client.events.read(turn_id)
        assert logged[-1].terminal  # nothing was published after the terminal event
        tool_message = next(m for m in await client.history(conv) if isinstance(m, ToolMessage))
        stored = await client.redis.get(client.keys.tool_result(turn_id, 1, 0))
        assert orjson.loads(stored)["content"] == tool_message.content  # one outcome, everywhere


async def test_a_merged_message_survives_the_interrupt_of_the_turn_it_joined(client, scenario):
    conv = uid("conv")
    _, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 3})]), Reply.text("never")))
    first = await client.submit(f"{marker} A", conversation_id=conv, agent="durable")
    async for event in first.events():
        if event.type == "tool_call.completed":
            break
    merged = await client.submit("B: also this", conversation_id=conv, agent="durable", multitask="merge")
    assert merged.turn_id == first.turn_id
    third = await client.submit("C: new topic", conversation_id=conv, agent="plain", multitask="interrupt")
    with pytest.raises(TurnCancelledError):
        await merged.result(timeout=30)
    await third.result(timeout=30)
    contents = [m.content for m in await client.history(conv) if isinstance(m, UserMessage)]
    assert contents[1:] == ["B: also this", "C: new topic"]  # kept, in order


async def test_a_follower_never_misses_the_terminal_event_of_a_quick_cancel(client, scenario):
    """The terminal status and event are written together; a follower that sees the status first still yields
    the event (this raced before: the follower stopped one event short)."""
    for _ in range(15):
        _, marker = scenario(Script(Reply.text("tick " * 200, chunk_size=5, delay=0.05)))
        handle = await client.submit(f"{marker} go", conversation_id=uid("conv"), agent="plain")
        async for event in handle.events():
            if event.type == "token":
                break
        await handle.cancel()
        events = [e async for e in handle.events(timeout=10)]
        assert events[-1].type == "turn.cancelled"
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
