"""How the fan-out routes what its pub/sub connection reads (smith_client/fanout.py), sharded channels included:
Redis Cluster's sharded pub/sub (docs/cluster.md, Pub/sub)."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from smith_client.fanout import _split, check_not_dropped, route


class Follower:
    def __init__(self) -> None:
        self.queue: asyncio.Queue[object] = asyncio.Queue()

    def taken(self) -> list[object]:
        return [self.queue.get_nowait() for _ in range(self.queue.qsize())]


def message(kind: str, channel: str, data: object = 1) -> dict[str, object]:
    return {"type": kind, "pattern": None, "channel": channel.encode(), "data": data}


def test_sharded_messages_reach_their_channels_followers_as_classic_ones_do():
    a, b = Follower(), Follower()
    followers, confirmed = {"{p}:turn:t1:events": {a}, "p:turn:t2:events": {b}}, set()
    route(message("smessage", "{p}:turn:t1:events", b"e1"), followers, confirmed)
    route(message("message", "p:turn:t2:events", b"e2"), followers, confirmed)
    assert [m["data"] for m in a.taken()] == [b"e1"]
    assert [m["data"] for m in b.taken()] == [b"e2"]


def test_a_second_sharded_subscribe_confirmation_is_a_gap():
    a = Follower()
    followers, confirmed = {"{p}:turn:t1:events": {a}}, set()
    route(message("ssubscribe", "{p}:turn:t1:events"), followers, confirmed)
    assert a.taken() == []
    route(message("ssubscribe", "{p}:turn:t1:events"), followers, confirmed)  # redis-py subscribed again by itself
    assert a.taken() == [None]
    route(message("sunsubscribe", "{p}:turn:t1:events"), followers, confirmed)
    assert confirmed == set()


def test_redis_ending_a_followed_sharded_subscription_is_a_lost_connection():
    followers = {"{p}:turn:t1:events": {Follower()}}
    with pytest.raises(RedisConnectionError, match="its slot moved"):
        check_not_dropped(message("sunsubscribe", "{p}:turn:t1:events", 0), followers)
    check_not_dropped(message("sunsubscribe", "{p}:turn:t2:events", 0), followers)  # ours: nobody follows it
    check_not_dropped(message("unsubscribe", "{p}:turn:t1:events", 0), followers)  # classic: only ever asked for
    check_not_dropped(message("smessage", "{p}:turn:t1:events"), followers)


def test_channels_split_into_classic_and_sharded():
    assert _split(["a", "{p}:b", "c"], {"{p}:b"}) == (["a", "c"], ["{p}:b"])
