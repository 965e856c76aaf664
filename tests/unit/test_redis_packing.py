"""The asyncio connections' command packing (smith_client/connection.py): hiredis's bytes, redis-py's rules."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError
from redis.utils import HIREDIS_AVAILABLE

from smith_client import SmithClient
from smith_client.connection import _HiredisPacking, connect_redis

pytestmark = pytest.mark.skipif(not HIREDIS_AVAILABLE, reason="redis-py packs in Python without hiredis")

COMMANDS = [
    ("EVALSHA", "a" * 40, 2, "p:turn:t:seq", "p:turn:t:log", 10_000, 86_400.5, b'{"type":"token"}', "é"),
    ("SET", "k", memoryview(b"raw"), "EX", 5),
    ("CONFIG GET", "maxmemory"),  # a two-word command name goes as two words
    (b"XADD", "s", "*", "e", "x" * 100_000),  # over redis-py's chunking cutoff
]


def test_every_pool_of_an_asyncio_client_packs_with_hiredis():
    sentinel = {"sentinels": "a:1", "sentinel_master": "m"}
    redises = [
        connect_redis("redis://127.0.0.1:1/0"),  # a worker's
        SmithClient.from_url("redis://127.0.0.1:1/0").redis,  # a client's, capped
        connect_redis("rediss://127.0.0.1:1/0"),
        connect_redis("redis://x/0", **sentinel),
        connect_redis("redis://x/0", max_connections=3, **sentinel),
    ]
    for redis in redises:
        assert issubclass(redis.connection_pool.connection_class, _HiredisPacking)


@pytest.mark.parametrize("command", COMMANDS)
def test_hiredis_packs_the_bytes_redis_py_packs(command):
    pooled = connect_redis("redis://127.0.0.1:1/0").connection_pool
    packed = pooled.make_connection().pack_commands([command])
    assert b"".join(packed) == b"".join(Connection().pack_commands([command]))


def test_a_value_redis_cannot_take_is_a_data_error():
    connection = connect_redis("redis://127.0.0.1:1/0").connection_pool.make_connection()
    with pytest.raises(DataError):
        connection.pack_command("SET", "k", True)
