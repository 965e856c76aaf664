"""One pub/sub connection per client, shared by every turn it follows, against a real Redis."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from smith_client import SmithClient, SyncSmithClient
from smith_client.events import TokenData, TurnCompletedData
from smith_client.fanout import AsyncFanout
from smith_worker.local.processes import ManagedProcess, start_redis_server

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


async def _pubsub_ids(client: SmithClient) -> set[str]:
    return {c["id"] for c in await client.redis.client_list() if int(c.get("sub", 0)) > 0 or c.get("flags") == "P"}


async def _kill_new_pubsub(client: SmithClient, others: set[str]) -> None:
    """CLIENT KILL the pub/sub connections opened since ``others`` (not other tests' workers')."""
    mine = await _pubsub_ids(client) - others
    assert mine
    for connection in mine:
        await client.redis.execute_command("CLIENT KILL ID", connection)


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
    others = await _pubsub_ids(client)  # other tests' workers share this redis-server
    followers = asyncio.create_task(_follow_all(client, turns))
    channels = [client.keys.turn_events_channel(t) for t in turns]

    async def all_subscribed() -> bool:
        counts = await client.redis.pubsub_numsub(*channels)
        return all(n == 1 for _, n in counts)

    await _until(all_subscribed, "every stream subscribed")
    assert len(await _pubsub_ids(client) - others) == 1
    for i in range(TOKENS):
        await asyncio.gather(*(client.events.publish(t, TokenData(text=str(i))) for t in turns))
    await asyncio.gather(*(client.events.publish(t, COMPLETED) for t in turns))
    seen = await followers
    assert all(seqs == list(range(1, TOKENS + 2)) for seqs in seen.values()), seen


async def test_killing_the_pubsub_connection_mid_stream_loses_no_event(client):
    turns = [f"t-kill-{i}-{uuid.uuid4().hex[:6]}" for i in range(STREAMS)]
    await _running(client, turns)
    others = await _pubsub_ids(client)
    followers = asyncio.create_task(_follow_all(client, turns))
    channels = [client.keys.turn_events_channel(t) for t in turns]

    async def all_subscribed() -> bool:
        return all(n == 1 for _, n in await client.redis.pubsub_numsub(*channels))

    await _until(all_subscribed, "every stream subscribed")
    for i in range(TOKENS):
        if i == TOKENS // 2:
            await _kill_new_pubsub(client, others)
        await asyncio.gather(*(client.events.publish(t, TokenData(text=str(i))) for t in turns))
    await _until(all_subscribed, "every stream subscribed again")  # events from here on arrive live
    await asyncio.gather(*(client.events.publish(t, COMPLETED) for t in turns))
    seen = await followers
    assert all(seqs == list(range(1, TOKENS + 2)) for seqs in seen.values()), seen


async def test_sync_client_threads_share_one_pubsub_connection_and_survive_a_kill(client, redis_url):
    turns = [f"t-sync-{i}-{uuid.uuid4().hex[:6]}" for i in range(STREAMS)]
    await _running(client, turns)
    others = await _pubsub_ids(client)
    seen: dict[str, list[int]] = {turn: [] for turn in turns}
    with SyncSmithClient.from_url(redis_url, prefix=client.keys.prefix) as sync_client:

        def one(turn: str) -> None:
            seen[turn].extend(event.seq for event in sync_client.follow(turn, timeout=30))

        threads = [threading.Thread(target=one, args=(turn,)) for turn in turns]
        for thread in threads:
            thread.start()
        channels = [client.keys.turn_events_channel(t) for t in turns]

        async def all_subscribed() -> bool:
            return all(n == 1 for _, n in await client.redis.pubsub_numsub(*channels))

        await _until(all_subscribed, "every stream subscribed")
        assert len(await _pubsub_ids(client) - others) == 1
        for i in range(TOKENS):
            if i == TOKENS // 2:
                await _kill_new_pubsub(client, others)
            await asyncio.gather(*(client.events.publish(t, TokenData(text=str(i))) for t in turns))
        await _until(all_subscribed, "every stream subscribed again")
        await asyncio.gather(*(client.events.publish(t, COMPLETED) for t in turns))
        await asyncio.to_thread(lambda: [thread.join() for thread in threads])
    assert all(seqs == list(range(1, TOKENS + 2)) for seqs in seen.values()), seen


async def test_a_burst_is_handed_to_followers_message_by_message(client):
    """With several streams followed, the reader lets a follower take each message before it parses the
    next: when 50 streams' events arrive in one read, the first is not held back until the whole burst
    is routed."""
    fanout = AsyncFanout(client.redis)
    subscription = fanout.open()
    channel = f"{client.keys.prefix}:burst"
    await subscription.subscribe(channel)
    other = fanout.open()  # a second stream followed: the reader hands messages over one by one
    await other.subscribe(f"{client.keys.prefix}:quiet")
    try:
        async with client.redis.pipeline(transaction=False) as pipe:
            for i in range(3):
                pipe.publish(channel, str(i))
            assert await pipe.execute() == [1, 1, 1]
        time.sleep(0.05)  # noqa: ASYNC251  # all three are in the socket's buffer before the reader wakes
        first = await subscription.receive(5)
        left_behind = subscription.queue.qsize()
        assert first is not None and first["data"] == b"0"
        assert left_behind == 0  # the reader had not routed the next two yet
        assert [(await subscription.receive(5) or {}).get("data") for _ in range(2)] == [b"1", b"2"]
    finally:
        await subscription.close()
        await other.close()
        await fanout.aclose()




async def test_followers_come_and_go_while_redis_is_killed_and_restarted(tmp_path):
    """Followers subscribing and closing while the shared connection's Redis is SIGKILLed and started
    again on its port (5 times) never fail with another error than Redis's own: only the fan-out reconnects (two
    tasks reconnecting one connection read its socket at once, and asyncio raises RuntimeError), and a
    channel followed throughout is subscribed again and gets its messages."""
    server, url = start_redis_server(log_path=tmp_path / "redis.log")
    servers = [server]  # each start on the port, all stopped at the end whatever happens
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        await _churn_through_restarts(url, port, servers, tmp_path)
    finally:
        for server in servers:
            server.stop()


async def _churn_through_restarts(url: str, port: int, servers: list[ManagedProcess], tmp_path: Path) -> None:
    async with SmithClient.from_url(url, prefix="churn") as client:
        fanout = client.runner.fanout
        keeper = fanout.open()  # one follower throughout: the reader keeps running and reconnecting
        await keeper.subscribe("churn:keeper")
        stop = asyncio.Event()

        async def churn(n: int) -> int:
            rounds = 0
            while not stop.is_set():
                subscription = fanout.open()
                with contextlib.suppress(RedisError):  # Redis's own: it is down
                    await subscription.subscribe(f"churn:{n}-{rounds % 3}")
                await asyncio.sleep(0.002 * (n % 5))
                await subscription.close()
                rounds += 1
            return rounds

        churners = [asyncio.create_task(churn(n)) for n in range(20)]
        try:
            for _ in range(5):
                await asyncio.sleep(0.3)
                servers[-1].signal(signal.SIGKILL)
                await asyncio.to_thread(servers[-1].stop)  # reaped
                await asyncio.sleep(0.5)
                servers.append(start_redis_server(port, log_path=tmp_path / "redis.log")[0])
        finally:
            stop.set()
            rounds = await asyncio.gather(*churners)
        try:
            assert min(rounds) > 3
            await _until(lambda: _numsub(client, "churn:keeper"), "the kept channel subscribed again")
            assert await client.redis.publish("churn:keeper", "after") == 1
            while (message := await keeper.receive(5)) is None:
                pass  # gaps from the restarts
            assert message["data"] == b"after"
            assert fanout.connections == 1
        finally:
            await keeper.close()


async def test_followers_waiting_on_a_failing_connect_share_its_error():
    """Five streams opened at once while Redis does not answer make one connect attempt, not five in turn:
    the followers that waited for it get its error (with Redis unreachable, each waiter retrying after the
    one before would fail one connect-with-retries apart). The server here accepts and never answers."""
    accepted: list[asyncio.StreamWriter] = []
    server = await asyncio.start_server(lambda _reader, writer: accepted.append(writer), "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
    try:
        async with SmithClient.from_url(url, prefix="silent", socket_timeout=0.3) as client:
            fanout = client.runner.fanout
            errors = await asyncio.gather(*(fanout.open().subscribe(f"c{i}") for i in range(5)),
                                          return_exceptions=True)
            assert [type(error) for error in errors] == [RedisTimeoutError] * 5, errors
            assert len(accepted) == 1  # (retries of the one attempt would add to it, each waiter's to five)
            await asyncio.sleep(0.01)
            with pytest.raises(RedisTimeoutError):  # a later follower tries again
                await fanout.open().subscribe("later")
            assert len(accepted) == 2
    finally:
        server.close()


async def _numsub(client: SmithClient, channel: str) -> bool:
    return dict(await client.redis.pubsub_numsub(channel)).get(channel.encode(), 0) == 1
