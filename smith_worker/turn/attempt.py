"""Worker side of the turn state machine: attempts, leases, fencing, checkpoints (docs/architecture.md, Fault model).

Every run of a turn is an *attempt*. :meth:`TurnAttempt.begin` atomically
moves the turn to ``running`` and increments its ``attempt`` number, which is
the fencing token: every write of the attempt (history appends, events, the
final state) is a Lua script that first checks the turn's current attempt,
so a stalled or stale attempt cannot write after another took over.

While it runs, the attempt renews a short lease (``lease`` seconds, renewed
every ``lease / 3``) in the turn's state and in ``{p}:running``; a sweeper
(:mod:`smith_worker.turn.sweeper`) re-enqueues a turn whose lease expired, under a
new arq job id, so recovery does not wait for arq's in-progress key (job
timeout + 10 s, docs/architecture.md, Keys).

The history is the checkpoint: the user message is appended once per turn
id (its absolute position kept as ``history_start``, :mod:`smith_worker.memory.history`),
assistant and tool messages are appended whole, so a re-run reads where the
turn stopped. Every append trims the history to ``history_max`` messages.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from smith_client import turn_record as record
from smith_client.enqueue import enqueue_job
from smith_client.errors import ParseError
from smith_client.eventlog import EventLog
from smith_client.events import PendingItem, TurnCompletedData, TurnPausedData
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.keys import RUNNING_TTL, Keys, now_ms
from smith_client.messages import AssistantMessage, TokenUsage, message_to_json
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.scripts import LuaScript
from smith_client.turn_record import decode_state
from smith_worker.memory.fencing import StaleAttemptError
from smith_worker.memory.history import APPEND, DEFAULT_HISTORY_MAX_MESSAGES, Repair
from smith_worker.ops.tasks import cancel_and_wait

#: The scripts of this module, in ``lua/`` beside it.
BEGIN = LuaScript("begin", __package__)
RENEW = LuaScript("renew", __package__)
REQUEUE = LuaScript("requeue", __package__)
REGRESSED = LuaScript("regressed", __package__)
FINISH = LuaScript("finish", __package__)
HEAD = LuaScript("head", __package__)
APPEND_USER = LuaScript("append_user", __package__)
DRAIN_INBOX = LuaScript("drain_inbox", __package__)
COMPLETE = LuaScript("complete", __package__)
FAIL_UNREAD = LuaScript("fail_unread", __package__)
PAUSE = LuaScript("pause", __package__)

logger = logging.getLogger("agent_smith.worker")

#: Seconds a turn's lease lives without renewal (renewed every third of it).
DEFAULT_LEASE = 10.0

#: Seconds a turn paused without an approval timeout keeps its keys at most (365 days): past that, a decision
#: finds nothing to resume.
PAUSE_KEPT_AT_MOST = 365 * 24 * 3600

#: Seconds between the checks of a parked turn (one waiting behind an earlier turn of its conversation).
#: The turn that finishes wakes the next one at once; this only covers a wake-up that was lost.
PARK_RECHECK = 15.0


class TurnAttempt:
    """One attempt at running one turn (see the module docstring).

    ``lease`` is seconds. ``on_lost`` is called (once) when renewal finds the
    lease taken over, so the owner can stop its task. ``history_max`` is the
    number of messages the stored history keeps (``SMITH_HISTORY_MAX_MESSAGES``). ``job_id`` is the arq
    job the attempt runs under (``""`` outside arq), recorded for the sweeper. The attempt's start and
    its renewals keep the turn in its worker's SET of running turns (:meth:`Keys.worker_turns`), so a
    worker that dies under the turn is blamed on it only when it ran it alone (``record.CRASHES``).
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
        history_max: int = DEFAULT_HISTORY_MAX_MESSAGES,
        job_id: str = "",
        events: EventLog | None = None,
        agent_path: list[str] | None = None,
        has_context: bool = False,
    ) -> None:
        self.redis = redis
        #: The turn has a caller context record (``TurnJob.has_context``), whose TTL follows the turn's.
        self.has_context = has_context
        self.events = events
        self.agent_path = agent_path or []
        #: Set when :meth:`queue_close`'s round trip completed the turn: the conversation's oldest unfinished
        #: turn then (None: none), for :func:`woken`.
        self.completed: Completed | None = None
        self.job_id = job_id
        self.keys = keys
        self.turn_id = turn_id
        self.conversation_id = conversation_id
        self.worker_id = worker_id
        self.lease_ms = int(lease * 1000)
        self.history_ttl = keys.history_ttl
        self.history_max = history_max
        self.attempt = 0
        self.begun_state: dict[str, str] = {}
        #: The history's absolute end as this attempt's own writes left it (None until its user message
        #: is in): each append names it, so a failover that lost some of them stops the attempt.
        self.history_end: int | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._renewing = False  # cleared by stop_renewing; the renewal loop ends on it
        self._state = keys.turn_state(turn_id)
        self._worker_turns = keys.worker_turns(worker_id)
        self._history = keys.history(conversation_id)
        self._statuses = keys.conversation_statuses(conversation_id)
        self._trimmed = keys.history_trimmed(conversation_id)

    def queue_begin(self, rt: RoundTrip) -> Pending[str]:
        """Add the start of this attempt to ``rt`` (other reads may share its round trip); the handle gets
        ``"go"`` (this attempt runs the turn), ``"wait"`` (an earlier turn of the conversation is unfinished),
        ``"done"``, ``"busy"`` (another live attempt) or ``"missing"``.

        On ``"go"``, :attr:`attempt` is set and :attr:`begun_state` is the turn's state hash as the attempt
        starts (decoded, fields in :mod:`smith_client.turn_record`), read by the same script.
        """
        keys = [
            self._state,
            self.keys.running,
            self.keys.conversation_turns(self.conversation_id),
            self._statuses,
            self._worker_turns,
        ]
        args = [self.turn_id, self.worker_id, now_ms(), self.lease_ms, RUNNING_TTL, self.job_id]
        return rt.script(BEGIN, keys, args, parse=self._begun)

    def _begun(self, reply: list[Any]) -> str:
        outcome: str = reply[0].decode()
        if outcome == "go":
            self.attempt = int(reply[1])
            flat = reply[2]
            self.begun_state = decode_state(dict(zip(flat[::2], flat[1::2], strict=True)))
        return outcome

    def start_renewing(self, on_lost: Callable[[], None]) -> None:
        """Renew the lease every third of its life until :meth:`stop_renewing`."""
        self._renewing = True
        self._renewer = asyncio.create_task(self._renew_loop(on_lost))

    async def stop_renewing(self) -> None:
        """Stop the lease renewal task (the attempt is over).

        The flag ends the loop even when the cancel is lost inside a renewal (redis-py retries a
        read that Python 3.11's ``asyncio.timeout`` turned from the cancel into a ``TimeoutError``,
        and the renewal succeeds): the loop would otherwise renew the lease of a stopped attempt
        forever, and the turn would never be re-run. Waiting is then bounded by one renewal interval.
        """
        self._renewing = False
        await cancel_and_wait(self._renewer)

    async def _renew_loop(self, on_lost: Callable[[], None]) -> None:
        while self._renewing:
            await asyncio.sleep(self.lease_ms / 3000)
            if not self._renewing:
                return
            try:
                args = [self.turn_id, self.attempt, now_ms(), self.lease_ms]
                renewed = await RENEW(self.redis, [self._state, self.keys.running, self._worker_turns], args)
            except Exception:  # a Redis blip: the lease has slack for two more tries
                logger.warning("turn %s: lease renewal failed", self.turn_id, exc_info=True)
                continue
            if not renewed:
                logger.warning("turn %s: attempt %d lost its lease", self.turn_id, self.attempt)
                on_lost()
                return

    async def state(self) -> dict[str, str]:
        """The turn's state hash, decoded (fields in :mod:`smith_client.turn_record`)."""
        return decode_state(await self.redis.hgetall(self._state))

    def queue_append_user(self, rt: RoundTrip, message: BaseModel, repair: Repair | None = None) -> Pending[int]:
        """Add the append of the turn's user message (once per turn id) to ``rt``; the handle gets its
        absolute position in the history.

        ``repair`` (error tool messages for dangling tool calls of an earlier
        turn) is inserted in the same script, so the history is repaired once
        (docs/architecture.md, Tool-call pairing); it is skipped if the history changed since
        it was computed. Running ``rt`` raises :class:`StaleAttemptError` when fenced off.
        """
        extra: list[Any] = []
        if repair is not None:
            extra = [repair.end, repair.position, *(message_to_json(m) for m in repair.messages)]
        return rt.script(
            APPEND_USER,
            [self._state, self._history, self._trimmed],
            [self.attempt, message_to_json(message), self.history_ttl, self.history_max, *extra],
            parse=self._user_appended,
        )

    def _user_appended(self, reply: Any) -> int:
        if reply == -1:
            raise StaleAttemptError(self.turn_id)
        self.history_end = int(reply[1])
        return int(reply[0])

    async def append(self, *messages: BaseModel) -> None:
        """Append whole messages to the history, fenced. Raises :class:`StaleAttemptError`."""
        if messages:
            rt = RoundTrip()
            self.queue_append(rt, *messages)
            await rt.run(self.redis)

    def queue_append(self, rt: RoundTrip, *messages: BaseModel) -> Pending[None]:
        """Add :meth:`append` of (at least one of) ``messages`` to ``rt``. Running it raises
        :class:`StaleAttemptError`, also when the history does not end where this attempt's own writes
        left it (:attr:`history_end`)."""
        blobs = [message_to_json(m) for m in messages]
        expected = "" if self.history_end is None else self.history_end
        return rt.script(
            APPEND,
            [self._state, self._history, self._trimmed],
            [self.attempt, expected, self.history_ttl, self.history_max, *blobs],
            parse=self._appended,
        )

    def _appended(self, reply: int) -> None:
        if reply < 0:
            raise StaleAttemptError(self.turn_id)
        self.history_end = int(reply)

    def queue_drain_inbox(self, rt: RoundTrip) -> Pending[list[bytes]]:
        """Add the move of merged user messages into the history to ``rt`` (to share a step's round trip);
        the handle gets the moved messages. Running ``rt`` raises :class:`StaleAttemptError` when fenced off."""
        keys = [self._state, self.keys.turn_inbox(self.turn_id), self._history, self._trimmed]
        args = [self.attempt, self.history_ttl, self.history_max]
        return rt.script(DRAIN_INBOX, keys, args, parse=self._drained)

    def _drained(self, reply: Any) -> list[bytes]:
        if reply is None:
            raise StaleAttemptError(self.turn_id)
        if self.history_end is not None:
            self.history_end += len(reply)
        return list(reply)

    def queue_close(
        self, rt: RoundTrip, final: AssistantMessage, output: Any = None, usage: TokenUsage | None = None
    ) -> Pending[list[bytes]]:
        """Add the end of the turn with answer ``final`` (``usage``: the turn's tokens, on ``turn.completed``) to
        ``rt`` (``lua/complete.lua``), after the answer's
        append: merged user messages that wait join the history instead, and the handle gets them (the
        turn goes on); when none wait, in the same script, the inbox closes, ``turn.completed`` is
        published (with ``output``, the answer's structured output, if any) and the state becomes completed;
        the handle then gets ``[]`` and :attr:`completed` is set. Running ``rt`` raises
        :class:`StaleAttemptError` when fenced off. Needs ``events``."""
        if self.events is None:
            raise RuntimeError("TurnAttempt.queue_close needs the attempt's event log (events=)")
        event_keys, event_args = self.events.publish_args(
            self.turn_id, TurnCompletedData(message=final, output=output, usage=usage), self.agent_path, self.attempt
        )
        keys = [*self._finish_keys(), self._trimmed, *event_keys[:3]]
        args = [*self._finish_args(record.COMPLETED, record.RESULT, final.model_dump_json()), self.history_max]
        closed = rt.script(COMPLETE, keys, [*args, *event_args[:2]], parse=self._closed)
        self._queue_context_ttl(rt)
        return closed

    def _closed(self, reply: Any) -> list[bytes]:
        if reply is None:
            raise StaleAttemptError(self.turn_id)
        moved: list[bytes] = reply[0]
        if moved:
            return self._drained(moved)
        self.completed = Completed(_head(reply[2]))
        return []

    def queue_finish(self, rt: RoundTrip, status: str, field: str, value: str) -> Pending[bool]:
        """Add the fenced final write (``lua/finish.lua``) to ``rt``, to commit with the terminal event:
        ``status`` and ``field`` = ``value`` in the state, which then lives ``keys.turn_ttl`` seconds.
        The handle gets False when this attempt was fenced off."""
        finished = rt.script(FINISH, self._finish_keys(), self._finish_args(status, field, value), parse=bool)
        self._queue_context_ttl(rt)
        return finished

    def _queue_context_ttl(self, rt: RoundTrip) -> None:
        """Add to ``rt`` (a turn's end) a fresh ``turn_ttl`` for its caller context record, which so expires
        with the turn's state (docs/architecture.md, Caller context; nothing without a record)."""
        if self.has_context:
            rt.call("expire", self.keys.turn_context(self.turn_id), self.keys.turn_ttl)

    def _finish_keys(self) -> list[str]:
        return [
            self._state,
            self.keys.running,
            self.keys.conversation_turns(self.conversation_id),
            self.keys.turn_inbox(self.turn_id),
            self._history,
            self._statuses,
            self._worker_turns,
            self.keys.turn_pending(self.turn_id),
            self.keys.turn_decisions(self.turn_id),
            self.keys.paused,
        ]

    def _finish_args(self, status: str, field: str, value: str) -> list[Any]:
        return [self.turn_id, self.attempt, status, field, value, self.keys.turn_ttl, self.history_ttl]

    async def pause(self, pending: list[PendingItem], kept_keys: list[str], timeout: float | None) -> int:
        """Pause the turn (``lua/pause.lua``; docs/architecture.md, Pausing for a person): ``turn.paused`` listing
        ``pending``, which are stored; the status ``paused``; the lease, the running ZSET and this worker's SET
        of running turns left. ``timeout`` (seconds, None = forever) is how long the calls wait for a person;
        the turn's keys and ``kept_keys`` (what the resumed step needs) are kept that long plus ``turn_ttl``
        (forever: at most :data:`PAUSE_KEPT_AT_MOST`, as every key has a TTL; docs/architecture.md, Lifetimes).
        Returns the event's seq. Raises :class:`StaleAttemptError` when fenced off. Needs ``events``."""
        if self.events is None:
            raise RuntimeError("TurnAttempt.pause needs the attempt's event log (events=)")
        event_keys, event_args = self.events.publish_args(
            self.turn_id, TurnPausedData(pending=pending), self.agent_path, self.attempt
        )
        life = (PAUSE_KEPT_AT_MOST if timeout is None else int(timeout)) + self.keys.turn_ttl
        deadline = "" if timeout is None else now_ms() + int(timeout * 1000)
        keys = [
            self._state,
            self.keys.running,
            self._worker_turns,
            self._statuses,
            self.keys.turn_pending(self.turn_id),
            self.keys.turn_decisions(self.turn_id),
            self.keys.paused,
            *event_keys[:3],
            *kept_keys,
        ]
        items = [part for item in pending for part in (item.call_id, item.model_dump_json())]
        args = [self.turn_id, self.attempt, deadline, life, *event_args[:2], life, *items]
        seq = int(await PAUSE(self.redis, keys, args))
        if seq < 0:
            raise StaleAttemptError(self.turn_id)
        return seq

    async def requeue(self) -> int:
        """Hand the turn off (worker shutdown): back to ``queued`` and re-enqueued under a new job id."""
        return await requeue_turn(
            self.redis, self.keys, self.turn_id, self.conversation_id, self.worker_id, str(self.attempt)
        )

    async def requeue_if_regressed(self) -> bool:
        """After this attempt was fenced off: re-enqueue the turn when its state fell back to ``queued``
        behind this attempt (its writes were lost in a Redis failover), so it runs again instead of
        waiting for a job that no longer exists. True when it was re-enqueued."""
        count = int(await REGRESSED(self.redis, [self._state], [self.attempt]))
        if count:
            await _enqueue_turn(self.redis, self.keys, self.turn_id, self.keys.turn_rerun_job_id(self.turn_id, count))
            logger.warning("turn %s: state fell back behind attempt %d; re-enqueued", self.turn_id, self.attempt)
        return bool(count)


async def _enqueue_turn(redis: Any, keys: Keys, turn_id: str, job_id: str, defer: float | None = None) -> bool:
    """Enqueue ``run_turn`` for a turn from its stored payload; False when arq already has that job id.
    Due now, it waits for admission in its tenant's line at the place of its submit (docs/architecture.md,
    Fair pickup): a turn run again after its worker died or stopped does not go to the back of the line."""
    payload, created_at = await redis.hmget(keys.turn_state(turn_id), [record.JOB, record.CREATED_AT])
    if payload is None:
        return False
    job = TurnJob.model_validate_json(payload)
    since_ms = float(created_at) * 1000 if created_at else None  # to the microsecond, as its submit placed it
    return await enqueue_job(
        redis,
        RUN_TURN,
        job.model_dump(mode="json"),
        job_id=job_id,
        queue=keys.turns_queue,
        defer=defer,
        requires=job.agent,  # on a worker serving its agent (smith_worker/routing.py)
        fair=True,  # a conversation's next turn waits its tenant's turn; a parked one (defer) was admitted
        tenant=job.tenant,
        since_ms=since_ms,
    )


async def park(redis: Any, keys: Keys, turn_id: str, conversation_id: str) -> None:
    """A turn waits behind an earlier one: give up the worker slot, come back in :data:`PARK_RECHECK` seconds.

    It also makes sure the conversation's oldest turn can run (:func:`wake_head`),
    in case the wake-up of a finished turn was lost with its worker.
    """
    await _enqueue_turn(redis, keys, turn_id, keys.turn_park_job_id(turn_id, now_ms()), defer=PARK_RECHECK)
    await wake_head(redis, keys, conversation_id)


async def wake_head(redis: Any, keys: Keys, conversation_id: str) -> str:
    """Enqueue the conversation's oldest unfinished turn if it is queued; return its id ('' if none).

    Called when a turn ends (the next one runs at once) and by parked turns.
    The job id (:meth:`Keys.turn_kick_job_id`) is fixed, so arq keeps at most one pending.
    """
    rt = RoundTrip()
    head = queue_head(rt, keys, conversation_id)
    await rt.run(redis)
    return await woken(redis, keys, head.value)


@dataclass(frozen=True)
class Head:
    """A conversation's oldest unfinished turn: its id, and whether it is queued (so it needs a job)."""

    turn_id: str
    queued: bool


@dataclass(frozen=True)
class Completed:
    """A turn completed by :meth:`TurnAttempt.queue_close`: its conversation's oldest unfinished turn
    then (None: none), to wake with :func:`woken`."""

    head: Head | None


def _head(reply: list[bytes]) -> Head | None:
    return Head(reply[0].decode(), reply[1] == record.QUEUED.encode()) if reply else None


def queue_head(rt: RoundTrip, keys: Keys, conversation_id: str) -> Pending[Head | None]:
    """Add the read of the conversation's oldest unfinished turn (``lua/head.lua``) to ``rt``, e.g. the
    transaction that ends a turn; pass its value to :func:`woken`. None: the conversation has none."""
    turns = [keys.conversation_turns(conversation_id), keys.conversation_statuses(conversation_id)]
    return rt.script(HEAD, turns, parse=_head)


async def woken(redis: Any, keys: Keys, head: Head | None) -> str:
    """The second half of :func:`wake_head`, given :func:`queue_head`'s value: enqueue the head if queued;
    return its id ('' if none)."""
    if head is None:
        return ""
    if head.queued:
        await _enqueue_turn(redis, keys, head.turn_id, keys.turn_kick_job_id(head.turn_id))
    return head.turn_id


async def requeue_turn(
    redis: Any, keys: Keys, turn_id: str, conversation_id: str, worker_id: str, attempt: str = ""
) -> int:
    """Put a running turn of ``conversation_id`` back on the turns queue; with ``attempt=""`` only if its
    lease expired. ``worker_id`` is the worker of the attempt that stops (its SET of running turns).

    Returns the re-enqueue number, or 0 when the turn was not taken. The new
    job id is unique per re-enqueue, so arq's leftover keys of the old job
    (its in-progress key survives a crash) cannot block it.
    """
    state = keys.turn_state(turn_id)
    script_keys = [state, keys.running, keys.conversation_statuses(conversation_id), keys.worker_turns(worker_id)]
    count = int(await REQUEUE(redis, script_keys, [turn_id, attempt, now_ms()]))
    if count:
        if not await redis.hexists(state, record.JOB):
            raise ParseError(f"turn {turn_id} has no stored job payload")
        await _enqueue_turn(redis, keys, turn_id, keys.turn_rerun_job_id(turn_id, count))
        logger.info("turn %s re-enqueued (re-enqueue #%d)", turn_id, count)
    return count
