"""One pub/sub connection per client, shared by every turn it follows (issue 18), against a real Redis."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest

from smith_client import SmithClient, SyncSmithClient
from smith_client.events import TokenData, TurnCompletedData

pytestmark = pytest.mark.integration

STREAMS = 20
TOKENS = 30
COMPLETED = TurnCompletedData.model_validate({"message": {"role": "assistant", "content": "x"}})


@pytest.fixture
async def client(redis_url):
    async with SmithClient.from_url(redis_url, prefix=f"fan{uuid.uuid4().hex[:6]}") as client:
        yield client


async def _running(client: SmithClient, turns: list[str]) -> None:
    for turn in turns:  # known, running turns (the followers check the state when the channel is silent)
        await client.redis.hset(client.keys.turn_state(turn), "status", "running")
        await client.redis.expire(client.keys.turn_state(turn), 60)


async def _pubsub_connections(client: SmithClient) -> int:
    return sum(1 for c in await client.redis.client_list() if int(c.get("sub", 0)) > 0 or c.get("flags") == "P")


async def _follow_all(client: SmithClient, turns: list[str]) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = {turn: [] for turn in turns}

    async def one(turn: str) -> None:
        async for event in client.follow(turn, timeout=30):
            seen[turn].append(event.seq)

    await asyncio.gather(*(one(turn) for turn in turns))
    return seen


async def _until(predicate, what: str) -> None:
    async with asyncio.timeout(10):
        while not await predicate():
            await asyncio.sleep(0.01)


async def test_concurrent_streams_share_one_pubsub_connection_and_get_every_event_in_order(client):
    turns = [f"t-fan-{i}-{uuid.uuid4().hex[:6]}" for i in range(STREAMS)]
    await _running(client, turns)
    followers = asyncio.create_task(_follow_all(client, turns))
    channels = [client.keys.turn_events_channel(t) for t in turns]

    async def all_subscribed() -> bool:
        counts = await client.redis.pubsub_numsub(*channels)
        return all(n == 1 for _, n in counts)

    await _until(all_subscribed, "every stream subscribed")
    assert await _pubsub_connections(client) == 1
    for i in range(TOKENS):
        await asyncio.gather(*(client.events.publish(t, TokenData(text=str(i))) for t in turns))
    await asyncio.gather(*(client.events.publish(t, COMPLETED) for t in turns))
    seen = await followers
    assert all(seqs == list(range(1, TOKENS + 2)) for seqs in seen.values()), seen


async def test_killing_the_pubsub_connection_mid_stream_loses_no_event(client):
    turns = [f"t-kill-{i}-{uuid.uuid4().hex[:6]}" for i in range(STREAMS)]
    await _running(client, turns)
    followers = asyncio.create_task(_follow_all(client, turns))
    channels = [client.keys.turn_events_channel(t) for t in turns]

    async def all_subscribed() -> bool:
        return all(n == 1 for _, n in await client.redis.pubsub_numsub(*channels))

    await _until(all_subscribed, "every stream subscribed")
    for i in range(TOKENS):
        if i == TOKENS // 2:
            killed = await client.redis.execute_command("CLIENT KILL TYPE pubsub")
            assert killed >= 1
        await asyncio.gather(*(client.events.publish(t, TokenData(text=str(i))) for t in turns))
    await _until(all_subscribed, "every stream subscribed again")  # events from here on arrive live
    await asyncio.gather(*(client.events.publish(t, COMPLETED) for t in turns))
    seen = await followers
    assert all(seqs == list(range(1, TOKENS + 2)) for seqs in seen.values()), seen
    assert await _pubsub_connections(client) <= 1
