"""The interface between the agent loop and a memory strategy (docs/architecture.md, Memory).

The loop calls :meth:`Memory.view` once per step, before the model call, with
a :class:`MemoryContext` holding what it has: the conversation store (reads by
absolute position), the turn's start position, a non-streaming model call for
summaries and the turn's event publisher. A strategy returns the *model's
view* of the history (without the agent's system prompt, which the loop puts
first); it never rewrites the stored history. Every
view goes through :func:`~smith_worker.memory.pairing.well_formed` before it
is returned, so no strategy can send a broken tool-call group (rule 2, 3).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from smith_client.events import EventData
from smith_client.keys import DEFAULT_HISTORY_TTL, Keys
from smith_client.roundtrip import RoundTrip
from smith_worker.memory.history import ConversationStore
from smith_worker.memory.pairing import well_formed

#: A non-streaming model call with the agent's model: request messages → the reply's text.
Summarize = Callable[[list[Any]], Awaitable[str]]
#: Publishes one event of the running turn (its typed data) and returns its ``seq``.
Publish = Callable[[EventData], Awaitable[int]]


@dataclass
class MemoryContext:
    """What a strategy may use to compute one step's view.

    ``turn_start`` is the absolute position of the current turn's user
    message; every message from it on belongs to the current turn.
    ``redis`` / ``keys`` / ``conversation_id`` address the strategy's own
    state in Redis (key names come from :class:`~smith_client.keys.Keys`),
    which lives ``history_ttl`` seconds like the history.
    """

    store: ConversationStore
    turn_start: int
    summarize: Summarize
    publish: Publish
    redis: Any
    keys: Keys
    conversation_id: str
    history_ttl: int = DEFAULT_HISTORY_TTL

    def reading(self, rt: RoundTrip, first: int, end: int | None = None) -> MemoryContext:
        """This context with a store whose first ``read(first, end)`` is sent now, in ``rt``
        (:meth:`~smith_worker.memory.history.ConversationStore.with_read`)."""
        return dataclasses.replace(self, store=self.store.with_read(rt, first, end))


class Memory(abc.ABC):
    """A memory strategy: computes the model's view of a conversation at each step."""

    def prefetch(self, ctx: MemoryContext, rt: RoundTrip) -> MemoryContext:
        """Add the first read :meth:`select` makes to ``rt``, the round trip of the step's other reads
        (after the merged user messages joined the history), and return the context the step's
        :meth:`view` then gets (:meth:`MemoryContext.reading`). The default reads nothing ahead: a
        strategy that overrides it saves one round trip per step (docs/architecture.md, One turn's path)."""
        return ctx

    async def view(self, ctx: MemoryContext) -> list[Any]:
        """The messages to send after the system prompt: :meth:`select`, made well-formed.

        Well-formed: docs/architecture.md, Tool-call pairing.
        """
        return well_formed(await self.select(ctx))

    @abc.abstractmethod
    async def select(self, ctx: MemoryContext) -> list[Any]:
        """The strategy's choice of messages (and summary messages) for this step, oldest first.

        Raises :class:`~smith_client.errors.ContextOverflowError` when the
        current turn cannot fit the strategy's limits.
        """


class FullMemory(Memory):
    """Every stored message, never truncated; the default of ``app.agent``.

    Reads the whole stored history at each step (bounded by ``SMITH_HISTORY_MAX_MESSAGES``; a history over
    ``SMITH_VIEW_MAX_BYTES`` fails the turn with :class:`~smith_client.errors.ContextOverflowError`).
    """

    def prefetch(self, ctx: MemoryContext, rt: RoundTrip) -> MemoryContext:
        """The whole history, read with the step's other reads."""
        return ctx.reading(rt, 0)

    async def select(self, ctx: MemoryContext) -> list[Any]:
        """All stored messages."""
        return (await ctx.store.read(0)).messages

    def __repr__(self) -> str:
        return "FullMemory()"
