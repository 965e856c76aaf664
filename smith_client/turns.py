"""Turn submission, state and cancellation: the client's half of the turn state machine.

They are operations (see :mod:`smith_client.protocol`).

A turn's state lives in the hash ``{p}:turn:{id}:state`` (TTL 24 h after the
turn ends, docs/architecture.md, Lifetimes): ``status`` (queued → running → completed | failed |
cancelled; running ↔ paused while a step waits for a person), the request ``fingerprint``,
``attempt`` (the fencing token,
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
import logging
import time
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

import orjson

from smith_client import scripts
from smith_client import turn_record as record
from smith_client.enqueue import enqueue_call
from smith_client.errors import (
    ConflictError,
    ConversationBusyError,
    InvalidRequestError,
    ParseError,
    TurnCancelledError,
    TurnPausedError,
    error_from_payload,
)
from smith_client.eventlog import publish
from smith_client.events import TURN_COMPLETED, TURN_FAILED, Event, PendingItem, TurnCancelledData, TurnPausedData
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage
from smith_client.protocol import Operation, call, run_script
from smith_client.runners import AsyncRunner
from smith_client.tenants import quota_arguments, quota_error
from smith_client.tracing import submit_span
from smith_client.turn_record import decode_state
from smith_client.validation import check_multitask, check_served

logger = logging.getLogger("agent_smith")
#: Seconds between two "no turn worker is registered" warnings for one prefix in a process: a web app sending
#: many turns while its workers are down logs it once a minute, not once per turn.
NO_WORKER_WARNING_INTERVAL = 60.0
_no_worker_warned: dict[str, float] = {}  # prefix -> monotonic time of its last warning

#: ``SUBMIT`` calls before giving up when the conversation's unfinished turns keep changing under it.
_SUBMIT_TRIES = 8


class _Client(Protocol):
    """What :func:`submit` needs of an async client (:class:`~smith_client.client.SmithClient`)."""

    keys: Keys

    @property
    def runner(self) -> AsyncRunner: ...


def fingerprint(job: TurnJob, context: str | None = None) -> str:
    """A digest of what makes two requests "the same turn" (conversation, agent, message, options, and the
    caller ``context``'s JSON, by its own digest, and the tenant when there is one: a request without one has the
    digest it had before tenants)."""
    body = {k: v for k, v in job.model_dump(mode="json").items() if k not in ("turn_id", "submitted_at", "trace")}
    if body.get("tenant") is None:
        body.pop("tenant", None)
    if context is not None:
        body["context"] = hashlib.sha256(context.encode()).hexdigest()
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


SubmitOutcome = Literal["new", "attach", "merged"]


@dataclass(frozen=True)
class Submission:
    """What submitting a turn did: ``outcome`` is new, attach or merged; ``turn_id`` the turn to follow."""

    outcome: SubmitOutcome
    turn_id: str
    status: str = "queued"


def submit_turn(keys: Keys, job: TurnJob, multitask: str, context: str | None = None) -> Operation[Submission]:
    """Operation: create (or join) the turn for ``job`` and enqueue it when it needs a worker.

    ``context`` is the caller context's JSON (:func:`~smith_client.validation.check_context`), stored with a
    new turn in the same script call (:meth:`Keys.turn_context`; docs/architecture.md, Caller context).

    Raises :class:`UnknownAgentError` (live turn workers exist but none serves ``job.agent``; nothing is
    written), :class:`ConflictError` (same turn id, different request), :class:`ConversationBusyError`
    (``reject`` policy), :class:`QuotaExceededError` (``job.tenant``'s token quota is used up in the current
    window, docs/tenants.md; nothing is written) or :class:`InvalidRequestError`. Logs a warning when no turn
    worker is live at all: the turn is enqueued and waits for one.
    """
    check_multitask(multitask)
    with submit_span(job) as job:  # the caller's trace context, when it uses OpenTelemetry
        reply = yield from _run_submit(keys, job, multitask, context)
    outcome, turn_id = reply[0].decode(), reply[1].decode()
    if outcome == "unknown":
        check_served(job.agent, {raw.decode() for raw in reply[2:]})  # raises UnknownAgentError
    if outcome == "conflict":
        raise ConflictError(f"turn {turn_id} exists with a different request", turn_id=turn_id)
    if outcome == "quota":
        used, quota, reset_at = (int(value) for value in reply[2:5])
        raise quota_error(job.tenant or "", used, quota, reset_at)
    if outcome == "busy":
        raise ConversationBusyError(
            f"conversation {job.conversation_id} has an unfinished turn ({turn_id})",
            conversation_id=job.conversation_id, active_turn_id=turn_id,
        )  # fmt: skip
    if reply[3] == b"1":
        _warn_no_worker(keys.prefix)
    for paused in reply[4:] if outcome == "new" else ():  # paused turns the interrupt asks to stop
        yield from cancel_turn(keys, paused.decode(), "interrupt")
    status = reply[2].decode() if outcome == "attach" and reply[2] else "queued"
    return Submission(cast(SubmitOutcome, outcome), turn_id, status)


def _warn_no_worker(prefix: str) -> None:
    """Warn that no turn worker is registered under ``prefix``, at most once per
    :data:`NO_WORKER_WARNING_INTERVAL` seconds per prefix."""
    now = time.monotonic()
    if now - _no_worker_warned.get(prefix, -NO_WORKER_WARNING_INTERVAL) < NO_WORKER_WARNING_INTERVAL:
        return
    _no_worker_warned[prefix] = now
    logger.warning(
        "no turn worker is registered under prefix %r: the turn waits in the queue "
        "(check SMITH_PREFIX and SMITH_REDIS_URL match the workers'; said once a minute at most)",
        prefix,
    )


def _run_submit(keys: Keys, job: TurnJob, multitask: str, context: str | None) -> Operation[list[Any]]:
    """The ``SUBMIT`` script's reply (``lua/submit.lua``). ``merge`` and ``interrupt`` touch other turns of
    the conversation; the script names them (a ``keys`` reply) and is called again with their keys.
    The script enqueues the turn's arq job itself (a new turn, or one still queued), so submitting
    is one round trip."""
    now = time.time()  # the turn's created_at, and its place in its tenant's line (to the microsecond)
    enqueue_keys, enqueue_args = enqueue_call(
        RUN_TURN,
        job.model_dump(mode="json"),
        job_id=keys.turn_job_id(job.turn_id),
        queue=keys.turns_queue,
        requires=job.agent,  # a turn runs on a worker serving its agent
        fair=True,
        tenant=job.tenant,
        since_ms=now * 1000,
    )
    tenant_keys = (keys.tenant_limits(job.tenant),) if job.tenant else ()
    quota_args = quota_arguments(keys, job.tenant)
    base = (
        keys.turn_state(job.turn_id),
        keys.conversation_turns(job.conversation_id),
        keys.conversation_statuses(job.conversation_id),
        *enqueue_keys,
        keys.turn_context(job.turn_id),
    )
    args = (
        job.turn_id,
        fingerprint(job, context),
        job.conversation_id,
        job.agent,
        multitask,
        job.message.model_dump_json(),
        now,
        keys.turn_ttl,
        keys.history_ttl,
        job.model_dump_json(),
        keys.control_channel,
        *enqueue_args,
        context or "",
        *quota_args,
    )
    others: tuple[str, ...] = ()
    for _ in range(_SUBMIT_TRIES):
        other_keys = tuple(key for other in others for key in _other_turn_keys(keys, other))
        reply: list[Any] = yield from run_script(scripts.SUBMIT, base + other_keys + tenant_keys, args + others)
        if reply[0] != b"keys":
            return reply
        others = tuple(raw.decode() for raw in reply[1:])
    raise ConversationBusyError(
        f"conversation {job.conversation_id}'s unfinished turns kept changing; try again",
        conversation_id=job.conversation_id, active_turn_id=others[0] if others else "",
    )  # fmt: skip


def _other_turn_keys(keys: Keys, turn_id: str) -> tuple[str, ...]:
    """The keys ``SUBMIT`` touches of another unfinished turn of the conversation (``merge``, ``interrupt``)."""
    return keys.turn_state(turn_id), keys.turn_inbox(turn_id)


async def submit(client: _Client, job: TurnJob, multitask: str) -> Submission:
    """:func:`submit_turn` on an async client's Redis, for producers that build their own :class:`TurnJob`."""
    return await client.runner.run(submit_turn(client.keys, job, multitask))


def _decode(reply: bytes) -> str:
    return reply.decode()


def read_state(keys: Keys, turn_id: str) -> Operation[dict[str, str]]:
    """Operation: the raw state hash of a turn (fields in :mod:`smith_client.turn_record`; empty when the
    turn is unknown or expired)."""
    return (yield from call("hgetall", keys.turn_state(turn_id), parse=decode_state))


def outcome_from_state(state: dict[str, str]) -> AssistantMessage | None:
    """The final message of a completed turn's state, None while it is unfinished.

    Raises the turn's typed error when it failed, :class:`TurnCancelledError` when cancelled.
    """
    status = state.get(record.STATUS)
    if status == record.COMPLETED:
        return AssistantMessage.model_validate_json(state[record.RESULT])
    if status == record.FAILED:
        raise error_from_payload(orjson.loads(state.get(record.ERROR) or "{}"))
    if status == record.CANCELLED:
        reason = state.get(record.CANCEL_REQUESTED) or "cancel"
        raise TurnCancelledError(f"turn was cancelled ({reason})", operation=reason)
    return None


def paused_error(turn_id: str, pending: list[PendingItem]) -> TurnPausedError:
    """The :class:`TurnPausedError` of a turn waiting on ``pending``."""
    names = ", ".join(f"{item.tool} ({item.call_id}, {item.kind})" for item in pending)
    return TurnPausedError(
        f"turn {turn_id} paused: it waits for a decision on {names}",
        turn_id=turn_id,
        pending=[item.model_dump(mode="json") for item in pending],
    )


def outcome_from_event(event: Event) -> AssistantMessage:
    """The final message of a ``turn.completed`` event; raises the turn's error for the other terminal events,
    :class:`TurnPausedError` for ``turn.paused``."""
    if event.type == TURN_COMPLETED:
        return event.final_message()
    if event.type == TURN_FAILED:
        raise event.error()
    payload = event.payload
    if isinstance(payload, TurnCancelledData):
        reason = payload.reason
        raise TurnCancelledError(f"turn was cancelled ({reason})", operation=reason)
    if isinstance(payload, TurnPausedData):
        raise paused_error(event.turn_id, payload.pending)
    raise ParseError(f"event {event.type!r} does not end a turn")


def cancel_turn(keys: Keys, turn_id: str, reason: str = "cancel") -> Operation[str]:
    """Operation: ask for the turn to stop; see :meth:`TurnHandle.cancel` for the outcomes."""
    if not isinstance(reason, str) or not reason:
        raise InvalidRequestError(f"reason must be a non-empty string, got {reason!r}", field="reason")
    state = yield from read_state(keys, turn_id)
    conversation = state.get(record.CONVERSATION_ID, "")
    # a paused turn is queued again for a worker to end it: the job of its next attempt, as a decision's
    enqueue_keys, enqueue_args = resume_job_call(
        keys, state, keys.turn_resume_job_id(turn_id, int(state.get(record.ATTEMPT, "0")))
    )
    script_keys = (
        keys.turn_state(turn_id),
        keys.conversation_turns(conversation),
        keys.conversation_statuses(conversation),
        keys.paused,
        *enqueue_keys,
    )
    waiting_jobs = (keys.turn_job_id(turn_id), keys.turn_kick_job_id(turn_id))  # a turn that never started
    args = (turn_id, reason, keys.control_channel, *enqueue_args, *waiting_jobs)
    outcome = yield from run_script(scripts.CANCEL, script_keys, args, _decode)
    if outcome == "cancelled_queued":
        yield from publish(keys, turn_id, TurnCancelledData(reason=reason))
    return outcome


def resume_job_call(keys: Keys, state: dict[str, str], job_id: str) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of lib.lua's ``enqueue_job`` for a turn's ``run_turn`` job under ``job_id``, from its state
    (``state``, decoded; the turn's stored job and its agent as the job's requirement)."""
    job = TurnJob.model_validate_json(state[record.JOB]) if record.JOB in state else None
    return enqueue_call(
        RUN_TURN,
        job.model_dump(mode="json") if job else {},
        job_id=job_id,
        queue=keys.turns_queue,
        requires=job.agent if job else "",  # on a worker serving its agent (smith_worker/routing.py)
        fair=True,
        tenant=job.tenant if job else None,
    )
