"""Fencing of a turn's attempts (docs/architecture.md, Fault model): the error a superseded attempt stops with, and the
fenced writes the agent loop may make (implemented by :class:`smith_worker.turn.attempt.TurnAttempt`)."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel


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

    def queue_append(self, pipe: Any, *messages: BaseModel) -> None:
        """Queue an append of (at least one of) ``messages`` on ``pipe``; :meth:`appended` reads its reply."""
        ...

    def appended(self, replies: list[Any]) -> None:
        """Check a queued append's reply, the first of ``replies``."""
        ...

    async def drain_inbox(self, closing: bool) -> list[bytes]:
        """Move merged user messages into the history; when ``closing`` and none wait, close the inbox."""
        ...

    def queue_drain_inbox(self, pipe: Any, closing: bool = False) -> None:
        """Queue a drain on ``pipe`` (closing the inbox when ``closing``); :meth:`drained` reads its reply."""
        ...

    def drained(self, reply: Any) -> list[bytes]:
        """The moved messages from a queued drain's reply."""
        ...
