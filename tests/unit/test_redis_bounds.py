"""Bounded waits, unit rules: the Redis socket timeout setting, the reconnection backoff, readiness."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from smith_client import SmithClient
from smith_client.sync_client import SyncSmithClient
from smith_client.connection import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_SOCKET_TIMEOUT,
    HEALTH_CHECK_INTERVAL,
    BoundedPool,
    BoundedSentinelPool,
    ConnectOutsideLockPool,
    SyncBoundedPool,
    SyncBoundedSentinelPool,
    client_max_connections,
    connect_redis,
)
from smith_client.errors import ConfigurationError
from smith_client.settings import ClientSettings
from smith_worker.ops.redis_health import BACKOFF_CAP, RedisHealth, backoff_delay


def test_socket_timeout_defaults_to_5_s_and_reads_the_environment(monkeypatch):
    monkeypatch.delenv("SMITH_REDIS_SOCKET_TIMEOUT", raising=False)
    assert ClientSettings.from_env().redis_socket_timeout == DEFAULT_SOCKET_TIMEOUT == 5.0
    monkeypatch.setenv("SMITH_REDIS_SOCKET_TIMEOUT", "2.5")
    assert ClientSettings.from_env().redis_socket_timeout == 2.5


@pytest.mark.parametrize("raw", ["soon", "0", "-1"])
def test_a_bad_socket_timeout_is_a_configuration_error(monkeypatch, raw):
    monkeypatch.setenv("SMITH_REDIS_SOCKET_TIMEOUT", raw)
    with pytest.raises(ConfigurationError) as info:
        SmithClient.from_url("redis://127.0.0.1:1/0")  # a client reads it too
    assert info.value.setting == "SMITH_REDIS_SOCKET_TIMEOUT"


def test_every_connection_is_bounded(monkeypatch):
    monkeypatch.setenv("SMITH_REDIS_SOCKET_TIMEOUT", "7")
    kwargs = SmithClient.from_url("redis://127.0.0.1:1/0").redis.connection_pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"]) == (7.0, 7.0)
    assert connect_redis("redis://127.0.0.1:1/0").connection_pool.connection_kwargs["socket_timeout"] == 5.0
    assert kwargs["health_check_interval"] == HEALTH_CHECK_INTERVAL
    client = SmithClient.from_url("redis://127.0.0.1:1/0", socket_timeout=1.5)  # the argument wins
    assert client.redis.connection_pool.connection_kwargs["socket_timeout"] == 1.5
    sync_kwargs = SyncSmithClient.from_url("redis://127.0.0.1:1/0").redis.connection_pool.connection_kwargs
    assert (sync_kwargs["socket_timeout"], sync_kwargs["health_check_interval"]) == (7.0, HEALTH_CHECK_INTERVAL)


def test_a_workers_pool_is_capped_by_its_own_setting(monkeypatch):
    """Thousands of turns in flight share a few dozen connections (docs/capacity.md), never one each."""
    from smith_worker.config import DEFAULT_WORKER_MAX_CONNECTIONS, Settings

    monkeypatch.delenv("SMITH_WORKER_REDIS_MAX_CONNECTIONS", raising=False)
    monkeypatch.setenv("SMITH_REDIS_SOCKET_TIMEOUT", "3")
    pool = Settings.from_env().connect_redis().connection_pool
    assert (type(pool), pool.max_connections, pool.timeout) == (BoundedPool, DEFAULT_WORKER_MAX_CONNECTIONS, 3.0)
    monkeypatch.setenv("SMITH_WORKER_REDIS_MAX_CONNECTIONS", "9")
    assert Settings.from_env().connect_redis().connection_pool.max_connections == 9


def test_a_clients_pool_is_capped_and_its_wait_bounded_a_workers_is_not(monkeypatch):
    monkeypatch.delenv("SMITH_REDIS_MAX_CONNECTIONS", raising=False)
    pool = SmithClient.from_url("redis://127.0.0.1:1/0", socket_timeout=1.5).redis.connection_pool
    assert (type(pool), pool.max_connections, pool.timeout) == (BoundedPool, DEFAULT_MAX_CONNECTIONS, 1.5)
    monkeypatch.setenv("SMITH_REDIS_MAX_CONNECTIONS", "7")
    pool = SyncSmithClient.from_url("redis://127.0.0.1:1/0", pool_timeout=0.5).redis.connection_pool
    assert (type(pool), pool.max_connections, pool.timeout) == (SyncBoundedPool, 7, 0.5)
    sentinel = {"sentinels": "a:1", "sentinel_master": "m"}
    pool = SmithClient.from_url("redis://x/0", max_connections=3, **sentinel).redis.connection_pool
    assert (type(pool), pool.max_connections) == (BoundedSentinelPool, 3)
    pool = SyncSmithClient.from_url("redis://x/0", **sentinel).redis.connection_pool
    assert (type(pool), pool.max_connections) == (SyncBoundedSentinelPool, 7)
    assert type(connect_redis("redis://127.0.0.1:1/0").connection_pool) is ConnectOutsideLockPool  # workers'


@pytest.mark.parametrize("raw", ["many", "1", "0", "-3", "2.5"])
def test_a_connection_cap_below_two_or_not_a_whole_number_is_a_configuration_error(monkeypatch, raw):
    monkeypatch.setenv("SMITH_REDIS_MAX_CONNECTIONS", raw)
    with pytest.raises(ConfigurationError) as info:
        SmithClient.from_url("redis://127.0.0.1:1/0")
    assert info.value.setting == "SMITH_REDIS_MAX_CONNECTIONS"
    with pytest.raises(ConfigurationError):
        client_max_connections(1)
    with pytest.raises(ConfigurationError):
        SmithClient.from_url("redis://127.0.0.1:1/0", max_connections=1)
    with pytest.raises(ConfigurationError):
        SmithClient.from_url("redis://127.0.0.1:1/0", max_connections=5, pool_timeout=0)


def test_backoff_grows_with_jitter_up_to_the_cap():
    for failures in range(1, 30):
        ceiling = min(BACKOFF_CAP, 0.2 * 2 ** (failures - 1))
        delays = [backoff_delay(failures) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(set(delays)) > 1  # jittered: a fleet does not reconnect in lockstep


async def test_readiness_follows_redis():
    health = RedisHealth()
    assert not health.ready  # not ready before Redis first answered
    health.ok()
    assert health.ready
    assert health.failed("the job poll", RedisConnectionError("refused")) > 0
    assert not health.ready and health.failures == 1
    calls = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise RedisConnectionError("still down")
        return "pong"

    assert await health.until_ok("start-up", flaky) == "pong"
    assert len(calls) == 3 and health.ready and health.failures == 0


async def test_refused_credentials_are_a_configuration_error_not_an_outage():
    """A worker waits out an outage but exits on a wrong password (it would never get in)."""
    async def refused() -> None:
        raise AuthenticationError("invalid username-password pair")

    with pytest.raises(ConfigurationError) as info:
        await RedisHealth().until_ok("start-up", refused)
    assert info.value.setting == "SMITH_REDIS_URL"


def test_answers_again_is_logged_only_after_a_failure(caplog):
    caplog.set_level(logging.INFO, logger="agent_smith")
    health = RedisHealth()

    def again() -> list[str]:
        return [r.getMessage() for r in caplog.records if "answers again" in r.getMessage()]

    health.ok()  # a normal start: Redis answered the first command
    health.ok()
    assert health.ready and again() == []
    health.failed("a poll", RedisConnectionError("refused"))
    health.ok()
    assert health.ready and len(again()) == 1


async def test_a_clean_pooled_connection_is_reused_without_a_socket_probe_and_a_dirty_one_is_replaced(
    redis_url, monkeypatch
):
    """redis-py probes the socket (a zero-timeout read, one pass through the event loop) before every
    command; a connection that plainly holds nothing skips it, one with unread bytes is still replaced."""
    from redis._parsers.hiredis import _AsyncHiredisParser

    probes = []
    real_probe = _AsyncHiredisParser.can_read_destructive

    async def counted(self):
        probes.append(self)
        return await real_probe(self)

    monkeypatch.setattr(_AsyncHiredisParser, "can_read_destructive", counted)
    redis = connect_redis(redis_url)
    try:
        await redis.set("pool-probe", "v")
        for _ in range(5):
            assert await redis.get("pool-probe") == b"v"
        assert len(probes) == 1  # only the new connection's, right after its connect
        (connection,) = redis.connection_pool._available_connections
        await connection.send_command("PING")  # a reply nobody reads: the next command must not get it
        while not connection._reader._buffer:
            await asyncio.sleep(0.01)
        assert await redis.get("pool-probe") == b"v"
        assert len(probes) >= 2
    finally:
        await redis.aclose()
