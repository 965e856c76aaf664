"""Conversation history in Redis, read by absolute position (DESIGN.md §2 "in-process Memory").

One Redis list per conversation holds the stored form of every message, so
any worker can run the conversation's next turn. The list lives until the
conversation has been idle ``smith_client.keys.DEFAULT_HISTORY_TTL`` seconds (30 days,
DESIGN.md §8): every write (:mod:`smith_worker.turn_state`) refreshes the TTL.

Storage is bounded by ``SMITH_HISTORY_MAX_MESSAGES`` (default
:data:`DEFAULT_HISTORY_MAX_MESSAGES`): the append scripts trim the oldest
messages beyond it, whole tool-call groups at a time (:data:`TRIM_LUA`), and
count what they removed in ``{p}:conv:{c}:trimmed``. A message's *position*
is its absolute number in the conversation (list index + trimmed count), so
positions kept elsewhere (a turn's start, a summary's coverage) survive
trimming (issue 13 design rule 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from smith_client.keys import Keys
from smith_client.messages import messages_from_json_list

#: Messages kept in a conversation's stored history (``SMITH_HISTORY_MAX_MESSAGES``).
DEFAULT_HISTORY_MAX_MESSAGES = 10_000

#: Lua function ``trim(history, trimmed, max, ttl)``: drop the oldest messages beyond ``max``,
#: moving the cut forward past tool messages so a tool-call group goes whole, and refresh the
#: trimmed counter's TTL with the history's; prepended to every script that appends to a history.
TRIM_LUA = """
local function trim(history, trimmed, max, ttl)
  redis.call('EXPIRE', trimmed, ttl)  -- lives as long as the history: positions depend on it
  local len = redis.call('LLEN', history)
  local cut = len - tonumber(max)
  if cut <= 0 then return end
  while cut < len and cjson.decode(redis.call('LINDEX', history, cut))['role'] == 'tool' do
    cut = cut + 1
  end
  redis.call('LTRIM', history, cut, -1)
  redis.call('INCRBY', trimmed, cut)
  redis.call('EXPIRE', trimmed, ttl)
end
"""

# KEYS: history, trimmed. ARGV: first position, end position ('' = the end), or a negative count
# of messages from the end when ARGV[3] == 'tail'. Returns {trimmed, length, first index, items}.
_READ = """
local base = tonumber(redis.call('GET', KEYS[2]) or '0')
local len = redis.call('LLEN', KEYS[1])
local first, last
if ARGV[3] == 'tail' then
  first = math.max(len - tonumber(ARGV[1]), 0)
  last = len - 1
else
  first = math.max(tonumber(ARGV[1]) - base, 0)
  last = (ARGV[2] == '' and len or tonumber(ARGV[2]) - base) - 1
end
if last < first then return {base, len, first, {}} end
return {base, len, first, redis.call('LRANGE', KEYS[1], first, last)}
"""


@dataclass(frozen=True)
class HistorySlice:
    """Stored messages ``messages`` at positions ``first`` … ``first + len(messages) - 1``;
    the history holds positions ``stored_first`` … ``end - 1`` (absolute message numbers)."""

    first: int
    messages: list[Any]
    stored_first: int
    end: int


@dataclass(frozen=True)
class Repair:
    """Tool messages to insert at absolute ``position``, computed when the history ended at ``end``."""

    position: int
    end: int
    messages: list[Any]


class ConversationStore:
    """Read one conversation's messages by absolute position. Turns write them through their
    fenced :class:`~smith_worker.turn_state.TurnAttempt`, so a stale attempt cannot.

    ``bytes_read`` counts the stored-form bytes this object has read (for benchmarks).
    """

    def __init__(self, redis: Redis, keys: Keys, conversation_id: str) -> None:
        self._redis = redis
        self._keys = (keys.history(conversation_id), keys.history_trimmed(conversation_id))
        self.bytes_read = 0

    async def read(self, first: int, end: int | None = None) -> HistorySlice:
        """Messages at positions ``first`` (clamped to the oldest stored) up to ``end`` (exclusive; None = all)."""
        return self._slice(await self._redis.eval(_READ, 2, *self._keys, first, "" if end is None else end, "range"))

    async def tail(self, count: int) -> HistorySlice:
        """The last ``count`` stored messages (fewer when the history is shorter)."""
        return self._slice(await self._redis.eval(_READ, 2, *self._keys, count, "", "tail"))

    def _slice(self, reply: Any) -> HistorySlice:
        base, length, index, items = int(reply[0]), int(reply[1]), int(reply[2]), reply[3]
        self.bytes_read += sum(len(item) for item in items)
        return HistorySlice(base + index, messages_from_json_list(items), base, base + length)
