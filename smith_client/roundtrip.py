"""One round trip to Redis, built from commands whose replies come back by name, not by position.

Every place that sends Redis several commands together (a pipeline, or a
``MULTI … EXEC`` transaction) builds a :class:`RoundTrip`: each command or
script call added to it returns a :class:`Pending` handle, typed by what the
call's ``parse`` function makes of its raw reply; running the round trip sends
every command in one pipeline and resolves every handle, so readers take
``pending.value`` and never index a list of replies. A helper that adds its
commands to someone else's round trip returns its handles (or a small record
of them), so adding a read to a round trip changes only the helper and the
line that reads it::

    rt = RoundTrip()
    status = rt.call("hget", state_key, "status", parse=decode_or_none)
    seq = rt.script(PUBLISH, keys, args, parse=int)
    await rt.run(redis)
    status.value, seq.value

``parse`` runs as the round trip completes, in the order the commands were
added, so a parse that raises (a fenced-off write raising
``StaleAttemptError``) raises from :meth:`RoundTrip.run`; the handles after it
stay unresolved. A Redis error reply raises too (redis-py's ``execute``).

The client's operations (:mod:`smith_client.protocol`) yield a round trip as
one request; the workers run theirs directly, and their auto-pipeline
(``smith_worker/ops/auto_pipeline.py``) coalesces single :class:`Command`
objects of many tasks. Script calls go as ``EVALSHA``; a ``NOSCRIPT`` reply
loads every script of the process and runs the round trip once more
(:mod:`smith_client.scripts`), which is safe because a flushed script cache
fails every ``EVALSHA`` of the pipeline alike and the other commands callers
put in a round trip are idempotent (reads, ``SET`` with TTL, ``EXPIRE``) or
count one more at worst (the tree's model calls, which errs on the safe side).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from redis.exceptions import NoScriptError

from smith_client import scripts
from smith_client.scripts import LuaScript

T = TypeVar("T")


def raw(reply: Any) -> Any:
    """The reply as redis-py gives it (bytes, not decoded): the default ``parse``."""
    return reply


class Pending(Generic[T]):
    """The parsed reply of one command of a :class:`RoundTrip`, readable once the round trip ran."""

    __slots__ = ("_resolved", "_value")

    def __init__(self) -> None:
        self._resolved = False
        self._value: Any = None

    @property
    def value(self) -> T:
        """The parsed reply. Raises :class:`RuntimeError` before the round trip ran (or when it failed)."""
        if not self._resolved:
            raise RuntimeError("this command's round trip has not completed")
        return self._value  # type: ignore[no-any-return]

    def resolve(self, value: T) -> None:
        """Set the parsed reply (the round trip or the auto-pipeline that sent the command does)."""
        self._value, self._resolved = value, True


@dataclass(frozen=True)
class Command(Generic[T]):
    """One Redis command: redis-py's method ``name`` with ``args`` and ``kwargs``, and the ``parse`` of its
    raw reply into a ``T`` (it may raise, e.g. when the reply says a fenced write was refused)."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    parse: Callable[[Any], T] = raw

    def queue_on(self, pipe: Any) -> None:
        """Add the command to a redis-py pipeline (asyncio or blocking)."""
        getattr(pipe, self.name)(*self.args, **self.kwargs)


def script_command(
    script: LuaScript, keys: Sequence[str], args: Sequence[Any] = (), parse: Callable[[Any], T] = raw
) -> Command[T]:
    """The ``EVALSHA`` of ``script`` with ``keys`` and ``args``, its reply parsed by ``parse``."""
    return Command("evalsha", _evalsha_args(script, keys, args), parse=parse)


def _evalsha_args(script: LuaScript, keys: Sequence[str], args: Sequence[Any]) -> tuple[Any, ...]:
    """redis-py's ``evalsha`` arguments for a call of ``script``: its SHA1, the number of keys, keys, args."""
    return (script.sha, len(keys), *keys, *args)


#: One queued command of a :class:`RoundTrip`: redis-py's method name, its args and kwargs, the ``parse`` of its
#: reply and the handle that gets it (a plain tuple: a turn builds a few dozen of them).
_Queued = tuple[str, tuple[Any, ...], dict[str, Any], Callable[[Any], Any], Pending[Any]]


class RoundTrip:
    """Commands sent together and read together: one pipeline, or one ``MULTI … EXEC`` when ``transaction``.

    Add commands with :meth:`call`, :meth:`script` or :meth:`add`; each returns its :class:`Pending`.
    Run with :meth:`run` (asyncio client) or :meth:`run_sync` (blocking client); a round trip runs once.
    """

    __slots__ = ("_commands", "transaction")

    def __init__(self, *, transaction: bool = False) -> None:
        self.transaction = transaction
        self._commands: list[_Queued] = []

    def __len__(self) -> int:
        return len(self._commands)

    def add(self, command: Command[T]) -> Pending[T]:
        """Queue ``command``; its parsed reply comes in the returned handle."""
        return self._queue(command.name, command.args, command.kwargs, command.parse)

    def call(self, name: str, *args: Any, parse: Callable[[Any], T] = raw, **kwargs: Any) -> Pending[T]:
        """Queue redis-py's ``name(*args, **kwargs)``; its reply parsed by ``parse`` (raw by default)."""
        return self._queue(name, args, kwargs, parse)

    def script(
        self, script: LuaScript, keys: Sequence[str], args: Sequence[Any] = (), parse: Callable[[Any], T] = raw
    ) -> Pending[T]:
        """Queue a call of ``script`` (``EVALSHA``); its reply parsed by ``parse`` (raw by default)."""
        return self._queue("evalsha", _evalsha_args(script, keys, args), {}, parse)

    def _queue(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], parse: Callable[[Any], T]) -> Pending[T]:
        pending: Pending[T] = Pending()
        self._commands.append((name, args, kwargs, parse, pending))
        return pending

    def extend(self, other: RoundTrip) -> None:
        """Add ``other``'s commands after these, in order; their handles resolve when this round trip runs
        (``other`` itself is not run)."""
        self._commands.extend(other._commands)

    async def run(self, redis: Any) -> None:
        """Send every command in one round trip on an asyncio redis client and resolve the handles.

        On ``NOSCRIPT`` the scripts are loaded and the round trip is sent once more. Raises a Redis
        error reply or a connection error as redis-py does, and whatever a ``parse`` raises.
        """
        for attempt in range(2):
            try:
                async with redis.pipeline(transaction=self.transaction) as pipe:
                    self.queue_on(pipe)
                    replies = await pipe.execute()
                break
            except NoScriptError:
                if attempt:
                    raise
                await scripts.load_all(redis)
        self.resolve(replies)

    def run_sync(self, redis: Any) -> None:
        """:meth:`run` on a blocking :class:`redis.Redis`."""
        for attempt in range(2):
            try:
                with redis.pipeline(transaction=self.transaction) as pipe:
                    self.queue_on(pipe)
                    replies = pipe.execute()
                break
            except NoScriptError:
                if attempt:
                    raise
                scripts.load_all_sync(redis)
        self.resolve(replies)

    async def run_on(self, pipe: Any) -> None:
        """Send the commands on ``pipe``, an asyncio pipeline the caller prepared (a ``WATCH`` transaction
        after its ``multi()``), and resolve the handles. No ``NOSCRIPT`` repair: load the scripts first."""
        self.queue_on(pipe)
        self.resolve(await pipe.execute())

    def queue_on(self, pipe: Any) -> None:
        """Add every command to a redis-py pipeline, in order."""
        for name, args, kwargs, _, _ in self._commands:
            getattr(pipe, name)(*args, **kwargs)

    def resolve(self, replies: Sequence[Any]) -> None:
        """Parse ``replies`` (one per command, in order) into the handles; raises what a ``parse`` raises."""
        if len(replies) != len(self._commands):
            raise RuntimeError(f"{len(replies)} replies for {len(self._commands)} commands")
        for (_, _, _, parse, pending), reply in zip(self._commands, replies, strict=True):
            pending.resolve(parse(reply))
