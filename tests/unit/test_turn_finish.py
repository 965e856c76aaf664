"""A turn ends once: its status and its log's terminal event always agree (lua/finish.lua), on the
session's real redis-server, through TurnExecution's own end paths."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import orjson
import pytest
import redis.asyncio as aioredis

from smith_client import turn_record as record
from smith_client.eventlog import EventLog
from smith_client.events import MessageData, TurnCompletedData
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage
from smith_client.roundtrip import RoundTrip
from smith_worker.memory.history import ConversationStore
from smith_worker.turn.attempt import TurnAttempt
from smith_worker.turn.lifecycle import TurnExecution


@pytest.fixture
async def redis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def running_turn(redis, keys: Keys) -> TurnExecution:
    """A queued turn taken by a real attempt, wrapped in a TurnExecution holding only what its end paths use."""
    turn_id, conversation_id = f"t{uuid.uuid4().hex[:8]}", f"c{uuid.uuid4().hex[:8]}"
    await redis.hset(keys.turn_state(turn_id), mapping={record.STATUS: record.QUEUED, record.ATTEMPT: 0})
    await redis.rpush(keys.conversation_turns(conversation_id), turn_id)
    await redis.hset(keys.conversation_statuses(conversation_id), turn_id, record.QUEUED)
    attempt = TurnAttempt(redis, keys, turn_id, conversation_id, "w1", events=EventLog(redis, keys), agent_path=["a"])
    begin = RoundTrip()
    outcome = attempt.queue_begin(begin)
    await begin.run(redis)
    assert outcome.value == "go"
    execution = object.__new__(TurnExecution)
    execution._lease_lost, execution._cancel_requested = False, False
    execution.rt = SimpleNamespace(
        redis=redis, keys=keys, events=EventLog(redis, keys), metrics=SimpleNamespace(record_turn=lambda *_: None)
    )
    execution.job = SimpleNamespace(turn_id=turn_id, conversation_id=conversation_id, agent="a", tenant=None)
    execution.attempt, execution.agent_path, execution.ctx, execution._started = attempt, ["a"], None, 0.0
    execution.store = ConversationStore(redis, keys, conversation_id)
    return execution


async def terminal_events(redis, keys: Keys, turn_id: str) -> list[str]:
    entries = await redis.xrange(keys.turn_log(turn_id))
    types = [orjson.loads(fields[b"e"])["type"] for _, fields in entries]
    return [t for t in types if t in ("turn.completed", "turn.failed", "turn.cancelled")]


async def test_a_cancel_landing_after_the_turn_completed_leaves_it_completed(redis):
    """The completing write reached Redis but its reply was lost to a caller's cancel of the task: the
    cancel path then ends the same attempt again. It must change nothing (it used to set the status to
    cancelled behind a logged turn.completed)."""
    keys = Keys(f"fin{uuid.uuid4().hex[:6]}")
    execution = await running_turn(redis, keys)
    final = AssistantMessage(content="done")
    await execution._finish(record.COMPLETED, record.RESULT, final.model_dump_json(), TurnCompletedData(message=final))
    await execution._cancelled(None, "user")
    state = await redis.hgetall(keys.turn_state(execution.job.turn_id))
    assert state[record.STATUS.encode()] == b"completed"
    assert record.CANCEL_REQUESTED.encode() not in state
    assert await terminal_events(redis, keys, execution.job.turn_id) == ["turn.completed"]


async def test_an_attempt_handed_back_cannot_end_the_queued_turn(redis):
    """After a hand-off the turn is queued for its next attempt: the old attempt's late end is fenced off."""
    keys = Keys(f"fin{uuid.uuid4().hex[:6]}")
    execution = await running_turn(redis, keys)
    await redis.hset(keys.turn_state(execution.job.turn_id), record.STATUS, record.QUEUED)
    await execution._cancelled(None, "user")
    assert await redis.hget(keys.turn_state(execution.job.turn_id), record.STATUS) == b"queued"
    assert await terminal_events(redis, keys, execution.job.turn_id) == []


async def close(execution: TurnExecution, final: AssistantMessage) -> list[bytes]:
    """The agent loop's close of the turn with ``final`` (lua/complete.lua), in a round trip of its own."""
    rt = RoundTrip()
    closed = execution.attempt.queue_close(rt, final)
    await rt.run(execution.rt.redis)
    return closed.value


async def test_the_close_completes_the_turn_in_one_script(redis):
    keys = Keys(f"fin{uuid.uuid4().hex[:6]}")
    execution = await running_turn(redis, keys)
    turn_id = execution.job.turn_id
    assert await close(execution, AssistantMessage(content="done")) == []
    assert execution.attempt.completed is not None
    state = await redis.hgetall(keys.turn_state(turn_id))
    assert state[record.STATUS.encode()] == b"completed"
    assert orjson.loads(state[record.RESULT.encode()])["content"] == "done"
    assert state[b"inbox_closed"] == b"1"
    assert await terminal_events(redis, keys, turn_id) == ["turn.completed"]
    assert await redis.zscore(keys.running, turn_id) is None


async def test_a_merged_message_waiting_at_the_close_keeps_the_turn_running(redis):
    """A user message merged into the turn after its answer was appended: the close moves it into the
    history and leaves the turn running (it answers it next), with no terminal event."""
    keys = Keys(f"fin{uuid.uuid4().hex[:6]}")
    execution = await running_turn(redis, keys)
    turn_id = execution.job.turn_id
    await redis.rpush(keys.turn_inbox(turn_id), b'{"role":"user","content":"and also"}')
    moved = await close(execution, AssistantMessage(content="done"))
    assert moved == [b'{"role":"user","content":"and also"}'] and execution.attempt.completed is None
    assert await redis.hget(keys.turn_state(turn_id), record.STATUS) == b"running"
    assert await terminal_events(redis, keys, turn_id) == []
    history = await redis.lrange(keys.history(execution.job.conversation_id), 0, -1)
    assert history[-1] == b'{"role":"user","content":"and also"}'


async def test_a_cancel_after_the_close_completed_the_turn_changes_nothing(redis):
    """The close committed; then the task was cancelled (a caller's cancel, in an on_message hook): the
    turn stays completed and ends as completed (counted, its conversation's next turn woken)."""
    keys = Keys(f"fin{uuid.uuid4().hex[:6]}")
    execution = await running_turn(redis, keys)
    turn_id = execution.job.turn_id
    ended: list[str] = []
    execution.rt.metrics = SimpleNamespace(record_turn=lambda agent, status, seconds, tenant: ended.append(status))
    await close(execution, AssistantMessage(content="done"))
    execution._cancel_requested = True
    await execution._after_task_cancelled(None)
    assert await redis.hget(keys.turn_state(turn_id), record.STATUS) == b"completed"
    assert await terminal_events(redis, keys, turn_id) == ["turn.completed"]
    assert ended == ["completed"]  # counted once, as completed (its conversation's next turn woken after)


async def test_the_final_message_and_turn_completed_have_non_decreasing_ts_in_seq_order(redis):
    """As the agent loop ends a turn: the close (its ``turn.completed``) is queued first, the final message's
    event later, and the script sends the message first. Each event's ``ts`` is the Redis server's when it is
    logged, so the log's ts never go back in seq order (docs/architecture.md, Events)."""
    keys = Keys(f"fin{uuid.uuid4().hex[:6]}")
    execution = await running_turn(redis, keys)
    turn_id, final = execution.job.turn_id, AssistantMessage(content="done")
    closing = RoundTrip()
    execution.attempt.queue_close(closing, final)  # built first, as in the loop's last round trip
    await asyncio.sleep(0.002)  # the message's event is built later (it was, by microseconds)
    rt = RoundTrip()
    rt.add(execution.rt.events.publish_many_command(turn_id, [MessageData(message=final.model_dump(mode="json"))],
                                                    ["a"], execution.attempt.attempt, None, lambda seq: seq))  # fmt: skip
    rt.extend(closing)
    await rt.run(redis)
    events = [orjson.loads(fields[b"e"]) for _, fields in await redis.xrange(keys.turn_log(turn_id))]
    assert [e["type"] for e in events] == ["message", "turn.completed"]
    assert [e["seq"] for e in events] == [1, 2]
    assert events[0]["ts"] <= events[1]["ts"]
