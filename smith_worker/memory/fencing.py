"""Fencing of a turn's attempts (docs/architecture.md, Fault model): the error a superseded attempt stops with, and the
fenced writes the agent loop may make (implemented by :class:`smith_worker.turn.attempt.TurnAttempt`)."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel

from smith_client.messages import AssistantMessage, TokenUsage
from smith_client.roundtrip import Pending, RoundTrip


class StaleAttemptError(Exception):
    """This attempt is no longer the turn's current one: it must stop without writing."""


class AttemptWrites(Protocol):
    """The fenced writes of the current attempt (:class:`smith_worker.turn.attempt.TurnAttempt`).

    Each raises :class:`StaleAttemptError` when another attempt took the turn over.
    """

    @property
    def attempt(self) -> int:
        """The attempt number (the fencing token): 1 on a first run, more on a resume."""
        ...

    async def append(self, *messages: BaseModel) -> None:
        """Append whole messages to the history."""
        ...

    def queue_append(self, rt: RoundTrip, *messages: BaseModel) -> Pending[None]:
        """Add an append of (at least one of) ``messages`` to ``rt``; running it raises
        :class:`StaleAttemptError` when the append was refused."""
        ...

    def queue_drain_inbox(self, rt: RoundTrip) -> Pending[list[bytes]]:
        """Add the move of merged user messages into the history to ``rt``; the handle gets the moved
        messages, and running it raises :class:`StaleAttemptError` when fenced off."""
        ...

    def queue_close(
        self, rt: RoundTrip, final: AssistantMessage, output: Any = None, usage: TokenUsage | None = None
    ) -> Pending[list[bytes]]:
        """Add the end of the agent's run with answer ``final`` (already appended in ``rt``; ``usage`` the run's
        tokens): the handle gets the merged user messages that joined the history instead (the run goes on to
        answer them), or ``[]``; for a turn's root agent, ``[]`` means the turn completed in that round trip
        (``turn.completed`` carrying ``output``, the answer's structured output, if any, and ``usage``)."""
        ...
