"""Deciding a paused turn's calls: the client's half of docs/architecture.md, Pausing for a person.

A turn whose step has calls that need a person (a tool declared ``needs_approval``, an external tool)
pauses with its calls listed in ``{p}:turn:{t}:pending`` (:class:`~smith_client.events.PendingItem`
JSON by call id). Each operation here is one of :mod:`smith_client.protocol` (both clients run them):
:func:`pending` lists the calls still undecided, :func:`decide` records one decision with
``lua/decide.lua``, which queues the turn again, and enqueues its job, once every pending call has one.
The first decision on a call stays: deciding it again returns that one and changes nothing, also once the
turn resumed (the resumed step's append deletes the decisions; its ``tool_call.decided`` events keep them).
:func:`approval`, :func:`rejection` and :func:`tool_result` check what a caller asks for into a
:class:`Decision` (its values at most :data:`~smith_client.validation.MAX_MESSAGE_BYTES`, as a user message).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from smith_client import scripts
from smith_client import turn_record as record
from smith_client.errors import InvalidRequestError, NoPendingCallError, TurnNotFoundError
from smith_client.eventlog import log_reads
from smith_client.events import (
    TOOL_CALL_DECIDED,
    TOOL_RESULT,
    TURN_PAUSED,
    Event,
    PendingItem,
    ToolCallDecidedData,
    ToolResultData,
    TurnPausedData,
)
from smith_client.keys import Keys
from smith_client.protocol import Operation, call, run, run_script
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.turn_record import decode_state
from smith_client.turns import resume_job_call
from smith_client.validation import check_fits_schema, check_id, check_json, check_size

#: The default message of a rejected call's error tool message.
REJECTED = "a person rejected this call"
#: The tool message content of a call whose approval timed out (docs/architecture.md, Pausing for a person).
APPROVAL_TIMED_OUT = "approval timed out"
#: ``decide.lua`` calls before giving up when the turn keeps pausing again under the caller.
_DECIDE_TRIES = 3


class Decision(BaseModel):
    """A decision on one pending call: ``action`` ``approve`` (run it, with ``arguments`` when a person edited
    them; None: the model's), ``reject`` (the model gets an error tool message with ``message``) or
    ``result`` (an external tool's result: ``content`` and ``is_error`` make its tool message)."""

    model_config = ConfigDict(extra="allow")
    action: Literal["approve", "reject", "result"]
    arguments: dict[str, Any] | None = None
    message: str = ""
    content: str = ""
    is_error: bool = False


def approval(arguments: Any = None) -> Decision:
    """The decision of ``approve``: ``arguments`` None (the model's) or edited ones, a dict (a JSON object) of at
    most :data:`~smith_client.validation.MAX_MESSAGE_BYTES` encoded. Raises :class:`InvalidRequestError`
    (field ``arguments``)."""
    if arguments is not None:
        if not isinstance(arguments, dict):
            raise InvalidRequestError(
                f"arguments must be a JSON object (a dict) or None, got {type(arguments).__name__}", field="arguments"
            )
        check_json(arguments, "arguments")
    return Decision(action="approve", arguments=arguments)


def rejection(message: Any = REJECTED) -> Decision:
    """The decision of ``reject``: ``message``, a string of at most :data:`~smith_client.validation.MAX_MESSAGE_BYTES`
    UTF-8 bytes, is the model's error tool message. Raises :class:`InvalidRequestError` (field ``message``)."""
    if not isinstance(message, str):
        raise InvalidRequestError(f"message must be a string, got {type(message).__name__}", field="message")
    return Decision(action="reject", message=check_size(message, "message"))


def tool_result(result: Any, is_error: Any = False) -> Decision:
    """The decision of ``submit_tool_result``: ``result`` as its tool message content (:func:`result_content`,
    at most :data:`~smith_client.validation.MAX_MESSAGE_BYTES` UTF-8 bytes), an error one when ``is_error``
    (a bool). Raises :class:`InvalidRequestError` naming ``result`` or ``is_error``."""
    if not isinstance(is_error, bool):
        raise InvalidRequestError(f"is_error must be a bool, got {type(is_error).__name__}", field="is_error")
    return Decision(action="result", content=result_content(result), is_error=is_error)


def unknown_turn(keys: Keys, turn_id: str) -> TurnNotFoundError:
    """The error for a turn whose state Redis does not have (never submitted under this prefix, or expired)."""
    return TurnNotFoundError(f"no turn {turn_id} under prefix {keys.prefix!r} (or it expired)", turn_id=turn_id)


def pending(keys: Keys, turn_id: Any) -> Operation[list[PendingItem]]:
    """Operation of ``pending``: the turn's calls waiting for a decision, in call order (none when it is not
    paused or every call is decided), then the open MCP elicitations of its running tool calls (kind ``input``,
    :mod:`smith_client.inputs`). Raises :class:`InvalidRequestError` for a bad id, :class:`TurnNotFoundError`
    for a turn Redis does not have."""
    check_id(turn_id, "turn_id")
    rt = RoundTrip()
    items = rt.call("hgetall", keys.turn_pending(turn_id), parse=pending_items)
    decided = rt.call("hkeys", keys.turn_decisions(turn_id), parse=_texts)
    status: Pending[bytes | None] = rt.call("hget", keys.turn_state(turn_id), record.STATUS)
    inputs = rt.call("hgetall", keys.turn_inputs(turn_id), parse=pending_items)
    yield from run(rt)
    if status.value is None:
        raise unknown_turn(keys, turn_id)
    paused = status.value == record.PAUSED.encode()
    return [item for item in items.value if paused and item.call_id not in decided.value] + inputs.value


def decide(keys: Keys, turn_id: Any, call_id: Any, decision: Decision) -> Operation[Decision]:
    """Operation of ``approve`` / ``reject`` / ``submit_tool_result``: record ``decision`` on call ``call_id``
    of paused turn ``turn_id``; returns the decision that stands: the first one when the call was decided
    already (from the decisions hash while it holds it, else from the turn's ``tool_call.decided`` event once
    the resumed step took it), which the caller compares with ``decision`` to know whether its own was ignored.
    Edited arguments are checked against the tool's schema (the pending item's ``parameters``).

    Raises :class:`TurnNotFoundError` for a turn Redis does not have, :class:`NoPendingCallError` (naming the
    calls still waiting) when the turn never waited on such a call or ended without deciding it (cancelled),
    :class:`InvalidRequestError` for a bad id, arguments that do not fit the schema, or an
    action that does not fit the call (``approve`` / ``reject`` an external tool's call, ``result`` for an
    approval).
    """
    check_id(turn_id, "turn_id")
    if not isinstance(call_id, str) or not call_id:
        raise InvalidRequestError(f"call_id must be a non-empty string, got {call_id!r}", field="call_id")
    for _ in range(_DECIDE_TRIES):
        read = _PauseRead(keys, turn_id, call_id)
        yield from run(read.rt)
        first = read.first.value
        if first is not None:
            return Decision.model_validate_json(first)
        if not read.state.value:
            raise unknown_turn(keys, turn_id)
        item = read.item.value
        if item is None or read.state.value.get(record.STATUS) != record.PAUSED:
            return (yield from _standing(keys, turn_id, call_id))
        _check_fits(PendingItem.model_validate_json(item), decision)
        reply = yield from _run_decide(keys, turn_id, call_id, decision, read.state.value)
        outcome = reply[0].decode()
        if outcome in ("same", "decided"):
            return Decision.model_validate_json(reply[1])
        if outcome == "missing":  # resumed (or ended) between the read and the script
            return (yield from _standing(keys, turn_id, call_id))
    raise InvalidRequestError(f"turn {turn_id} kept pausing again while deciding {call_id}; try again", field="turn_id")


def expire(keys: Keys, turn_id: str) -> Operation[bool]:
    """Operation of the sweeper (docs/architecture.md, Pausing for a person): reject every undecided call of
    paused turn ``turn_id`` with :data:`APPROVAL_TIMED_OUT` and enqueue the turn. False when it was not paused
    (the paused ZSET's entry is then dropped)."""
    state = yield from call("hgetall", keys.turn_state(turn_id), parse=decode_state)
    decision = Decision(action="reject", message=APPROVAL_TIMED_OUT)
    reply = yield from _run_decide(keys, turn_id, "", decision, state)
    return bool(reply[0] == b"decided")


class _PauseRead:
    """One round trip's reads before a decision: the turn's state, the call's pending item and its decision."""

    def __init__(self, keys: Keys, turn_id: str, call_id: str) -> None:
        self.rt = RoundTrip()
        self.state = self.rt.call("hgetall", keys.turn_state(turn_id), parse=decode_state)
        self.item: Pending[bytes | None] = self.rt.call("hget", keys.turn_pending(turn_id), call_id)
        self.first: Pending[bytes | None] = self.rt.call("hget", keys.turn_decisions(turn_id), call_id)


def _run_decide(
    keys: Keys, turn_id: str, call_id: str, decision: Decision, state: dict[str, str]
) -> Operation[list[Any]]:
    """``lua/decide.lua`` with the enqueue of the turn's job, under the resume job id of the attempt that
    paused it (``state``'s), for when this decision completes the step."""
    attempt = state.get(record.ATTEMPT, "0")
    enqueue_keys, enqueue_args = resume_job_call(keys, state, keys.turn_resume_job_id(turn_id, int(attempt)))
    conversation = state.get(record.CONVERSATION_ID, "")
    script_keys = (
        keys.turn_state(turn_id),
        keys.turn_pending(turn_id),
        keys.turn_decisions(turn_id),
        keys.paused,
        keys.conversation_statuses(conversation),
        *enqueue_keys,
    )
    args = (turn_id, call_id, decision.model_dump_json(exclude_none=True), attempt, *enqueue_args)
    reply: list[Any] = yield from run_script(scripts.DECIDE, script_keys, args)
    return reply


def _standing(keys: Keys, turn_id: str, call_id: str) -> Operation[Decision]:
    """The decision on ``call_id`` of ``turn_id`` a resumed step took, from the turn's log (its decisions hash
    is gone; one read of the log, for a late or concurrent decision only). Raises :class:`NoPendingCallError`
    naming the calls still waiting when the log has none."""
    rt = RoundTrip()
    log = log_reads(rt, keys, turn_id, 0)
    yield from run(rt)
    decision = _logged_decision(log.kept(), call_id)
    if decision is None:
        raise _not_pending(turn_id, call_id, (yield from pending(keys, turn_id)))
    return decision


def _logged_decision(events: list[Event], call_id: str) -> Decision | None:
    """The decision on ``call_id`` (path-qualified) as a turn's ``events`` tell it: its first ``tool_call.decided``
    (``arguments`` None when they are the model's, as the ``turn.paused`` listing the call gave them; an external
    tool's result from the ``tool.result`` that follows), or None when the call was not decided."""
    asked: dict[str, Any] | None = None
    decided: tuple[Event, ToolCallDecidedData] | None = None
    for event in events:
        if event.type not in (TURN_PAUSED, TOOL_CALL_DECIDED, TOOL_RESULT):
            continue
        data = event.payload
        if isinstance(data, TurnPausedData):
            asked = next((item.arguments for item in data.pending if item.call_id == call_id), asked)
        elif isinstance(data, ToolCallDecidedData) and decided is None and _qualified(event, data.id) == call_id:
            decided = event, data
            if data.action != "result":
                break
        elif isinstance(data, ToolResultData) and decided is not None and _same_call(decided[0], event, data):
            return Decision(action="result", content=data.content, is_error=data.is_error)
    if decided is None:
        return None
    data = decided[1]
    if data.action == "approve":
        return Decision(action="approve", arguments=None if data.arguments == asked else data.arguments)
    return Decision.model_validate({"action": data.action, "message": data.message})


def _qualified(event: Event, call_id: str) -> str:
    """The id a person decides call ``call_id`` of ``event``'s agent by (its ``call_path`` ids, then its own)."""
    return "/".join([*event.call_path, call_id])


def _same_call(decided: Event, event: Event, data: ToolResultData) -> bool:
    return event.call_path == decided.call_path and data.tool_call_id == decided.data.get("id")


def _not_pending(turn_id: str, call_id: str, waiting: list[PendingItem]) -> NoPendingCallError:
    ids = [item.call_id for item in waiting]
    return NoPendingCallError(
        f"turn {turn_id} does not wait on call {call_id!r}; it waits on {ids or 'nothing'}",
        turn_id=turn_id,
        call_id=call_id,
        pending=ids,
    )


def _check_fits(item: PendingItem, decision: Decision) -> None:
    """Raise :class:`InvalidRequestError` when ``decision`` does not fit pending ``item`` (its kind, its schema)."""
    if (item.kind == "external") != (decision.action == "result"):
        wanted = "submit_tool_result" if item.kind == "external" else "approve or reject"
        raise InvalidRequestError(f"call {item.call_id} ({item.kind}) takes {wanted}", field="call_id")
    if decision.arguments is not None:
        check_fits_schema(
            item.parameters, decision.arguments, "arguments", f"arguments for {item.tool} do not fit its schema"
        )


def result_content(result: Any) -> str:
    """An external tool's ``result`` as its tool message content: text as it is, other values as compact JSON.
    Raises :class:`InvalidRequestError` for a value that is not JSON-able, or larger than
    :data:`~smith_client.validation.MAX_MESSAGE_BYTES` UTF-8 bytes."""
    return check_size(result, "result") if isinstance(result, str) else check_json(result, "result")


def pending_items(raw: dict[bytes, bytes]) -> list[PendingItem]:
    """The items of a hash of :class:`PendingItem` JSON values (``HGETALL``), in call order."""
    items = [PendingItem.model_validate_json(blob) for blob in raw.values()]
    return sorted(items, key=lambda item: (item.call_path, item.step, item.index, item.request_id))


def _texts(raw: list[bytes]) -> set[str]:
    return {name.decode() for name in raw}
