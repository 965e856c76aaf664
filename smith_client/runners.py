"""Perform the requests of :mod:`smith_client.protocol`: on redis-py's asyncio client or on its blocking one.

The two runners are the only I/O of :class:`SmithClient` and
:class:`SyncSmithClient`; everything else is in the operations they run.
Redis failures come out as :class:`~smith_client.errors.TransportError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Generator
from typing import Any, cast

import redis
from redis.asyncio import Redis

from smith_client.errors import SmithTimeoutError, TransportError
from smith_client.events import Event
from smith_client.fanout import AsyncFanout, Subscription, SyncFanout, SyncSubscription
from smith_client.protocol import Operation, Subscribe, T
from smith_client.redis_errors import typed_redis_errors
from smith_client.roundtrip import RoundTrip


class _Done:
    """The result of a finished operation, passed from the driving loop to ``run``."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _step(op: Operation[Any], reply: Any) -> Any:
    """The operation's next request or event, or :class:`_Done` with its result."""
    try:
        return op.send(reply)
    except StopIteration as stop:
        return _Done(stop.value)


class _Closable:
    """A runner's open/closed state: a closed client's calls fail instead of silently reconnecting."""

    closed = False

    def close(self) -> None:
        """Refuse every later request (the client closed its connections)."""
        self.closed = True

    def _check_open(self, request: Any) -> None:
        if self.closed:
            raise TransportError("the client is closed", operation=type(request).__name__)


def _is_request(item: Any) -> bool:
    return not isinstance(item, (Event, _Done))


class AsyncRunner(_Closable):
    """Runs operations on an :class:`ArqRedis` (redis-py asyncio); for :class:`SmithClient`."""

    def __init__(self, client: Redis) -> None:
        self.redis = client
        #: The pub/sub connection every streaming operation of this runner shares.
        self.fanout = AsyncFanout(client)

    async def aclose(self) -> None:
        """:meth:`close`, and close the shared pub/sub connection."""
        self.close()
        await self.fanout.aclose()

    async def run(self, op: Operation[T], bound: Any = None) -> T:
        """Run an operation that yields no events; return its result.

        ``bound`` (seconds, the caller's ``timeout``) limits the whole run, Redis
        commands included: with Redis frozen a command would otherwise hold the
        caller for the socket timeout past it (:class:`SmithTimeoutError`; docs/architecture.md, Fault model).
        A ``bound`` that is not a positive number is left to the operation to refuse.
        """
        limit = bound if isinstance(bound, (int, float)) and not isinstance(bound, bool) and bound > 0 else None
        deadline = asyncio.timeout(limit)
        try:
            async with deadline:
                return await self._run(op)
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise SmithTimeoutError(
                f"did not finish in {limit:g} s", operation="send", budget=float(limit or 0)
            ) from exc

    async def _run(self, op: Operation[T]) -> T:
        async with contextlib.aclosing(self._drive(op)) as items:
            async for item in items:
                if isinstance(item, _Done):
                    return cast(T, item.value)
        raise AssertionError("an operation always ends with its result")

    async def iterate(self, op: Operation[Any]) -> AsyncGenerator[Event, None]:
        """Run a streaming operation, yielding its events (its subscriptions on the shared pub/sub connection)."""
        async with contextlib.aclosing(self._drive(op)) as items:  # closing this closes the run now
            async for item in items:
                if isinstance(item, Event):
                    yield item

    async def _drive(self, op: Operation[Any]) -> AsyncGenerator[Any, None]:
        subscription = self.fanout.open()
        try:
            item = _step(op, None)
            while not isinstance(item, _Done):
                if _is_request(item):
                    item = _step(op, await self._perform(item, subscription))
                else:
                    yield item
                    item = _step(op, None)
            yield item
        finally:
            await subscription.close()

    @typed_redis_errors
    async def _perform(self, request: Any, subscription: Subscription) -> Any:
        self._check_open(request)
        if isinstance(request, RoundTrip):
            return await request.run(self.redis)
        if isinstance(request, Subscribe):
            return await subscription.subscribe(request.channel, request.sharded)
        return await subscription.receive(request.timeout)


class SyncRunner(_Closable):
    """Runs operations on a blocking :class:`redis.Redis`; for :class:`SyncSmithClient`.

    Thread-safe: commands take a connection from the client's pool per call, and
    streaming operations share one pub/sub connection (:class:`SyncFanout`).
    """

    def __init__(self, client: redis.Redis) -> None:
        self.redis = client
        #: The pub/sub connection every streaming operation of this runner shares.
        self.fanout = SyncFanout(client)

    def close(self) -> None:
        """Refuse every later request and close the shared pub/sub connection."""
        super().close()
        self.fanout.close()

    def run(self, op: Operation[T], bound: Any = None) -> T:
        """Run an operation that yields no events; return its result.

        ``bound`` is unused: each blocking command is bounded by the socket timeout.
        """
        return cast(T, next(item.value for item in self._drive(op) if isinstance(item, _Done)))

    def iterate(self, op: Operation[Any]) -> Generator[Event, None, None]:
        """Run a streaming operation, yielding its events (its subscriptions on the shared pub/sub connection).

        Closing the iterator (``close()``, or letting it go unfinished) unsubscribes its channels at
        once; after the client is closed, or at interpreter exit, without any Redis I/O.
        """
        with contextlib.closing(self._drive(op)) as items:
            yield from (item for item in items if isinstance(item, Event))

    def _drive(self, op: Operation[Any]) -> Generator[Any, None, None]:
        subscription = self.fanout.open()
        try:
            reply = None
            while True:
                item = _step(op, reply)
                reply = self._perform(item, subscription) if _is_request(item) else None
                if not _is_request(item):
                    yield item
                if isinstance(item, _Done):
                    return
        finally:
            subscription.close()

    @typed_redis_errors
    def _perform(self, request: Any, subscription: SyncSubscription) -> Any:
        self._check_open(request)
        if isinstance(request, RoundTrip):
            return request.run_sync(self.redis)
        if isinstance(request, Subscribe):
            return subscription.subscribe(request.channel, request.sharded)
        return subscription.receive(request.timeout)
