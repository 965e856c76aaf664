"""The thin client a web app uses: enqueue turns, follow their events.

``SmithClient.send()`` validates the request, subscribes to the turn's event
channel *before* enqueueing (so no event is missed), enqueues ``run_turn`` on
the turns queue with the turn id as the arq job id, and follows the events
until ``turn.completed`` or ``turn.failed`` (DESIGN.md §4 step 1).

Following a turn combines the live pub/sub channel with the replay log: a gap
in ``seq`` on the channel is filled from the log, duplicates are dropped, and
when the channel is silent for ``poll_interval`` seconds the log is re-read,
which covers a lost pub/sub message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Required, TypedDict, Unpack

import orjson
from arq.connections import ArqRedis
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from smith_client import skills
from smith_client.connection import connect_redis
from smith_client.errors import (
    EventsTrimmedError,
    InvalidRequestError,
    SmithTimeoutError,
    TurnNotFoundError,
    UnknownAgentError,
    UnknownSkillError,
)
from smith_client.eventlog import EventLog
from smith_client.events import TURN_COMPLETED, Event, event_from_json
from smith_client.jobs import Sampling, TurnJob
from smith_client.keys import ID_PATTERN, Keys
from smith_client.messages import AssistantMessage, UserMessage, messages_from_json_list
from smith_client.registry import live_agents, live_skills
from smith_client.redis_errors import typed_redis_errors
from smith_client.turns import MULTITASK_POLICIES, TurnHandle, submit

logger = logging.getLogger("agent_smith")

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
#: Largest user message accepted, in UTF-8 bytes.
MAX_MESSAGE_BYTES = 1_000_000


def _check_id(value: Any, field: str) -> str:
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise InvalidRequestError(
            f"{field} must be a string of 1-200 characters from [A-Za-z0-9_.:@-], got {value!r}",
            field=field,
        )
    return value


def _check_text(text: Any) -> str:
    if not isinstance(text, str):
        raise InvalidRequestError(f"text must be a string, got {type(text).__name__}", field="text")
    if not text.strip():
        raise InvalidRequestError("text must not be empty", field="text")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"text is not valid Unicode (lone surrogate at {exc.start})", field="text") from exc
    if size > MAX_MESSAGE_BYTES:
        raise InvalidRequestError(f"text is larger than {MAX_MESSAGE_BYTES} bytes", field="text")
    return text


def _check_sampling(sampling: Any) -> dict[str, Any] | None:
    """Validate per-turn sampling against the contract (:class:`Sampling`); returns its JSON form."""
    if sampling is None:
        return None
    if not isinstance(sampling, dict):
        raise InvalidRequestError("sampling must be a dict", field="sampling")
    try:
        checked = Sampling.model_validate(sampling)
        as_json = checked.model_dump(mode="json", exclude_defaults=True)
        orjson.dumps(as_json)
    except (ValidationError, PydanticSerializationError, TypeError) as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()) if isinstance(
            exc, ValidationError) else str(exc)
        raise InvalidRequestError(f"invalid sampling: {problems}", field="sampling") from exc
    if checked.reserved_keys():
        raise InvalidRequestError(f"sampling.extra may not set {checked.reserved_keys()}", field="sampling")
    return as_json


def _check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidRequestError(f"timeout must be a positive number of seconds or None, got {timeout!r}",
                                  field="timeout")
    return float(timeout)


#: Largest ``after_seq`` accepted: Redis stream ids and counters are signed 64-bit.
MAX_SEQ = 2**63 - 1


def _check_seq(after_seq: Any) -> int:
    if isinstance(after_seq, bool) or not isinstance(after_seq, int) or not 0 <= after_seq <= MAX_SEQ:
        raise InvalidRequestError(f"after_seq must be an integer in [0, 2**63-1], got {after_seq!r}",
                                  field="after_seq")
    return after_seq


class TurnOptions(TypedDict, total=False):
    """Options of one turn request (see :meth:`SmithClient.send`)."""

    conversation_id: Required[str]
    agent: str
    turn_id: str | None
    multitask: str
    sampling: dict[str, Any] | None
    stream: bool | None


class SmithClient:
    """Client for one Agent Smith deployment (one Redis database, one key prefix).

    Use ``SmithClient.from_url(url, prefix=...)``, as ``async with`` or closing
    with :meth:`aclose`. Safe to share between concurrent tasks of one event loop.
    """

    def __init__(self, redis: ArqRedis, *, prefix: str = "smith", owns_redis: bool = False) -> None:
        self.redis = redis
        self.keys = Keys(prefix)
        self.events = EventLog(redis, self.keys)
        self._owns_redis = owns_redis

    @classmethod
    def from_url(
        cls, redis_url: str = DEFAULT_REDIS_URL, *, prefix: str = "smith", socket_timeout: float | None = None
    ) -> "SmithClient":
        """Connect lazily to ``redis_url`` (e.g. ``redis://127.0.0.1:6379/0``).

        ``socket_timeout`` (seconds) bounds every Redis connect and command
        (default ``SMITH_REDIS_SOCKET_TIMEOUT``, else 5 s): with Redis not
        answering, a call raises :class:`TransportError` after it instead of
        blocking.
        """
        return cls(connect_redis(redis_url, socket_timeout=socket_timeout), prefix=prefix, owns_redis=True)

    async def __aenter__(self) -> "SmithClient":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the Redis connections this client created."""
        if self._owns_redis:
            await self.redis.aclose(close_connection_pool=True)

    @typed_redis_errors
    async def send(self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]) -> AssistantMessage:
        """Run one turn and return its final assistant message.

        ``options`` are :class:`TurnOptions`: ``conversation_id`` (required),
        ``agent``, ``turn_id`` (an idempotency key: the same id sent again with
        the same request attaches to the existing turn instead of starting
        another), ``multitask`` (the policy when the conversation already has
        an unfinished turn, see :mod:`smith_client.turns`), ``sampling`` and
        ``stream`` (per-turn model options). ``timeout`` (seconds, None = wait
        forever) bounds the wait, not the turn.

        Raises :class:`InvalidRequestError` / :class:`UnknownAgentError` /
        :class:`ConversationBusyError` / :class:`ConflictError` before
        enqueueing; the turn's own typed error (e.g. ``ParseError``,
        ``LlmApiError``) when it fails; :class:`TurnCancelledError` when it is
        cancelled; :class:`SmithTimeoutError` on ``timeout``.
        """
        timeout = _check_timeout(timeout)
        # One bound on the whole call, Redis commands included: with Redis frozen, a
        # command would otherwise hold the caller for the socket timeout past ``timeout``.
        bound = asyncio.timeout(timeout)
        try:
            async with bound:
                async for event in self.stream(text, timeout=timeout, **options):
                    if event.type == TURN_COMPLETED:
                        return event.final_message()
                    if event.terminal:
                        TurnHandle._raise_terminal(event)
        except TimeoutError as exc:
            if not bound.expired():
                raise
            raise SmithTimeoutError(f"turn did not finish in {timeout:g} s", operation="send", budget=timeout) from exc
        raise SmithTimeoutError("turn event stream ended without a terminal event", operation="send")

    @typed_redis_errors
    async def stream(
        self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]
    ) -> AsyncIterator[Event]:
        """Run one turn and yield its events, ending with ``turn.completed``, ``turn.failed`` or ``turn.cancelled``.

        Options and errors as for :meth:`send`; validation errors are raised at
        the first iteration, before anything is enqueued. A caller attaching to
        an existing turn (same ``turn_id``) gets all of its events from the
        start; a ``merge`` caller gets the events of the turn it joined from the
        moment it joined.
        """
        timeout = _check_timeout(timeout)
        job, multitask = await self._prepare(text, **options)
        pubsub = self.redis.pubsub()
        try:
            # subscribe before submitting, so no live event is missed
            await pubsub.subscribe(self.keys.turn_events_channel(job.turn_id))
            submission = await submit(self, job, multitask)
            after = 0
            if submission.turn_id != job.turn_id:  # merged into another turn
                await pubsub.subscribe(self.keys.turn_events_channel(submission.turn_id))
                after = await self.events.last_seq(submission.turn_id)
            async for event in self._follow(pubsub, submission.turn_id, after, timeout):
                yield event
        finally:
            await pubsub.aclose()

    @typed_redis_errors
    async def submit(self, text: str, **options: Unpack[TurnOptions]) -> TurnHandle:
        """Start a background turn and return its handle at once (options and errors as for :meth:`send`)."""
        job, multitask = await self._prepare(text, **options)
        submission = await submit(self, job, multitask)
        return TurnHandle(self, submission.turn_id)

    def turn(self, turn_id: str) -> TurnHandle:
        """A handle on an existing turn, from any process (e.g. a web request after a reload)."""
        return TurnHandle(self, _check_id(turn_id, "turn_id"))

    @typed_redis_errors
    async def follow(self, turn_id: str, after_seq: int = 0, timeout: float | None = None) -> AsyncIterator[Event]:
        """Events of ``turn_id`` with ``seq > after_seq``: replayed from the log, then live, until terminal.

        Raises :class:`InvalidRequestError` for a bad argument, :class:`TurnNotFoundError`
        for an unknown turn, :class:`EventsTrimmedError`, :class:`SmithTimeoutError`.
        """
        _check_id(turn_id, "turn_id")
        after_seq, timeout = _check_seq(after_seq), _check_timeout(timeout)
        pubsub = self.redis.pubsub()
        try:
            await pubsub.subscribe(self.keys.turn_events_channel(turn_id))
            async for event in self._follow(pubsub, turn_id, after_seq, timeout):
                yield event
        finally:
            await pubsub.aclose()

    @typed_redis_errors
    async def history(self, conversation_id: str) -> list[Any]:
        """All messages of a conversation, oldest first (stored form, ``is_error`` included)."""
        _check_id(conversation_id, "conversation_id")
        raw = await self.redis.lrange(self.keys.history(conversation_id), 0, -1)
        return messages_from_json_list(raw)

    @typed_redis_errors
    async def activate_skill(self, conversation_id: str, name: str) -> None:
        """Activate skill ``name`` (its declared name) on a conversation, after the skills active already.

        Any registered skill can be activated on any conversation, whatever
        agent runs it; the activation is stored in Redis, so every worker's next
        step sees it (a running turn at its next model call), and lives as long
        as the conversation's history (issue 14). Activating an active skill
        does nothing (it keeps its place in the activation order).

        Raises :class:`InvalidRequestError` for a bad id or name and
        :class:`UnknownSkillError` when live turn workers are registered and
        none serves ``name``; in both cases nothing changes. With no turn
        worker registered at all it logs a warning and accepts.
        """
        _check_id(conversation_id, "conversation_id")
        skills.check_skill_name(name)
        await self._check_skill(name)
        await skills.activate(self.redis, self.keys, conversation_id, name)

    @typed_redis_errors
    async def deactivate_skill(self, conversation_id: str, name: str) -> None:
        """Deactivate skill ``name`` on a conversation; deactivating an inactive skill does nothing.

        Takes effect at the next step of any turn, like an activation. An
        agent's default skills (``app.agent(..., skills=[...])``) stay active
        for that agent. Raises :class:`InvalidRequestError` for a bad id or name.
        """
        _check_id(conversation_id, "conversation_id")
        skills.check_skill_name(name)
        await skills.deactivate(self.redis, self.keys, conversation_id, name)

    @typed_redis_errors
    async def active_skills(self, conversation_id: str) -> list[str]:
        """Declared names of the skills activated on a conversation, in activation order.

        An agent's default skills are not listed: they belong to the agent, not
        to the conversation. Raises :class:`InvalidRequestError` for a bad id.
        """
        _check_id(conversation_id, "conversation_id")
        return await skills.active(self.redis, self.keys, conversation_id)

    async def _prepare(
        self,
        text: Any,
        conversation_id: Any = None,
        agent: Any = "default",
        turn_id: Any = None,
        multitask: Any = "enqueue",
        sampling: Any = None,
        stream: Any = None,
    ) -> tuple[TurnJob, str]:
        """Validate a request (raising :class:`InvalidRequestError` / :class:`UnknownAgentError`) into a job."""
        _check_text(text)
        _check_id(conversation_id, "conversation_id")
        _check_id(agent, "agent")
        if turn_id is not None:
            _check_id(turn_id, "turn_id")
        if multitask not in MULTITASK_POLICIES:
            raise InvalidRequestError(f"multitask must be one of {MULTITASK_POLICIES}, got {multitask!r}", field="multitask")
        sampling = _check_sampling(sampling)
        if stream is not None and not isinstance(stream, bool):
            raise InvalidRequestError("stream must be a bool or None", field="stream")
        await self._check_agent(agent)
        job = TurnJob(
            turn_id=turn_id or uuid.uuid4().hex,
            conversation_id=conversation_id,
            agent=agent,
            message=UserMessage(content=text),
            sampling=sampling,
            stream=stream,
            submitted_at=time.time(),
        )
        return job, multitask

    async def _check_agent(self, agent: str) -> None:
        served = await live_agents(self.redis, self.keys)
        if served is None:
            logger.warning("no turn worker is registered under prefix %r: the turn waits in the queue "
                           "(check SMITH_PREFIX and SMITH_REDIS_URL match the workers')", self.keys.prefix)
        elif agent not in served:
            raise UnknownAgentError(
                f"no live worker serves agent {agent!r} (served: {sorted(served)})", agent=agent, known=sorted(served)
            )

    async def _check_skill(self, name: str) -> None:
        served = await live_skills(self.redis, self.keys)
        if served is None:
            logger.warning("no turn worker is registered under prefix %r: skill %r is activated unchecked",
                           self.keys.prefix, name)
        elif name not in served:
            raise UnknownSkillError(
                f"no live worker serves skill {name!r} (served: {sorted(served)})", skill_name=name, known=sorted(served)
            )

    async def _ended(self, turn_id: str, seen_any: bool) -> bool:
        """With no event pending: True when the turn is over (nothing more will come).

        Raises :class:`TurnNotFoundError` for a turn nobody knows.
        """
        status = await self.redis.hget(self.keys.turn_state(turn_id), "status")
        if status is None:
            if not seen_any and await self.events.last_seq(turn_id) == 0:
                raise TurnNotFoundError(f"no turn {turn_id!r} (never submitted, or expired)", turn_id=turn_id)
            # A followed turn's state outlives its last event (DESIGN.md §8), so it is gone only when
            # its keys were evicted or deleted: nothing will ever finish it (issue 8).
            raise TurnNotFoundError(f"turn {turn_id!r} vanished: its keys were deleted or evicted", turn_id=turn_id)
        return status in (b"completed", b"failed", b"cancelled")

    async def _catch_up(self, turn_id: str, last: int, seen_any: bool) -> tuple[list[Event], bool]:
        """Events after ``last`` from the log, and whether the turn is over with nothing more to come."""
        pending = await self._read_log(turn_id, last)
        if pending or not await self._ended(turn_id, seen_any):
            return pending, False
        # The terminal event and the terminal status are written together, but the
        # status may have been read after the log: read the log again.
        pending = await self._read_log(turn_id, last)
        return pending, not pending

    async def _read_log(self, turn_id: str, last: int) -> list[Event]:
        """:meth:`EventLog.read`; a log lost with the turn's state raises :class:`TurnNotFoundError`."""
        try:
            return await self.events.read(turn_id, last)
        except EventsTrimmedError:
            await self._ended(turn_id, seen_any=True)  # raises TurnNotFoundError when the state is gone too
            raise

    async def _follow(
        self, pubsub: Any, turn_id: str, after_seq: int, timeout: float | None, poll_interval: float = 1.0
    ) -> AsyncIterator[Event]:
        """Yield the turn's events with ``seq > after_seq`` exactly once, in order, until terminal.

        Returns at once when the turn already ended at or before ``after_seq``.
        Every Redis read is bounded by ``timeout`` (:class:`SmithTimeoutError`)
        as well as by the socket timeout.
        """
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout

        async def bounded(awaitable: Any) -> Any:
            bound = asyncio.timeout_at(deadline)
            try:
                async with bound:
                    return await awaitable
            except TimeoutError as exc:
                if not bound.expired():
                    raise
                raise SmithTimeoutError(f"turn {turn_id} did not finish in time", operation="send",
                                        budget=timeout) from exc

        last = after_seq
        pending, over = await bounded(self._catch_up(turn_id, last, seen_any=after_seq > 0))
        if over:
            return
        while True:
            for event in pending:
                if event.seq != last + 1:
                    continue  # a duplicate, or out of order: the log read below fills gaps
                last = event.seq
                yield event
                if event.terminal:
                    return
            if deadline is not None and asyncio.get_running_loop().time() > deadline:
                raise SmithTimeoutError(f"turn {turn_id} did not finish in time", operation="send", budget=timeout)
            message = await bounded(pubsub.get_message(ignore_subscribe_messages=True, timeout=poll_interval))
            if message is None:
                pending, over = await bounded(self._catch_up(turn_id, last, seen_any=True))
                if over:
                    return
                continue
            event = event_from_json(message["data"])
            pending = [event] if event.seq <= last + 1 else await bounded(self._read_log(turn_id, last))
