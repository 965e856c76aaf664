"""The per-turn event log: atomic sequence numbers, a replay log, live pub/sub.

Several processes publish for one turn (the turn worker, tool workers, a
re-run after a crash), so :meth:`EventLog.publish` assigns ``seq`` inside one
Lua script that INCRs the turn's counter, XADDs the event to a bounded Redis
Stream (entry id ``0-<seq>``, so replay by sequence number is an XRANGE) and
PUBLISHes it, all atomically (docs/architecture.md, Events).

Pub/sub is at-most-once; the stream is the durable copy a late or
reconnecting subscriber reads from (docs/architecture.md, Events).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from redis.asyncio import Redis

from smith_client import scripts
from smith_client.errors import EventsTrimmedError
from smith_client.events import PROTOCOL_VERSION, Event, EventData, event_from_json
from smith_client.keys import Keys
from smith_client.protocol import Operation, call, run, run_script
from smith_client.roundtrip import Command, Pending, RoundTrip, script_command
from smith_client.runners import AsyncRunner

T = TypeVar("T")

#: ``attempt`` value for a publish that needs the turn running, whatever its attempt (tool workers).
WHILE_RUNNING = -1
#: Default cap on the entries of one turn's replay log (approximate trimming).
DEFAULT_LOG_MAX_LEN = 100_000


class EventLog:
    """Publish and read the events of turns.

    The log outlives a turn's last event by ``keys.turn_ttl`` seconds;
    ``max_len`` caps the entries kept per turn. The script is ``lua/publish.lua``.
    """

    def __init__(self, redis: Redis, keys: Keys, *, max_len: int = DEFAULT_LOG_MAX_LEN) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl = keys.turn_ttl
        self._max_len = max_len

    @property
    def ttl(self) -> int:
        """Seconds a turn's log outlives its last event."""
        return self._ttl

    async def publish(
        self,
        turn_id: str,
        data: EventData,
        agent_path: list[str] | None = None,
        *,
        attempt: int | None = None,
        once_key: str | None = None,
        call_path: list[str] | None = None,
    ) -> int:
        """Append one event (its type is ``data``'s) to the turn's log and publish it; return its ``seq``.

        With ``attempt``, publish only while the turn runs and that attempt is
        its current one (fencing, docs/architecture.md, Fault model; :data:`WHILE_RUNNING`: any
        attempt); return -1 otherwise. With ``once_key`` (needs ``attempt``),
        publish only if that marker key is absent, setting it atomically with
        the event; return 0 when it was already set. ``call_path`` is a sub-agent's
        (see :mod:`smith_client.events`).
        """
        keys, args = self.publish_args(turn_id, data, agent_path, attempt, once_key, call_path)
        return int(await scripts.PUBLISH(self._redis, keys, args))

    # ``attempt`` for the publish helpers: an attempt number fences on that attempt
    # and a running turn; WHILE_RUNNING on a running turn only (tool workers); None: no fence.

    def publish_args(
        self,
        turn_id: str,
        data: EventData,
        agent_path: list[str] | None,
        attempt: int | None,
        once_key: str | None = None,
        call_path: list[str] | None = None,
    ) -> tuple[list[str], list[Any]]:
        """The KEYS and ARGV of ``lua/publish.lua`` for a :meth:`publish` with this log's cap and TTL, for a
        script that publishes an event as one of its steps (``lua/store_tool_result.lua``)."""
        return publish_script_args(
            self._keys, turn_id, data, agent_path, attempt, self._max_len, once_key=once_key, call_path=call_path
        )

    def publish_in(
        self,
        rt: RoundTrip,
        turn_id: str,
        data: EventData,
        agent_path: list[str] | None = None,
        attempt: int | None = None,
        once_key: str | None = None,
        call_path: list[str] | None = None,
    ) -> Pending[int]:
        """Add a :meth:`publish` (fenced with ``attempt``, once per ``once_key``) to ``rt``; the handle
        gets its ``seq`` (-1 fenced off, 0 already published)."""
        keys, args = self.publish_args(turn_id, data, agent_path, attempt, once_key, call_path)
        return rt.script(scripts.PUBLISH, keys, args, parse=int)

    def publish_many_command(
        self,
        turn_id: str,
        events: list[EventData],
        agent_path: list[str] | None,
        attempt: int,
        call_path: list[str] | None,
        parse: Callable[[int], T],
    ) -> Command[T]:
        """The publish of consecutive ``events`` of one step in one script call (``lua/publish_batch.lua``):
        each gets its own ``seq``, log entry and message, as with :meth:`publish`, fenced once by
        ``attempt`` (or :data:`WHILE_RUNNING`). ``parse`` gets the first event's ``seq``, or -1 when
        fenced off (none published). Add it to a :class:`~smith_client.roundtrip.RoundTrip`, or send it
        with a worker's auto-pipeline."""
        keys, args = self._publish_many_call(turn_id, events, agent_path, attempt, call_path)
        return script_command(scripts.PUBLISH_BATCH, keys, args, parse=lambda reply: parse(int(reply)))

    def _publish_many_call(
        self,
        turn_id: str,
        events: list[EventData],
        agent_path: list[str] | None,
        attempt: int,
        call_path: list[str] | None,
    ) -> tuple[list[str], list[Any]]:
        keys = self._keys
        script_keys = [keys.turn_seq(turn_id), keys.turn_log(turn_id), keys.turn_events_channel(turn_id)]
        script_keys.append(keys.turn_state(turn_id))
        bodies = [_body(turn_id, data, agent_path, call_path)[1:] for data in events]
        fence = "" if attempt == WHILE_RUNNING else attempt
        return script_keys, [self._max_len, self._ttl, fence, *bodies]

    async def read(self, turn_id: str, after_seq: int = 0, count: int | None = None) -> list[Event]:
        """Events with ``seq > after_seq`` from the replay log, in order.

        Raises :class:`EventsTrimmedError` when some of them are no longer kept
        (the log was trimmed by its cap, or has expired).
        """
        return await AsyncRunner(self._redis).run(read_events(self._keys, turn_id, after_seq, count))

    async def last_seq(self, turn_id: str) -> int:
        """The highest ``seq`` published so far for the turn (0 if none)."""
        return await AsyncRunner(self._redis).run(last_seq(self._keys, turn_id))


def publish_script_args(
    keys: Keys,
    turn_id: str,
    data: EventData,
    agent_path: list[str] | None,
    attempt: int | None,
    max_len: int = DEFAULT_LOG_MAX_LEN,
    *,
    once_key: str | None = None,
    call_path: list[str] | None = None,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ``lua/publish.lua`` for one event, which lives ``keys.turn_ttl`` seconds (see
    :meth:`EventLog.publish` for ``attempt``, ``once_key`` and ``call_path``)."""
    body = _body(turn_id, data, agent_path, call_path)
    script_keys = [keys.turn_seq(turn_id), keys.turn_log(turn_id), keys.turn_events_channel(turn_id)]
    args: list[Any] = [body[1:], max_len, keys.turn_ttl]
    if attempt is not None:
        script_keys.append(keys.turn_state(turn_id))
        args.append("" if attempt == WHILE_RUNNING else attempt)
        if once_key is not None:
            script_keys.append(once_key)
    return script_keys, args


def _body(turn_id: str, data: EventData, agent_path: list[str] | None, call_path: list[str] | None) -> bytes:
    """An event's JSON without its ``seq`` and ``ts``: the scripts put them in front, ``ts`` from the Redis
    server's clock, so a turn's log has non-decreasing ``ts`` in ``seq`` order whichever process built its
    events, and when (docs/architecture.md, Events)."""
    envelope: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "turn_id": turn_id,
        "agent_path": agent_path or [],
        "type": data.event_type,
        "data": data.to_wire(),
    }
    if call_path:  # a sub-agent's events only: the root agent's stay as they were
        envelope["call_path"] = call_path
    return orjson.dumps(envelope)


def publish(keys: Keys, turn_id: str, data: EventData) -> Operation[int]:
    """Operation: publish one unfenced event with the default cap; returns its ``seq``."""
    script_keys, args = publish_script_args(keys, turn_id, data, None, None)
    return (yield from run_script(scripts.PUBLISH, script_keys, args, parse=int))


def read_events(keys: Keys, turn_id: str, after_seq: int = 0, count: int | None = None) -> Operation[list[Event]]:
    """Operation: :meth:`EventLog.read`."""
    rt = RoundTrip(transaction=True)  # one transaction: the log and the counter are read as of the same instant
    log = log_reads(rt, keys, turn_id, after_seq, count)
    yield from run(rt)
    return log.events()


@dataclass(frozen=True)
class LogRead:
    """The reads :func:`log_reads` added to a round trip: the log's ``entries`` after ``after_seq`` and its
    counter ``last`` (the highest ``seq`` published)."""

    turn_id: str
    after_seq: int
    entries: Pending[Any]
    last: Pending[int]

    def kept(self) -> list[Event]:
        """The events read, as the log keeps them: unlike :meth:`events`, no check that none was trimmed."""
        return [event_from_json(fields[b"e"]) for _entry_id, fields in self.entries.value]

    def events(self) -> list[Event]:
        """The events read. Raises :class:`EventsTrimmedError` (see :meth:`EventLog.read`)."""
        events = self.kept()
        after_seq = self.after_seq
        if events and events[0].seq != after_seq + 1 or not events and after_seq < self.last.value:
            first = events[0].seq if events else 0
            raise EventsTrimmedError(
                f"events of turn {self.turn_id} after seq {after_seq} are no longer in the replay log",
                turn_id=self.turn_id,
                after_seq=after_seq,
                first_seq=first,
            )
        return events


def log_reads(rt: RoundTrip, keys: Keys, turn_id: str, after_seq: int, count: int | None = None) -> LogRead:
    """Add the reads of :func:`read_events` (log entries after ``after_seq``, the seq counter) to ``rt``."""
    entries: Pending[Any] = rt.call("xrange", keys.turn_log(turn_id), min=f"(0-{after_seq}", max="+", count=count)
    last = rt.call("get", keys.turn_seq(turn_id), parse=_counter)
    return LogRead(turn_id, after_seq, entries, last)


def _counter(reply: Any) -> int:
    return int(reply or 0)


def last_seq(keys: Keys, turn_id: str) -> Operation[int]:
    """Operation: the highest ``seq`` published so far for the turn (0 if none)."""
    return (yield from call("get", keys.turn_seq(turn_id), parse=_counter))
