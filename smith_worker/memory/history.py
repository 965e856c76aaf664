"""Conversation history in Redis, read by absolute position (docs/architecture.md, Memory).

One Redis list per conversation holds the stored form of every message, so
any worker can run the conversation's next turn. The list lives until the
conversation has been idle ``smith_client.keys.DEFAULT_HISTORY_TTL`` seconds (30 days,
docs/architecture.md, Lifetimes): every write (:mod:`smith_worker.turn.attempt`) refreshes the TTL.

Storage is bounded by ``SMITH_HISTORY_MAX_MESSAGES`` (default
:data:`DEFAULT_HISTORY_MAX_MESSAGES`): the append scripts trim the oldest
messages beyond it, whole tool-call groups at a time (``trim`` in ``smith_client/lua/lib.lua``), and
count what they removed in ``{p}:conv:{c}:trimmed``. A message's *position*
is its absolute number in the conversation (list index + trimmed count), so
positions kept elsewhere (a turn's start, a summary's coverage) survive
trimming.

One read returns at most ``SMITH_VIEW_MAX_BYTES`` (default :data:`DEFAULT_VIEW_MAX_BYTES`) of
stored messages: the history read script sums their bytes inside Redis and returns none of them
past the limit, so a worker never pulls an unbounded history into its memory; the read raises
:class:`~smith_client.errors.ContextOverflowError` instead, which fails the turn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from smith_client.errors import ContextOverflowError
from smith_client.keys import Keys
from smith_client.messages import messages_from_json_list
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.scripts import LuaScript
from smith_worker.memory.fencing import StaleAttemptError

#: The history's scripts, in ``lua/`` beside this module: the read by position (here) and the fenced
#: append of whole messages (a turn's attempt, a sub-agent).
HISTORY_READ = LuaScript("history_read", __package__)
APPEND = LuaScript("append", __package__)

#: Messages kept in a conversation's stored history (``SMITH_HISTORY_MAX_MESSAGES``).
DEFAULT_HISTORY_MAX_MESSAGES = 10_000
#: Bytes (stored form) one read of a history may return (``SMITH_VIEW_MAX_BYTES``): 16 MiB.
DEFAULT_VIEW_MAX_BYTES = 16 * 1024 * 1024


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
    fenced :class:`~smith_worker.turn.attempt.TurnAttempt`, so a stale attempt cannot.

    ``lists`` reads another message list and its trimmed counter instead (a
    sub-agent's, :mod:`smith_worker.agent.subagents`). ``expected_end()`` is where the
    running attempt's own writes left the history's end (None: not known yet):
    a read that finds another end raises :class:`~smith_worker.memory.fencing.StaleAttemptError`
    (a failover lost some of them), so no prompt is built from a history missing them.
    A read whose messages sum to more than ``max_bytes`` (stored form, bytes) raises
    :class:`~smith_client.errors.ContextOverflowError` (``limit="SMITH_VIEW_MAX_BYTES"``, ``budget`` the
    limit, ``size`` their bytes); Redis sends none of them.
    """

    def __init__(
        self,
        redis: Redis,
        keys: Keys,
        conversation_id: str,
        *,
        lists: tuple[str, str] | None = None,
        expected_end: Callable[[], int | None] | None = None,
        max_bytes: int = DEFAULT_VIEW_MAX_BYTES,
    ) -> None:
        self._redis = redis
        self._max_bytes = max_bytes
        self._keys = lists or (keys.history(conversation_id), keys.history_trimmed(conversation_id))
        self._expected_end = expected_end
        #: Reads sent ahead by :meth:`with_read`, by their ``(first, end)``: each serves one :meth:`read`.
        self._ready: dict[tuple[int, int | None], Pending[HistorySlice]] = {}

    async def read(self, first: int, end: int | None = None) -> HistorySlice:
        """Messages at positions ``first`` (clamped to the oldest stored) up to ``end`` (exclusive; None = all)."""
        ready = self._ready.pop((first, end), None)
        if ready is not None:
            return ready.value
        return self._slice(await HISTORY_READ(self._redis, self._keys, self._read_args(first, end)))

    def with_read(self, rt: RoundTrip, first: int, end: int | None = None) -> ConversationStore:
        """A copy of this store whose first :meth:`read` of ``(first, end)`` is answered by a read added to
        ``rt`` now (a step's view read sent with the step's other reads; docs/architecture.md, One turn's
        path). Running ``rt`` raises what :meth:`read` raises; reading before ``rt`` ran raises
        :class:`RuntimeError`."""
        ahead = copy.copy(self)
        ahead._ready = {(first, end): rt.script(HISTORY_READ, self._keys, self._read_args(first, end), self._slice)}
        return ahead

    def _read_args(self, first: int, end: int | None) -> list[Any]:
        return [first, "" if end is None else end, "range", self._max_bytes]

    def queue_tail(self, rt: RoundTrip, count: int) -> Pending[HistorySlice]:
        """Add a read of the last ``count`` stored messages (fewer when the history is shorter) to ``rt``,
        to share another call's round trip; running it raises what :meth:`read` raises."""
        return rt.script(HISTORY_READ, self._keys, [count, "", "tail", self._max_bytes], parse=self._slice)

    def _slice(self, reply: Any) -> HistorySlice:
        base, length, index, items = int(reply[0]), int(reply[1]), int(reply[2]), reply[3]
        if items is None:
            raise ContextOverflowError(
                f"the history read for this step is {int(reply[4])} bytes, over "
                f"SMITH_VIEW_MAX_BYTES={self._max_bytes} (a memory strategy that reads less, or a higher limit)",
                limit="SMITH_VIEW_MAX_BYTES",
                budget=self._max_bytes,
                size=int(reply[4]),
            )
        expected = self._expected_end() if self._expected_end is not None else None
        if expected is not None and base + length != expected:
            raise StaleAttemptError(f"history ends at {base + length}, this attempt's writes left it at {expected}")
        return HistorySlice(base + index, messages_from_json_list(items), base, base + length)
