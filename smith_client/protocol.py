"""The requests a client operation makes, so each operation is written once and free of I/O.

A client operation (see :mod:`smith_client.operations`) is a generator: it
yields a request below and is sent back its reply; an operation that streams
also yields :class:`~smith_client.events.Event` objects, which go to the caller
(the operation is sent ``None`` for them). The generator's return value is the
operation's result. :class:`~smith_client.runners.AsyncRunner` performs the
requests with redis-py's asyncio client (for :class:`SmithClient`) and
:class:`~smith_client.runners.SyncRunner` with the blocking one (for
:class:`SyncSmithClient`), so both clients share every rule and differ only in
I/O (the "sans-I/O" pattern of h11 and hyper-h2).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from smith_client.scripts import LuaScript

T = TypeVar("T")

#: An operation: yields requests (and events), is sent their replies, returns a ``T``.
Operation = Generator[Any, Any, T]


@dataclass(frozen=True)
class Call:
    """One Redis command: ``redis.<command>(*args, **kwargs)``; the reply is redis-py's (bytes, not decoded)."""

    command: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunScript:
    """One call of a Lua script of the package (:mod:`smith_client.scripts`), sent with ``EVALSHA``
    (loaded again on ``NOSCRIPT``); the reply is the script's (bytes, not decoded)."""

    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Transaction:
    """Commands sent in one MULTI/EXEC; the reply is the list of their replies."""

    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Subscribe:
    """Subscribe the operation's pub/sub connection (one per operation, opened on first use) to ``channel``."""

    channel: str


@dataclass(frozen=True)
class Receive:
    """The next message on the operation's pub/sub connection (redis-py's dict; its ``data`` is bytes),
    or None after ``timeout`` seconds."""

    timeout: float
