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

Every connection is bounded (issue 8): a connect or a command that gets no
answer within ``socket_timeout`` seconds raises ``redis.exceptions.TimeoutError``
(a ``TransportError`` for callers) instead of blocking forever on a frozen
server, and a connection idle for :data:`HEALTH_CHECK_INTERVAL` seconds is
PINGed before it is used again, so one broken by a Redis restart is replaced
rather than failing the next command. Blocking reads (pub/sub ``get_message``)
pass their own, shorter bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, cast

import redis as sync_redis
from arq.connections import ArqRedis
from redis.asyncio import ConnectionPool
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel

from smith_client.errors import ConfigurationError
from smith_client.serialization import job_deserializer, job_serializer

#: Default bound on one Redis connect or command, seconds (``SMITH_REDIS_SOCKET_TIMEOUT``, smith_client/settings.py).
DEFAULT_SOCKET_TIMEOUT = 5.0
#: Seconds a pooled connection may sit idle before it is checked with PING on its next use.
HEALTH_CHECK_INTERVAL = 10


class ConnectOutsideLockPool(ConnectionPool):
    """redis-py's asyncio :class:`ConnectionPool`, connecting new connections outside the pool's lock.

    redis-py 5 (pinned below 6 by arq 0.28) connects while holding the pool
    lock, so with Redis frozen N concurrent callers queue behind each other's
    connect timeouts (N x ``socket_timeout``; 17 s seen with 20 callers and a
    5 s timeout). Connecting outside the lock, as redis-py's own
    ``BlockingConnectionPool`` does, bounds each caller by one timeout.
    """

    async def ensure_connection(self, connection: Any) -> None:
        """redis-py's check that a pooled connection is connected and holds no unread bytes, cheap when plain.

        redis-py reads the socket with a zero timeout for every command it sends: one extra pass
        through the event loop each time (~5 % of a busy turn worker's CPU). A connected connection
        whose stream reader holds no bytes and no EOF and whose hiredis parser holds no reply is
        ready as it is (redis-py disconnects a connection whose read was interrupted, so no stale
        reply can be on its way); any other goes through redis-py's own check.
        """
        if not _plainly_idle(connection):
            await super().ensure_connection(connection)

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection from the pool (see the class docstring)."""
        async with self._lock:
            connection = self.get_available_connection()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection


def _plainly_idle(connection: Any) -> bool:
    """True when ``connection`` is connected, its stream reader is empty and open and its parser holds nothing.

    Only redis-py's hiredis parser (the one installed with the worker extra) exposes that; with the
    pure-Python parser the answer is False and redis-py's own check runs.
    """
    reader = getattr(connection, "_reader", None)
    parser = getattr(getattr(connection, "_parser", None), "_reader", None)
    if not connection.is_connected or not isinstance(reader, asyncio.StreamReader) or parser is None:
        return False
    has_data = getattr(parser, "has_data", None)
    if has_data is None:
        return False
    buffered = reader._buffer  # type: ignore[attr-defined]  # asyncio's buffer, as redis-py reads it too
    return not buffered and not reader.at_eof() and reader.exception() is None and not has_data()


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
            raise ConfigurationError(
                f"a Sentinel address must be host:port, got {item!r}", setting="SMITH_REDIS_SENTINELS"
            )
        addresses.append((host.strip("[]"), int(port)))  # [v6]:port
    return addresses


def check_url(url: str) -> str:
    """``url`` if redis-py can parse it (scheme ``redis``/``rediss``/``unix``, numeric port and database).

    Raises :class:`ConfigurationError` naming ``SMITH_REDIS_URL`` (the URL itself is not
    repeated: it may carry a password).
    """
    try:
        parse_url(url)
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(f"SMITH_REDIS_URL is not a valid Redis URL: {exc}", setting="SMITH_REDIS_URL") from exc
    return url


def connect_redis(
    url: str,
    *,
    sentinels: str | Sequence[str | tuple[str, int]] | None = None,
    sentinel_master: str | None = None,
    socket_timeout: float | None = None,
) -> ArqRedis:
    """An :class:`ArqRedis` client using the project's JSON job serializer.

    ``url`` is ``redis://`` or ``rediss://`` (TLS) with optional ACL user and
    password. With ``sentinels`` (see :func:`parse_sentinels`) and
    ``sentinel_master`` the client asks the Sentinels for the current master
    and follows failovers: commands that meet a dead master retry (up to
    :data:`SENTINEL_RETRIES` times) until a new one is promoted.

    ``socket_timeout`` (seconds; default :data:`DEFAULT_SOCKET_TIMEOUT`) bounds each connect and each
    command, to the Sentinels too (the clients' ``from_url`` and the workers pass ``SMITH_REDIS_SOCKET_TIMEOUT``).

    Connects lazily: no command is sent until the first use. Raises
    :class:`ConfigurationError` for a malformed ``url`` (:func:`check_url`) or when only one of the
    two Sentinel options is given.
    """
    check_url(url)
    addresses = _sentinel_addresses(sentinels, sentinel_master)
    bounds = _bounds(socket_timeout)
    if not addresses:
        pool = ConnectOutsideLockPool.from_url(url, **bounds)
        return ArqRedis(pool, job_serializer=job_serializer, job_deserializer=job_deserializer)
    assert sentinel_master is not None
    options = _master_options(url, Retry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES)) | bounds
    redis = Sentinel(addresses, sentinel_kwargs=_sentinel_bounds(bounds)).master_for(
        sentinel_master, redis_class=ArqRedis, **options
    )
    redis.job_serializer, redis.job_deserializer = job_serializer, job_deserializer  # master_for takes no such options
    return cast(ArqRedis, redis)


def connect_sync_redis(
    url: str,
    *,
    sentinels: str | Sequence[str | tuple[str, int]] | None = None,
    sentinel_master: str | None = None,
    socket_timeout: float | None = None,
) -> sync_redis.Redis:
    """A blocking :class:`redis.Redis` for ``url``, for :class:`SyncSmithClient`; options as :func:`connect_redis`.

    Its connection pool is thread-safe (one connection per command in flight).
    Connects lazily: no command is sent until the first use.
    """
    check_url(url)
    addresses = _sentinel_addresses(sentinels, sentinel_master)
    bounds = _bounds(socket_timeout)
    if not addresses:
        return sync_redis.Redis(connection_pool=sync_redis.ConnectionPool.from_url(url, **bounds))
    assert sentinel_master is not None
    options = _master_options(url, SyncRetry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES)) | bounds
    sentinel = SyncSentinel(addresses, sentinel_kwargs=_sentinel_bounds(bounds))
    return cast(sync_redis.Redis, sentinel.master_for(sentinel_master, **options))


def _bounds(socket_timeout: float | None) -> dict[str, Any]:
    """The connection options bounding every wait (issue 8), for redis-py's asyncio and blocking pools."""
    timeout = socket_timeout if socket_timeout is not None else DEFAULT_SOCKET_TIMEOUT
    return {
        "socket_timeout": timeout,
        "socket_connect_timeout": timeout,
        "socket_keepalive": True,
        "health_check_interval": HEALTH_CHECK_INTERVAL,
    }


def _sentinel_bounds(bounds: dict[str, Any]) -> dict[str, Any]:
    """The same bounds for the connections to the Sentinels (no health check: they are short-lived)."""
    return {"socket_timeout": bounds["socket_timeout"], "socket_connect_timeout": bounds["socket_connect_timeout"]}


def _sentinel_addresses(
    sentinels: str | Sequence[str | tuple[str, int]] | None, sentinel_master: str | None
) -> list[tuple[str, int]]:
    """The Sentinel addresses, or ``[]`` for a direct connection; both options or neither."""
    addresses = parse_sentinels(sentinels)
    if bool(addresses) != bool(sentinel_master):
        raise ConfigurationError(
            "Sentinel needs both SMITH_REDIS_SENTINELS and SMITH_REDIS_SENTINEL_MASTER",
            setting="SMITH_REDIS_SENTINEL_MASTER",
        )
    return addresses


def _master_options(url: str, retry: Retry | SyncRetry) -> dict[str, Any]:
    """Connection options of the Sentinel-managed master connections, from ``url``."""
    options: dict[str, Any] = dict(parse_url(url))
    for address_part in ("host", "port", "path"):  # the Sentinels name the master
        options.pop(address_part, None)
    # SentinelConnectionPool picks its own (TLS or plain) connection class from ``ssl``
    options["ssl"] = options.pop("connection_class", None) is SSLConnection or options.get("ssl", False)
    options["retry"] = retry
    options["retry_on_error"] = [RedisConnectionError, RedisTimeoutError]
    return options
