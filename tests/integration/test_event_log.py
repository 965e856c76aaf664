"""The event log against a real Redis: atomic seq, replay, gap filling, fencing."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from smith_client.events import TokenData, TurnCancelledData, TurnCompletedData
from smith_client import SmithClient, operations
from smith_client.errors import EventsTrimmedError
from smith_worker.testing import Reply, Script

pytestmark = pytest.mark.integration


@pytest.fixture
async def log_client(redis_url):
    async with SmithClient.from_url(redis_url, prefix=f"log{uuid.uuid4().hex[:6]}") as client:
        yield client


async def test_concurrent_publishers_get_gap_free_unique_seqs(log_client):
    turn = "t-concurrent"
    seqs = await asyncio.gather(*(log_client.events.publish(turn, TokenData(text=str(i))) for i in range(200)))
    assert sorted(seqs) == list(range(1, 201))
    events = await log_client.events.read(turn)
    assert [e.seq for e in events] == list(range(1, 201))
    assert await log_client.redis.ttl(log_client.keys.turn_log(turn)) > 0
    assert await log_client.redis.ttl(log_client.keys.turn_seq(turn)) > 0


class LossyPubSub:
    """A redis-py pub/sub connection that drops every other published message, as a slow or reconnecting
    subscriber may (subscription confirmations pass)."""

    def __init__(self, pubsub):
        self.pubsub = pubsub
        self.count = 0

    def __getattr__(self, name):
        return getattr(self.pubsub, name)

    async def get_message(self, **kwargs):
        while True:
            message = await self.pubsub.get_message(**kwargs)
            if message is None or message["type"] != "message":
                return message
            self.count += 1
            if self.count % 2:
                return message


async def test_follow_fills_gaps_from_the_log(log_client, monkeypatch):
    turn = "t-gaps"
    await log_client.redis.hset(log_client.keys.turn_state(turn), "status", "running")  # a known turn
    await log_client.redis.expire(log_client.keys.turn_state(turn), 60)
    lossy = []
    fanout = log_client.runner.fanout
    plain_pubsub = fanout._open_pubsub

    def lossy_pubsub():
        lossy.append(LossyPubSub(plain_pubsub()))
        return lossy[-1]

    monkeypatch.setattr(fanout, "_open_pubsub", lossy_pubsub)  # what the client's shared connection reads
    # the log is re-read after this long a silence: longer than the test, so only a gap in seq can fill one
    monkeypatch.setattr(operations, "POLL_INTERVAL", 30.0)

    async def publish_all():
        await asyncio.sleep(0.05)
        for i in range(30):
            await log_client.events.publish(turn, TokenData(text=str(i)))
        await log_client.events.publish(turn, TurnCompletedData.model_validate({"message": {"role": "assistant", "content": "x"}}))

    publisher = asyncio.create_task(publish_all())
    started = time.monotonic()
    seen = [e async for e in log_client.turn(turn).events(timeout=10)]
    assert time.monotonic() - started < 15  # each gap filled at once, not by the re-read after 30 s of silence
    await publisher
    assert len(lossy) == 1 and lossy[0].count > 10  # the client's shared connection, and it did lose messages
    assert [e.seq for e in seen] == list(range(1, 32))  # nothing missing, nothing twice
    assert [e.data.get("text") for e in seen[:30]] == [str(i) for i in range(30)]


async def test_fenced_publish_is_dropped_for_a_stale_attempt(log_client):
    turn = "t-fenced"
    state = log_client.keys.turn_state(turn)
    await log_client.redis.hset(state, mapping={"attempt": 2, "status": "running"})
    await log_client.redis.expire(state, 60)
    assert await log_client.events.publish(turn, TokenData(text="old"), attempt=1) == -1
    assert await log_client.events.publish(turn, TokenData(text="new"), attempt=2) == 1
    # once the turn has ended, even its current attempt publishes nothing more
    await log_client.redis.hset(state, "status", "completed")
    assert await log_client.events.publish(turn, TurnCancelledData(reason="late"), attempt=2) == -1
    assert [e.data["text"] for e in await log_client.events.read(turn)] == ["new"]


async def test_expired_log_is_reported_not_silently_empty(log_client):
    turn = "t-expired"
    for _ in range(3):
        await log_client.events.publish(turn, TokenData(text="x"))
    await log_client.redis.delete(log_client.keys.turn_log(turn))
    with pytest.raises(EventsTrimmedError):
        await log_client.events.read(turn, after_seq=1)
    assert await log_client.events.read(turn, after_seq=3) == []


async def test_a_whole_turns_log_has_non_decreasing_ts_in_seq_order(workers, client, scenario):
    """A one-tool turn on the real workers, its events published by the turn worker and the tool worker: in seq
    order, no event's ts is earlier than the one before (the final message and turn.completed included)."""
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]), Reply.text("five", chunk_size=1)))
    handle = await client.submit(f"{marker} add", conversation_id=f"conv-{uuid.uuid4().hex[:8]}")
    assert (await handle.result(timeout=30)).content == "five"
    events = [e async for e in handle.events()]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert {"tool.result", "message", "turn.completed"} <= {e.type for e in events}
    assert [e.type for e in events][-2:] == ["message", "turn.completed"]
    stamps = [e.ts for e in events]
    assert stamps == sorted(stamps), [(e.seq, e.type, e.ts) for e in events]
