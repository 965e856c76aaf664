"""RoundTrip (smith_client/roundtrip.py) on the session's real redis-server: handles by name, in order."""

from __future__ import annotations

import uuid

import pytest
from redis.asyncio import Redis

from smith_client import scripts
from smith_client.roundtrip import Command, RoundTrip


@pytest.fixture
async def redis(redis_url):
    client = Redis.from_url(redis_url)
    await scripts.load_all(client)  # a NOSCRIPT retry would send the counter's INCRBY twice
    yield client
    await client.aclose()


async def test_calls_scripts_added_commands_and_an_extension_resolve_in_one_round_trip(redis):
    key = f"rt{uuid.uuid4().hex[:8]}"
    rt = RoundTrip(transaction=True)
    first = rt.call("incrby", key, 2, parse=int)
    trimmed = rt.call("xrange", f"{key}:log", min="-", max="+", count=1)
    added = rt.add(Command("get", (key,), parse=lambda reply: reply.decode()))
    other = RoundTrip()
    publish_keys = [f"{key}:seq", f"{key}:log", f"{key}:events"]
    seq = other.script(scripts.PUBLISH, publish_keys, [b'{"type":"x"}', 10, 60], parse=int)
    rt.extend(other)
    assert len(rt) == 4
    await rt.run(redis)
    assert (first.value, trimmed.value, added.value, seq.value) == (2, [], "2", 1)


async def test_a_parse_that_raises_raises_from_run_and_leaves_later_handles_unread(redis):
    rt = RoundTrip()

    def refuse(reply: object) -> None:
        raise ValueError("refused")

    rt.call("ping", parse=refuse)
    later = rt.call("ping")
    with pytest.raises(ValueError, match="refused"):
        await rt.run(redis)
    with pytest.raises(RuntimeError):
        _ = later.value
