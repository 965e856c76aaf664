"""The Redis Cluster connection option (``cluster=True``, ``SMITH_REDIS_CLUSTER``): the clients it builds, the
options it refuses, and the runtime refusing it at start (docs/cluster.md). Against a real cluster:
tests/integration/test_redis_cluster.py."""

import subprocess
import sys
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster

from smith_client import SmithClient, SyncSmithClient
from smith_client.connection import CLUSTER_NODE_RETRIES, CLUSTER_RETRIES, connect_redis, connect_sync_redis
from smith_client.errors import ConfigurationError
from smith_client.settings import ClientSettings
from smith_worker.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def test_cluster_true_gives_redis_pys_cluster_client_bounded_and_lazy():
    redis = connect_redis("redis://127.0.0.1:1/0", cluster=True, socket_timeout=2.5, max_connections=7)  # no server
    assert isinstance(redis, RedisCluster)
    assert redis.cluster_error_retry_attempts == CLUSTER_RETRIES
    assert redis.retry is not None and redis.retry._retries == CLUSTER_NODE_RETRIES
    node = redis.nodes_manager.connection_kwargs
    assert (node["socket_timeout"], node["socket_connect_timeout"], node["max_connections"]) == (2.5, 2.5, 7)


@pytest.mark.parametrize("connect", [connect_redis, connect_sync_redis])
@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("unix:///run/redis.sock", {}),
        ("redis://127.0.0.1:7000/1", {}),
        ("redis://127.0.0.1:7000/0", {"sentinels": "s:26379", "sentinel_master": "m"}),
        ("redis://127.0.0.1:7000/0", {"pool_timeout": 1.0}),
        ("redis://127.0.0.1:7000/0", {"max_connections": 1}),
    ],
)
def test_cluster_refuses_what_a_cluster_cannot_take(connect, url, options):
    with pytest.raises(ConfigurationError) as info:
        connect(url, cluster=True, **options)
    assert info.value.setting in ("SMITH_REDIS_CLUSTER", "SMITH_REDIS_MAX_CONNECTIONS")


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
