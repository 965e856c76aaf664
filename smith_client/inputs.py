"""Answering an MCP server's elicitation: the client's half of docs/architecture.md, Pausing for a person (input).

While a tool call runs, its MCP server may ask for a person's input (``elicitation/create``, MCP 2025-06-18,
https://modelcontextprotocol.io/specification/2025-06-18/client/elicitation). The tool worker holding the MCP
request lists it in ``{p}:turn:{t}:inputs`` (:class:`~smith_client.events.PendingItem` JSON, kind ``input``, by
request id), publishes ``input.requested`` and waits on ``{p}:turn:{t}:input:{r}``. :func:`respond` checks the
answer against the request's ``requestedSchema``, takes the request off the list and pushes the answer there, in
one transaction. The turn is not paused meanwhile: its tool job stays live. An MCP server's ``sampling/createMessage``
that needs a person's approval (the item's ``method``) is listed and answered alike: ``accept`` (no content) or
``decline``.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel

from smith_client import turn_record as record
from smith_client.approvals import pending_items, unknown_turn
from smith_client.errors import InvalidRequestError, NoPendingCallError, TurnNotFoundError
from smith_client.events import InputAction, PendingItem
from smith_client.keys import INPUT_REPLY_TTL, Keys
from smith_client.protocol import Operation, call, run
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.validation import check_fits_schema, check_id, check_json

#: ``PendingItem.method`` of a sampling that waits for a person's approval (MCP 2025-06-18, sampling).
SAMPLING_METHOD = "sampling/createMessage"


class InputResponse(BaseModel):
    """The answer to one elicitation: ``action`` and, for ``accept``, the ``content`` (a JSON object that fits
    the request's ``requestedSchema``)."""

    action: InputAction
    content: dict[str, Any] | None = None


def respond(
    keys: Keys, turn_id: Any, request_id: Any, action: Any, content: dict[str, Any] | None
) -> Operation[InputResponse]:
    """Operation of ``respond``: answer open elicitation ``request_id`` of turn ``turn_id``; returns the answer
    sent to the tool worker holding the MCP request.

    Raises :class:`InvalidRequestError` for a bad id or action, ``content`` given with anything but ``accept``
    (or with a sampling approval, whose ``accept`` takes none), ``accept`` without content (but for a sampling
    approval), content larger than :data:`~smith_client.validation.MAX_MESSAGE_BYTES` encoded, or content that does not
    fit the request's schema; :class:`TurnNotFoundError` for a turn Redis does not have;
    :class:`NoPendingCallError` (naming the open requests) when the turn has no such open request (answered
    already, timed out, or never asked).
    """
    check_id(turn_id, "turn_id")
    check_id(request_id, "request_id")
    answer = input_response(action, content)
    raw: bytes | None = yield from call("hget", keys.turn_inputs(turn_id), request_id)
    if raw is None:
        raise (yield from _not_open(keys, turn_id, request_id))
    item = PendingItem.model_validate_json(raw)
    approval = item.method == SAMPLING_METHOD
    if answer.action == "accept" and (answer.content is None) != approval:
        needs = "a sampling approval's accept takes no content" if approval else "accept needs content: a JSON object"
        raise InvalidRequestError(needs, field="content")
    if answer.content is not None:
        check_fits_schema(item.parameters, answer.content, "content", "content does not fit the requested schema")
    rt = RoundTrip(transaction=True)
    taken = rt.call("hdel", keys.turn_inputs(turn_id), request_id, parse=int)
    reply = keys.turn_input_reply(turn_id, request_id)
    rt.call("rpush", reply, answer.model_dump_json(exclude_none=True))
    rt.call("expire", reply, INPUT_REPLY_TTL)
    yield from run(rt)
    if not taken.value:  # answered by another caller, or timed out, between the read and the transaction
        raise (yield from _not_open(keys, turn_id, request_id))
    return answer


def input_response(action: Any, content: Any) -> InputResponse:
    """The answer ``respond`` sends, checked: ``action`` one of ``accept``, ``decline``, ``cancel``; ``content`` a
    JSON object (a dict) of at most :data:`~smith_client.validation.MAX_MESSAGE_BYTES` encoded with ``accept``,
    None with the others. Raises :class:`InvalidRequestError` naming ``action`` or ``content``. (The fit to the
    request's schema is checked by :func:`respond`, which reads the request.)"""
    if action not in get_args(InputAction):
        raise InvalidRequestError(f"action must be accept, decline or cancel, got {action!r}", field="action")
    if action == "accept" and content is not None and not isinstance(content, dict):
        raise InvalidRequestError("accept needs content: a JSON object", field="content")
    if action != "accept" and content is not None:
        raise InvalidRequestError(f"{action} takes no content", field="content")
    if content is not None:
        check_json(content, "content")
    return InputResponse(action=action, content=content)


def _not_open(keys: Keys, turn_id: str, request_id: str) -> Operation[NoPendingCallError | TurnNotFoundError]:
    """The error for a request that is not open: :class:`TurnNotFoundError` when Redis has no such turn."""
    rt = RoundTrip()
    waiting = rt.call("hgetall", keys.turn_inputs(turn_id), parse=pending_items)
    status: Pending[bytes | None] = rt.call("hget", keys.turn_state(turn_id), record.STATUS)
    yield from run(rt)
    if status.value is None:
        return unknown_turn(keys, turn_id)
    ids = [item.request_id for item in waiting.value]
    return NoPendingCallError(
        f"turn {turn_id} has no open input request {request_id!r}; open: {ids or 'none'}",
        turn_id=turn_id,
        call_id=request_id,
        pending=ids,
    )
