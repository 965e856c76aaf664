"""``SyncSmithClient``: the blocking twin of :class:`~smith_client.client.SmithClient`, for WSGI apps.

Same methods, arguments, events and errors (each method runs the operation
:class:`~smith_client.client.ClientBase` builds for both clients), run on
redis-py's blocking client: no event loop is started. One instance can be
shared by all threads of a WSGI server (Flask, Django): commands take pooled
connections and every ``stream`` / ``follow`` shares the client's one pub/sub
connection (read by a daemon thread, :class:`~smith_client.fanout.SyncFanout`),
unsubscribing its channel when the iterator ends or is closed. Under WSGI every
open stream holds a worker thread; fan out to many browsers with the ASGI relay
in ``examples/web/`` instead.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Self, Unpack

import redis

from smith_client.client import ClientBase, HandleBase
from smith_client.connection import connect_sync_redis
from smith_client.events import Event
from smith_client.messages import AssistantMessage, Message
from smith_client.runners import SyncRunner
from smith_client.validation import TurnOptions, check_id


class SyncSmithClient(ClientBase):
    """Blocking client for one Agent Smith deployment (one Redis database, one key prefix).

    Use ``SyncSmithClient.from_url(url, prefix=...)``, as ``with`` or closing
    with :meth:`close`. Thread-safe. Every method raises :class:`TransportError`
    when Redis fails (each command within the socket timeout); times are seconds.
    """

    _connect = staticmethod(connect_sync_redis)
    _runner = SyncRunner
    redis: redis.Redis
    runner: SyncRunner

    def send(self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]) -> AssistantMessage:
        """Run one turn and return its final :class:`AssistantMessage`.

        ``text``: the user message (non-blank, at most 1 000 000 UTF-8 bytes).
        ``options`` are :class:`TurnOptions`: ``conversation_id`` (required),
        ``agent``, ``turn_id`` (an idempotency key: the same id sent again with
        the same request attaches to the existing turn instead of starting
        another), ``multitask`` (the policy when the conversation already has
        an unfinished turn, see :mod:`smith_client.turns`), ``sampling`` and
        ``stream`` (per-turn model options). ``timeout`` (seconds, None = wait
        forever) bounds the wait for the turn's events, not the turn.

        Raises :class:`InvalidRequestError` / :class:`UnknownAgentError` /
        :class:`ConversationBusyError` / :class:`ConflictError` before
        enqueueing; the turn's own typed error (e.g. ``ParseError``,
        ``LlmApiError``) when it fails; :class:`TurnCancelledError` when it is
        cancelled; :class:`SmithTimeoutError` on ``timeout``.
        """
        return self.runner.run(self._op_send(text, timeout, options), bound=timeout)

    def stream(
        self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]
    ) -> Generator[Event, None, None]:
        """Run one turn and iterate its :class:`Event` objects (a plain ``for``), ending with ``turn.completed``,
        ``turn.failed`` or ``turn.cancelled``.

        Options, ``timeout`` (seconds) and errors as for :meth:`send`; the
        errors are raised at the first iteration, validation errors before
        anything is enqueued. A caller attaching to an existing turn (same
        ``turn_id``) gets all of its events from the start; a ``merge`` caller
        gets the events of the turn it joined from the moment it joined. Leaving
        the loop early (or ``close()``) unsubscribes; the turn goes on.
        """
        return self.runner.iterate(self._op_stream(text, timeout, options))

    def submit(self, text: str, **options: Unpack[TurnOptions]) -> SyncTurnHandle:
        """Start a background turn and return its :class:`SyncTurnHandle` at once (the turn queued, not awaited).

        Options and the errors raised before enqueueing as for :meth:`send`.
        """
        return self.turn(self.runner.run(self._op_submit(text, options)))

    def turn(self, turn_id: str) -> SyncTurnHandle:
        """A handle on an existing turn, from any process (e.g. a web request after a reload).

        Raises :class:`InvalidRequestError` for a malformed id; an unknown turn is
        found out by the handle's methods.
        """
        return SyncTurnHandle(self, check_id(turn_id, "turn_id"))

    def follow(self, turn_id: str, after_seq: int = 0, timeout: float | None = None) -> Generator[Event, None, None]:
        """Iterate the events of ``turn_id`` with ``seq > after_seq``: replayed from the log, then live, until terminal.

        ``after_seq`` is the ``seq`` of the last event the caller has (an SSE
        ``Last-Event-ID``); 0 replays everything. ``timeout`` (seconds, None = forever)
        bounds the whole iteration. Raises :class:`InvalidRequestError`
        for a bad argument, :class:`TurnNotFoundError` for an unknown turn,
        :class:`EventsTrimmedError`, :class:`SmithTimeoutError`.
        """
        return self.runner.iterate(self._op_follow(turn_id, after_seq, timeout))

    def clear(self, conversation_id: str) -> None:
        """Remove a conversation's messages, memory state (its summary) and active skills, in one atomic step.

        Raises :class:`ConversationBusyError` (``active_turn_id`` set) and
        changes nothing while the conversation has an unfinished (queued or
        running) turn; :class:`InvalidRequestError` for a bad id. Finished
        turns keep their own state (results, events) until it expires.
        """
        self.runner.run(self._op_clear(conversation_id))

    def history(self, conversation_id: str) -> list[Message]:
        """All messages of a conversation, oldest first (stored form, ``is_error`` included); ``[]`` for an
        unknown or cleared conversation. Raises :class:`InvalidRequestError` for a bad id."""
        return self.runner.run(self._op_history(conversation_id))

    def activate_skill(self, conversation_id: str, name: str) -> None:
        """Activate skill ``name`` (its declared name) on a conversation, after the skills active already.

        Any registered skill can be activated on any conversation, whatever
        agent runs it; the activation is stored in Redis, so every worker's next
        step sees it (a running turn at its next model call), and lives as long
        as the conversation's history. Activating an active skill
        does nothing (it keeps its place in the activation order).

        Raises :class:`InvalidRequestError` for a bad id or name and
        :class:`UnknownSkillError` when live turn workers are registered and
        none serves ``name``; in both cases nothing changes. With no turn
        worker registered at all it logs a warning and accepts.
        """
        self.runner.run(self._op_activate_skill(conversation_id, name))

    def deactivate_skill(self, conversation_id: str, name: str) -> None:
        """Deactivate skill ``name`` on a conversation; deactivating an inactive skill does nothing.

        Takes effect at the next step of any turn, like an activation. An
        agent's default skills (``app.agent(..., skills=[...])``) stay active
        for that agent. Raises :class:`InvalidRequestError` for a bad id or name.
        """
        self.runner.run(self._op_deactivate_skill(conversation_id, name))

    def active_skills(self, conversation_id: str) -> list[str]:
        """Declared names of the skills activated on a conversation, in activation order.

        An agent's default skills are not listed: they belong to the agent, not
        to the conversation. Raises :class:`InvalidRequestError` for a bad id.
        """
        return self.runner.run(self._op_active_skills(conversation_id))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the Redis connections this client created; later calls raise :class:`TransportError`."""
        self.runner.close()
        if self._owns_redis:
            self.redis.close()
            self.redis.connection_pool.disconnect()


class SyncTurnHandle(HandleBase):
    """A turn seen from any process through a :class:`SyncSmithClient`: its status, events, result, and cancel.

    Get one from :meth:`SyncSmithClient.submit` or :meth:`SyncSmithClient.turn`
    (:class:`~smith_client.client.TurnHandle` is the asyncio one). Its methods
    raise :class:`TransportError` when Redis fails.
    """

    def __init__(self, client: SyncSmithClient, turn_id: str) -> None:
        super().__init__(client.keys, turn_id)
        self.client = client

    def state(self) -> dict[str, str]:
        """The raw state hash, field to value (empty when the turn is unknown or expired)."""
        return self.client.runner.run(self._op_state())

    def status(self) -> str:
        """``queued``, ``running``, ``completed``, ``failed``, ``cancelled``, or ``unknown``."""
        return self.client.runner.run(self._op_status())

    def events(self, after_seq: int = 0, timeout: float | None = None) -> Generator[Event, None, None]:
        """Every event with ``seq > after_seq``, exactly once and in order, then live ones until the end
        (a plain ``for``; ``timeout`` in seconds, None = forever).

        Raises as :meth:`SyncSmithClient.follow`, e.g. :class:`EventsTrimmedError` when the asked-for events
        are no longer kept.
        """
        return self.client.follow(self.turn_id, after_seq, timeout)

    def result(self, timeout: float | None = None) -> AssistantMessage:
        """Wait for the final :class:`AssistantMessage` (``timeout`` seconds, None = forever).

        Raises the turn's typed error, :class:`TurnCancelledError` for a
        cancelled turn, :class:`TurnNotFoundError` for an unknown one, or :class:`SmithTimeoutError`.
        """
        return self.client.runner.run(self._op_result(timeout), bound=timeout)

    def cancel(self, reason: str = "cancel") -> str:
        """Ask for the turn to stop; returns what happened: ``cancelled_queued`` (it never started),
        ``cancelling`` (its worker stops it and publishes ``turn.cancelled``), a terminal status
        (nothing to do), or ``missing``. Raises :class:`InvalidRequestError` for an empty ``reason``."""
        return self.client.runner.run(self._op_cancel(reason))
