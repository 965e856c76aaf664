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

from smith_client.events import PROTOCOL_VERSION, Event, event_from_json
from smith_client.keys import Keys

#: Default lifetime of a turn's log and counter after its last event (seconds): 24 h (DESIGN.md §8).
DEFAULT_TURN_TTL = 24 * 3600
#: Default cap on the entries of one turn's replay log (approximate trimming).
DEFAULT_LOG_MAX_LEN = 100_000

# KEYS: seq counter, log stream, channel. ARGV: event JSON without its opening
# brace, max length, ttl seconds. The seq is spliced in as the first field so
# no JSON library is needed inside Redis (cjson would turn [] into {}).
_PUBLISH_LUA = """
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

    async def publish(
        self, turn_id: str, type: str, data: dict[str, Any], agent_path: list[str] | None = None
    ) -> int:
        """Append one event to the turn's log and publish it; return its ``seq``."""
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
        keys = [
            self._keys.turn_seq(turn_id),
            self._keys.turn_log(turn_id),
            self._keys.turn_events_channel(turn_id),
        ]
        return int(await self._script(keys=keys, args=[body[1:], self._max_len, self._ttl]))

    async def read(self, turn_id: str, after_seq: int = 0, count: int | None = None) -> list[Event]:
        """Events with ``seq > after_seq`` from the replay log, in order."""
        entries = await self._redis.xrange(
            self._keys.turn_log(turn_id), min=f"(0-{after_seq}", max="+", count=count
        )
        return [event_from_json(fields[b"e"]) for _entry_id, fields in entries]

    async def last_seq(self, turn_id: str) -> int:
        """The highest ``seq`` published so far for the turn (0 if none)."""
        raw = await self._redis.get(self._keys.turn_seq(turn_id))
        return int(raw or 0)
