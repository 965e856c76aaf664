"""A turn's durable record: the fields of its state hash, its statuses, one decoder.

The state hash ``{p}:turn:{id}:state`` (:meth:`~smith_client.keys.Keys.turn_state`)
is written by the client (submission, cancel of a queued turn) and by workers
(attempts, the final write), always through the scripts of
:mod:`smith_client.scripts`, and read by the client, the worker and the
sweeper through :func:`decode_state`. The Lua files use these same field names.

``status`` goes queued → running → completed | failed | cancelled (a hand-off
or a crashed worker puts a running turn back to queued); a running turn whose
step waits for a person becomes paused, and queued again once every pending
call is decided (docs/architecture.md, Pausing for a person).
"""

from __future__ import annotations

from typing import Any

QUEUED = "queued"
RUNNING = "running"
#: Waiting for a person's decisions (not terminal; no worker holds it).
PAUSED = "paused"
COMPLETED = "completed"
FAILED = "failed"
CANCELLED = "cancelled"
#: What ``TurnHandle.status()`` says of a turn Redis does not have (never sent, or expired), as ``cancel`` does.
MISSING = "missing"
#: Statuses after which a turn changes no more.
TERMINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED})

# Field names of the state hash.
STATUS = "status"
#: The request digest (:func:`smith_client.turns.fingerprint`): same turn id + other request = conflict.
FINGERPRINT = "fingerprint"
CONVERSATION_ID = "conversation_id"
AGENT = "agent"
#: Epoch seconds (float) of the submission.
CREATED_AT = "created_at"
#: The fencing token: incremented by each worker attempt (docs/architecture.md, Fault model).
ATTEMPT = "attempt"
#: The :class:`~smith_client.jobs.TurnJob` JSON, so a turn can be re-enqueued after a crash; its ``trace`` (the
#: sender's trace context) is how every attempt of the turn continues one trace (docs/architecture.md, Tracing).
JOB = "job"
#: The worker id of the current attempt.
WORKER = "worker"
#: The arq job id the current attempt runs under ("" outside arq): the sweeper removes that job
#: from the turns queue when it re-enqueues the turn of a dead worker.
JOB_ID = "job_id"
#: Epoch ms until which the current attempt's lease holds.
LEASE_UNTIL = "lease_until"
#: Index of the turn's user message in the conversation's history, once appended.
HISTORY_START = "history_start"
#: ``"1"`` once the turn takes no more merged messages (it is finishing).
INBOX_CLOSED = "inbox_closed"
#: Why the turn was asked to stop: ``cancel`` or ``interrupt``.
CANCEL_REQUESTED = "cancel_requested"
#: ``decision`` while a turn is queued again because its paused calls were decided (decide.lua); the next
#: attempt takes it out as it begins, and says so in its ``turn.resumed``.
RESUMED_BY = "resumed_by"
#: The final :class:`~smith_client.messages.AssistantMessage` JSON of a completed turn.
RESULT = "result"
#: The error payload JSON (:meth:`~smith_client.errors.SmithError.to_payload`) of a failed turn.
ERROR = "error"
#: How many times the turn was re-enqueued (crash recovery, hand-offs).
REQUEUES = "requeues"
#: How many of those were hand-offs by the attempt's own worker, at its shutdown or after Redis failed under
#: the attempt (they do not count as failed attempts).
HANDOFFS = "handoffs"
#: Attempts whose worker died (or lost Redis for good) while it ran this turn alone: the turn may be what
#: kills its worker, so these count against ``SMITH_TURN_MAX_ATTEMPTS``.
CRASHES = "crashes"
#: Attempts whose worker died while running other turns too: bad luck, not counted against
#: ``SMITH_TURN_MAX_ATTEMPTS``, but bounded (a turn killing busy workers still stops; smith_worker/turn/lifecycle.py).
SHARED_CRASHES = "shared_crashes"


def decode_state(raw: dict[Any, Any]) -> dict[str, str]:
    """The state hash from ``HGETALL`` (bytes or str keys and values) as ``str`` → ``str``; empty when unknown."""
    return {_text(k): _text(v) for k, v in raw.items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def is_terminal(status: bytes | str | None) -> bool:
    """True when ``status`` (as read from Redis, or None) is a terminal status."""
    return status is not None and _text(status) in TERMINAL_STATUSES
