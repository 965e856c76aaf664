"""Auto-pipelining (smith_worker/ops/auto_pipeline.py) on the session's real redis-server: commands sent at
once share one pipeline, each caller gets its own reply or error, order holds, NOSCRIPT is repaired."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from smith_client import scripts
from smith_client.keys import Keys
from smith_client.roundtrip import Command, script_command
from smith_worker.local.processes import free_port
from smith_worker.ops.auto_pipeline import MAX_COMMANDS, AutoPipeline


class CountingRedis(Redis):
    """A real client that counts the pipelines made from it."""

    pipelines = 0

    def pipeline(self, *args: Any, **kwargs: Any) -> Any:
        self.pipelines += 1
        return super().pipeline(*args, **kwargs)


@pytest.fixture
async def redis(redis_url):
    client = CountingRedis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def key() -> str:
    return f"ap{uuid.uuid4().hex[:8]}"


async def test_commands_sent_at_once_share_pipelines_of_a_few_and_each_gets_its_reply(redis, key):
    """50 commands sent at once go as pipelines of at most MAX_COMMANDS: a smaller pipeline's pub/sub
    messages leave Redis sooner (see the module docstring)."""
    auto = AutoPipeline(redis)
    replies = await asyncio.gather(*(auto.submit(lambda i=i: Command("incrby", (f"{key}:{i}", i + 1))) for i in range(50)))
    assert replies == [i + 1 for i in range(50)]
    assert redis.pipelines == -(-50 // MAX_COMMANDS)  # 7 of up to 8
    await redis.delete(*(f"{key}:{i}" for i in range(50)))


async def test_order_holds_across_the_pipelines_of_a_burst(redis, key):
    auto = AutoPipeline(redis)
    await asyncio.gather(*(auto.submit(lambda i=i: Command("rpush", (key, i))) for i in range(3 * MAX_COMMANDS + 1)))
    assert await redis.lrange(key, 0, -1) == [str(i).encode() for i in range(3 * MAX_COMMANDS + 1)]
    await redis.delete(key)


async def test_a_command_alone_is_sent_at_once_and_order_holds_across_pipelines(redis, key):
    auto = AutoPipeline(redis)
    assert await auto.submit(lambda: Command("rpush", (key, "first"))) == 1
    first = asyncio.ensure_future(auto.submit(lambda: Command("rpush", (key, "a"))))
    await asyncio.sleep(0)  # its pipeline is in flight when the next two are sent
    rest = [asyncio.ensure_future(auto.submit(lambda v=v: Command("rpush", (key, v)))) for v in ("b", "c")]
    await asyncio.gather(first, *rest)
    assert await redis.lrange(key, 0, -1) == [b"first", b"a", b"b", b"c"]
    assert redis.pipelines == 3  # alone, then "a" alone, then "b" and "c" together
    await redis.delete(key)


async def test_a_failing_command_fails_only_its_caller(redis, key):
    auto = AutoPipeline(redis)
    await redis.set(f"{key}:s", "text")
    results = await asyncio.gather(
        auto.submit(lambda: Command("incr", (f"{key}:n",))),
        auto.submit(lambda: Command("incr", (f"{key}:s",))),  # not an integer
        auto.submit(lambda: Command("incr", (f"{key}:n",))),
        return_exceptions=True,
    )
    assert results[0] == 1 and results[2] == 2
    assert isinstance(results[1], ResponseError)
    await redis.delete(f"{key}:n", f"{key}:s")


async def test_noscript_loads_the_scripts_and_repeats_only_those_calls(redis, key):
    auto = AutoPipeline(redis)
    keys = Keys(key)
    await redis.script_flush()
    seq_key = keys.turn_seq("t1")
    script_keys = [seq_key, keys.turn_log("t1"), keys.turn_events_channel("t1")]
    body = b'"v":1,"turn_id":"t1","agent_path":[],"type":"token","data":{"text":"x"}}'
    publish = lambda: script_command(scripts.PUBLISH, script_keys, [body, 100, 60])  # noqa: E731
    replies = await asyncio.gather(auto.submit(publish), auto.submit(lambda: Command("incr", (f"{key}:n",))))
    assert replies == [1, 1]  # the publish got seq 1 once; the INCR was not sent twice
    assert await redis.script_exists(scripts.PUBLISH.sha) == [True]
    await redis.delete(*script_keys, f"{key}:n")


async def test_a_broken_connection_fails_every_caller_of_that_pipeline_and_the_next_one_goes():
    dead = Redis(port=free_port(), socket_connect_timeout=1)
    auto = AutoPipeline(dead)
    results = await asyncio.gather(*(auto.submit(lambda: Command("ping")) for _ in range(3)), return_exceptions=True)
    assert all(isinstance(result, RedisConnectionError) for result in results)
    with pytest.raises(RedisConnectionError):  # the sender did not die with the first pipeline
        await auto.submit(lambda: Command("ping"))
    await dead.aclose()


async def test_a_caller_cancelled_before_its_pipeline_goes_sends_nothing(redis, key):
    auto = AutoPipeline(redis)
    call = auto.submit(lambda: Command("set", (key, "sent")))  # queued, its pipeline not built yet
    call.cancel()
    assert await auto.submit(lambda: Command("exists", (key,))) == 0
    assert call.cancelled()
