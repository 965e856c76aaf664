"""The Redis Cluster connections: redis-py's cluster client (``connect_redis_cluster``) and the slot-pinned clients
(``connect_redis`` / ``connect_sync_redis`` with ``cluster_key``), the options they refuse, and the settings and clients
of ``SMITH_REDIS_CLUSTER`` (docs/cluster.md). Against a real cluster: tests/integration/test_redis_cluster.py
and tests/integration/test_redis_slot_pool.py."""

import functools

import pytest
from redis.asyncio.cluster import RedisCluster
from redis.cluster import key_slot
from redis.exceptions import ResponseError

from smith_client import SmithClient, SyncSmithClient
from smith_client.connection import (
    CLUSTER_NODE_RETRIES,
    CLUSTER_RETRIES,
    BoundedSlotPool,
    connect_redis,
    connect_redis_cluster,
    connect_sync_redis,
    connect_sync_redis_cluster,
)
from smith_client.errors import ConfigurationError, TransportError
from smith_client.redis_errors import smith_error
from smith_worker.demo.run import smith_hint
from smith_client.settings import ClientSettings
from smith_worker.config import Settings

#: Every way to connect to a Redis Cluster: redis-py's cluster clients, and the slot-pinned ones.
CLUSTER_CONNECTS = [
    connect_redis_cluster,
    connect_sync_redis_cluster,
    functools.partial(connect_redis, cluster_key="{smith}"),
    functools.partial(connect_sync_redis, cluster_key="{smith}"),
]


def test_redis_pys_cluster_client_is_bounded_and_lazy():
    redis = connect_redis_cluster("redis://127.0.0.1:1/0", socket_timeout=2.5, max_connections=7)  # no server
    assert isinstance(redis, RedisCluster)
    assert redis.cluster_error_retry_attempts == CLUSTER_RETRIES
    assert redis.retry is not None and redis.retry._retries == CLUSTER_NODE_RETRIES
    node = redis.nodes_manager.connection_kwargs
    assert (node["socket_timeout"], node["socket_connect_timeout"], node["max_connections"]) == (2.5, 2.5, 7)


@pytest.mark.parametrize("connect", CLUSTER_CONNECTS)
@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("unix:///run/redis.sock", {}),
        ("redis://127.0.0.1:7000/1", {}),
        ("redis://127.0.0.1:7000/0", {"sentinels": "s:26379", "sentinel_master": "m"}),
        ("redis://127.0.0.1:7000/0", {"sentinel_master": "m"}),
        ("redis://127.0.0.1:7000/0", {"max_connections": 1}),
        ("redis://127.0.0.1:7000/0", {"max_connections": 5, "pool_timeout": 0}),
        ("http://127.0.0.1:7000/0", {}),
    ],
)
def test_cluster_refuses_what_a_cluster_cannot_take(connect, url, options):
    with pytest.raises(ConfigurationError) as info:
        connect(url, **options)
    assert info.value.setting in ("SMITH_REDIS_CLUSTER", "SMITH_REDIS_MAX_CONNECTIONS", "SMITH_REDIS_URL", "")


@pytest.mark.parametrize("connect", [connect_redis_cluster, connect_sync_redis_cluster])
def test_redis_pys_cluster_client_takes_no_pool_timeout(connect):
    with pytest.raises(ConfigurationError, match="no pool timeout") as info:
        connect("redis://127.0.0.1:7000/0", max_connections=5, pool_timeout=1.0)
    assert info.value.setting == "SMITH_REDIS_CLUSTER"


@pytest.mark.parametrize("connect", [connect_redis, connect_sync_redis])
def test_a_slot_pinned_client_needs_a_key(connect):
    with pytest.raises(ConfigurationError, match="cluster_key") as info:
        connect("redis://127.0.0.1:7000/0", cluster_key="")
    assert info.value.setting == "SMITH_REDIS_CLUSTER"


def test_the_setting_is_a_flag_the_client_settings_read_and_sentinel_excludes():
    assert ClientSettings.from_env({}).redis_cluster is False
    assert ClientSettings.from_env({"SMITH_REDIS_CLUSTER": "yes"}).redis_cluster is True
    with pytest.raises(ConfigurationError, match="exclude each other") as info:
        ClientSettings.from_env({"SMITH_REDIS_CLUSTER": "1", "SMITH_REDIS_SENTINELS": "s:26379",
                                 "SMITH_REDIS_SENTINEL_MASTER": "m"})  # fmt: skip
    assert info.value.setting == "SMITH_REDIS_CLUSTER"


async def test_cluster_mode_tags_the_keys_and_pins_the_pools_to_their_slot(monkeypatch):
    slot = key_slot(b"acme")
    settings = Settings.from_env({"SMITH_REDIS_CLUSTER": "true", "SMITH_PREFIX": "acme"})
    assert settings.keys().key_prefix == "{acme}" and settings.keys().turn_state("t") == "{acme}:turn:t:state"
    worker_redis = settings.connect_redis()  # lazy: no server needed
    assert isinstance(worker_redis.connection_pool, BoundedSlotPool)  # SMITH_WORKER_REDIS_MAX_CONNECTIONS
    assert worker_redis.connection_pool.slot_master.slot == slot
    await worker_redis.aclose()
    monkeypatch.setenv("SMITH_REDIS_CLUSTER", "1")
    async with SmithClient.from_url("redis://127.0.0.1:1/0", prefix="acme") as client:
        assert client.keys.key_prefix == "{acme}"
        assert isinstance(client.redis.connection_pool, BoundedSlotPool)
        assert client.redis.connection_pool.slot_master.slot == slot
    with SyncSmithClient.from_url("redis://127.0.0.1:1/0", prefix="acme") as sync_client:
        assert sync_client.keys.key_prefix == "{acme}"
        assert sync_client.redis.connection_pool.slot_master.slot == slot
    async with SmithClient.from_url("redis://127.0.0.1:1/0", prefix="acme", cluster=False) as plain:
        assert plain.keys.key_prefix == "acme" and not isinstance(plain.redis.connection_pool, BoundedSlotPool)


@pytest.mark.parametrize(
    ("reply", "hinted"),
    [
        ("MOVED 9666 127.0.0.1:55001", True),
        ("ASK 9666 127.0.0.1:55001", True),
        ("Command # 1 (ZRANGEBYSCORE ct1:workers 1 +inf) of pipeline caused error: ('MOVED 9666 127.0.0.1:55001',)",
         True),
        ("CROSSSLOT Keys in request don't hash to the same slot", True),
        # the slot-pinned pool's own error for a key without the deployment's tag: not a missing setting
        ("MOVED 9666 127.0.0.1:55001: a key outside hash slot 3, the one the connection is pinned to", False),
        ("ERR unknown command", False),
    ],
)
def test_a_cluster_reply_to_a_client_not_in_cluster_mode_names_the_setting(reply, hinted):
    error = smith_error(ResponseError(reply))
    if hinted:
        assert isinstance(error, ConfigurationError) and error.setting == "SMITH_REDIS_CLUSTER"
        assert "set SMITH_REDIS_CLUSTER=1" in str(error)
    else:
        assert isinstance(error, TransportError)


def test_the_demos_smith_status_line_carries_the_cluster_setting():
    assert smith_hint("redis://127.0.0.1:7000/0", "p", cluster=True).startswith(
        "SMITH_REDIS_CLUSTER=1 SMITH_REDIS_URL=redis://127.0.0.1:7000/0 SMITH_PREFIX=p ")
    assert smith_hint("redis://127.0.0.1:7000/0", "p").startswith("SMITH_REDIS_URL=")
