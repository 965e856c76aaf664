"""Pickup by wake-up: real redis-server, real worker processes, the fallback poll set long.

With ``SMITH_FALLBACK_POLL`` at 30 s a worker that only polled would start a
job up to 30 s late; every ceiling below is far under that (and ~5x what a
wake-up needs on a loaded machine), so meeting it proves the job was started
by a wake-up or by the next deferred job's time. The idle command rate is
measured on a private redis-server so no other test's workers count.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from arq.jobs import Job
from redis.asyncio import Redis

from smith_client import SmithClient
from smith_client.enqueue import enqueue_job
from smith_client.jobs import RUN_TOOL, ToolJob
from smith_client.keys import Keys
from smith_client.messages import ToolCall
from smith_client.serialization import job_deserializer
from smith_worker.local.processes import start_redis_server
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from smith_worker.tools.waiter import abort_job
from tests.conftest import LOGS

#: The fallback poll of the workers here, seconds: far longer than any ceiling below.
LONG_FALLBACK = "30"
#: Seconds a woken job may take to start (a wake-up needs milliseconds; generous for a loaded machine).
CEILING = 6.0


@pytest.fixture(scope="module")
async def private(tmp_path_factory, scripted_llm):
    """A private redis-server with one idle turn worker and two idle tool workers (fallback 30 s).

    Yields ``(url, prefix, {"turns": rate, "tools": rate})``: the idle Redis commands/s of each worker,
    measured as the turn worker starts alone and then with the first tool worker.
    """
    server, url = start_redis_server(log_path=tmp_path_factory.mktemp("pickup-redis") / "redis.log")
    prefix = f"pk{uuid.uuid4().hex[:6]}"
    env = worker_env(url, prefix, scripted_llm.base_url, SMITH_FALLBACK_POLL=LONG_FALLBACK)
    procs = []
    try:
        procs += start_workers("tests.support.app:app", env, ["turns"], f"{prefix}-a", log_dir=LOGS)
        await wait_for_workers(url, prefix, 1)
        rates = {"turns": await idle_rate(url)}
        procs += start_workers("tests.support.app:app", env, ["tools"], f"{prefix}-b", log_dir=LOGS)
        await wait_for_workers(url, prefix, 2)
        rates["tools"] = await idle_rate(url) - rates["turns"]
        # a second tool worker: an abort must reach the one running the job, not the idle one
        procs += start_workers("tests.support.app:app", env, ["tools"], f"{prefix}-c", log_dir=LOGS)
        await wait_for_workers(url, prefix, 3)
        yield url, prefix, rates
    finally:
        for proc in procs:
            proc.stop()
        server.stop()


async def idle_rate(url: str, settle: float = 2.0, window: float = 5.0) -> float:
    """Redis commands/s on the server over ``window`` seconds (INFO commandstats delta, INFO itself excluded)."""
    redis = Redis.from_url(url)
    try:
        await asyncio.sleep(settle)  # start-up traffic (registration, script loads) is over
        before, started = await command_count(redis), time.monotonic()
        await asyncio.sleep(window)
        after, ended = await command_count(redis), time.monotonic()
        return (after - before - 1) / (ended - started)  # the second INFO counts itself
    finally:
        await redis.aclose()


async def command_count(redis: Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


@pytest.fixture
async def private_client(private):
    url, prefix, _ = private
    async with SmithClient.from_url(url, prefix=prefix) as c:
        yield c


def slow_tool_job(keys: Keys, turn_id: str, seconds: float) -> ToolJob:
    return ToolJob(turn_id=turn_id, conversation_id="c", agent="default", step=1, index=0,
                   call=ToolCall(id="call-1", name="slow_tool", arguments={"seconds": seconds}), timeout=30.0,
                   reply_channel=keys.worker_replies_channel("test"), result_key=keys.tool_result(turn_id, 1, 0))


async def test_idle_workers_send_few_commands(private):
    *_, rates = private
    print(f"idle Redis commands/s: turn worker {rates['turns']:.1f}, tool worker {rates['tools']:.1f}")
    # polling at arq's 10-20 ms sent ~240 (turns) and ~470 (tools) per second; the target is <= 10
    assert rates["turns"] < 30
    assert rates["tools"] < 30


async def test_a_tool_turn_runs_on_wake_ups_not_the_fallback_poll(private, private_client, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]), Reply.text("five")))
    for _ in range(3):  # each time the workers are idle in their blocking wait
        await asyncio.sleep(0.5)
        started = time.monotonic()
        handle = await private_client.submit(f"{marker} add", conversation_id=f"c-{uuid.uuid4().hex[:8]}")
        assert (await handle.result(timeout=CEILING)).content == "five"  # a turn job, a tool job, a turn wake-up
        print(f"tool turn on wake-ups: {1000 * (time.monotonic() - started):.1f} ms")


async def test_a_deferred_job_runs_at_its_time_not_before(private, private_client):
    url, prefix, _ = private
    keys, turn_id = Keys(prefix), f"defer-{uuid.uuid4().hex[:8]}"
    job_id = keys.tool_job_id(turn_id, 1, 0)
    job = slow_tool_job(keys, turn_id, 0)
    assert await enqueue_job(private_client.redis, RUN_TOOL, job.model_dump(mode="json"), job_id=job_id,
                             queue=keys.tools_queue, defer=2.0)
    info = await Job(job_id, private_client.redis, _deserializer=job_deserializer).result_info()
    assert info is None  # not run before its time
    result = await wait_for_result(private_client.redis, job_id, 2.0 + CEILING)  # long before the 30 s fallback
    assert (result.start_time - result.enqueue_time).total_seconds() >= 2.0  # arq's own record of the job


async def test_a_job_enqueued_without_a_token_still_runs_within_the_fallback(redis_url, scripted_llm, client):
    prefix = f"pkf{uuid.uuid4().hex[:6]}"
    keys, turn_id = Keys(prefix), "no-token"
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_FALLBACK_POLL="2")
    (worker,) = start_workers("tests.support.app:app", env, ["tools"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, 1)
        job_id = keys.tool_job_id(turn_id, 1, 0)
        # arq's own enqueue_job pushes no wake-up token: only the fallback poll finds the job
        await client.redis.enqueue_job(RUN_TOOL, slow_tool_job(keys, turn_id, 0).model_dump(mode="json"),
                                       _job_id=job_id, _queue_name=keys.tools_queue)
        assert not await client.redis.exists(keys.wake_list(keys.tools_queue))
        result = await wait_for_result(client.redis, job_id, 2.0 + CEILING)
        assert result.success
    finally:
        worker.stop()


async def test_an_aborted_tool_job_is_cancelled_on_a_wake_up(private, private_client):
    url, prefix, _ = private
    keys, turn_id = Keys(prefix), f"abort-{uuid.uuid4().hex[:8]}"
    job_id = keys.tool_job_id(turn_id, 1, 0)
    redis = private_client.redis
    assert await enqueue_job(redis, RUN_TOOL, slow_tool_job(keys, turn_id, 25).model_dump(mode="json"),
                             job_id=job_id, queue=keys.tools_queue)
    async with asyncio.timeout(CEILING):
        while b"started" not in await redis.lrange(f"{prefix}:test:slow:{turn_id}", 0, -1):
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # both tool workers are back in their blocking waits, the idle one first in line
    await abort_job(redis, keys, job_id)
    async with asyncio.timeout(CEILING):  # the tool sleeps 25 s and the fallback poll is 30 s away
        while b"cancelled" not in await redis.lrange(f"{prefix}:test:slow:{turn_id}", 0, -1):
            await asyncio.sleep(0.05)


async def wait_for_result(redis: Redis, job_id: str, timeout: float):
    async with asyncio.timeout(timeout):
        while (info := await Job(job_id, redis, _deserializer=job_deserializer).result_info()) is None:
            await asyncio.sleep(0.05)
    return info
