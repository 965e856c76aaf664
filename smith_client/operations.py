"""The client's operations, written once for :class:`SmithClient` and :class:`SyncSmithClient`.

Each is a generator of :mod:`smith_client.protocol` requests (see there); the
clients run them with :mod:`smith_client.runners`.

Following a turn combines the live pub/sub channel with the replay log: a gap
in ``seq`` on the channel is filled from the log, duplicates are dropped, and
when the channel is silent for :data:`POLL_INTERVAL` seconds the log is re-read,
which covers a lost pub/sub message (docs/architecture.md, Events).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from smith_client import approvals, scripts
from smith_client import turn_record as record
from smith_client.errors import ConversationBusyError, EventsTrimmedError, SmithTimeoutError, TurnNotFoundError
from smith_client.eventlog import last_seq, log_reads, read_events
from smith_client.events import Event, event_from_json
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage, Message, messages_from_json_list
from smith_client.protocol import Operation, Receive, Subscribe, call, run, run_script
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.turns import outcome_from_event, outcome_from_state, paused_error, read_state, submit_turn
from smith_client.validation import (
    DEFAULT_CONTEXT_MAX_BYTES,
    build_turn_request,
    check_id,
    check_seq,
    check_timeout,
)

logger = logging.getLogger("agent_smith")

#: Seconds of silence on the live channel after which the replay log is read again.
POLL_INTERVAL = 1.0


def submit(
    keys: Keys, text: Any, options: dict[str, Any], context_max_bytes: int = DEFAULT_CONTEXT_MAX_BYTES
) -> Operation[str]:
    """Operation of ``submit``: start a background turn; returns the id of the turn to follow.

    The submit script refuses an agent no live turn worker serves (:class:`UnknownAgentError`) and
    warns when no turn worker is live at all, so nothing reads the registrations before it.
    ``context_max_bytes`` caps the caller context (:func:`~smith_client.validation.check_context`).
    """
    job, multitask, context = build_turn_request(text, options, context_max_bytes)
    return (yield from submit_turn(keys, job, multitask, context)).turn_id


def stream(
    keys: Keys, text: Any, timeout: Any, options: dict[str, Any], context_max_bytes: int = DEFAULT_CONTEXT_MAX_BYTES
) -> Operation[None]:
    """Operation of ``stream``: run one turn, yielding its events until the terminal one (see :func:`submit`)."""
    timeout = check_timeout(timeout)
    job, multitask, context = build_turn_request(text, options, context_max_bytes)
    yield Subscribe(
        keys.turn_events_channel(job.turn_id), keys.cluster
    )  # before submitting, so no live event is missed
    submission = yield from submit_turn(keys, job, multitask, context)
    after = 0
    if submission.turn_id != job.turn_id:  # merged into another turn: its events from now on
        yield Subscribe(keys.turn_events_channel(submission.turn_id), keys.cluster)
        after = yield from last_seq(keys, submission.turn_id)
    # a new turn has no events yet and its channel was subscribed first: no log to read before the live ones
    fresh = submission.outcome == "new"
    yield from follow_subscribed(keys, submission.turn_id, after, timeout, read_first=not fresh, until_paused=True)


def send(
    keys: Keys, text: Any, timeout: Any, options: dict[str, Any], context_max_bytes: int = DEFAULT_CONTEXT_MAX_BYTES
) -> Operation[AssistantMessage]:
    """Operation of ``send``: run one turn; returns its final message or raises its error
    (:class:`TurnPausedError` when it pauses)."""
    events = stream(keys, text, timeout, options, context_max_bytes)
    return outcome_from_event((yield from _terminal_event(events, "send")))


def follow(
    keys: Keys, turn_id: Any, after_seq: Any = 0, timeout: Any = None, *, until_paused: bool = False
) -> Operation[None]:
    """Operation of ``follow``: the events of ``turn_id`` with ``seq > after_seq``, replayed then live, through
    pauses (``until_paused``: see :func:`follow_subscribed`)."""
    check_id(turn_id, "turn_id")
    after_seq, timeout = check_seq(after_seq), check_timeout(timeout)
    yield Subscribe(keys.turn_events_channel(turn_id), keys.cluster)
    yield from follow_subscribed(keys, turn_id, after_seq, timeout, until_paused=until_paused)


def result(keys: Keys, turn_id: str, timeout: Any = None) -> Operation[AssistantMessage]:
    """Operation of ``TurnHandle.result``: the final message, from the state when the turn is over; raises
    :class:`TurnPausedError` while (or as soon as) the turn is paused."""
    state = yield from read_state(keys, turn_id)
    if state.get(record.STATUS) == record.PAUSED:
        raise paused_error(turn_id, (yield from approvals.pending(keys, turn_id)))
    done = outcome_from_state(state)
    if done is not None:
        return done
    events = follow(keys, turn_id, 0, timeout, until_paused=True)
    return outcome_from_event((yield from _terminal_event(events, "result")))


def clear(keys: Keys, conversation_id: Any) -> Operation[None]:
    """Operation of ``clear``: delete a conversation's own keys unless it has an unfinished turn.

    Raises :class:`ConversationBusyError` (nothing deleted) or :class:`InvalidRequestError`.
    """
    check_id(conversation_id, "conversation_id")
    script_keys = (
        keys.conversation_turns(conversation_id),
        keys.conversation_statuses(conversation_id),
        *keys.conversation_state(conversation_id),
    )
    busy: bytes | None = yield from run_script(scripts.CLEAR, script_keys)
    if busy:
        raise ConversationBusyError(
            f"conversation {conversation_id} has an unfinished turn ({busy.decode()}); cancel it or wait",
            conversation_id=conversation_id, active_turn_id=busy.decode(),
        )  # fmt: skip


def history(keys: Keys, conversation_id: Any) -> Operation[list[Message]]:
    """Operation of ``history``: all messages of a conversation, oldest first (stored form)."""
    check_id(conversation_id, "conversation_id")
    return (yield from call("lrange", keys.history(conversation_id), 0, -1, parse=messages_from_json_list))


def conversation_agent(keys: Keys, conversation_id: Any) -> Operation[str | None]:
    """Operation of ``conversation_agent``: the agent a handoff made current in a conversation, or None
    (docs/architecture.md, Handoffs)."""
    check_id(conversation_id, "conversation_id")
    return (yield from call("get", keys.conversation_agent(conversation_id), parse=_text_or_none))


def _text_or_none(reply: bytes | None) -> str | None:
    return None if reply is None else reply.decode()


def _terminal_event(events: Operation[None], operation: str) -> Operation[Event]:
    """Run a streaming operation without passing its events on; returns its terminal event, or the
    ``turn.paused`` event it ended on."""
    reply = None
    last: Event | None = None
    while True:
        try:
            item = events.send(reply)
        except StopIteration:
            if last is not None and last.paused:
                return last
            raise SmithTimeoutError("turn event stream ended without a terminal event", operation=operation) from None
        if isinstance(item, Event):
            last = item
            if item.terminal:
                events.close()
                return item
        reply = None if isinstance(item, Event) else (yield item)


def _still_paused(keys: Keys, turn_id: str) -> Operation[bool]:
    """True when the turn is paused now (a ``turn.paused`` read from the log may be of a pause already over)."""
    status: bytes | None = yield from call("hget", keys.turn_state(turn_id), record.STATUS)
    return status == record.PAUSED.encode()


def _ended(keys: Keys, turn_id: str, seen_any: bool) -> Operation[bool]:
    """With no event pending: True when the turn is over (nothing more will come).

    Raises :class:`TurnNotFoundError` for a turn nobody knows, and for a
    followed turn whose state and log vanished (expired, or lost in a
    Sentinel failover by asynchronous replication), so a follower never
    waits for events that cannot come.
    """
    status: bytes | None = yield from call("hget", keys.turn_state(turn_id), record.STATUS)
    if status is None and (seen_any or (yield from last_seq(keys, turn_id)) == 0):
        _lost(turn_id, seen_any)
    return record.is_terminal(status)


def _catch_up(keys: Keys, turn_id: str, last: int, seen_any: bool) -> Operation[tuple[list[Event], bool]]:
    """Events after ``last`` from the log, and whether the turn is over with nothing more to come.

    The log, its counter and the status are read in one transaction, so they
    agree: the terminal event and the terminal status are written together.
    """
    rt = RoundTrip(transaction=True)
    log = log_reads(rt, keys, turn_id, last)
    state: Pending[bytes | None] = rt.call("hget", keys.turn_state(turn_id), record.STATUS)
    yield from run(rt)
    status = state.value
    try:
        pending = log.events()
    except EventsTrimmedError:
        yield from _ended(keys, turn_id, seen_any=True)  # raises TurnNotFoundError when the state is gone too
        raise
    if pending:
        return pending, False
    if status is None and (seen_any or log.last.value == 0):
        _lost(turn_id, seen_any)
    return pending, record.is_terminal(status)


def _lost(turn_id: str, seen_any: bool) -> None:
    """Raise :class:`TurnNotFoundError`: a followed turn's state outlives its last event (docs/architecture.md,
    Lifetimes), so without it its keys were evicted or deleted, and nothing will ever finish it, even if its
    log is left (docs/architecture.md, Fault model)."""
    why = "lost: its keys are gone" if seen_any else "never submitted, or expired"
    raise TurnNotFoundError(f"no turn {turn_id!r} ({why})", turn_id=turn_id)


def _read_log(keys: Keys, turn_id: str, last: int) -> Operation[list[Event]]:
    """:func:`read_events`; a log lost with the turn's state raises :class:`TurnNotFoundError`."""
    try:
        return (yield from read_events(keys, turn_id, last))
    except EventsTrimmedError:
        yield from _ended(keys, turn_id, seen_any=True)  # raises TurnNotFoundError when the state is gone too
        raise


def follow_subscribed(
    keys: Keys,
    turn_id: str,
    after_seq: int,
    timeout: float | None,
    *,
    read_first: bool = True,
    until_paused: bool = False,
) -> Operation[None]:
    """Yield the turn's events with ``seq > after_seq`` exactly once, in order, until terminal (with
    ``until_paused``, also until a ``turn.paused`` while the turn is still paused; else a follower goes on
    through a pause, the turn's events after its resume included).

    Expects the operation's pub/sub connection subscribed to the turn's channel.
    Returns at once when the turn already ended at or before ``after_seq``.
    ``read_first=False`` (a turn submitted after subscribing) waits for the
    first live event instead of reading the log first; a gap in ``seq`` or a
    silent channel still reads it. Raises :class:`SmithTimeoutError` after
    ``timeout`` seconds (None: never).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    last = after_seq
    pending: list[Event] = []
    over = False
    if read_first:
        pending, over = yield from _catch_up(keys, turn_id, last, seen_any=after_seq > 0)
    while not over:
        for event in pending:
            if event.seq != last + 1:
                continue  # a duplicate, or out of order: the log read below fills gaps
            last = event.seq
            yield event
            if event.terminal or (until_paused and event.paused and (yield from _still_paused(keys, turn_id))):
                return
        if deadline is not None and time.monotonic() > deadline:
            raise SmithTimeoutError(
                f"turn {turn_id} did not finish in {timeout:g} s", operation="send", budget=timeout or 0.0
            )
        message = yield Receive(POLL_INTERVAL)
        if message is None:
            pending, over = yield from _catch_up(keys, turn_id, last, seen_any=True)
            continue
        event = event_from_json(message["data"])
        pending = [event] if event.seq <= last + 1 else (yield from _read_log(keys, turn_id, last))
