"""Turn submission, handles and cancellation: the client's half of the turn state machine.

A turn's state lives in the hash ``{p}:turn:{id}:state`` (TTL 24 h after the
turn ends, DESIGN.md §8): ``status`` (queued → running → completed | failed |
cancelled), the request ``fingerprint``, ``attempt`` (the fencing token,
incremented by each worker attempt), ``result`` / ``error``, and
``cancel_requested``, and ``job`` (the payload, so a sweeper can re-enqueue
the turn after a crash). Each conversation keeps ``{p}:conv:{id}:turns``, the
FIFO of its unfinished turns; a worker runs a turn only when it is at the head.

Submission is one Lua script, so concurrent callers with the same turn id see
exactly one turn (the first writer creates it, the others attach), and the
conversation's multitask policy is decided atomically:

* ``enqueue`` (default): FIFO after the conversation's unfinished turns;
* ``reject``: :class:`ConversationBusyError` when one is unfinished;
* ``interrupt``: the unfinished turns are cancelled (reason ``interrupt``), then this one runs;
* ``merge``: the message joins the running turn before its next model call
  (steering); if that turn is not running yet, or already closing, it is
  enqueued instead. A merged message is kept in the history even when the turn
  it joined is cancelled or fails before answering it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Protocol

import orjson

from smith_client.errors import (
    ConflictError,
    ConversationBusyError,
    InvalidRequestError,
    SmithTimeoutError,
    TurnCancelledError,
    error_from_payload,
)
from smith_client.events import TURN_CANCELLED, TURN_COMPLETED, TURN_FAILED, Event, TurnCancelledData
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.messages import AssistantMessage
from smith_client import scripts
from smith_client import turn_record as record
from smith_client.eventlog import EventLog
from smith_client.keys import Keys
from smith_client.redis_errors import typed_redis_errors
from smith_client.turn_record import decode_state



class TurnBackend(Protocol):
    """What submitting and handling turns needs of a client (:class:`~smith_client.client.SmithClient` is one)."""

    redis: Any
    keys: Keys
    events: EventLog

    def follow(self, turn_id: str, after_seq: int = 0, timeout: float | None = None) -> AsyncIterator[Event]:
        """The turn's events after ``after_seq``, exactly once and in order, until its terminal event."""
        ...


def raise_for_terminal(event: Event) -> NoReturn:
    """Raise what a ``turn.failed`` (its typed error) or ``turn.cancelled`` (:class:`TurnCancelledError`,
    ``operation`` = the reason) event means for a caller waiting for the answer."""
    if event.type == TURN_FAILED:
        raise event.error()
    payload = event.payload
    reason = payload.reason if isinstance(payload, TurnCancelledData) else "cancel"
    raise TurnCancelledError(f"turn was cancelled ({reason})", operation=reason)

MULTITASK_POLICIES = ("enqueue", "reject", "interrupt", "merge")
#: ``SUBMIT`` calls before giving up when the conversation's unfinished turns keep changing under it.
_SUBMIT_TRIES = 8


def fingerprint(job: TurnJob) -> str:
    """A digest of what makes two requests "the same turn" (conversation, agent, message, options)."""
    body = {k: v for k, v in job.model_dump(mode="json").items() if k not in ("turn_id", "submitted_at")}
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class Submission:
    """What submitting a turn did: ``outcome`` is new, attach or merged; ``turn_id`` the turn to follow."""

    outcome: Literal["new", "attach", "merged"]
    turn_id: str
    status: str = "queued"


async def submit(client: TurnBackend, job: TurnJob, multitask: str) -> Submission:
    """Create (or join) the turn for ``job`` and enqueue it when it needs a worker.

    Raises :class:`ConflictError` (same turn id, different request),
    :class:`ConversationBusyError` (``reject`` policy) or :class:`InvalidRequestError`.
    """
    if multitask not in MULTITASK_POLICIES:
        raise InvalidRequestError(f"multitask must be one of {MULTITASK_POLICIES}, got {multitask!r}", field="multitask")
    keys = client.keys
    reply = await _run_submit(client.redis, keys, job, multitask)
    outcome, turn_id = reply[0].decode(), reply[1].decode()
    if outcome == "conflict":
        raise ConflictError(f"turn {turn_id} exists with a different request", turn_id=turn_id)
    if outcome == "busy":
        raise ConversationBusyError(
            f"conversation {job.conversation_id} has an unfinished turn ({turn_id})",
            conversation_id=job.conversation_id, active_turn_id=turn_id,
        )  # fmt: skip
    status = reply[2].decode() if outcome == "attach" and len(reply) > 2 and reply[2] else "queued"
    if outcome == "new" or (outcome == "attach" and status == "queued"):
        # Enqueueing again on attach covers a first caller that died between the two
        # steps; arq ignores a second enqueue of a queued or running job id.
        await client.redis.enqueue_job(
            RUN_TURN, job.model_dump(mode="json"), _job_id=keys.turn_job_id(job.turn_id), _queue_name=keys.turns_queue
        )
    return Submission(outcome, turn_id, status)  # type: ignore[arg-type]


async def _run_submit(redis: Any, keys: Keys, job: TurnJob, multitask: str) -> list[Any]:
    """The ``SUBMIT`` script's reply. ``merge`` and ``interrupt`` touch other turns of the
    conversation; the script names them (``keys`` reply) and is called again with their keys."""
    base = [keys.turn_state(job.turn_id), keys.conversation_turns(job.conversation_id),
            keys.conversation_statuses(job.conversation_id)]
    args = [job.turn_id, fingerprint(job), job.conversation_id, job.agent, multitask, job.message.model_dump_json(),
            time.time(), keys.turn_ttl, keys.history_ttl, job.model_dump_json(), keys.control_channel]
    others: list[str] = []
    for _ in range(_SUBMIT_TRIES):
        other_keys = [key for other in others for key in (keys.turn_state(other), keys.turn_inbox(other))]
        reply: list[Any] = await scripts.SUBMIT(redis, base + other_keys, args + others)
        if reply[0] != b"keys":
            return reply
        others = [raw.decode() for raw in reply[1:]]
    raise ConversationBusyError(
        f"conversation {job.conversation_id}'s unfinished turns kept changing; try again",
        conversation_id=job.conversation_id, active_turn_id=others[0] if others else "",
    )  # fmt: skip


class TurnHandle:
    """A turn seen from any process: its status, events, result, and cancel.

    Get one from :meth:`SmithClient.submit` or :meth:`SmithClient.turn`.
    """

    def __init__(self, client: TurnBackend, turn_id: str) -> None:
        self.client = client
        self.turn_id = turn_id

    def __repr__(self) -> str:
        return f"TurnHandle({self.turn_id!r})"

    @typed_redis_errors
    async def state(self) -> dict[str, str]:
        """The raw state hash (fields in :mod:`smith_client.turn_record`; empty when the turn is unknown or expired)."""
        return decode_state(await self.client.redis.hgetall(self.client.keys.turn_state(self.turn_id)))

    @typed_redis_errors
    async def status(self) -> str:
        """``queued``, ``running``, ``completed``, ``failed``, ``cancelled``, or ``unknown``."""
        return (await self.state()).get("status", "unknown")

    @typed_redis_errors
    async def events(self, after_seq: int = 0, timeout: float | None = None) -> AsyncIterator[Event]:
        """Every event with ``seq > after_seq``, exactly once and in order, then live ones until the end.

        Raises :class:`EventsTrimmedError` when the asked-for events are no longer kept.
        """
        async for event in self.client.follow(self.turn_id, after_seq, timeout):
            yield event

    @typed_redis_errors
    async def result(self, timeout: float | None = None) -> AssistantMessage:
        """Wait for the final message (``timeout`` seconds, None = forever).

        Raises the turn's typed error, :class:`TurnCancelledError` for a
        cancelled turn, or :class:`SmithTimeoutError`.
        """
        done = self._outcome(await self.state())
        if done is not None:
            return done
        async for event in self.events(timeout=timeout):
            if event.type == TURN_COMPLETED:
                return event.final_message()
            if event.type in (TURN_FAILED, TURN_CANCELLED):
                raise_for_terminal(event)
        raise SmithTimeoutError(f"turn {self.turn_id} ended without a terminal event", operation="result")

    def _outcome(self, state: dict[str, str]) -> AssistantMessage | None:
        status = state.get(record.STATUS)
        if status == record.COMPLETED:
            return AssistantMessage.model_validate_json(state[record.RESULT])
        if status == record.FAILED:
            raise error_from_payload(orjson.loads(state.get(record.ERROR) or "{}"))
        if status == record.CANCELLED:
            reason = state.get(record.CANCEL_REQUESTED) or "cancel"
            raise TurnCancelledError(f"turn was cancelled ({reason})", operation=reason)
        return None

    @typed_redis_errors
    async def cancel(self, reason: str = "cancel") -> str:
        """Ask for the turn to stop; returns what happened: ``cancelled_queued`` (it never started),
        ``cancelling`` (its worker stops it and publishes ``turn.cancelled``), a terminal status
        (nothing to do), or ``missing``."""
        if not isinstance(reason, str) or not reason:
            raise InvalidRequestError(f"reason must be a non-empty string, got {reason!r}", field="reason")
        keys = self.client.keys
        conversation = (await self.state()).get(record.CONVERSATION_ID, "")
        script_keys = [keys.turn_state(self.turn_id), keys.conversation_turns(conversation),
                       keys.conversation_statuses(conversation)]
        reply = await scripts.CANCEL(self.client.redis, script_keys, [self.turn_id, reason, keys.control_channel])
        outcome = reply.decode()
        if outcome == "cancelled_queued":
            await self.client.events.publish(self.turn_id, TurnCancelledData(reason=reason))
        return outcome
