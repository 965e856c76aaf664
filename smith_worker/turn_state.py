"""Worker side of the turn state machine: attempts, leases, fencing, checkpoints (DESIGN.md §8).

Every run of a turn is an *attempt*. :meth:`TurnAttempt.begin` atomically
moves the turn to ``running`` and increments its ``attempt`` number, which is
the fencing token: every write of the attempt (history appends, events, the
final state) is a Lua script that first checks the turn's current attempt,
so a stalled or stale attempt cannot write after another took over.

While it runs, the attempt renews a short lease (``lease`` seconds, renewed
every ``lease / 3``) in the turn's state and in ``{p}:running``; a sweeper
(:mod:`smith_worker.sweeper`) re-enqueues a turn whose lease expired, under a
new arq job id, so recovery does not wait for arq's in-progress key (job
timeout + 10 s, arq-notes.md §1.6).

The history is the checkpoint: the user message is appended once per turn
id (its absolute position kept as ``history_start``, :mod:`smith_worker.history`),
assistant and tool messages are appended whole, so a re-run reads where the
turn stopped. Every append trims the history to ``history_max`` messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from smith_client.errors import ParseError
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.keys import DEFAULT_HISTORY_TTL, Keys
from smith_client.messages import message_to_json
from smith_worker.history import DEFAULT_HISTORY_MAX_MESSAGES, TRIM_LUA, Repair

logger = logging.getLogger("agent_smith.worker")

#: Seconds a turn's lease lives without renewal (renewed every third of it).
DEFAULT_LEASE = 10.0

# KEYS: state, running, conversation turns. ARGV: turn id, worker id, now ms, lease ms, prefix.
# Only the oldest unfinished turn of a conversation may run: a later one gets
# {'wait', <id ahead>} and parks, holding no worker slot while it waits.
_BEGIN = """
local st = redis.call('HGET', KEYS[1], 'status')
if not st then return {'missing'} end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return {'done', st} end
if st == 'running' and tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') > tonumber(ARGV[3]) then
  return {'busy'}
end
for _, id in ipairs(redis.call('LRANGE', KEYS[3], 0, -1)) do
  if id == ARGV[1] then break end
  local other = redis.call('HGET', ARGV[5] .. ':turn:' .. id .. ':state', 'status')
  if other == false or other == 'completed' or other == 'failed' or other == 'cancelled' then
    redis.call('LREM', KEYS[3], 0, id)
  else
    return {'wait', id}
  end
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
local until_ms = tonumber(ARGV[3]) + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'status', 'running', 'worker', ARGV[2], 'lease_until', until_ms)
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
redis.call('EXPIRE', KEYS[2], 86400)
return {'go', attempt}
"""

_RENEW = """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] or redis.call('HGET', KEYS[1], 'status') ~= 'running' then
  return 0
end
local until_ms = tonumber(ARGV[3]) + tonumber(ARGV[4])
redis.call('HSET', KEYS[1], 'lease_until', until_ms)
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
return 1
"""

# ARGV[2] is the owner's attempt (a hand-off at shutdown, counted in 'handoffs':
# it does not use up one of SMITH_TURN_MAX_ATTEMPTS) or '' (the sweeper, which
# may only take a turn whose lease has expired).
_REQUEUE = """
if redis.call('HGET', KEYS[1], 'status') ~= 'running' then return 0 end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 0 end
if ARGV[2] == '' and tonumber(redis.call('HGET', KEYS[1], 'lease_until') or '0') > tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'lease_until', 0)
redis.call('ZREM', KEYS[2], ARGV[1])
if ARGV[2] ~= '' then redis.call('HINCRBY', KEYS[1], 'handoffs', 1) end
return redis.call('HINCRBY', KEYS[1], 'requeues', 1)
"""

# KEYS: state. ARGV: the stale attempt. A turn back at 'queued' with an older attempt
# than one that ran lost writes (a Redis failover: replication is asynchronous).
_REGRESSED = """
if redis.call('HGET', KEYS[1], 'status') ~= 'queued' then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'attempt') or '0') >= tonumber(ARGV[1]) then return 0 end
return redis.call('HINCRBY', KEYS[1], 'requeues', 1)
"""

# Merged user messages the turn did not get to (it was cancelled or failed first)
# are kept: moved to the history, after what the turn completed.
FINISH_LUA = """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[3], ARGV[4], ARGV[5], 'inbox_closed', '1', 'lease_until', 0)
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('LREM', KEYS[3], 0, ARGV[1])
local merged = redis.call('LRANGE', KEYS[4], 0, -1)
if #merged > 0 then
  redis.call('RPUSH', KEYS[5], unpack(merged))
  redis.call('EXPIRE', KEYS[5], ARGV[7])
end
redis.call('DEL', KEYS[4])
return 1
"""

# KEYS: state, history, trimmed. ARGV: attempt, message, ttl, max messages, then optionally the
# repair of dangling tool calls: the history end it was computed for, the position to insert at,
# the tool messages. The repair is skipped when the history changed since it was computed.
_APPEND_USER = TRIM_LUA + """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
local start = redis.call('HGET', KEYS[1], 'history_start')
if start then return tonumber(start) end
local base = tonumber(redis.call('GET', KEYS[3]) or '0')
if #ARGV > 6 and base + redis.call('LLEN', KEYS[2]) == tonumber(ARGV[5]) and tonumber(ARGV[6]) > base then
  local at = tonumber(ARGV[6]) - base
  local after = redis.call('LRANGE', KEYS[2], at, -1)
  redis.call('LTRIM', KEYS[2], 0, at - 1)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, 7))
  if #after > 0 then redis.call('RPUSH', KEYS[2], unpack(after)) end
end
local position = base + redis.call('RPUSH', KEYS[2], ARGV[2]) - 1
redis.call('EXPIRE', KEYS[2], ARGV[3])
trim(KEYS[2], KEYS[3], ARGV[4], ARGV[3])
redis.call('HSET', KEYS[1], 'history_start', position)
return position
"""

# KEYS: state, history, trimmed. ARGV: attempt, ttl, max messages, messages.
_APPEND = TRIM_LUA + """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return -1 end
local n = redis.call('RPUSH', KEYS[2], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[2], ARGV[2])
trim(KEYS[2], KEYS[3], ARGV[3], ARGV[2])
return n
"""

# Moves merged user messages into the history. With ARGV[3] == '1' and nothing
# to move, closes the inbox (the turn is finishing), atomically with the check.
_DRAIN_INBOX = TRIM_LUA + """
if redis.call('HGET', KEYS[1], 'attempt') ~= ARGV[1] then return false end
local msgs = redis.call('LRANGE', KEYS[2], 0, -1)
if #msgs > 0 then
  redis.call('RPUSH', KEYS[3], unpack(msgs))
  redis.call('EXPIRE', KEYS[3], ARGV[2])
  trim(KEYS[3], KEYS[4], ARGV[4], ARGV[2])
  redis.call('DEL', KEYS[2])
elseif ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'inbox_closed', '1')
end
return msgs
"""

# The conversation's oldest unfinished turn id ('' if none); drops finished ones on the way.
_HEAD = """
for _, id in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
  local st = redis.call('HGET', ARGV[1] .. ':turn:' .. id .. ':state', 'status')
  if st == false or st == 'completed' or st == 'failed' or st == 'cancelled' then
    redis.call('LREM', KEYS[1], 0, id)
  else
    return id
  end
end
return ''
"""

#: Seconds between the checks of a parked turn (one waiting behind an earlier turn of its conversation).
#: The turn that finishes wakes the next one at once; this only covers a wake-up that was lost.
PARK_RECHECK = 15.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class StaleAttemptError(Exception):
    """This attempt is no longer the turn's current one: it must stop without writing."""


class TurnAttempt:
    """One attempt at running one turn (see the module docstring).

    ``lease`` is seconds. ``on_lost`` is called (once) when renewal finds the
    lease taken over, so the owner can stop its task. ``history_max`` is the
    number of messages the stored history keeps (``SMITH_HISTORY_MAX_MESSAGES``).
    """

    def __init__(
        self,
        redis: Any,
        keys: Keys,
        turn_id: str,
        conversation_id: str,
        worker_id: str,
        *,
        lease: float = DEFAULT_LEASE,
        history_ttl: int = DEFAULT_HISTORY_TTL,
        history_max: int = DEFAULT_HISTORY_MAX_MESSAGES,
    ) -> None:
        self.redis = redis
        self.keys = keys
        self.turn_id = turn_id
        self.conversation_id = conversation_id
        self.worker_id = worker_id
        self.lease_ms = int(lease * 1000)
        self.history_ttl = history_ttl
        self.history_max = history_max
        self.attempt = 0
        self._renewer: asyncio.Task[None] | None = None
        self._state = keys.turn_state(turn_id)
        self._history = keys.history(conversation_id)
        self._trimmed = keys.history_trimmed(conversation_id)

    async def begin(self) -> str:
        """Take the turn: ``"go"`` (this attempt runs it), ``"wait"`` (an earlier turn of the
        conversation is unfinished), ``"done"``, ``"busy"`` (another live attempt) or ``"missing"``."""
        reply = await self.redis.eval(
            _BEGIN, 3, self._state, self.keys.running, self.keys.conversation_turns(self.conversation_id),
            self.turn_id, self.worker_id, _now_ms(), self.lease_ms, self.keys.prefix,
        )  # fmt: skip
        outcome = reply[0].decode()
        if outcome == "go":
            self.attempt = int(reply[1])
        return outcome

    def start_renewing(self, on_lost: Callable[[], None]) -> None:
        """Renew the lease every third of its life until :meth:`stop_renewing`."""
        self._renewer = asyncio.create_task(self._renew_loop(on_lost))

    async def stop_renewing(self) -> None:
        """Stop the lease renewal task (the attempt is over)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer

    async def _renew_loop(self, on_lost: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.lease_ms / 3000)
            try:
                renewed = await self.redis.eval(
                    _RENEW, 2, self._state, self.keys.running, self.turn_id, self.attempt, _now_ms(), self.lease_ms
                )
            except Exception:  # a Redis blip: the lease has slack for two more tries
                logger.warning("turn %s: lease renewal failed", self.turn_id, exc_info=True)
                continue
            if not renewed:
                logger.warning("turn %s: attempt %d lost its lease", self.turn_id, self.attempt)
                on_lost()
                return

    async def state(self) -> dict[str, str]:
        """The turn's state hash, decoded."""
        raw = await self.redis.hgetall(self._state)
        return {k.decode(): v.decode() for k, v in raw.items()}

    async def append_user(self, message: BaseModel, repair: Repair | None = None) -> int:
        """Append the turn's user message once per turn id; return its absolute position in the history.

        ``repair`` (error tool messages for dangling tool calls of an earlier
        turn) is inserted in the same script, so the history is repaired once
        (issue 13 design rule 3); it is skipped if the history changed since
        it was computed.
        """
        extra: list[Any] = []
        if repair is not None:
            extra = [repair.end, repair.position, *(message_to_json(m) for m in repair.messages)]
        index = await self.redis.eval(
            _APPEND_USER, 3, self._state, self._history, self._trimmed,
            self.attempt, message_to_json(message), self.history_ttl, self.history_max, *extra,
        )  # fmt: skip
        if index < 0:
            raise StaleAttemptError(self.turn_id)
        return int(index)

    async def append(self, *messages: BaseModel) -> None:
        """Append whole messages to the history, fenced. Raises :class:`StaleAttemptError`."""
        if not messages:
            return
        blobs = [message_to_json(m) for m in messages]
        reply = await self.redis.eval(_APPEND, 3, self._state, self._history, self._trimmed,
                                      self.attempt, self.history_ttl, self.history_max, *blobs)
        if reply < 0:
            raise StaleAttemptError(self.turn_id)

    async def drain_inbox(self, closing: bool) -> list[bytes]:
        """Move merged user messages into the history; when ``closing`` and none are waiting, close the inbox."""
        return self.drained(await self.redis.eval(*self.drain_inbox_args(closing)))

    def drain_inbox_args(self, closing: bool) -> tuple[Any, ...]:
        """The ``EVAL`` arguments of :meth:`drain_inbox`, to send it in a pipeline with other commands."""
        return (_DRAIN_INBOX, 4, self._state, self.keys.turn_inbox(self.turn_id), self._history, self._trimmed,
                self.attempt, self.history_ttl, "1" if closing else "0", self.history_max)  # fmt: skip

    def drained(self, reply: Any) -> list[bytes]:
        """The moved messages from a drain's reply. Raises :class:`StaleAttemptError` when fenced off."""
        if reply is None:
            raise StaleAttemptError(self.turn_id)
        return list(reply)

    def finish_script_args(self, status: str, field: str, value: str, ttl: int) -> tuple[list[str], list[Any]]:
        """Keys and args of :data:`FINISH_LUA`, the fenced final write (committed with the terminal event)."""
        keys = [self._state, self.keys.running, self.keys.conversation_turns(self.conversation_id),
                self.keys.turn_inbox(self.turn_id), self._history]
        return keys, [self.turn_id, self.attempt, status, field, value, ttl, self.history_ttl]

    async def requeue(self) -> int:
        """Hand the turn off (worker shutdown): back to ``queued`` and re-enqueued under a new job id."""
        return await requeue_turn(self.redis, self.keys, self.turn_id, str(self.attempt))

    async def requeue_if_regressed(self) -> bool:
        """After this attempt was fenced off: re-enqueue the turn when its state fell back to ``queued``
        behind this attempt (its writes were lost in a Redis failover), so it runs again instead of
        waiting for a job that no longer exists. True when it was re-enqueued."""
        count = int(await self.redis.eval(_REGRESSED, 1, self._state, self.attempt))
        if count:
            await _enqueue_turn(self.redis, self.keys, self.turn_id, self.keys.turn_rerun_job_id(self.turn_id, count))
            logger.warning("turn %s: state fell back behind attempt %d; re-enqueued", self.turn_id, self.attempt)
        return bool(count)


async def _enqueue_turn(redis: Any, keys: Keys, turn_id: str, job_id: str, defer: float | None = None) -> bool:
    """Enqueue ``run_turn`` for a turn from its stored payload; False when arq already has that job id."""
    payload = await redis.hget(keys.turn_state(turn_id), "job")
    if payload is None:
        return False
    job = TurnJob.model_validate_json(payload)
    queued = await redis.enqueue_job(
        RUN_TURN, job.model_dump(mode="json"), _job_id=job_id, _queue_name=keys.turns_queue, _defer_by=defer
    )
    return queued is not None


async def park(redis: Any, keys: Keys, turn_id: str, conversation_id: str) -> None:
    """A turn waits behind an earlier one: give up the worker slot, come back in :data:`PARK_RECHECK` seconds.

    It also makes sure the conversation's oldest turn can run (:func:`wake_head`),
    in case the wake-up of a finished turn was lost with its worker.
    """
    await _enqueue_turn(redis, keys, turn_id, keys.turn_park_job_id(turn_id, _now_ms()), defer=PARK_RECHECK)
    await wake_head(redis, keys, conversation_id)


async def wake_head(redis: Any, keys: Keys, conversation_id: str) -> str:
    """Enqueue the conversation's oldest unfinished turn if it is queued; return its id ('' if none).

    Called when a turn ends (the next one runs at once) and by parked turns.
    The job id (:meth:`Keys.turn_kick_job_id`) is fixed, so arq keeps at most one pending.
    """
    head = (await redis.eval(_HEAD, 1, keys.conversation_turns(conversation_id), keys.prefix)).decode()
    if head and await redis.hget(keys.turn_state(head), "status") == b"queued":
        await _enqueue_turn(redis, keys, head, keys.turn_kick_job_id(head))
    return head


async def requeue_turn(redis: Any, keys: Keys, turn_id: str, attempt: str = "") -> int:
    """Put a running turn back on the turns queue; with ``attempt=""`` only if its lease expired.

    Returns the re-enqueue number, or 0 when the turn was not taken. The new
    job id is unique per re-enqueue, so arq's leftover keys of the old job
    (its in-progress key survives a crash) cannot block it.
    """
    state = keys.turn_state(turn_id)
    count = int(await redis.eval(_REQUEUE, 2, state, keys.running, turn_id, attempt, _now_ms()))
    if count:
        if not await redis.hexists(state, "job"):
            raise ParseError(f"turn {turn_id} has no stored job payload")
        await _enqueue_turn(redis, keys, turn_id, keys.turn_rerun_job_id(turn_id, count))
        logger.info("turn %s re-enqueued (re-enqueue #%d)", turn_id, count)
    return count

