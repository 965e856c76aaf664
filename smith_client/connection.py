"""The one place Redis connections are built, for the client and the workers.

Every process of a deployment (``SmithClient``, turn and tool workers, the
CLI) connects through :func:`connect_redis`, and ``SyncSmithClient`` through
:func:`connect_sync_redis`, so connection options (timeouts,
TLS, Sentinel) are decided here once.

Supported topologies:

* a single server: ``redis://[user:password@]host:port/db``;
* TLS: ``rediss://…``, with ``ssl_ca_certs`` / ``ssl_certfile`` /
  ``ssl_keyfile`` / ``ssl_cert_reqs`` as URL query parameters
  (redis-py's URL syntax);
* ACL users: the URL's user and password (``AUTH user password``);
* Sentinel: ``sentinels`` (``host:port`` addresses) and ``sentinel_master``
  (the monitored master's name). The URL still gives the master's
  credentials, database and TLS; its host and port are ignored, the
  sentinels name the master. The Sentinels themselves are reached without
  TLS or password.

Redis Cluster is not supported: arq, the job queue, has no cluster mode
(python-arq/arq#385), and redis-py's async cluster client lacks the pub/sub
this runtime uses under arq's ``redis<6`` pin (research/web-and-ops-notes.md §Q4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis as sync_redis
from arq.connections import ArqRedis
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from smith_client.errors import ConfigurationError
from smith_client.serialization import job_deserializer, job_serializer

#: Retries of a command while Sentinel promotes a new master (each waits up to 1 s, exponential backoff):
#: enough for a failover with ``down-after-milliseconds`` of a few seconds plus the election.
SENTINEL_RETRIES = 30


def parse_sentinels(value: str | Sequence[str | tuple[str, int]] | None) -> list[tuple[str, int]]:
    """``"h1:26379,h2:26379"`` (or a list of ``"host:port"`` / ``(host, port)``) → ``[(host, port), …]``.

    Raises :class:`ConfigurationError` on an address without a numeric port.
    """
    if not value:
        return []
    items = value.split(",") if isinstance(value, str) else list(value)
    addresses = []
    for item in items:
        if isinstance(item, tuple):
            addresses.append((item[0], int(item[1])))
            continue
        host, _, port = item.strip().rpartition(":")
        if not host or not port.isdigit():
            raise ConfigurationError(f"a Sentinel address must be host:port, got {item!r}",
                                     setting="SMITH_REDIS_SENTINELS")
        addresses.append((host.strip("[]"), int(port)))  # [v6]:port
    return addresses


def connect_redis(
    url: str,
    *,
    sentinels: str | Sequence[str | tuple[str, int]] | None = None,
    sentinel_master: str | None = None,
) -> ArqRedis:
    """An :class:`ArqRedis` client using the project's JSON job serializer.

    ``url`` is ``redis://`` or ``rediss://`` (TLS) with optional ACL user and
    password. With ``sentinels`` (see :func:`parse_sentinels`) and
    ``sentinel_master`` the client asks the Sentinels for the current master
    and follows failovers: commands that meet a dead master retry (up to
    :data:`SENTINEL_RETRIES` times) until a new one is promoted.

    Connects lazily: no command is sent until the first use. Raises
    :class:`ConfigurationError` when only one of the two Sentinel options is given.
    """
    addresses = _sentinel_addresses(sentinels, sentinel_master)
    if not addresses:
        return ArqRedis(ConnectionPool.from_url(url), job_serializer=job_serializer, job_deserializer=job_deserializer)
    assert sentinel_master is not None
    options = _master_options(url, Retry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES))
    redis = Sentinel(addresses).master_for(sentinel_master, redis_class=ArqRedis, **options)
    redis.job_serializer, redis.job_deserializer = job_serializer, job_deserializer  # master_for takes no such options
    return redis


def connect_sync_redis(
    url: str,
    *,
    sentinels: str | Sequence[str | tuple[str, int]] | None = None,
    sentinel_master: str | None = None,
) -> sync_redis.Redis:
    """A blocking :class:`redis.Redis` for ``url``, for :class:`SyncSmithClient`; options as :func:`connect_redis`.

    Its connection pool is thread-safe (one connection per command in flight).
    Connects lazily: no command is sent until the first use.
    """
    addresses = _sentinel_addresses(sentinels, sentinel_master)
    if not addresses:
        return sync_redis.Redis(connection_pool=sync_redis.ConnectionPool.from_url(url))
    assert sentinel_master is not None
    options = _master_options(url, SyncRetry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES))
    return SyncSentinel(addresses).master_for(sentinel_master, **options)


def _sentinel_addresses(
    sentinels: str | Sequence[str | tuple[str, int]] | None, sentinel_master: str | None
) -> list[tuple[str, int]]:
    """The Sentinel addresses, or ``[]`` for a direct connection; both options or neither."""
    addresses = parse_sentinels(sentinels)
    if bool(addresses) != bool(sentinel_master):
        raise ConfigurationError("Sentinel needs both SMITH_REDIS_SENTINELS and SMITH_REDIS_SENTINEL_MASTER",
                                 setting="SMITH_REDIS_SENTINEL_MASTER")
    return addresses


def _master_options(url: str, retry: Retry | SyncRetry) -> dict[str, Any]:
    """Connection options of the Sentinel-managed master connections, from ``url``."""
    options = parse_url(url)
    for address_part in ("host", "port", "path"):  # the Sentinels name the master
        options.pop(address_part, None)
    # SentinelConnectionPool picks its own (TLS or plain) connection class from ``ssl``
    options["ssl"] = options.pop("connection_class", None) is SSLConnection or options.get("ssl", False)
    options["retry"] = retry
    options["retry_on_error"] = [RedisConnectionError, RedisTimeoutError]
    return options
