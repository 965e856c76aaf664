"""The per-turn event log: atomic sequence numbers, a replay log, live pub/sub.

Several processes publish for one turn (the turn worker, tool workers, a
re-run after a crash), so :meth:`EventLog.publish` assigns ``seq`` inside one
Lua script that INCRs the turn's counter, XADDs the event to a bounded Redis
Stream (entry id ``0-<seq>``, so replay by sequence number is an XRANGE) and
PUBLISHes it, all atomically (DESIGN.md §5).

Pub/sub is at-most-once; the stream is the durable copy a late or
reconnecting subscriber reads from (arq-notes.md §2(c), §4.7).
"""

from __future__ import annotations

import time
from typing import Any

import orjson
from redis.asyncio import Redis

from smith_client.errors import EventsTrimmedError
from smith_client.events import PROTOCOL_VERSION, Event, event_from_json
from smith_client.keys import Keys
from smith_client.protocol import Call, Operation, Transaction
from smith_client.runners import AsyncRunner

#: Default lifetime of a turn's log and counter after its last event (seconds): 24 h (DESIGN.md §8).
DEFAULT_TURN_TTL = 24 * 3600
#: ``attempt`` value for a publish that needs the turn running, whatever its attempt (tool workers).
WHILE_RUNNING = -1
#: Default cap on the entries of one turn's replay log (approximate trimming).
DEFAULT_LOG_MAX_LEN = 100_000

# KEYS: seq counter, log stream, channel[, turn state]. ARGV: event JSON without
# its opening brace, max length, ttl seconds[, attempt]. The seq is spliced in as
# the first field so no JSON library is needed inside Redis (cjson would turn []
# into {}). With a state key, the event is dropped (-1) unless the turn is
# running and (when ARGV[4] is not '') its current attempt is ARGV[4]: the
# fencing token that keeps a stale attempt silent. Nothing follows a turn's
# terminal event. With a fifth key (a "published once" marker, which needs the
# state key), the event is published only if the marker is absent (else 0), and
# the marker is set with it: an event several processes may try to publish
# (a tool result landing while its turn changes attempts) goes out exactly once.
_PUBLISH_LUA = """
if KEYS[4] and (redis.call('HGET', KEYS[4], 'status') ~= 'running'
                or (ARGV[4] ~= '' and redis.call('HGET', KEYS[4], 'attempt') ~= ARGV[4])) then
  return -1
end
if KEYS[5] then
  if redis.call('EXISTS', KEYS[5]) == 1 then return 0 end
  redis.call('SET', KEYS[5], '1', 'EX', ARGV[3])
end
local seq = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
local payload = '{"seq":' .. seq .. ',' .. ARGV[1]
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '0-' .. seq, 'e', payload)
redis.call('EXPIRE', KEYS[2], ARGV[3])
redis.call('PUBLISH', KEYS[3], payload)
return seq
"""


class EventLog:
    """Publish and read the events of turns.

    ``ttl`` (seconds) is how long the log outlives a turn's last event;
    ``max_len`` caps the entries kept per turn.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        *,
        ttl: int = DEFAULT_TURN_TTL,
        max_len: int = DEFAULT_LOG_MAX_LEN,
    ) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl = ttl
        self._max_len = max_len
        self._script = redis.register_script(_PUBLISH_LUA)

    @property
    def ttl(self) -> int:
        """Seconds a turn's log outlives its last event."""
        return self._ttl

    async def publish(
        self,
        turn_id: str,
        type: str,
        data: dict[str, Any],
        agent_path: list[str] | None = None,
        *,
        attempt: int | None = None,
        once_key: str | None = None,
    ) -> int:
        """Append one event to the turn's log and publish it; return its ``seq``.

        With ``attempt``, publish only while the turn runs and that attempt is
        its current one (fencing, DESIGN.md §8; :data:`WHILE_RUNNING`: any
        attempt); return -1 otherwise. With ``once_key`` (needs ``attempt``),
        publish only if that marker key is absent, setting it atomically with
        the event; return 0 when it was already set.
        """
        keys, args = self._publish_call(turn_id, type, data, agent_path, attempt, once_key)
        return int(await self._script(keys=keys, args=args))

    # ``attempt`` for the publish helpers: an attempt number fences on that attempt
    # and a running turn; WHILE_RUNNING on a running turn only (tool workers); None: no fence.

    def _publish_call(
        self, turn_id: str, type: str, data: dict[str, Any], agent_path: list[str] | None, attempt: int | None,
        once_key: str | None = None,
    ) -> tuple[list[str], list[Any]]:
        return publish_script_args(self._keys, turn_id, type, data, agent_path, attempt, self._max_len, self._ttl,
                                   once_key=once_key)

    def publish_in(
        self,
        pipe: Any,
        turn_id: str,
        type: str,
        data: dict[str, Any],
        agent_path: list[str] | None = None,
        attempt: int | None = None,
        once_key: str | None = None,
    ) -> None:
        """Queue a :meth:`publish` (fenced with ``attempt``, once per ``once_key``) on a pipeline."""
        keys, args = self._publish_call(turn_id, type, data, agent_path, attempt, once_key)
        pipe.eval(_PUBLISH_LUA, len(keys), *keys, *args)

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
    keys: Keys, turn_id: str, type: str, data: dict[str, Any], agent_path: list[str] | None, attempt: int | None,
    max_len: int = DEFAULT_LOG_MAX_LEN, ttl: int = DEFAULT_TURN_TTL, *, once_key: str | None = None,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of the publish script for one event (see :meth:`EventLog.publish` for ``attempt``
    and ``once_key``)."""
    body = orjson.dumps(
        {
            "v": PROTOCOL_VERSION,
            "turn_id": turn_id,
            "ts": time.time(),
            "agent_path": agent_path or [],
            "type": type,
            "data": data,
        }
    )
    script_keys = [keys.turn_seq(turn_id), keys.turn_log(turn_id), keys.turn_events_channel(turn_id)]
    args: list[Any] = [body[1:], max_len, ttl]
    if attempt is not None:
        script_keys.append(keys.turn_state(turn_id))
        args.append("" if attempt == WHILE_RUNNING else attempt)
        if once_key is not None:
            script_keys.append(once_key)
    return script_keys, args


def publish(keys: Keys, turn_id: str, type: str, data: dict[str, Any]) -> Operation[int]:
    """Operation: publish one unfenced event with the default TTL and cap; returns its ``seq``."""
    script_keys, args = publish_script_args(keys, turn_id, type, data, None, None)
    return int((yield Call("eval", (_PUBLISH_LUA, len(script_keys), *script_keys, *args))))


def read_events(keys: Keys, turn_id: str, after_seq: int = 0, count: int | None = None) -> Operation[list[Event]]:
    """Operation: :meth:`EventLog.read`."""
    # one transaction: the log and the counter are read as of the same instant
    entries, last = yield Transaction((
        Call("xrange", (keys.turn_log(turn_id),), {"min": f"(0-{after_seq}", "max": "+", "count": count}),
        Call("get", (keys.turn_seq(turn_id),)),
    ))
    events = [event_from_json(fields[b"e"]) for _entry_id, fields in entries]
    if events and events[0].seq != after_seq + 1 or not events and after_seq < int(last or 0):
        first = events[0].seq if events else 0
        raise EventsTrimmedError(
            f"events of turn {turn_id} after seq {after_seq} are no longer in the replay log",
            turn_id=turn_id, after_seq=after_seq, first_seq=first,
        )
    return events


def last_seq(keys: Keys, turn_id: str) -> Operation[int]:
    """Operation: the highest ``seq`` published so far for the turn (0 if none)."""
    return int((yield Call("get", (keys.turn_seq(turn_id),))) or 0)
