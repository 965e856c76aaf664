"""Fair pickup across tenants (docs/architecture.md, Fair pickup): real redis-server, two real turn workers of
8 slots each, the scripted model answering every request after 200 ms.

Each scenario reads when each turn started from its ``turn.started`` event (``ts`` from Redis ``TIME``, so the
workers' and this process's clocks never mix) and compares the order with what the scheduling promises.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from smith_client import SmithClient
from smith_client.keys import Keys
from smith_client.registry import fleet_status
from smith_client.tenants import TenantLimits
from smith_worker.testing import Reply
from tests.support.fleets import turn_workers

pytestmark = pytest.mark.integration

#: Seconds the scripted model takes per response.
LATENCY = 0.2
#: Turn workers and slots per worker.
WORKERS, SLOTS = 2, 8


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm):
    """Two turn workers (8 slots each) on a prefix of their own; yields the prefix."""
    slots = {"SMITH_TURN_MAX_JOBS": str(SLOTS)}
    async with turn_workers(redis_url, scripted_llm.base_url, WORKERS, "fair", **slots) as prefix:
        yield prefix


@pytest.fixture
async def fair_client(redis_url, fleet):
    async with SmithClient.from_url(redis_url, prefix=fleet) as client:
        yield client


def slow_scenario(scenario, delay: float = LATENCY) -> str:
    """A scenario answering every request with a short text taking about ``delay`` seconds; returns its marker."""
    # one content chunk: role, content, finish, usage and [DONE] frames, the delay slept before all but the first
    _, marker = scenario(Reply.text("done", chunk_size=16, delay=delay / 4))
    return marker


async def submit_many(client: SmithClient, marker: str, tenant: str, count: int) -> list[str]:
    """Submit ``count`` one-step turns of ``tenant``, each in a conversation of its own; returns their ids."""
    ids = []
    for _ in range(count):
        handle = await client.submit(f"{marker} hi", conversation_id=uuid.uuid4().hex, agent="plain", tenant=tenant)
        ids.append(handle.turn_id)
    return ids


async def finish(client: SmithClient, turn_ids: list[str], timeout: float = 120) -> None:
    """Wait until every turn of ``turn_ids`` completed."""
    async with asyncio.timeout(timeout):
        for turn_id in turn_ids:
            await client.turn(turn_id).result()


async def spans(client: SmithClient, turn_ids: list[str]) -> dict[str, tuple[float, float]]:
    """Each turn's (started, ended) time in Redis seconds, from its turn.started and turn.completed events."""
    result = {}
    for turn_id in turn_ids:
        events = {e.type: e.ts for e in await client.events.read(turn_id)}
        result[turn_id] = (events["turn.started"], events["turn.completed"])
    return result


async def started_times(client: SmithClient, turn_ids: list[str]) -> list[float]:
    """The turn.started times (Redis seconds) of those of ``turn_ids`` that started."""
    starts = []
    for turn_id in turn_ids:
        starts += [e.ts for e in await client.events.read(turn_id) if e.type == "turn.started"]
    return starts


async def redis_now(client: SmithClient) -> float:
    seconds, micros = await client.redis.time()
    return seconds + micros / 1e6


async def test_a_small_tenant_is_not_held_behind_a_big_burst(fair_client, scenario):
    marker = slow_scenario(scenario)
    big = await submit_many(fair_client, marker, "acme", 500)
    small = await submit_many(fair_client, marker, "beta", 10)
    enqueued = await redis_now(fair_client)
    queue = (await fleet_status(fair_client.redis, fair_client.keys)).queues[fair_client.keys.turns_queue]
    assert queue.counts.waiting["acme"] > 300 and queue.counts.queued >= queue.counts.waiting["acme"]  # `smith status`
    try:
        await finish(fair_client, small)
    finally:  # no need to run the rest of the burst (nor to leave it to the next tests)
        await fair_client.redis.delete(Keys.tenant_waiting(fair_client.keys.turns_queue, "acme"))
    small_started = max(start for start, _ in (await spans(fair_client, small)).values())
    big_starts = await started_times(fair_client, big)
    # most of the burst was still waiting when beta's last turn started (not when it ended: acme's go on meanwhile)
    assert sum(start <= small_started for start in big_starts) < 200
    # acme turns started while beta's waited; in FIFO order all ~480 still queued would have gone first
    overtaking = sum(enqueued < start <= small_started for start in big_starts)
    assert overtaking < 40, overtaking


async def test_weights_set_each_tenant_s_share(fair_client, scenario):
    await fair_client.set_tenant_limits("heavy", TenantLimits(weight=3))
    try:
        # every slot busy for a while, so both tenants' turns are all waiting when pickup resumes
        blockers = await submit_many(fair_client, slow_scenario(scenario, delay=2.0), "blocker", WORKERS * SLOTS)
        marker = slow_scenario(scenario)
        heavy, light = [], []
        for _ in range(40):
            heavy += await submit_many(fair_client, marker, "heavy", 1)
            light += await submit_many(fair_client, marker, "light", 1)
        await finish(fair_client, blockers + heavy + light)
        started = await spans(fair_client, heavy + light)
        order = sorted(started, key=lambda turn_id: started[turn_id][0])
        first = order[:48]
        share = sum(turn_id in set(heavy) for turn_id in first) / len(first)
        assert 0.65 <= share <= 0.85, share  # weight 3 against 1: three quarters of the pickups
    finally:
        await fair_client.clear_tenant_limits("heavy")


async def test_max_running_caps_one_tenant_only(fair_client, scenario):
    await fair_client.set_tenant_limits("capped", TenantLimits(max_running=2))
    try:
        marker = slow_scenario(scenario)
        capped = await submit_many(fair_client, marker, "capped", 12)
        free = await submit_many(fair_client, marker, "free", 12)
        await finish(fair_client, capped + free)
        assert most_at_once(await spans(fair_client, capped)) == 2
        assert most_at_once(await spans(fair_client, free)) > 2  # the other tenant is not held to it
    finally:
        await fair_client.clear_tenant_limits("capped")


async def test_the_ring_and_waiting_lists_are_gone_once_all_started(fair_client, scenario):
    marker = slow_scenario(scenario, delay=0.0)
    await finish(fair_client, await submit_many(fair_client, marker, "tidy", 20))
    queue = fair_client.keys.turns_queue
    assert not await fair_client.redis.exists(Keys.tenant_ring(queue), Keys.tenant_waiting(queue, "tidy"))


def most_at_once(intervals: dict[str, tuple[float, float]]) -> int:
    """The most intervals (start, end) open at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals.values()] + [(end, -1) for _, end in intervals.values()])
    open_now = peak = 0
    for _, step in edges:
        open_now += step
        peak = max(peak, open_now)
    return peak
