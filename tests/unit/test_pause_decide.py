"""A turn's pause and its decisions (smith_worker/turn/lua/pause.lua, smith_client/lua/decide.lua) on the
session's real redis-server: fencing, what the pause leaves, first decision wins, the resume's enqueue."""

from __future__ import annotations

import uuid

import orjson
import pytest
import redis.asyncio as aioredis

from smith_client import approvals
from smith_client import turn_record as record
from smith_client.approvals import Decision
from smith_client.errors import NoPendingCallError
from smith_client.eventlog import EventLog
from smith_client.events import PendingItem
from smith_client.jobs import TurnJob
from smith_client.keys import Keys
from smith_client.messages import UserMessage
from smith_client.roundtrip import RoundTrip
from smith_client.runners import AsyncRunner
from smith_client.turns import cancel_turn
from smith_worker.memory.fencing import StaleAttemptError
from smith_worker.turn.attempt import PAUSE_KEPT_AT_MOST, TurnAttempt
from tests.support.queues import waiting_key


@pytest.fixture
async def redis(redis_url):
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def item(call_id: str, index: int = 0) -> PendingItem:
    return PendingItem(call_id=call_id, tool="guarded_delete", kind="approval", step=1, index=index,
                       parameters={"type": "object", "properties": {"target": {"type": "string"}}})  # fmt: skip


async def running(redis, keys: Keys) -> TurnAttempt:
    """A queued turn (with its job payload) taken by a real attempt."""
    turn_id, conversation_id = f"t{uuid.uuid4().hex[:8]}", f"c{uuid.uuid4().hex[:8]}"
    job = TurnJob(turn_id=turn_id, conversation_id=conversation_id, agent="guarded", message=UserMessage(content="x"))
    state = {record.STATUS: record.QUEUED, record.ATTEMPT: 0, record.JOB: job.model_dump_json(),
             record.CONVERSATION_ID: conversation_id}  # fmt: skip
    await redis.hset(keys.turn_state(turn_id), mapping=state)
    await redis.rpush(keys.conversation_turns(conversation_id), turn_id)
    await redis.hset(keys.conversation_statuses(conversation_id), turn_id, record.QUEUED)
    attempt = TurnAttempt(redis, keys, turn_id, conversation_id, "w1", events=EventLog(redis, keys), agent_path=["a"])
    rt = RoundTrip()
    begun = attempt.queue_begin(rt)
    await rt.run(redis)
    assert begun.value == "go"
    return attempt


async def test_a_pause_leaves_no_lease_and_keeps_the_turn_unfinished(redis):
    keys = Keys(f"pz{uuid.uuid4().hex[:6]}")
    attempt = await running(redis, keys)
    turn_id = attempt.turn_id
    result_key = keys.tool_result(turn_id, 1, 1)
    await redis.set(result_key, '{"content":"ran"}', ex=60)
    seq = await attempt.pause([item("call_a")], [result_key], timeout=100.0)
    state = await redis.hgetall(keys.turn_state(turn_id))
    assert state[b"status"] == b"paused" and state[b"lease_until"] == b"0"
    assert await redis.zscore(keys.running, turn_id) is None
    assert not await redis.sismember(keys.worker_turns("w1"), turn_id)
    assert await redis.hget(keys.conversation_statuses(attempt.conversation_id), turn_id) == b"paused"
    assert await redis.lrange(keys.conversation_turns(attempt.conversation_id), 0, -1) == [turn_id.encode()]
    assert PendingItem.model_validate_json(await redis.hget(keys.turn_pending(turn_id), "call_a")) == item("call_a")
    for key in (keys.turn_state(turn_id), keys.turn_pending(turn_id), keys.turn_log(turn_id), result_key):
        assert 100 + keys.turn_ttl - 5 < await redis.ttl(key) <= 100 + keys.turn_ttl  # the timeout + turn_ttl
    assert await redis.zscore(keys.paused, turn_id) is not None
    (_, fields), = await redis.xrange(keys.turn_log(turn_id), f"0-{seq}", f"0-{seq}")
    event = orjson.loads(fields[b"e"])
    assert event["type"] == "turn.paused" and event["data"]["pending"][0]["call_id"] == "call_a"
    # a job reaching the paused turn does not start it; a second pause of the same attempt is fenced off
    rt = RoundTrip()
    again = TurnAttempt(redis, keys, turn_id, attempt.conversation_id, "w2").queue_begin(rt)
    await rt.run(redis)
    assert again.value == "paused"
    with pytest.raises(StaleAttemptError):
        await attempt.pause([item("call_a")], [], timeout=None)


async def test_decisions_first_wins_and_the_last_one_resumes_the_turn(redis):
    keys = Keys(f"pz{uuid.uuid4().hex[:6]}")
    attempt = await running(redis, keys)
    turn_id = attempt.turn_id
    await attempt.pause([item("call_a"), item("call_b", 1)], [], timeout=None)
    kept = await redis.ttl(keys.turn_state(turn_id))  # no timeout: kept until the turn ends, a year at most
    assert PAUSE_KEPT_AT_MOST < kept <= PAUSE_KEPT_AT_MOST + keys.turn_ttl
    runner = AsyncRunner(redis)
    with pytest.raises(NoPendingCallError) as missing:
        await runner.run(approvals.decide(keys, turn_id, "call_z", Decision(action="approve")))
    assert missing.value.pending == ["call_a", "call_b"]
    first = await runner.run(approvals.decide(keys, turn_id, "call_a", Decision(action="reject", message="no")))
    again = await runner.run(approvals.decide(keys, turn_id, "call_a", Decision(action="approve")))
    assert again == first and first.action == "reject"
    assert await redis.hget(keys.turn_state(turn_id), record.STATUS) == b"paused"  # call_b still waits
    assert [p.call_id for p in await runner.run(approvals.pending(keys, turn_id))] == ["call_b"]
    await runner.run(approvals.decide(keys, turn_id, "call_b", Decision(action="approve", arguments={"target": "x"})))
    assert await redis.hget(keys.turn_state(turn_id), record.STATUS) == b"queued"
    assert await redis.zscore(waiting_key(keys), keys.turn_resume_job_id(turn_id, attempt.attempt)) is not None
    assert await redis.zscore(keys.paused, turn_id) is None
    assert await runner.run(approvals.pending(keys, turn_id)) == []


async def test_expiry_rejects_the_undecided_calls_and_cancel_ends_a_paused_turn(redis):
    keys = Keys(f"pz{uuid.uuid4().hex[:6]}")
    runner = AsyncRunner(redis)
    timed = await running(redis, keys)
    await timed.pause([item("call_a"), item("call_b", 1)], [], timeout=0.0)
    await runner.run(approvals.decide(keys, timed.turn_id, "call_a", Decision(action="approve")))
    assert await runner.run(approvals.expire(keys, timed.turn_id))
    decisions = await redis.hgetall(keys.turn_decisions(timed.turn_id))
    assert Decision.model_validate_json(decisions[b"call_a"]).action == "approve"  # a decision made stays
    assert Decision.model_validate_json(decisions[b"call_b"]).message == approvals.APPROVAL_TIMED_OUT
    assert not await runner.run(approvals.expire(keys, timed.turn_id))  # not paused any more
    cancelled = await running(redis, keys)
    await cancelled.pause([item("call_a")], [], timeout=None)
    # a cancel queues the paused turn again, for a worker to answer its calls and end it
    assert await runner.run(cancel_turn(keys, cancelled.turn_id)) == "cancelling"
    state = await redis.hgetall(keys.turn_state(cancelled.turn_id))
    assert state[record.STATUS.encode()] == b"queued" and state[record.CANCEL_REQUESTED.encode()] == b"cancel"
    resume = keys.turn_resume_job_id(cancelled.turn_id, cancelled.attempt)
    assert await redis.zscore(waiting_key(keys), resume) is not None
    assert await redis.zscore(keys.paused, cancelled.turn_id) is None
    with pytest.raises(NoPendingCallError):
        await runner.run(approvals.decide(keys, cancelled.turn_id, "call_a", Decision(action="approve")))


async def test_a_step_that_pauses_again_keeps_its_earlier_decisions(redis):
    """A resumed step whose sub-agent waits for a person anew pauses again (docs/architecture.md, Pausing for
    a person): the call decided before stays decided, only the new call is pending, and its decision resumes."""
    keys = Keys(f"pz{uuid.uuid4().hex[:6]}")
    runner = AsyncRunner(redis)
    first = await running(redis, keys)
    turn_id = first.turn_id
    await first.pause([item("call_a")], [], timeout=None)
    await runner.run(approvals.decide(keys, turn_id, "call_a", Decision(action="approve")))
    resumed = TurnAttempt(redis, keys, turn_id, first.conversation_id, "w2", events=EventLog(redis, keys),
                          agent_path=["a"])  # fmt: skip
    rt = RoundTrip()
    begun = resumed.queue_begin(rt)
    await rt.run(redis)
    assert begun.value == "go"
    await resumed.pause([item("call_a/call_x")], [], timeout=None)
    assert [p.call_id for p in await runner.run(approvals.pending(keys, turn_id))] == ["call_a/call_x"]
    again = await runner.run(approvals.decide(keys, turn_id, "call_a", Decision(action="reject")))
    assert again.action == "approve"  # the first decision stays through the second pause
    assert await redis.hget(keys.turn_state(turn_id), record.STATUS) == b"paused"
    await runner.run(approvals.decide(keys, turn_id, "call_a/call_x", Decision(action="approve")))
    assert await redis.hget(keys.turn_state(turn_id), record.STATUS) == b"queued"
    assert await redis.hlen(keys.turn_decisions(turn_id)) == 2
