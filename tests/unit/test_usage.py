"""Token usage accounting: per-minute buckets in Redis, window sums, ``SmithClient.usage`` and ``smith usage``
(docs/architecture.md, Token usage)."""

from __future__ import annotations

import time

import fakeredis
import pytest

from smith_client import AgentUsage, InvalidRequestError, SmithClient, TokenUsage
from smith_client import cli as smith_cli
from smith_client.connection import connect_redis
from smith_client.keys import USAGE_TTL, Keys
from smith_client.roundtrip import RoundTrip
from smith_client.sync_client import SyncSmithClient
from smith_client.usage import KINDS, bucket_of, parse_field, usage, usage_field, window_buckets
from smith_worker.ops.metrics import WorkerMetrics
from smith_worker.ops.usage import queue_count

#: A fixed "now" in the middle of a minute (Unix seconds).
NOW = 1_800_000_030.0
HOUR = 3600


async def count(redis, keys: Keys, agent: str, used: AgentUsage, at: float) -> None:
    """What ``queue_count``'s script does, for fakeredis (which runs no Lua): its fields, incremented."""
    bucket = keys.usage_bucket(bucket_of(at))
    for kind in KINDS:
        await redis.hincrby(bucket, usage_field(agent, kind), getattr(used, kind))


def calls(n: int, prompt: int, completion: int) -> AgentUsage:
    return AgentUsage(requests=n, prompt=prompt, completion=completion, total=prompt + completion)


async def test_a_count_lands_in_its_minute_bucket_with_the_ttl_and_skips_zero_kinds(redis_url):
    """The workers' count (smith_worker/ops/usage.py, a Lua script: a real redis-server)."""
    redis, keys = connect_redis(redis_url), Keys(f"u{time.time_ns()}")

    async def count_now(used: AgentUsage, at: float) -> None:
        rt = RoundTrip()
        queue_count(rt, keys, "default", used, now=at)
        await rt.run(redis)

    try:
        await count_now(AgentUsage(requests=1, prompt=7), NOW)
        key = keys.usage_bucket(bucket_of(NOW))
        assert key == f"{keys.prefix}:usage:{int(NOW // 60)}"
        assert await redis.hgetall(key) == {b"default:requests": b"1", b"default:prompt": b"7"}
        assert USAGE_TTL - 5 < await redis.ttl(key) <= USAGE_TTL
        await count_now(AgentUsage(), NOW)  # nothing used: nothing written
        await count_now(calls(1, 3, 2), NOW + 29)  # the same minute
        assert await redis.hgetall(key) == {b"default:requests": b"2", b"default:prompt": b"10",
                                            b"default:completion": b"2", b"default:total": b"5"}
        await count_now(calls(1, 1, 1), NOW + 30)  # the next minute: a bucket of its own
        assert await redis.exists(keys.usage_bucket(bucket_of(NOW) + 1)) == 1
        client = SmithClient(redis, prefix=keys.prefix)  # and the client reads what the workers counted
        assert await client.runner.run(usage(client.keys, 60, now=NOW + 30)) == {"default": calls(1, 1, 1)}
        assert await client.runner.run(usage(client.keys, 120, now=NOW + 30)) == {
            "default": AgentUsage(requests=3, prompt=11, completion=3, total=7)}
    finally:
        await redis.delete(*await redis.keys(f"{keys.prefix}:*"))
        await redis.aclose()


def test_a_window_reads_its_minutes_up_to_now():
    last = bucket_of(NOW)
    assert window_buckets(3600, NOW) == list(range(last - 59, last + 1))
    assert len(window_buckets(24 * HOUR, NOW)) == 1440
    assert window_buckets(1, NOW) == [last]
    assert window_buckets(90, NOW) == [last - 1, last]  # rounded up to whole minutes


def test_fields_name_the_agent_and_kind_and_leave_room_for_a_tenant():
    assert parse_field("default:total") == ("", "default", "total")
    assert parse_field("ns:agent:prompt") == ("", "ns:agent", "prompt")  # agent names may hold ':'
    assert parse_field("acme/default:completion") == ("acme", "default", "completion")
    assert parse_field("default:bogus") is None
    assert parse_field(":requests") is None


async def test_usage_sums_the_buckets_of_the_window_per_agent():
    redis, keys = fakeredis.FakeAsyncRedis(), Keys("u")
    await count(redis, keys, "default", calls(1, 10, 5), NOW)
    await count(redis, keys, "default", calls(2, 20, 10), NOW - 59 * 60)  # the oldest minute of the hour
    await count(redis, keys, "plain", calls(1, 1, 1), NOW - 30 * 60)
    await count(redis, keys, "default", calls(4, 100, 100), NOW - 61 * 60)  # outside the hour, inside the day
    await count(redis, keys, "plain", calls(8, 800, 800), NOW - 24 * HOUR - 60)  # outside the day
    await redis.hset(keys.usage_bucket(bucket_of(NOW)), mapping={"acme/plain:prompt": 3, "plain:bogus": 9})

    client = SmithClient(redis, prefix="u")
    hour = await client.runner.run(usage(client.keys, HOUR, now=NOW))
    assert hour == {"default": calls(3, 30, 15), "plain": AgentUsage(requests=1, prompt=4, completion=1, total=2)}
    assert list(hour) == ["default", "plain"]
    day = await client.runner.run(usage(client.keys, 24 * HOUR, now=NOW))
    assert day["default"] == calls(7, 130, 115)
    assert day["plain"].requests == 1  # the bucket a day and a minute old is not read
    only = await client.runner.run(usage(client.keys, HOUR, "plain", now=NOW))
    assert list(only) == ["plain"]
    assert await client.runner.run(usage(client.keys, HOUR, now=NOW + 2 * 24 * HOUR)) == {}


async def test_both_clients_read_the_current_window_and_check_their_arguments():
    redis, keys = fakeredis.FakeAsyncRedis(), Keys("u")
    await count(redis, keys, "default", calls(1, 10, 5), time.time())
    client = SmithClient(redis, prefix="u")
    assert await client.usage() == {"default": calls(1, 10, 5)}
    assert await client.usage(60, agent="other") == {}
    for bad in (0, -1, 24 * HOUR + 1, True, "3600", float("nan")):
        with pytest.raises(InvalidRequestError) as err:
            await client.usage(bad)
        assert err.value.fields["field"] == "window_seconds"
    with pytest.raises(InvalidRequestError) as err:
        await client.usage(agent="no/slash")
    assert err.value.fields["field"] == "agent"

    sync_redis = fakeredis.FakeRedis()
    for kind, amount in calls(2, 4, 4).model_dump().items():
        sync_redis.hincrby(Keys("s").usage_bucket(bucket_of(time.time())), usage_field("default", kind), amount)
    assert SyncSmithClient(sync_redis, prefix="s").usage(24 * HOUR) == {"default": calls(2, 4, 4)}


async def test_agent_usage_adds_tokens_and_calls():
    assert AgentUsage().plus(TokenUsage(prompt=1, completion=2, total=3), requests=1) == calls(1, 1, 2)
    assert calls(1, 1, 2).plus(calls(2, 3, 4)) == calls(3, 4, 6)


async def test_model_calls_are_counted_per_agent_in_prometheus():
    class Reply:
        class message:  # noqa: N801 (the shape of an LlmResponse)
            usage = TokenUsage(prompt=10, completion=5, total=15)

    async def answer() -> Reply:
        return Reply()

    async def fail() -> Reply:
        raise RuntimeError("down")

    metrics = WorkerMetrics()
    await metrics.count_llm_request(answer(), "default")
    await metrics.count_llm_request(answer(), "plain")
    with pytest.raises(RuntimeError):
        await metrics.count_llm_request(fail(), "plain")
    sample = metrics.registry.get_sample_value
    assert sample("smith_llm_tokens_total", {"agent": "default", "kind": "prompt", "tenant": ""}) == 10
    assert sample("smith_llm_tokens_total", {"agent": "plain", "kind": "completion", "tenant": ""}) == 5
    assert sample("smith_llm_requests_total", {"agent": "plain", "status": "error", "tenant": ""}) == 1
    assert sample("smith_llm_requests_total", {"agent": "default", "status": "ok", "tenant": ""}) == 1


def test_smith_usage_parses_its_window_and_agent():
    assert smith_cli.parse_args(["usage"]).hours == 1.0
    assert smith_cli.parse_args(["usage", "--day"]).hours == 24.0
    assert smith_cli.parse_args(["usage", "--hours", "2.5"]).hours == 2.5
    assert smith_cli.parse_args(["usage"]).agent is None  # every agent
    assert smith_cli.parse_args(["usage", "--agent", "plain"]).agent == "plain"
    assert smith_cli.parse_args(["ask", "hi"]).agent == "default"  # ask and chat still default to "default"
    for argv in (["usage", "--hours", "0"], ["usage", "--hours", "25"], ["usage", "--day", "--hours", "2"]):
        with pytest.raises(SystemExit) as exit_:
            smith_cli.parse_args(argv)
        assert exit_.value.code == 2


async def test_smith_usage_prints_a_row_per_agent_and_their_sum(monkeypatch, capsys):
    redis = fakeredis.FakeAsyncRedis()
    monkeypatch.setattr(smith_cli, "_connect", lambda args: SmithClient(redis, prefix=args.prefix))
    args = smith_cli.parse_args(["usage", "--prefix", "u"])
    assert await smith_cli._run_usage(args) == 0
    assert "no model calls of any agent counted in the last 1 h under prefix 'u'" in capsys.readouterr().err
    now = time.time()
    await count(redis, Keys("u"), "default", calls(2, 20, 10), now)
    await count(redis, Keys("u"), "plain", calls(1, 1200, 34), now)
    assert await smith_cli._run_usage(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "model calls and tokens in the last 1 h (to the minute), prefix 'u':"
    assert [line.split() for line in lines[1:]] == [
        ["agent", "requests", "prompt", "completion", "total"],
        ["default", "2", "20", "10", "30"],
        ["plain", "1", "1200", "34", "1234"],
        ["(all)", "3", "1220", "44", "1264"],
    ]
    assert len({len(line) for line in lines[1:]}) == 1  # the numbers right-aligned
