"""A client's Redis connections are capped (``max_connections``) and waiting for one is bounded and typed.

Real worker processes (the session's pair), the session's redis-server and the
scripted model server. Connections are counted by Redis itself: the client's
URL names its connections (redis-py's ``client_name`` URL parameter), and
``CLIENT LIST`` is sampled from another connection while the streams run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from smith_client import SmithClient, SyncSmithClient
from smith_client.errors import SmithTimeoutError
from smith_worker.testing import Reply

pytestmark = pytest.mark.integration

STREAMS = 1000
CAP = 20


async def _named_connections(monitor: SmithClient, name: str) -> int:
    return sum(1 for entry in await monitor.redis.client_list() if entry.get("name") == name)


async def _peak(monitor: SmithClient, name: str, stop: asyncio.Event) -> int:
    """The most connections named ``name`` seen at once, sampling until ``stop`` is set."""
    peak = 0
    while not stop.is_set():
        peak = max(peak, await _named_connections(monitor, name))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.05)
    return max(peak, await _named_connections(monitor, name))


async def test_a_thousand_concurrent_streams_all_complete_within_the_connection_cap(
    workers, redis_url, prefix, scenario, scripted_llm
):
    key, marker = scenario(Reply.text("ok", chunk_size=2))
    name = f"pool-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()
    async with (
        SmithClient.from_url(f"{redis_url}?client_name={name}", prefix=prefix, max_connections=CAP) as client,
        SmithClient.from_url(redis_url, prefix=prefix) as monitor,
    ):

        async def one(i: int) -> str:
            events = [e async for e in client.stream(f"{marker} {i}", conversation_id=f"pool-{name}-{i}", timeout=120)]
            return events[-1].type

        sampler = asyncio.create_task(_peak(monitor, name, stop))
        try:
            ends = await asyncio.gather(*(one(i) for i in range(STREAMS)))
        finally:
            stop.set()
            peak = await sampler
    assert ends == ["turn.completed"] * STREAMS
    assert scripted_llm.attempts(key) == STREAMS
    assert 0 < peak <= CAP


async def test_waiting_past_the_pool_timeout_raises_a_typed_timeout(redis_url):
    """Both connections of the pool are held by slow commands (BLPOPs of 2 s); a third command waits 0.3 s."""
    prefix = f"pool{uuid.uuid4().hex[:6]}"
    async with SmithClient.from_url(redis_url, prefix=prefix, max_connections=2, pool_timeout=0.3) as client:
        slow = [asyncio.create_task(client.redis.blpop([f"{prefix}:nothing"], timeout=2)) for _ in range(2)]
        await asyncio.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(SmithTimeoutError) as caught:
            await client.history("c1")
        assert time.monotonic() - started < 1.5  # the wait's bound (0.3 s), before a BLPOP ends
        assert (caught.value.operation, caught.value.budget) == ("redis.pool", 0.3)
        assert await asyncio.gather(*slow) == [None, None]
        assert await client.history("c1") == []  # a connection is free again


def test_the_blocking_client_waits_for_a_connection_as_long_and_as_typed(redis_url):
    prefix = f"pool{uuid.uuid4().hex[:6]}"
    with (
        SyncSmithClient.from_url(redis_url, prefix=prefix, max_connections=2, pool_timeout=0.3) as client,
        ThreadPoolExecutor(2) as threads,
    ):
        slow = [threads.submit(client.redis.blpop, [f"{prefix}:nothing"], timeout=2) for _ in range(2)]
        time.sleep(0.3)
        started = time.monotonic()
        with pytest.raises(SmithTimeoutError) as caught:
            client.history("c1")
        assert time.monotonic() - started < 1.5
        assert caught.value.operation == "redis.pool"
        assert [s.result() for s in slow] == [None, None]
        assert client.history("c1") == []
