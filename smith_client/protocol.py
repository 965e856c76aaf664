"""The requests a client operation makes, so each operation is written once and free of I/O.

A client operation (see :mod:`smith_client.operations`) is a generator: it
yields a request below and is sent back its reply (for a
:class:`~smith_client.roundtrip.RoundTrip`, ``None``: its commands' handles hold
their parsed replies, the same typed round trips the workers build); an operation that streams
also yields :class:`~smith_client.events.Event` objects, which go to the caller
(the operation is sent ``None`` for them). The generator's return value is the
operation's result. :class:`~smith_client.runners.AsyncRunner` performs the
requests with redis-py's asyncio client (for :class:`SmithClient`) and
:class:`~smith_client.runners.SyncRunner` with the blocking one (for
:class:`SyncSmithClient`), so both clients share every rule and differ only in
I/O (the "sans-I/O" pattern of h11 and hyper-h2).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from smith_client.roundtrip import Command, RoundTrip, raw, script_command
from smith_client.scripts import LuaScript

T = TypeVar("T")

#: An operation: yields requests (and events), is sent their replies, returns a ``T``.
Operation = Generator[Any, Any, T]


def run(rt: RoundTrip) -> Operation[None]:
    """Operation: send ``rt``'s commands in one round trip; read the results from their handles."""
    yield rt


def one(command: Command[T]) -> Operation[T]:
    """Operation: ``command`` alone, in a round trip of its own; returns its parsed reply."""
    rt = RoundTrip()
    reply = rt.add(command)
    yield rt
    return reply.value


def call(name: str, *args: Any, parse: Callable[[Any], T] = raw, **kwargs: Any) -> Operation[T]:
    """Operation: redis-py's ``name(*args, **kwargs)`` alone; returns its reply parsed by ``parse`` (raw:
    redis-py's, bytes not decoded)."""
    return one(Command(name, args, kwargs, parse))


def run_script(
    script: LuaScript, keys: Sequence[str], args: Sequence[Any] = (), parse: Callable[[Any], T] = raw
) -> Operation[T]:
    """Operation: one call of a Lua script of the package (``EVALSHA``, loaded again on ``NOSCRIPT``);
    returns its reply parsed by ``parse``."""
    return one(script_command(script, keys, args, parse))


@dataclass(frozen=True)
class Subscribe:
    """Subscribe the operation's pub/sub connection (one per operation, opened on first use) to ``channel``;
    ``sharded``: with ``SSUBSCRIBE`` (a turn's events channel on Redis Cluster, :meth:`Keys.turn_events_channel`)."""

    channel: str
    sharded: bool = False


@dataclass(frozen=True)
class Receive:
    """The next message on the operation's pub/sub connection (redis-py's dict; its ``data`` is bytes),
    or None after ``timeout`` seconds."""

    timeout: float
