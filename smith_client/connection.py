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

Redis Cluster: ``cluster=True`` (``SMITH_REDIS_CLUSTER``) gives redis-py's cluster client
(:class:`redis.asyncio.cluster.RedisCluster`, or :class:`redis.cluster.RedisCluster` from
:func:`connect_sync_redis`); the URL names any one node, the client finds the others and follows
``MOVED`` / ``ASK`` redirections and failovers, with bounded retries (:data:`CLUSTER_RETRIES`,
:data:`CLUSTER_NODE_RETRIES`). The runtime does not run on it yet: its scripts touch keys of many hash
slots at once and arq, the job queue, has no cluster mode (https://github.com/python-arq/arq/issues/385),
so workers and clients refuse ``SMITH_REDIS_CLUSTER`` (:func:`refuse_cluster_runtime`); the key layout
that would let them is designed in docs/cluster.md.

Every connection is bounded (nothing waits forever: docs/architecture.md, Fault model): a
connect or a command that gets no answer within ``socket_timeout`` seconds raises ``redis.exceptions.TimeoutError``
(a ``TransportError`` for callers) instead of blocking forever on a frozen
server, and a connection idle for :data:`HEALTH_CHECK_INTERVAL` seconds is
PINGed before it is used again, so one broken by a Redis restart is replaced
rather than failing the next command. Blocking reads (pub/sub ``get_message``)
pass their own, shorter bound.

A client's connections are capped (:func:`client_max_connections`; default
:data:`DEFAULT_MAX_CONNECTIONS`, the client's one shared pub/sub connection
included, :mod:`smith_client.fanout`): a command finding them all in use waits
for one, up to ``pool_timeout`` seconds (default the socket timeout), then fails
with :class:`~smith_client.redis_errors.PoolTimeoutError`, which callers get as
:class:`~smith_client.errors.SmithTimeoutError`. Workers' pools are not capped:
their job slots bound their commands in flight.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import Sequence
from typing import Any, Literal, TypedDict, Unpack, cast, overload

import redis as sync_redis
from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.connection import HiredisRespSerializer
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel
from redis.sentinel import SentinelConnectionPool as SyncSentinelConnectionPool
from redis.utils import HIREDIS_AVAILABLE

from smith_client.errors import ConfigurationError
from smith_client.redis_errors import PoolTimeoutError
from smith_client.serialization import job_deserializer, job_serializer

#: Default bound on one Redis connect or command, seconds (``SMITH_REDIS_SOCKET_TIMEOUT``, smith_client/settings.py).
DEFAULT_SOCKET_TIMEOUT = 5.0
#: Seconds a pooled connection may sit idle before it is checked with PING on its next use.
HEALTH_CHECK_INTERVAL = 10
#: Default cap on one client's Redis connections (``SMITH_REDIS_MAX_CONNECTIONS``), as redis-py's
#: ``BlockingConnectionPool``: a command holds one for a round trip, so a few dozen serve thousands of streams.
DEFAULT_MAX_CONNECTIONS = 50
#: The smallest cap: a client streaming holds one connection for its shared pub/sub, commands need another.
MIN_MAX_CONNECTIONS = 2


def client_max_connections(value: int) -> int:
    """``value`` as a client's connection cap (``SMITH_REDIS_MAX_CONNECTIONS`` by default, read by the clients'
    ``from_url``).

    Raises :class:`ConfigurationError` unless it is a whole number of at least
    :data:`MIN_MAX_CONNECTIONS`.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_MAX_CONNECTIONS:
        raise ConfigurationError(
            f"max_connections (SMITH_REDIS_MAX_CONNECTIONS) must be a whole number of at least {MIN_MAX_CONNECTIONS} "
            f"(one is the shared pub/sub connection), got {value!r}",
            setting="SMITH_REDIS_MAX_CONNECTIONS",
        )
    return value


class _HiredisPacking(AbstractConnection):
    """A connection that packs its commands with hiredis, as redis-py's blocking connections do when it is installed.

    redis-py's asyncio connections pack every command in Python (about 3.5 µs a command, a few dozen per
    turn in a turn worker); hiredis packs the same bytes in C, about five times faster. A value neither
    ``str``, ``bytes``, ``int``, ``float`` nor a buffer raises redis-py's ``DataError`` as before.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        """The command ``args`` in the Redis protocol (one chunk)."""
        return _HIREDIS_PACKER.pack(*args)  # type: ignore[no-any-return]  # redis-py leaves it unannotated


_HIREDIS_PACKER = HiredisRespSerializer()
#: redis-py's connection classes and their :class:`_HiredisPacking` versions, each made once.
_PACKING_WITH_HIREDIS: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _packing_with_hiredis(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """``base`` (redis-py's TCP, TLS, Unix-socket or Sentinel-managed connection) packing with hiredis."""
    if base not in _PACKING_WITH_HIREDIS:
        _PACKING_WITH_HIREDIS[base] = type(base.__name__, (_HiredisPacking, base), {})
    return _PACKING_WITH_HIREDIS[base]


class _HiredisPackingPool(ConnectionPool):
    """A pool whose connections pack commands with hiredis (:class:`_HiredisPacking`) when redis-py uses hiredis
    and the connections encode as UTF-8, strictly (hiredis's only encoding; the project's)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.connection_kwargs
        encoding = (options.get("encoding", "utf-8"), options.get("encoding_errors", "strict"))
        if HIREDIS_AVAILABLE and encoding == ("utf-8", "strict"):
            self.connection_class = _packing_with_hiredis(self.connection_class)


class _PlainIdleCheck(_HiredisPackingPool):
    """A pool whose check of a pooled connection before a command is cheap when the connection is plainly idle."""

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


class ConnectOutsideLockPool(_PlainIdleCheck):
    """redis-py's asyncio :class:`ConnectionPool`, connecting new connections outside the pool's lock (workers).

    redis-py 5 (pinned below 6 by arq 0.28) connects while holding the pool
    lock, so with Redis frozen N concurrent callers queue behind each other's
    connect timeouts (N x ``socket_timeout``; 17 s seen with 20 callers and a
    5 s timeout). Connecting outside the lock, as redis-py's own
    ``BlockingConnectionPool`` does, bounds each caller by one timeout.
    """

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


class BoundedPool(_PlainIdleCheck, BlockingConnectionPool):
    """redis-py's asyncio :class:`BlockingConnectionPool` (clients): at most ``max_connections`` connections; a
    caller finding them all in use waits up to ``timeout`` seconds for one, then gets :class:`PoolTimeoutError`.

    redis-py's pool also connects outside its lock (see :class:`ConnectOutsideLockPool`).
    """

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection; raises :class:`PoolTimeoutError` when none came free within ``timeout``."""
        try:
            return await super().get_connection()
        except RedisConnectionError as exc:
            if isinstance(exc.__cause__, TimeoutError):  # redis-py's "No connection available." ends the wait so
                raise PoolTimeoutError(self.max_connections, float(self.timeout or 0)) from exc
            raise


class BoundedSentinelPool(SentinelConnectionPool, BoundedPool):
    """:class:`BoundedPool` for a master found through Sentinel (redis-py's :class:`SentinelConnectionPool`)."""


class SentinelPool(SentinelConnectionPool, _HiredisPackingPool):
    """redis-py's :class:`SentinelConnectionPool` (workers), its connections packing with hiredis."""


class SyncBoundedPool(sync_redis.BlockingConnectionPool):
    """:class:`BoundedPool` for redis-py's blocking client (``SyncSmithClient``); thread-safe."""

    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection; raises :class:`PoolTimeoutError` when none came free within ``timeout``."""
        try:
            return super().get_connection()
        except RedisConnectionError as exc:
            if isinstance(exc.__context__, queue.Empty):  # redis-py's "No connection available." ends the wait so
                raise PoolTimeoutError(self.max_connections, float(self.timeout or 0)) from exc
            raise


class SyncBoundedSentinelPool(SyncSentinelConnectionPool, SyncBoundedPool):
    """:class:`SyncBoundedPool` for a master found through Sentinel."""


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


class ConnectOptions(TypedDict, total=False):
    """The options of :func:`connect_redis` and :func:`connect_sync_redis` (documented there)."""

    sentinels: str | Sequence[str | tuple[str, int]] | None
    sentinel_master: str | None
    socket_timeout: float | None
    max_connections: int | None
    pool_timeout: float | None


@overload
def connect_redis(url: str, *, cluster: Literal[False] = False, **options: Unpack[ConnectOptions]) -> ArqRedis: ...


@overload
def connect_redis(url: str, *, cluster: Literal[True], **options: Unpack[ConnectOptions]) -> RedisCluster: ...


def connect_redis(url: str, *, cluster: bool = False, **options: Unpack[ConnectOptions]) -> ArqRedis | RedisCluster:
    """An :class:`ArqRedis` client using the project's JSON job serializer, or with ``cluster`` a Redis Cluster client.

    ``url`` is ``redis://`` or ``rediss://`` (TLS) with optional ACL user and
    password. With ``sentinels`` (see :func:`parse_sentinels`) and
    ``sentinel_master`` the client asks the Sentinels for the current master
    and follows failovers: commands that meet a dead master retry (up to
    :data:`SENTINEL_RETRIES` times) until a new one is promoted.

    ``socket_timeout`` (seconds; default :data:`DEFAULT_SOCKET_TIMEOUT`) bounds each connect and each
    command, to the Sentinels too (the clients' ``from_url`` and the workers pass ``SMITH_REDIS_SOCKET_TIMEOUT``).
    ``max_connections`` caps the pool (None: no cap, the workers'): a command
    finding every connection in use waits up to ``pool_timeout`` seconds
    (default ``socket_timeout``) for one, then raises :class:`PoolTimeoutError`.

    With ``cluster`` (``SMITH_REDIS_CLUSTER``), ``url`` names any node of a Redis Cluster and the result
    is redis-py's :class:`~redis.asyncio.cluster.RedisCluster` (no job serializer: the runtime does not
    run on it yet, docs/cluster.md), built by :func:`_cluster_options`.

    Connects lazily: no command is sent until the first use. Raises
    :class:`ConfigurationError` for a malformed ``url`` (:func:`check_url`) or when only one of the
    two Sentinel options is given.
    """
    if cluster:
        retry = Retry(_CLUSTER_BACKOFF, CLUSTER_NODE_RETRIES)
        return cast(RedisCluster, RedisCluster.from_url(url, **_cluster_options(url, options, retry)))
    addresses, sentinel_master, bounds, cap = _plan(url, options)
    if not addresses:
        pool = (BoundedPool if cap else ConnectOutsideLockPool).from_url(url, **bounds, **cap)
        return ArqRedis(pool, job_serializer=job_serializer, job_deserializer=job_deserializer)
    assert sentinel_master is not None
    master = _master_options(url, Retry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES)) | bounds | cap
    redis = Sentinel(addresses, sentinel_kwargs=_sentinel_bounds(bounds)).master_for(
        sentinel_master,
        redis_class=ArqRedis,
        connection_pool_class=BoundedSentinelPool if cap else SentinelPool,
        **master,
    )
    redis.job_serializer, redis.job_deserializer = job_serializer, job_deserializer  # master_for takes no such options
    return cast(ArqRedis, redis)


@overload
def connect_sync_redis(
    url: str, *, cluster: Literal[False] = False, **options: Unpack[ConnectOptions]
) -> sync_redis.Redis: ...


@overload
def connect_sync_redis(url: str, *, cluster: Literal[True], **options: Unpack[ConnectOptions]) -> SyncRedisCluster: ...


def connect_sync_redis(
    url: str, *, cluster: bool = False, **options: Unpack[ConnectOptions]
) -> sync_redis.Redis | SyncRedisCluster:
    """A blocking :class:`redis.Redis` for ``url``, for :class:`SyncSmithClient`; options as :func:`connect_redis`,
    ``cluster`` too (then redis-py's blocking :class:`redis.cluster.RedisCluster`).

    Its connection pool is thread-safe (one connection per command in flight).
    Connects lazily: no command is sent until the first use; but a cluster client reads the slot map at
    once, raising redis-py's ``RedisClusterException`` when no node answers.
    """
    if cluster:
        sync_retry = SyncRetry(_CLUSTER_BACKOFF, CLUSTER_NODE_RETRIES)
        return cast(SyncRedisCluster, SyncRedisCluster.from_url(url, **_cluster_options(url, options, sync_retry)))
    addresses, sentinel_master, bounds, cap = _plan(url, options)
    if not addresses:
        pool = (SyncBoundedPool if cap else sync_redis.ConnectionPool).from_url(url, **bounds, **cap)
        return sync_redis.Redis(connection_pool=pool)
    assert sentinel_master is not None
    master = _master_options(url, SyncRetry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES)) | bounds | cap
    sentinel = SyncSentinel(addresses, sentinel_kwargs=_sentinel_bounds(bounds))
    pool_class = SyncBoundedSentinelPool if cap else SyncSentinelConnectionPool
    return cast(sync_redis.Redis, sentinel.master_for(sentinel_master, connection_pool_class=pool_class, **master))


#: Retries of a cluster command that failed on a node down, a timeout or ``CLUSTERDOWN`` (redis-py's
#: ``cluster_error_retry_attempts``): each re-reads the slot map from a live node first, so one retry after a
#: replica's promotion reaches the new master. ``MOVED`` / ``ASK`` are followed apart from these, up to
#: redis-py's 16 redirections per command (``RedisClusterRequestTTL``).
CLUSTER_RETRIES = 10
#: Attempts to reach one node before the cluster client re-reads the slot map (redis-py's node ``retry``),
#: waiting :data:`_CLUSTER_BACKOFF` between them: with :data:`CLUSTER_RETRIES`, a command rides out about
#: 15 s of a master down (a failover with a ``cluster-node-timeout`` of a few seconds), then raises.
CLUSTER_NODE_RETRIES = 3
#: 0.2 s, 0.4 s, 0.8 s… up to 1 s between attempts at one node (redis-py's ``ExponentialBackoff``).
_CLUSTER_BACKOFF = ExponentialBackoff(cap=1.0, base=0.1)


def _cluster_options(url: str, options: ConnectOptions, retry: Retry | SyncRetry) -> dict[str, Any]:
    """The options of redis-py's cluster clients (either kind) for a node's ``url`` and :class:`ConnectOptions`.

    The timeouts of :func:`_bounds`; ``max_connections`` caps the connections to each node (redis-py's
    cluster pools do not wait for one: a command finding all in use raises at once). Raises
    :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``) for a ``url`` naming a socket or a database
    other than 0 (a cluster has only database 0: redis.io, "Redis cluster specification"), with Sentinel
    (the cluster promotes replicas itself) or with ``pool_timeout`` (no cluster pool waits).
    """
    parsed = dict(parse_url(check_url(url)))
    if "path" in parsed or parsed.get("db", 0) != 0:
        raise ConfigurationError(
            "a Redis Cluster URL must name a node by host and port, database 0 (redis://host:port/0)",
            setting="SMITH_REDIS_CLUSTER",
        )
    if options.get("sentinels") or options.get("sentinel_master") or options.get("pool_timeout") is not None:
        raise ConfigurationError(
            "Redis Cluster takes neither Sentinel (SMITH_REDIS_SENTINELS) nor a pool timeout: the cluster promotes "
            "replicas itself and its pools do not wait",
            setting="SMITH_REDIS_CLUSTER",
        )
    cluster = _bounds(options.get("socket_timeout"))
    cluster.update(cluster_error_retry_attempts=CLUSTER_RETRIES, retry=retry)
    if (cap := options.get("max_connections")) is not None:
        cluster["max_connections"] = client_max_connections(cap)
    return cluster


def refuse_cluster_runtime(cluster: bool) -> None:
    """Raise :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``) when ``cluster`` is set: the workers and
    clients do not run on Redis Cluster yet (its scripts' keys span hash slots; docs/cluster.md)."""
    if cluster:
        raise ConfigurationError(
            "SMITH_REDIS_CLUSTER is set, but Agent Smith does not run on Redis Cluster yet: its scripts touch keys "
            "of many hash slots at once (docs/cluster.md designs the layout that will); use a single Redis or Sentinel",
            setting="SMITH_REDIS_CLUSTER",
        )


#: What :func:`_plan` returns: Sentinel addresses, master name, timeouts, pool cap.
_Plan = tuple[list[tuple[str, int]], str | None, dict[str, Any], dict[str, Any]]


def _plan(url: str, options: ConnectOptions) -> _Plan:
    """What a connection of either kind is built from: the Sentinel addresses (none: connect to ``url``), the
    master's name, the timeouts bounding every wait and the pool cap. Raises :class:`ConfigurationError`."""
    check_url(url)
    master = options.get("sentinel_master")
    addresses = _sentinel_addresses(options.get("sentinels"), master)
    bounds = _bounds(options.get("socket_timeout"))
    return addresses, master, bounds, _cap(options.get("max_connections"), options.get("pool_timeout"), bounds)


def _cap(max_connections: int | None, pool_timeout: float | None, bounds: dict[str, Any]) -> dict[str, Any]:
    """The options of a capped pool (redis-py's ``BlockingConnectionPool``), or ``{}`` for no cap."""
    if max_connections is None:
        return {}
    if pool_timeout is not None and not pool_timeout > 0:
        raise ConfigurationError(f"pool_timeout must be a positive number of seconds, got {pool_timeout!r}")
    return {
        "max_connections": client_max_connections(max_connections),
        "timeout": pool_timeout if pool_timeout is not None else bounds["socket_timeout"],
    }


def _bounds(socket_timeout: float | None) -> dict[str, Any]:
    """The connection options bounding every wait, for redis-py's asyncio and blocking pools."""
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
