"""The one place Redis connections are built, for the client and the workers.

Every process of a deployment (``SmithClient``, turn and tool workers, the
CLI) connects through :func:`connect_redis`, and ``SyncSmithClient`` through
:func:`connect_sync_redis`, so connection options (timeouts,
TLS, Sentinel, Redis Cluster) are decided here once.

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

Redis Cluster, two ways, the URL naming any one node (``redis://host:port/0``):

* slot-pinned (``cluster_key``): a deployment whose every key carries one hash tag keeps all of them in one
  hash slot, so on one master at a time; :func:`connect_redis` / :func:`connect_sync_redis` with
  ``cluster_key`` (a key of that slot, or the tag itself) give the usual clients on a pool whose connections
  all go to that slot's master (:class:`SlotPool` and kin, as redis-py's Sentinel pools go to Sentinel's
  master): found with ``CLUSTER SLOTS`` from the URL's node or any node learned since, followed through
  ``MOVED``, failovers and slot moves, a command meeting a master down or a slot in motion retrying
  (:data:`SLOT_RETRIES`: about 15 s) meanwhile. Pub/sub, ``MULTI`` / ``EXEC`` and scripts work as on a
  single Redis. A redirected command never ran, so resending it is safe; as with Sentinel, one resent after a
  connection error may have run already, and a transaction under ``WATCH`` that meets either ends in
  redis-py's ``WatchError``.
* redis-py's cluster client (:func:`connect_redis_cluster`, :func:`connect_sync_redis_cluster`): keys of any
  slot, ``MOVED`` / ``ASK`` followed, bounded retries (:data:`CLUSTER_RETRIES`, :data:`CLUSTER_NODE_RETRIES`);
  no pub/sub and no ``MULTI`` in redis-py 5's asyncio client.

The runtime runs on the slot-pinned clients with ``SMITH_REDIS_CLUSTER`` (its keys all carry the prefix as a
hash tag: :attr:`smith_client.keys.Keys.cluster`; docs/cluster.md, One hash slot).

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
import threading
import weakref
from collections.abc import Sequence
from typing import Any, TypedDict, Unpack, cast

import redis as sync_redis
from arq.connections import ArqRedis
from redis.asyncio import BlockingConnectionPool, ConnectionPool
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.cluster import RedisCluster as SyncRedisCluster
from redis.connection import HiredisRespSerializer
from redis.crc import key_slot
from redis.exceptions import AuthenticationError, AuthorizationError, ReadOnlyError, RedisError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel
from redis.sentinel import SentinelConnectionPool as SyncSentinelConnectionPool
from redis.utils import HIREDIS_AVAILABLE, str_if_bytes

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


#: A node's ``(host, port)``.
Address = tuple[str, int]
#: Retries of a command on a slot-pinned pool (:func:`connect_redis` with ``cluster_key``) after a connection error
#: or a redirection (:meth:`SlotMaster.redirected`), :data:`_CLUSTER_BACKOFF` apart: 0.2 + 0.4 + 0.8 + 14 x 1 s =
#: 15.4 s of waiting, so a command rides out about 15 s of its master down (a failover with a
#: ``cluster-node-timeout`` of a few seconds) or of its slot moving, then raises. Each attempt's own time adds to
#: that: nothing where a dead node's host refuses the connect, up to ``socket_connect_timeout`` per node asked or
#: tried where its packets are lost. Getting a connection from the pool is retried as much (redis-py connects a
#: pooled connection before the command's own retries start).
SLOT_RETRIES = 17
#: Error replies (their first word) meaning "not here, not now": the command was not run, the slot's master is
#: elsewhere or about to be (redis.io, "Redis cluster specification": MOVED and ASK redirections, TRYAGAIN during a
#: slot's migration, CLUSTERDOWN while a slot has no master; READONLY from a demoted master; MASTERDOWN from a
#: replica cut from its master). ``LOADING`` (a node loading its data) is redis-py's ``BusyLoadingError``, a
#: ``ConnectionError`` already.
_RETRIED_REPLIES = frozenset({"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "READONLY", "MASTERDOWN"})
#: The nodes this process last learned of a cluster, by the node it was first reached through (a URL's): a slot
#: pool built later for the same URL starts from them, so one built after the URL's node died (a worker's new
#: wake-up or abort connection, a new client) still finds the cluster. Lists are replaced, never changed in place.
_KNOWN_CONTACTS: dict[Address, list[Address]] = {}
#: Refusals of a node that answered: asking it again changes nothing (credentials, permissions, not a cluster).
_REFUSALS = (ResponseError, AuthenticationError, AuthorizationError)


class SlotMaster:
    """Where the master of one hash slot is, for the slot-pinned pools (asyncio and blocking); no I/O.

    A deployment whose every key carries one hash tag has all its keys in one slot
    (``redis.crc.key_slot(cluster_key)``), so on one master at a time (redis.io, "Redis cluster
    specification", Keys hash tags). ``address`` is that master as last learned (None: ask the nodes again);
    ``contacts`` the nodes to ask with ``CLUSTER SLOTS``, in order: the one that answered last, the others of its
    reply, then the URL's node (``origin``), so any of them may die. The pools do the asking
    (:meth:`learn`, :meth:`failed`) and hand error replies to :meth:`redirected`.
    """

    def __init__(self, cluster_key: str, origin: Address) -> None:
        self.slot = key_slot(cluster_key.encode())
        self.origin = origin
        self.contacts: list[Address] = _KNOWN_CONTACTS.get(origin, [origin])
        self.address: Address | None = None

    def learn(self, reply: Any, asked: Address) -> Address:
        """Take node ``asked``'s ``CLUSTER SLOTS`` reply: its nodes become the contacts, the slot's master the address.

        ``reply``: ``[[first slot, last slot, [host, port, id, …] of the master, replicas…], …]``, strings as
        bytes or str (redis.io, "CLUSTER SLOTS"; an empty host means ``asked``'s host, ``?`` an unknown one).
        Raises redis-py's ``ConnectionError`` (retried) when no known master serves the slot.
        """
        master: Address | None = None
        nodes: list[Address] = []
        for first, last, *holders in reply:
            addresses = [_endpoint(holder[0], holder[1], asked) for holder in holders]
            nodes += [address for address in addresses if address is not None]
            if int(first) <= self.slot <= int(last):
                master = addresses[0]
        self.contacts = _KNOWN_CONTACTS[self.origin] = list(dict.fromkeys([asked, *nodes, self.origin]))
        if master is None:
            raise RedisConnectionError(f"{_node(asked)} knows no master serving hash slot {self.slot}")
        self.address = master
        return master

    def failed(self, contact: Address) -> None:
        """``contact`` did not answer: ask it last from now on."""
        if contact in self.contacts:
            self.contacts = [*(known for known in self.contacts if known != contact), contact]

    def none_answered(self, errors: list[tuple[Address, RedisError]]) -> Exception:
        """The error when no contact said where the slot's master is (``errors``: each contact asked and its error).

        When every contact answered with a refusal (:data:`_REFUSALS`), asking again cannot help: a node that is
        not a cluster node gives :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``), refused credentials or
        permissions the first refusal itself (a worker exits on those: smith_worker/ops/redis_health.py). Otherwise
        a ``ConnectionError`` listing them, which the pool's ``Retry`` retries.
        """
        if errors and all(isinstance(error, _REFUSALS) for _, error in errors):
            contact, refusal = errors[0]
            if "cluster support disabled" in str(refusal):
                return ConfigurationError(
                    f"SMITH_REDIS_CLUSTER is set, but {_node(contact)} is not a Redis Cluster node ({refusal})",
                    setting="SMITH_REDIS_CLUSTER",
                )
            return type(refusal)(f"{_node(contact)}: {refusal}")
        lines = "; ".join(f"{_node(contact)}: {error}" for contact, error in errors)
        return RedisConnectionError(f"no Redis Cluster node said which master serves hash slot {self.slot}: {lines}")

    def forget(self, address: Address) -> None:
        """Ask the nodes again before the next connect, unless the master was learned elsewhere than ``address``."""
        if self.address == address:
            self.address = None

    def serves_from(self, address: Address) -> bool:
        """False when a connection to ``address`` is known to be on another node than the slot's master."""
        return self.address is None or self.address == address

    def redirected(self, error: ResponseError, address: Address) -> RedisError:
        """What a connection to ``address`` raises for the error reply ``error``.

        A redirection or refusal for this slot (:data:`_RETRIED_REPLIES`) is a ``ConnectionError``, which the
        client's ``Retry`` answers by reconnecting: ``MOVED`` first makes its target the address, the others make
        the nodes be asked again. A ``MOVED`` / ``ASK`` for another slot is a key without the deployment's hash
        tag: a ``ResponseError`` saying so. Any other error is ``error`` itself.
        """
        code, _, detail = str(error).partition(" ")
        code = "READONLY" if isinstance(error, ReadOnlyError) else code  # redis-py strips that one's code
        if code not in _RETRIED_REPLIES:
            return error
        if code in ("MOVED", "ASK"):
            slot, _, target = detail.partition(" ")
            if slot != str(self.slot):
                return ResponseError(
                    f"{error}: a key outside hash slot {self.slot}, the one the connection is pinned to "
                    "(every key must carry the deployment's hash tag)"
                )
            host, _, port = target.rpartition(":")
            moved = _endpoint(host, port, address) if code == "MOVED" and port.isdigit() else None
            if moved is not None:
                self.address = moved
                return RedisConnectionError(f"{error} (from {_node(address)}): reconnecting to {_node(moved)}")
        self.forget(address)
        return RedisConnectionError(f"{error} (from {_node(address)}): reconnecting to hash slot {self.slot}'s master")


def _endpoint(host: Any, port: Any, asked: Address) -> Address | None:
    """A node's address from a cluster reply's ``host`` (bytes or str; empty: ``asked``'s, ``?``: unknown) and port."""
    name = str_if_bytes(host) if host is not None else ""
    if name == "?":
        return None
    return (name or asked[0], int(port))


def _node(address: Address) -> str:
    """``host:port``, for messages."""
    return f"{address[0]}:{address[1]}"


def _slot_options(options: dict[str, Any], origin: Address, retry: Retry | SyncRetry) -> dict[str, Any]:
    """A slot-pinned pool's connection options: ``options``, the first node to connect to, the command retries
    (``retry``), retrying on connection errors and timeouts unless ``options`` say on what."""
    return {"retry_on_error": [RedisConnectionError, RedisTimeoutError], **options, "retry": retry} | {
        "host": origin[0],
        "port": origin[1],
    }


class SlotConnection(Connection):
    """An asyncio connection to the master of its pool's hash slot (:class:`SlotPool`), as redis-py's
    ``SentinelManagedConnection`` is to Sentinel's master.

    Each connect asks the pool for the master's address (:meth:`SlotPool.master_address`); a connect, write or read
    that fails drops that address, and an error reply that means the slot is elsewhere or moving
    (:meth:`SlotMaster.redirected`) disconnects and raises ``ConnectionError``, so the client's ``Retry``
    reconnects to the slot's master and sends the command again (commands, pipelines and ``MULTI`` / ``EXEC``,
    scripts, pub/sub alike).
    """

    def __init__(self, *, slot_pool: Any, **kwargs: Any) -> None:
        self.slot_pool = slot_pool
        super().__init__(**kwargs)

    @property
    def address(self) -> Address:
        """The node this connection is (or was last) connected to."""
        return (self.host, self.port)

    async def connect(self) -> None:
        """Connect to the slot's master, unless connected."""
        if self.is_connected:
            return
        self.host, self.port = await self.slot_pool.master_address()
        try:
            await super().connect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        except (RedisConnectionError, RedisTimeoutError):
            self.slot_pool.slot_master.forget(self.address)
            raise

    async def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        """redis-py's, dropping the master's address when the write fails."""
        address = self.address
        try:
            await super().send_packed_command(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError):
            self.slot_pool.slot_master.forget(address)
            raise

    async def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's, an error reply for the slot's whereabouts turned into ``ConnectionError`` (see the class)."""
        address = self.address
        try:
            return await super().read_response(*args, **kwargs)
        except ResponseError as error:
            raised = self.slot_pool.slot_master.redirected(error, address)
            if raised is error:
                raise
            if isinstance(raised, RedisConnectionError):
                await self.disconnect()  # a MULTI's other replies are still on their way: never reuse it
            raise raised from error
        except (RedisConnectionError, RedisTimeoutError):
            self.slot_pool.slot_master.forget(address)
            raise


class SlotSSLConnection(SlotConnection, SSLConnection):
    """:class:`SlotConnection` over TLS (``rediss://``)."""


class _SlotPinning(ConnectionPool):
    """An asyncio pool whose connections all go to the master of ``cluster_key``'s hash slot (see :class:`SlotMaster`).

    ``host`` and ``port`` name any node of the cluster (the first contact). Its connections are
    :class:`SlotConnection` (:class:`SlotSSLConnection` for ``rediss://``), retrying :data:`SLOT_RETRIES` times
    unless ``retry`` says otherwise.
    """

    def __init__(
        self,
        *,
        cluster_key: str,
        host: str = "localhost",
        port: int = 6379,
        connection_class: type[Connection] = Connection,
        retry: Retry | None = None,
        **kwargs: Any,
    ) -> None:
        self.slot_master = SlotMaster(cluster_key, (host, int(port)))
        self._retry = retry or Retry(_CLUSTER_BACKOFF, SLOT_RETRIES)
        self._probe_class = connection_class
        self._resolving = asyncio.Lock()
        pinned = SlotSSLConnection if issubclass(connection_class, SSLConnection) else SlotConnection
        super().__init__(connection_class=pinned, **_slot_options(kwargs, self.slot_master.origin, self._retry))
        self.connection_kwargs["slot_pool"] = weakref.proxy(self)

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connection to the slot's master; a failed connect is retried as a command is (:data:`SLOT_RETRIES`),
        a :class:`PoolTimeoutError` is not (it has waited its time)."""
        return await self._retry.call_with_retry(super().get_connection, _raise_pool_timeout)

    async def ensure_connection(self, connection: Any) -> None:
        """redis-py's check, after closing a connection to a node that no longer holds the slot."""
        if connection.is_connected and not self.slot_master.serves_from(connection.address):
            await connection.disconnect()
        await super().ensure_connection(connection)

    async def master_address(self) -> Address:
        """The slot's master: the address learned last, else asked of the contacts (one asking at a time).

        Raises redis-py's ``ConnectionError`` when no contact answers with a master for the slot.
        """
        if self.slot_master.address is not None:
            return self.slot_master.address
        async with self._resolving:
            return self.slot_master.address or await self._ask_contacts()

    async def _ask_contacts(self) -> Address:
        errors: list[tuple[Address, RedisError]] = []
        for contact in list(self.slot_master.contacts):
            try:
                return self.slot_master.learn(await self._cluster_slots(contact), contact)
            except RedisError as exc:
                self.slot_master.failed(contact)
                errors.append((contact, exc))
        raise self.slot_master.none_answered(errors)

    async def _cluster_slots(self, node: Address) -> Any:
        """Node ``node``'s ``CLUSTER SLOTS``, on a connection of its own (the pool's options, one attempt)."""
        probe = self._probe_class(**_probe_options(self.connection_kwargs, node))
        try:
            await probe.connect()
            await probe.send_command("CLUSTER", "SLOTS")
            return await probe.read_response()
        finally:
            await probe.disconnect()


async def _raise_pool_timeout(error: RedisError) -> None:
    """A pool's wait ran out: no retry."""
    if isinstance(error, PoolTimeoutError):
        raise error


def _probe_options(connection_kwargs: dict[str, Any], node: Address) -> dict[str, Any]:
    """A slot pool's connection options for a one-shot connection to ``node`` (no retry, no health check)."""
    options = {name: value for name, value in connection_kwargs.items() if name != "slot_pool"}
    return options | {"host": node[0], "port": node[1], "retry": None, "retry_on_error": [], "health_check_interval": 0}


class SlotPool(_SlotPinning, ConnectOutsideLockPool):
    """The slot-pinned pool of a worker (uncapped, :class:`ConnectOutsideLockPool`); see :class:`_SlotPinning`."""


class BoundedSlotPool(_SlotPinning, BoundedPool):
    """The slot-pinned pool of a client (capped, :class:`BoundedPool`); see :class:`_SlotPinning`."""


class SyncSlotConnection(sync_redis.Connection):
    """:class:`SlotConnection` for redis-py's blocking client (:class:`SyncSlotPool`)."""

    def __init__(self, *, slot_pool: Any, **kwargs: Any) -> None:
        self.slot_pool = slot_pool
        super().__init__(**kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated

    @property
    def address(self) -> Address:
        """The node this connection is (or was last) connected to."""
        return (self.host, self.port)

    def connect(self) -> None:
        """Connect to the slot's master, unless connected there (a connection left on another node is closed)."""
        if self._sock is not None and not self.slot_pool.slot_master.serves_from(self.address):
            self.disconnect()
        if self._sock is not None:
            return
        self.host, self.port = self.slot_pool.master_address()
        try:
            super().connect()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        except (RedisConnectionError, RedisTimeoutError):
            self.slot_pool.slot_master.forget(self.address)
            raise

    def send_packed_command(self, *args: Any, **kwargs: Any) -> None:
        """redis-py's, dropping the master's address when the write fails."""
        address = self.address
        try:
            super().send_packed_command(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        except (RedisConnectionError, RedisTimeoutError):
            self.slot_pool.slot_master.forget(address)
            raise

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        """redis-py's, an error reply for the slot's whereabouts made ``ConnectionError`` (:class:`SlotConnection`)."""
        address = self.address
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        except ResponseError as error:
            raised = self.slot_pool.slot_master.redirected(error, address)
            if raised is error:
                raise
            if isinstance(raised, RedisConnectionError):
                self.disconnect()  # type: ignore[no-untyped-call]  # a MULTI's other replies are still on their way
            raise raised from error
        except (RedisConnectionError, RedisTimeoutError):
            self.slot_pool.slot_master.forget(address)
            raise


class SyncSlotSSLConnection(SyncSlotConnection, sync_redis.SSLConnection):
    """:class:`SyncSlotConnection` over TLS (``rediss://``)."""


class SyncSlotPool(sync_redis.ConnectionPool):
    """:class:`_SlotPinning` for redis-py's blocking client, without a cap; thread-safe."""

    def __init__(
        self,
        *,
        cluster_key: str,
        host: str = "localhost",
        port: int = 6379,
        connection_class: type[sync_redis.Connection] = sync_redis.Connection,
        retry: SyncRetry | None = None,
        **kwargs: Any,
    ) -> None:
        self.slot_master = SlotMaster(cluster_key, (host, int(port)))
        self._retry = retry or SyncRetry(_CLUSTER_BACKOFF, SLOT_RETRIES)
        self._probe_class = connection_class
        pinned = SyncSlotSSLConnection if issubclass(connection_class, sync_redis.SSLConnection) else SyncSlotConnection
        super().__init__(connection_class=pinned, **_slot_options(kwargs, self.slot_master.origin, self._retry))
        self.connection_kwargs["slot_pool"] = weakref.proxy(self)

    def reset(self) -> None:
        """redis-py's (at start and in a forked child), with a lock of its own for asking the contacts."""
        super().reset()
        self._resolving = threading.Lock()

    def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connection to the slot's master, retried as :meth:`_SlotPinning.get_connection`."""
        return self._retry.call_with_retry(super().get_connection, _sync_raise_pool_timeout)

    def master_address(self) -> Address:
        """The slot's master (:meth:`_SlotPinning.master_address`)."""
        if self.slot_master.address is not None:
            return self.slot_master.address
        with self._resolving:
            return self.slot_master.address or self._ask_contacts()

    def _ask_contacts(self) -> Address:
        errors: list[tuple[Address, RedisError]] = []
        for contact in list(self.slot_master.contacts):
            try:
                return self.slot_master.learn(self._cluster_slots(contact), contact)
            except RedisError as exc:
                self.slot_master.failed(contact)
                errors.append((contact, exc))
        raise self.slot_master.none_answered(errors)

    def _cluster_slots(self, node: Address) -> Any:
        """Node ``node``'s ``CLUSTER SLOTS`` (:meth:`_SlotPinning._cluster_slots`)."""
        probe = self._probe_class(**_probe_options(self.connection_kwargs, node))
        try:
            probe.connect()
            probe.send_command("CLUSTER", "SLOTS")
            return probe.read_response()
        finally:
            probe.disconnect()


def _sync_raise_pool_timeout(error: Exception) -> None:
    """A pool's wait ran out: no retry."""
    if isinstance(error, PoolTimeoutError):
        raise error


class SyncBoundedSlotPool(SyncSlotPool, SyncBoundedPool):
    """The slot-pinned pool of a blocking client with a cap (:class:`SyncBoundedPool`)."""


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


def connect_redis(url: str, *, cluster_key: str | None = None, **options: Unpack[ConnectOptions]) -> ArqRedis:
    """An :class:`ArqRedis` client using the project's JSON job serializer.

    ``url`` is ``redis://`` or ``rediss://`` (TLS) with optional ACL user and
    password. With ``sentinels`` (see :func:`parse_sentinels`) and
    ``sentinel_master`` the client asks the Sentinels for the current master
    and follows failovers: commands that meet a dead master retry (up to
    :data:`SENTINEL_RETRIES` times) until a new one is promoted.

    With ``cluster_key``, ``url`` names any node of a Redis Cluster whose deployment keeps every key in
    ``cluster_key``'s hash slot (one hash tag): every connection goes to that slot's master
    (:class:`SlotPool`, :class:`BoundedSlotPool` when capped), found with ``CLUSTER SLOTS`` and followed through
    failovers and slot moves, a command retrying up to :data:`SLOT_RETRIES` times (about 15 s) meanwhile. Checked
    as :func:`_check_cluster_url`; ``pool_timeout`` applies as without a cluster.

    ``socket_timeout`` (seconds; default :data:`DEFAULT_SOCKET_TIMEOUT`) bounds each connect and each
    command, to the Sentinels too (the clients' ``from_url`` and the workers pass ``SMITH_REDIS_SOCKET_TIMEOUT``).
    ``max_connections`` caps the pool (None: no cap, the workers'): a command
    finding every connection in use waits up to ``pool_timeout`` seconds
    (default ``socket_timeout``) for one, then raises :class:`PoolTimeoutError`.

    Connects lazily: no command is sent until the first use. Raises
    :class:`ConfigurationError` for a malformed ``url`` (:func:`check_url`) or when only one of the
    two Sentinel options is given.
    """
    if cluster_key is not None:
        pinned, capped = _slot_pool_options(url, cluster_key, options)
        slot_pool = (BoundedSlotPool if capped else SlotPool).from_url(url, **pinned)
        return ArqRedis(slot_pool, job_serializer=job_serializer, job_deserializer=job_deserializer)
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


def connect_sync_redis(
    url: str, *, cluster_key: str | None = None, **options: Unpack[ConnectOptions]
) -> sync_redis.Redis:
    """A blocking :class:`redis.Redis` for ``url``, for :class:`SyncSmithClient`; options as :func:`connect_redis`,
    ``cluster_key`` too (then on :class:`SyncSlotPool` / :class:`SyncBoundedSlotPool`).

    Its connection pool is thread-safe (one connection per command in flight).
    Connects lazily: no command is sent until the first use.
    """
    if cluster_key is not None:
        pinned, capped = _slot_pool_options(url, cluster_key, options)
        pinned_pool = (SyncBoundedSlotPool if capped else SyncSlotPool).from_url(url, **pinned)
        return sync_redis.Redis(connection_pool=pinned_pool)
    addresses, sentinel_master, bounds, cap = _plan(url, options)
    if not addresses:
        pool = (SyncBoundedPool if cap else sync_redis.ConnectionPool).from_url(url, **bounds, **cap)
        return sync_redis.Redis(connection_pool=pool)
    assert sentinel_master is not None
    master = _master_options(url, SyncRetry(ExponentialBackoff(cap=1.0, base=0.1), SENTINEL_RETRIES)) | bounds | cap
    sentinel = SyncSentinel(addresses, sentinel_kwargs=_sentinel_bounds(bounds))
    pool_class = SyncBoundedSentinelPool if cap else SyncSentinelConnectionPool
    return cast(sync_redis.Redis, sentinel.master_for(sentinel_master, connection_pool_class=pool_class, **master))


def _slot_pool_options(url: str, cluster_key: str, options: ConnectOptions) -> tuple[dict[str, Any], bool]:
    """A slot-pinned pool's options (``cluster_key``, timeouts, cap) for a node's ``url``, and whether it is capped.

    Raises :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``) as :func:`_check_cluster_url`, and for an empty
    ``cluster_key``.
    """
    _check_cluster_url(url, options)
    if not cluster_key:
        raise ConfigurationError(
            "cluster_key must be a key (or the hash tag) of the deployment's one hash slot, got ''",
            setting="SMITH_REDIS_CLUSTER",
        )
    _, _, bounds, cap = _plan(url, options)
    return {"cluster_key": cluster_key, **bounds, **cap}, bool(cap)


def connect_redis_cluster(url: str, **options: Unpack[ConnectOptions]) -> RedisCluster:
    """redis-py's :class:`~redis.asyncio.cluster.RedisCluster` for the Redis Cluster one of whose nodes ``url`` names.

    The client reads the slot map, sends each command to its key's slot's master and follows
    ``MOVED`` / ``ASK`` redirections and failovers, with bounded retries (:data:`CLUSTER_RETRIES`,
    :data:`CLUSTER_NODE_RETRIES`); options as :func:`_cluster_options`. redis-py 5's asyncio cluster client has no
    pub/sub and no ``MULTI``: the runtime uses :func:`connect_redis` with ``cluster_key`` instead.
    Connects lazily.
    """
    retry = Retry(_CLUSTER_BACKOFF, CLUSTER_NODE_RETRIES)
    return cast(RedisCluster, RedisCluster.from_url(url, **_cluster_options(url, options, retry)))


def connect_sync_redis_cluster(url: str, **options: Unpack[ConnectOptions]) -> SyncRedisCluster:
    """:func:`connect_redis_cluster` for redis-py's blocking :class:`redis.cluster.RedisCluster`.

    Reads the slot map at once, raising redis-py's ``RedisClusterException`` when no node answers.
    """
    sync_retry = SyncRetry(_CLUSTER_BACKOFF, CLUSTER_NODE_RETRIES)
    return cast(SyncRedisCluster, SyncRedisCluster.from_url(url, **_cluster_options(url, options, sync_retry)))


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
    :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``) as :func:`_check_cluster_url`, and with
    ``pool_timeout`` (no cluster pool waits).
    """
    _check_cluster_url(url, options)
    if options.get("pool_timeout") is not None:
        raise ConfigurationError(
            "redis-py's Redis Cluster client takes no pool timeout: its pools do not wait",
            setting="SMITH_REDIS_CLUSTER",
        )
    cluster = _bounds(options.get("socket_timeout"))
    cluster.update(cluster_error_retry_attempts=CLUSTER_RETRIES, retry=retry)
    if (cap := options.get("max_connections")) is not None:
        cluster["max_connections"] = client_max_connections(cap)
    return cluster


def _check_cluster_url(url: str, options: ConnectOptions) -> None:
    """Raise :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``) for a cluster node's ``url`` naming a socket or a
    database other than 0 (a cluster has only database 0: redis.io, "Redis cluster specification"), or for
    Sentinel options (the cluster promotes replicas itself); and :func:`check_url`'s error for a malformed one."""
    parsed = dict(parse_url(check_url(url)))
    if "path" in parsed or parsed.get("db", 0) != 0:
        raise ConfigurationError(
            "a Redis Cluster URL must name a node by host and port, database 0 (redis://host:port/0)",
            setting="SMITH_REDIS_CLUSTER",
        )
    if options.get("sentinels") or options.get("sentinel_master"):
        raise ConfigurationError(
            "Redis Cluster takes no Sentinel (SMITH_REDIS_SENTINELS): the cluster promotes replicas itself",
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
