"""One pub/sub connection per client, shared by every turn it follows.

:class:`AsyncFanout` keeps a single redis-py ``PubSub`` for a
:class:`~smith_client.client.SmithClient` and :class:`SyncFanout` one for a
:class:`~smith_client.sync_client.SyncSmithClient`; each follower (one
streaming operation) gets a subscription, a queue of the messages of the
channels it subscribed. One reader (a task; a daemon thread for the blocking
client, whose followers may be in any thread) routes messages by channel.

A follower never loses an event to a reconnect: when the connection fails,
or redis-py reconnects it on its own (it then subscribes again, and a second
``subscribe`` confirmation for a channel shows it), every follower of the
affected channels is sent a *gap* (``None``), which the operation answers by
reading the turn's replay log from its last ``seq``
(:func:`smith_client.operations.follow_subscribed`), so events stay gap-free
and without duplicates.

On Redis Cluster a turn's events channel is a sharded one (``SSUBSCRIBE``: :meth:`Keys.turn_events_channel`), which
the connection subscribes beside the classic ones. Redis ends such a subscription itself when the channel's slot
moves to another master (a reshard, a failover: an ``sunsubscribe`` nobody asked for); the reader then treats the
connection as lost, so its followers get a gap and the channels are subscribed again where the slot is now (the
connection pool follows the slot: docs/cluster.md, The connections).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Container, Iterable
from typing import Any

import redis
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

logger = logging.getLogger("agent_smith")

#: Longest single wait of the reader for a message, seconds (the socket timeout does not apply to it).
_LISTEN = 5.0
#: Seconds between tries to subscribe again while Redis is unreachable.
_RETRY = 0.2


class Subscription:
    """One follower's view of the shared connection: messages of its channels, in arrival order."""

    def __init__(self, fanout: AsyncFanout) -> None:
        self._fanout = fanout
        self.channels: set[str] = set()
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()

    async def subscribe(self, channel: str, sharded: bool = False) -> None:
        """Receive ``channel``'s messages from now on (sent to Redis before this returns); ``sharded``: a sharded
        pub/sub channel (``SSUBSCRIBE``)."""
        self.channels.add(channel)
        await self._fanout.add(channel, self, sharded)

    async def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message (redis-py's dict, ``data`` bytes), or None after ``timeout`` seconds or on a gap."""
        if not self.queue.empty():  # a stream's events come in bursts: no timer for those already here
            return self.queue.get_nowait()
        try:  # not wait_for: on Python 3.11 it wraps the get in a task of its own, per message
            async with asyncio.timeout(timeout):
                return await self.queue.get()
        except TimeoutError:
            return None

    async def close(self) -> None:
        """Stop receiving; channels no other follower wants are unsubscribed."""
        for channel in self.channels:
            await self._fanout.remove(channel, self)
        self.channels.clear()


class _FanoutPubSub(PubSub):
    """redis-py's ``PubSub``, except that a failed read or write does not reconnect on the spot.

    redis-py reconnects inside the failing call, so the reader's read and a follower's
    (un)subscribe could each reconnect the one connection at once and read its socket together
    (asyncio's "read() called while another coroutine is already waiting for incoming data"), or
    one write to the connection the other just closed. The fan-out reconnects instead, under its
    lock (:meth:`AsyncFanout._resubscribe`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The sharded channels subscribed (redis-py's asyncio ``PubSub`` has no ``SSUBSCRIBE``).
        self.shard_channels: set[str] = set()

    @property
    def subscribed(self) -> bool:
        """Whether any channel is subscribed, sharded ones included (no health-check ``PING`` is then sent as a
        plain command: its reply would be read as a message)."""
        return bool(self.channels or self.patterns or self.shard_channels)

    async def follow(self, channels: Iterable[str], sharded: Container[str]) -> None:
        """Subscribe ``channels``: with ``SSUBSCRIBE`` those in ``sharded``, ``SUBSCRIBE`` the others."""
        classic, shard = _split(channels, sharded)
        self.shard_channels.update(shard)
        await self._send(classic, self.subscribe, shard, "SSUBSCRIBE")

    async def unfollow(self, channels: Iterable[str], sharded: Container[str]) -> None:
        """Unsubscribe ``channels`` (``SUNSUBSCRIBE`` those in ``sharded``)."""
        classic, shard = _split(channels, sharded)
        self.shard_channels.difference_update(shard)
        await self._send(classic, self.unsubscribe, shard, "SUNSUBSCRIBE")

    async def _send(
        self, classic: list[str], classic_call: Callable[..., Awaitable[Any]], shard: list[str], shard_command: str
    ) -> None:
        """``classic_call`` (redis-py's) for the ``classic`` channels, then ``shard_command`` for the ``shard`` ones."""
        if classic:
            await classic_call(*classic)
        if shard:
            await self.execute_command(shard_command, *shard)

    async def aclose(self) -> None:
        """redis-py's ``aclose`` (the connection back to the pool, every subscription forgotten), sharded ones too."""
        await super().aclose()  # type: ignore[no-untyped-call]  # redis-py 5 leaves it unannotated
        self.shard_channels.clear()

    async def _disconnect_raise_connect(self, conn: Any, error: Exception) -> None:
        raise error


def _split(channels: Iterable[str], sharded: Container[str]) -> tuple[list[str], list[str]]:
    """``channels`` as (classic ones, those in ``sharded``)."""
    classic: list[str] = []
    shard: list[str] = []
    for channel in channels:
        (shard if channel in sharded else classic).append(channel)
    return classic, shard


class AsyncFanout:
    """The shared pub/sub connection of one asyncio client (see the module docstring).

    Only the reader reconnects, and only under the lock the (un)subscribes hold; they send
    nothing on a connection that is down (the reader subscribes every followed channel again).
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pubsub: Any = None
        self._followers: dict[str, set[Subscription]] = {}
        self._confirmed: set[str] = set()  # channels whose subscription Redis confirmed on this connection
        self._sharded: set[str] = set()  # followed channels that are sharded (SSUBSCRIBE)
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self._lock = asyncio.Lock()  # one (un)subscribe at a time: the first one also opens the connection
        self._connect_failure: tuple[float, Exception] | None = None  # when the last connect failed, and why

    def open(self) -> Subscription:
        """A new follower's subscription (subscribe it to channels, close it when done)."""
        return Subscription(self)

    @property
    def connections(self) -> int:
        """Pub/sub connections held now: 0 or 1."""
        return int(self._pubsub is not None and self._pubsub.connection is not None)

    async def add(self, channel: str, follower: Subscription, sharded: bool = False) -> None:
        """Route ``channel`` to ``follower``; subscribe the connection when it is the channel's first (``sharded``:
        with ``SSUBSCRIBE``)."""
        followers = self._followers.setdefault(channel, set())
        followers.add(follower)
        if len(followers) > 1:
            return
        if sharded:
            self._sharded.add(channel)
        asked = time.monotonic()
        try:
            async with self._lock:
                self._raise_connect_failure_since(asked)
                if self._pubsub is None:
                    self._pubsub = self._open_pubsub()
                if self._pubsub.connection is None:
                    await self._connect(channel)
                elif self._pubsub.connection.is_connected:
                    await self._pubsub.follow([channel], self._sharded)  # else down: the reader subscribes it again
        except BaseException:
            followers.discard(follower)
            if not followers:
                del self._followers[channel]
                self._sharded.discard(channel)
            raise
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read())

    async def remove(self, channel: str, follower: Subscription) -> None:
        """Stop routing ``channel`` to ``follower``; unsubscribe it when nobody follows it."""
        if not unfollow(self._followers, channel, follower):
            return
        async with self._lock:
            if self._connected():
                with contextlib.suppress(RedisError, OSError):  # a broken connection is not resubscribed to it
                    await self._pubsub.unfollow([channel], self._sharded)
            if channel not in self._followers:  # nobody followed it again meanwhile
                self._sharded.discard(channel)

    async def _connect(self, channel: str) -> None:
        """Open the connection with ``channel``'s subscribe; a failure is kept for the followers waiting."""
        try:
            await self._pubsub.follow([channel], self._sharded)
        except (RedisError, OSError) as exc:
            self._connect_failure = (time.monotonic(), exc)
            raise

    def _raise_connect_failure_since(self, asked: float) -> None:
        """Raise (a copy of) the error of a connect that failed since ``asked`` (``time.monotonic()``): the
        followers that waited for the lock meanwhile share its outcome instead of each retrying in turn
        (with Redis unreachable, N concurrent sends would fail one connect-with-retries apart)."""
        if self._connect_failure is not None and self._connect_failure[0] >= asked:
            error = self._connect_failure[1]
            raise type(error)(*error.args) from error

    def _connected(self) -> bool:
        """Whether the connection is open: redis-py would open one only to unsubscribe (and leave it
        open), a closed client (its follower let go after ``aclose``) has none to use, and one that is
        down is the reader's to reconnect."""
        return not self._closing and self.connections == 1 and self._pubsub.connection.is_connected

    def _open_pubsub(self) -> Any:
        """The pub/sub object, on the client's connection pool (not connected until its first subscribe)."""
        return _FanoutPubSub(self._redis.connection_pool)

    async def aclose(self) -> None:
        """Stop the reader and close the connection."""
        self._closing = True
        if self._reader is not None:
            self._reader.cancel()
            # Python 3.11's asyncio.timeout inside redis-py's read can swallow the cancel (it reads as "no
            # message"): the flag ends the loop at its next turn, at most _LISTEN seconds away
            await asyncio.wait([self._reader], timeout=2 * _LISTEN + 1)
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.aclose()
        self._pubsub = None

    async def _read(self) -> None:
        # no connection: closed with nobody to follow (add() restarts it)
        while not self._closing and self._pubsub.connection is not None:
            try:
                message = await self._next_message()
            except (RedisError, OSError) as exc:
                logger.warning("pub/sub connection lost (%s: %s); subscribing again", type(exc).__name__, exc)
                self._gap(set(self._followers))
                await self._resubscribe()
                continue
            if message is not None:
                self._route(message)
                if len(self._followers) > 1:
                    # let its follower take it before the next is parsed: a burst of many streams' events is
                    # then delivered one by one, not all after the whole burst was read (token
                    # latency); one stream's follower takes them in order anyway, so it is spared the pass
                    await asyncio.sleep(0)

    async def _next_message(self) -> dict[str, Any] | None:
        """The next message, None after ``_LISTEN`` seconds; ``ConnectionError`` when the connection is down
        (a failed subscribe closed it): redis-py would reconnect it here, outside the lock."""
        if not self._pubsub.connection.is_connected:
            raise RedisConnectionError("the connection was closed by a failed write")
        message: dict[str, Any] | None = await self._pubsub.get_message(timeout=_LISTEN)
        if message is not None:
            check_not_dropped(message, self._followers)
        return message

    def _route(self, message: dict[str, Any]) -> None:
        route(message, self._followers, self._confirmed)

    def _gap(self, channels: set[str]) -> None:
        gap(channels, self._followers)

    async def _resubscribe(self) -> None:
        """A fresh connection subscribed to every followed channel, retried until Redis answers; then every
        follower gets a gap again, for the events sent between its last read of the log and this."""
        self._confirmed.clear()
        while not self._closing:
            async with self._lock:
                with contextlib.suppress(RedisError, OSError):
                    await self._pubsub.aclose()  # drops the broken connection; subscribe opens a new one
                if not self._followers:
                    return
                try:
                    await self._pubsub.follow(self._followers, self._sharded)
                    self._gap(set(self._followers))
                    return
                except (RedisError, OSError):
                    pass
            await asyncio.sleep(_RETRY)


def route(message: dict[str, Any], followers: dict[str, Any], confirmed: set[str]) -> None:
    """Pass a pub/sub message to the followers of its channel, or track a (re)subscription.

    A second ``subscribe`` confirmation for a channel means redis-py reconnected
    and subscribed again on its own, so messages may have been lost: its
    followers get a gap.
    """
    kind, channel = message["type"], message["channel"].decode()
    if kind in ("message", "smessage"):
        for follower in followers.get(channel, ()):
            follower.queue.put_nowait(message)
    elif kind in ("subscribe", "ssubscribe"):
        if channel in confirmed:
            gap({channel}, followers)
        confirmed.add(channel)
    elif kind in ("unsubscribe", "sunsubscribe"):
        confirmed.discard(channel)


def check_not_dropped(message: dict[str, Any], followers: dict[str, Any]) -> None:
    """Raise ``ConnectionError`` when ``message`` is Redis ending the sharded subscription of a channel still
    followed: its slot moved to another master (redis.io, "Sharded Pub/Sub"), so the connection must subscribe
    again where the slot is now, and the followers read what they missed from the log."""
    if message["type"] == "sunsubscribe" and message["channel"].decode() in followers:
        raise RedisConnectionError(f"Redis ended the subscription to {message['channel'].decode()} (its slot moved)")


def unfollow(followers: dict[str, Any], channel: str, follower: Any) -> bool:
    """Drop ``follower`` from ``channel``'s followers; True when nobody follows the channel any more
    (the caller unsubscribes it), False when others still do or it was not followed."""
    following = followers.get(channel)
    if following is None:
        return False
    following.discard(follower)
    if following:
        return False
    del followers[channel]
    return True


def gap(channels: set[str], followers: dict[str, Any]) -> None:
    """Tell the followers of ``channels`` that messages may be lost (``None``: read the log)."""
    for channel in channels:
        for follower in followers.get(channel, ()):
            follower.queue.put_nowait(None)


class SyncSubscription:
    """:class:`Subscription` for the blocking client: one follower, in any thread."""

    def __init__(self, fanout: SyncFanout) -> None:
        self._fanout = fanout
        self.channels: set[str] = set()
        self.queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()

    def subscribe(self, channel: str, sharded: bool = False) -> None:
        """Receive ``channel``'s messages from now on (sent to Redis before this returns); ``sharded`` as
        :meth:`Subscription.subscribe`."""
        self.channels.add(channel)
        self._fanout.add(channel, self, sharded)

    def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next message, or None after ``timeout`` seconds or on a gap."""
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self) -> None:
        """Stop receiving; channels no other follower wants are unsubscribed."""
        for channel in self.channels:
            self._fanout.remove(channel, self)
        self.channels.clear()


class SyncFanout:
    """The shared pub/sub connection of one blocking client; thread-safe (one lock around the
    subscriptions and the routing, the reader in a daemon thread)."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._pubsub: Any = None
        self._followers: dict[str, set[SyncSubscription]] = {}
        self._confirmed: set[str] = set()
        self._sharded: set[str] = set()  # followed channels that are sharded (SSUBSCRIBE)
        self._lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._closed = False

    def open(self) -> SyncSubscription:
        """A new follower's subscription."""
        return SyncSubscription(self)

    def add(self, channel: str, follower: SyncSubscription, sharded: bool = False) -> None:
        """Route ``channel`` to ``follower``; subscribe the connection when it is the channel's first (``sharded``:
        with ``SSUBSCRIBE``)."""
        with self._lock:
            followers = self._followers.setdefault(channel, set())
            followers.add(follower)
            if len(followers) > 1:
                return
            if sharded:
                self._sharded.add(channel)
            try:
                if self._pubsub is None:
                    self._pubsub = self._redis.pubsub()
                self._follow([channel])
            except BaseException:
                del self._followers[channel]
                self._sharded.discard(channel)
                raise
            if self._reader is None or not self._reader.is_alive():
                self._reader = threading.Thread(target=self._read, name="smith-pubsub", daemon=True)
                self._reader.start()

    def remove(self, channel: str, follower: SyncSubscription) -> None:
        """Stop routing ``channel`` to ``follower``; unsubscribe it when nobody follows it.

        Without an open connection (the client was closed first, or it was lost and is
        resubscribed without the channel) there is nothing to unsubscribe: redis-py would open
        a connection for it and leave it open. At interpreter exit (an iterator never finished,
        collected with the module globals) it does nothing: the connection ends with the process,
        and the reader, a daemon thread stopped by the shutdown, may have held the lock
        (https://docs.python.org/3/library/sys.html#sys.is_finalizing).
        """
        if sys.is_finalizing():
            return
        with self._lock:
            if not unfollow(self._followers, channel, follower):
                return
            sharded = channel in self._sharded
            self._sharded.discard(channel)
            if self._closed or self._pubsub.connection is None:
                return
            with contextlib.suppress(redis.RedisError, OSError):
                (self._pubsub.sunsubscribe if sharded else self._pubsub.unsubscribe)(channel)

    def _follow(self, channels: Iterable[str]) -> None:
        """Subscribe ``channels``: with ``SSUBSCRIBE`` the sharded ones (redis-py's blocking ``PubSub`` subscribes
        both kinds again by itself when it reconnects)."""
        classic, shard = _split(channels, self._sharded)
        if classic:
            self._pubsub.subscribe(*classic)
        if shard:
            self._pubsub.ssubscribe(*shard)

    def close(self) -> None:
        """Stop the reader (within ``_LISTEN``-bounded reads: it polls every 0.2 s) and close the connection."""
        self._closed = True
        if self._reader is not None:
            self._reader.join()
        if self._pubsub is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                self._pubsub.close()

    def _read(self) -> None:
        while not self._closed:
            try:
                message = self._pubsub.get_message(timeout=_RETRY)
                if message is not None:
                    check_not_dropped(message, self._followers)
            except (redis.RedisError, OSError) as exc:
                logger.warning("pub/sub connection lost (%s: %s); subscribing again", type(exc).__name__, exc)
                with self._lock:
                    gap(set(self._followers), self._followers)
                self._resubscribe()
                continue
            if message is not None:
                with self._lock:
                    route(message, self._followers, self._confirmed)

    def _resubscribe(self) -> None:
        while not self._closed:
            with self._lock:
                self._confirmed.clear()
                with contextlib.suppress(redis.RedisError, OSError):
                    self._pubsub.close()
                if not self._followers:
                    return
                try:
                    self._follow(self._followers)
                    return
                except (redis.RedisError, OSError):
                    pass
            time.sleep(_RETRY)
