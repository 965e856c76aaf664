"""Turn submission, state and cancellation (as operations, see :mod:`smith_client.protocol`): the client's half of the turn state machine.

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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import orjson

from smith_client.errors import (
    ConflictError,
    ConversationBusyError,
    InvalidRequestError,
    ParseError,
    TurnCancelledError,
    error_from_payload,
)
from smith_client.eventlog import DEFAULT_TURN_TTL, publish
from smith_client.events import TURN_CANCELLED, TURN_COMPLETED, TURN_FAILED, Event
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage
from smith_client.protocol import Call, Enqueue, Operation
from smith_client.validation import check_multitask

if TYPE_CHECKING:
    from smith_client.client import SmithClient

Multitask = Literal["enqueue", "reject", "interrupt", "merge"]
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})

#: Lifetime of a conversation's bookkeeping (its FIFO of unfinished turns), seconds: 30 days.
CONVERSATION_TTL = 30 * 24 * 3600

_SUBMIT_LUA = """
local prefix, turn_id, fp, conv, agent, policy, msg, now, turn_ttl, conv_ttl, job = unpack(ARGV)
local state, conv_list = KEYS[1], KEYS[2]
local existing = redis.call('HGET', state, 'fingerprint')
if existing then
  if existing ~= fp then return {'conflict', turn_id} end
  return {'attach', turn_id, redis.call('HGET', state, 'status')}
end
local active = {}
for _, id in ipairs(redis.call('LRANGE', conv_list, 0, -1)) do
  local st = redis.call('HGET', prefix .. ':turn:' .. id .. ':state', 'status')
  if st == false or st == 'completed' or st == 'failed' or st == 'cancelled' then
    redis.call('LREM', conv_list, 0, id)
  else
    table.insert(active, id)
  end
end
if #active > 0 then
  if policy == 'reject' then return {'busy', active[1]} end
  if policy == 'merge' then
    local target = active[#active]
    local tstate = prefix .. ':turn:' .. target .. ':state'
    if redis.call('HGET', tstate, 'status') == 'running' and redis.call('HGET', tstate, 'inbox_closed') ~= '1' then
      local inbox = prefix .. ':turn:' .. target .. ':inbox'
      redis.call('RPUSH', inbox, msg)
      redis.call('EXPIRE', inbox, turn_ttl)
      return {'merged', target}
    end
  end
end
redis.call('HSET', state, 'status', 'queued', 'fingerprint', fp, 'conversation_id', conv,
           'agent', agent, 'created_at', now, 'attempt', 0, 'job', job)
redis.call('EXPIRE', state, turn_ttl)
redis.call('RPUSH', conv_list, turn_id)
redis.call('EXPIRE', conv_list, conv_ttl)
if policy == 'interrupt' then
  for _, id in ipairs(active) do
    redis.call('HSET', prefix .. ':turn:' .. id .. ':state', 'cancel_requested', 'interrupt')
    redis.call('PUBLISH', prefix .. ':control', id)
  end
end
return {'new', turn_id}
"""

# A turn that never started is cancelled here; a started one (attempt > 0) is
# cancelled by its worker, which repairs the history first.
_CANCEL_LUA = """
local prefix, turn_id, reason = unpack(ARGV)
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return 'missing' end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return st end
redis.call('HSET', KEYS[1], 'cancel_requested', reason)
if st == 'queued' and redis.call('HGET', KEYS[1], 'attempt') == '0' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled')
  redis.call('LREM', KEYS[2], 0, turn_id)
  return 'cancelled_queued'
end
redis.call('PUBLISH', prefix .. ':control', turn_id)
return 'cancelling'
"""


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


def submit_turn(keys: Keys, job: TurnJob, multitask: str) -> Operation[Submission]:
    """Operation: create (or join) the turn for ``job`` and enqueue it when it needs a worker.

    Raises :class:`ConflictError` (same turn id, different request),
    :class:`ConversationBusyError` (``reject`` policy) or :class:`InvalidRequestError`.
    """
    check_multitask(multitask)
    reply = yield Call("eval", (
        _SUBMIT_LUA,
        2,
        keys.turn_state(job.turn_id),
        keys.conversation_turns(job.conversation_id),
        keys.prefix, job.turn_id, fingerprint(job), job.conversation_id, job.agent, multitask,
        job.message.model_dump_json(), time.time(), DEFAULT_TURN_TTL, CONVERSATION_TTL, job.model_dump_json(),
    ))  # fmt: skip
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
        yield Enqueue(RUN_TURN, job.model_dump(mode="json"), keys.turn_job_id(job.turn_id), keys.turns_queue)
    return Submission(outcome, turn_id, status)  # type: ignore[arg-type]


async def submit(client: "SmithClient", job: TurnJob, multitask: str) -> Submission:
    """:func:`submit_turn` on an async client's Redis, for producers that build their own :class:`TurnJob`."""
    return await client.runner.run(submit_turn(client.keys, job, multitask))


def read_state(keys: Keys, turn_id: str) -> Operation[dict[str, str]]:
    """Operation: the raw state hash of a turn (empty when the turn is unknown or expired)."""
    raw = yield Call("hgetall", (keys.turn_state(turn_id),))
    return {k.decode(): v.decode() for k, v in raw.items()}


def outcome_from_state(state: dict[str, str]) -> AssistantMessage | None:
    """The final message of a completed turn's state, None while it is unfinished.

    Raises the turn's typed error when it failed, :class:`TurnCancelledError` when cancelled.
    """
    status = state.get("status")
    if status == "completed":
        return AssistantMessage.model_validate_json(state["result"])
    if status == "failed":
        raise error_from_payload(orjson.loads(state.get("error") or "{}"))
    if status == "cancelled":
        reason = state.get("cancel_requested") or "cancel"
        raise TurnCancelledError(f"turn was cancelled ({reason})", operation=reason)
    return None


def outcome_from_event(event: Event) -> AssistantMessage:
    """The final message of a ``turn.completed`` event; raises the turn's error for the other terminal events."""
    if event.type == TURN_COMPLETED:
        return event.final_message()
    if event.type == TURN_FAILED:
        raise event.error()
    if event.type == TURN_CANCELLED:
        reason = event.data.get("reason", "cancel")
        raise TurnCancelledError(f"turn was cancelled ({reason})", operation=reason)
    raise ParseError(f"event {event.type!r} does not end a turn")


def cancel_turn(keys: Keys, turn_id: str, reason: str = "cancel") -> Operation[str]:
    """Operation: ask for the turn to stop; see :meth:`TurnHandle.cancel` for the outcomes."""
    if not isinstance(reason, str) or not reason:
        raise InvalidRequestError(f"reason must be a non-empty string, got {reason!r}", field="reason")
    conversation = (yield from read_state(keys, turn_id)).get("conversation_id", "")
    outcome = (yield Call("eval", (
        _CANCEL_LUA, 2, keys.turn_state(turn_id), keys.conversation_turns(conversation), keys.prefix, turn_id, reason,
    ))).decode()  # fmt: skip
    if outcome == "cancelled_queued":
        yield from publish(keys, turn_id, TURN_CANCELLED, {"reason": reason})
    return outcome
