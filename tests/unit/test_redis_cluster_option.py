"""The Redis Cluster connections: redis-py's cluster client (``connect_redis_cluster``) and the slot-pinned clients
(``connect_redis`` / ``connect_sync_redis`` with ``cluster_key``), the options they refuse, and the runtime refusing
``SMITH_REDIS_CLUSTER`` at start (docs/cluster.md). Against a real cluster: tests/integration/test_redis_cluster.py
and tests/integration/test_redis_slot_pool.py."""

import functools
import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster

from smith_client import SmithClient, SyncSmithClient
from smith_client.connection import (
    CLUSTER_NODE_RETRIES,
    CLUSTER_RETRIES,
    connect_redis,
    connect_redis_cluster,
    connect_sync_redis,
    connect_sync_redis_cluster,
)
from smith_client.errors import ConfigurationError
from smith_client.settings import ClientSettings
from smith_worker.config import Settings

ROOT = Path(__file__).resolve().parents[2]
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


def test_worker_settings_and_clients_refuse_cluster_mode(monkeypatch):
    with pytest.raises(ConfigurationError, match="does not run on Redis Cluster yet.*docs/cluster.md") as info:
        Settings.from_env({"SMITH_REDIS_CLUSTER": "true"})
    assert info.value.setting == "SMITH_REDIS_CLUSTER"
    monkeypatch.setenv("SMITH_REDIS_CLUSTER", "1")
    for client in (SmithClient, SyncSmithClient):
        with pytest.raises(ConfigurationError, match="does not run on Redis Cluster yet"):
            client.from_url("redis://127.0.0.1:1/0")


def test_a_worker_configured_for_cluster_mode_exits_at_start_saying_so():
    env = {"SMITH_REDIS_CLUSTER": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "smith_worker", "tests.support.app:app", "--queue", "turns"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 1
    assert (
        "ConfigurationError: SMITH_REDIS_CLUSTER is set, but Agent Smith does not run on Redis Cluster" in done.stderr
    )
