"""The wait between polls (smith_worker/queue/pickup.py) on fakeredis: what ends it, what it leaves alone.

The fallback is 30 s everywhere, so a wait ending within the 5 s ceilings ended for the reason tested.
"""

from __future__ import annotations

import asyncio

import fakeredis
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from smith_client.keys import Keys, now_ms
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.ops.redis_health import RedisHealth
from smith_worker.queue.claim import HeldTokens
from smith_worker.queue.pickup import Pickup
from smith_worker.queue.worker import build_worker

QUEUE = "pw:tools"
CEILING = 5.0


def pickup_on(server: fakeredis.FakeServer, connect=None) -> Pickup:
    return Pickup(connect or (lambda: fakeredis.FakeAsyncRedis(server=server)), QUEUE, 30.0, RedisHealth())


@pytest.fixture
def server():
    return fakeredis.FakeServer()


async def test_a_token_ends_the_wait_and_is_counted_for_the_claim_which_pops_the_others(server):
    redis = fakeredis.FakeAsyncRedis(server=server)
    pickup = pickup_on(server)
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: 3, next_due=None))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await redis.rpush(Keys.wake_list(QUEUE), *["1"] * 5)
    async with asyncio.timeout(CEILING):
        await waiting
    assert await redis.llen(Keys.wake_list(QUEUE)) == 4  # the claim pops one per job it takes beyond the first
    assert pickup.take_tokens() == HeldTokens(queue=1) and pickup.take_tokens() == HeldTokens()
    await pickup.close()


async def test_a_token_of_the_capability_sets_list_is_taken_first_and_counted_apart(server):
    redis = fakeredis.FakeAsyncRedis(server=server)
    pickup = Pickup(lambda: fakeredis.FakeAsyncRedis(server=server), QUEUE, 30.0, RedisHealth(), capset="v2")
    await redis.rpush(Keys.wake_list(QUEUE), "1")
    await redis.rpush(Keys.wake_list(QUEUE, "v2"), "1")
    for expected in (HeldTokens(own=1), HeldTokens(queue=1)):  # a job only v2 serves, then any job
        pickup.before_poll()
        async with asyncio.timeout(CEILING):
            await pickup.wait(free_slots=lambda: 1, next_due=None)
        assert pickup.take_tokens() == expected
    await redis.rpush(Keys.wake_list(QUEUE, "v1"), "1")  # another version's job: not this worker's token
    async with asyncio.timeout(CEILING):
        await pickup.wait(free_slots=lambda: 1, next_due=now_ms() + 300)
    assert pickup.take_tokens() == HeldTokens() and await redis.llen(Keys.wake_list(QUEUE, "v1")) == 1
    await pickup.close()


async def test_a_full_worker_leaves_the_tokens_and_wakes_when_its_job_ends(server):
    redis = fakeredis.FakeAsyncRedis(server=server)
    pickup = pickup_on(server)
    await redis.rpush(Keys.wake_list(QUEUE), "1")
    pickup.before_poll()
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: 0, next_due=None))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    pickup.job_finished()
    async with asyncio.timeout(CEILING):
        await waiting
    assert await redis.llen(Keys.wake_list(QUEUE)) == 1  # left for a worker that can take the job


async def test_a_token_popped_after_the_worker_filled_up_is_pushed_back_for_another_worker(server):
    redis = fakeredis.FakeAsyncRedis(server=server)
    pickup = pickup_on(server)
    free = [1]
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: free[0], next_due=None))
    await asyncio.sleep(0.1)  # the pop is pending, started with a free slot
    free[0] = 0  # then the worker's last slot was taken
    await redis.rpush(Keys.wake_list(QUEUE), "1")
    async with asyncio.timeout(CEILING):
        await waiting
    assert await redis.lrange(Keys.wake_list(QUEUE), 0, -1) == [b"1"]
    await pickup.close()


async def test_a_pop_outlives_a_wait_ended_by_a_job_end_and_serves_the_next(server):
    redis = fakeredis.FakeAsyncRedis(server=server)
    connects = []

    def connect():
        connects.append(1)
        return fakeredis.FakeAsyncRedis(server=server)

    pickup = pickup_on(server, connect)
    pickup.before_poll()
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: 1, next_due=None))
    await asyncio.sleep(0.1)
    pickup.job_finished()
    async with asyncio.timeout(CEILING):
        await waiting
    pickup.before_poll()
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: 1, next_due=None))
    await asyncio.sleep(0.1)
    await redis.rpush(Keys.wake_list(QUEUE), "1")
    async with asyncio.timeout(CEILING):
        await waiting
    assert connects == [1]  # one connection, one pending pop across both waits
    assert await redis.llen(Keys.wake_list(QUEUE)) == 0
    await pickup.close()


async def test_the_next_deferred_job_bounds_the_wait(server):
    pickup = pickup_on(server)
    due = now_ms() + 300  # the score the poll's claim read
    async with asyncio.timeout(CEILING):
        await pickup.wait(free_slots=lambda: 1, next_due=due)
    assert now_ms() >= due  # not before its time
    await pickup.close()


async def test_stop_ends_the_wait_at_once(server):
    pickup = pickup_on(server)
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: 1, next_due=None))
    await asyncio.sleep(0.1)
    pickup.stop()
    async with asyncio.timeout(CEILING):
        await waiting
    await pickup.close()


@pytest.mark.parametrize("error", [RedisConnectionError("gone"), ResponseError("UNBLOCKED force unblock"),
                                   ResponseError("READONLY You can't write against a read only replica.")])
async def test_a_redis_error_of_the_pop_backs_off_drops_the_connection_and_returns(server, error):
    closed = []

    class Failing:
        async def blpop(self, *args, **kwargs):
            raise error

        async def aclose(self, close_connection_pool=False):
            closed.append(1)

    pickup = pickup_on(server, Failing)
    async with asyncio.timeout(CEILING):
        await pickup.wait(free_slots=lambda: 1, next_due=None)  # never raises: the worker polls again
    assert pickup._health.failures == 1 and closed == [1]


async def test_a_frozen_pop_is_given_up_after_its_timeout(server):

    class Frozen:
        async def blpop(self, *args, **kwargs):
            await asyncio.sleep(3600)  # a frozen Redis never answers

        async def aclose(self, close_connection_pool=False):
            pass

    pickup = Pickup(Frozen, QUEUE, 0.2, RedisHealth())
    async with asyncio.timeout(CEILING):
        while pickup._health.failures == 0:  # each wait ends at the 0.2 s fallback; the pop is kept
            await pickup.wait(free_slots=lambda: 1, next_due=None)  # until its own timeout plus the margin is past


@pytest.mark.parametrize(("queue", "checks_aborts"), [("turns", False), ("tools", True)])
async def test_only_tool_workers_run_arqs_abort_check(queue, checks_aborts):
    """Only tool jobs are aborted through arq; its check would cost a turn worker a read per poll."""
    worker = build_worker(SmithApp(), queue, Settings(redis_url="redis://127.0.0.1:1/0"))
    assert worker.allow_abort_jobs is checks_aborts
    await worker.pool.aclose()


async def test_an_abort_on_the_channel_ends_the_wait_of_a_full_worker(server):
    """Every tool worker follows the aborts channel: the one running the job polls (arq's abort check) at once."""
    redis = fakeredis.FakeAsyncRedis(server=server)
    pickup = Pickup(lambda: fakeredis.FakeAsyncRedis(server=server), QUEUE, 30.0, RedisHealth(), "pw:tools:aborts")
    pickup.before_poll()
    waiting = asyncio.create_task(pickup.wait(free_slots=lambda: 0, next_due=None))
    async with asyncio.timeout(CEILING):
        while await redis.publish("pw:tools:aborts", "job-1") == 0:  # until the subscription is up
            await asyncio.sleep(0.02)
        await waiting
    assert pickup.take_abort() and not pickup.take_abort()  # the worker runs arq's abort check once for it
    pickup.stop()
    await pickup.close()
