"""Redis key, channel, queue and job-id naming: the one place names are built.

Every name starts with the deployment's prefix (``SMITH_PREFIX``, default
``smith``) so several deployments or test runs can share one Redis database.
arq's own keys (``arq:job:<id>``, ``arq:result:<id>``, ``arq:in-progress:<id>``)
are global per database, so queue names and job ids carry the prefix too.

Lifetimes (DESIGN.md §8; every key has a TTL or an owner):

================================  ======================================  ==========================
key                               what                                    lifetime
================================  ======================================  ==========================
``{p}:turns`` / ``{p}:tools``     arq queues (ZSET)                        owned by arq and the queue's workers (*)
``{p}:turn:{t}:seq``              event sequence counter                   ``turn_ttl`` after the last event
``{p}:turn:{t}:log``              replay log (Redis Stream)                ``turn_ttl`` after the last event
``{p}:turn:{t}:state``            turn status and result (hash)            ``turn_ttl``
``{p}:tree:{r}:iterations``       model calls of a root turn's agent tree  ``turn_ttl`` after the last step
``{p}:conv:{c}:history``          conversation messages (list)             ``history_ttl`` after the last write
``{p}:conv:{c}:trimmed``          messages trimmed from the history's head ``history_ttl`` after the last write
``{p}:conv:{c}:summary``          SummaryMemory's summary + coverage      ``history_ttl`` after the last read or write
``{p}:toolres:{t}:{step}:{i}``    a tool call's result                     ``turn_ttl``
``{p}:workers``                   live workers (ZSET id → expiry ms)       pruned by workers; 1 day TTL
``{p}:worker:{w}``                one worker's registration                heartbeat TTL
``{p}:mcp:{alias}:tools``         an MCP server's tool schemas (JSON)      the server's ``schema_cache_ttl`` (300 s)
``{p}:running``                   running turns (ZSET id → lease expiry)   turn workers remove on finish; sweeper; 1 day TTL
``{p}:conv:{c}:turns``            the conversation's unfinished turns      ``history_ttl``; finished turns removed
``{p}:turn:{t}:inbox``            user messages merged into a turn         ``turn_ttl``
``{p}:toolres:{t}:{s}:{i}:started``  which tool worker started a call      ``turn_ttl``
``{p}:conv:{c}:skills``           the conversation's active skills (list)  ``history_ttl`` after the last activation or step
``{p}:toolres:{t}:{s}:{i}:published``  the call's ``tool.result`` is out     ``turn_ttl``
``arq:abort``                     arq's abort requests (global ZSET)      entries pruned after 60 s; key TTL 60 s
================================  ======================================  ==========================

(*) No TTL, by design: a worker removes a job from its queue when it takes it, and
Redis deletes the ZSET with its last member; a TTL would drop queued jobs. A queue
that no worker serves therefore keeps its jobs (and the key) until a worker of it
starts; the hygiene report lists it with this owner
(:func:`smith_client.hygiene.owned_keys_without_ttl`).

``{p}:worker:{w}:replies`` and ``{p}:control`` are pub/sub channels (no key).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from arq.constants import abort_jobs_ss, in_progress_key_prefix, job_key_prefix, result_key_prefix, retry_key_prefix

#: Idle lifetime of a conversation's keys (history, active skills), in seconds: 30 days (DESIGN.md §8).
DEFAULT_HISTORY_TTL = 30 * 24 * 3600

#: Allowed characters for ids chosen by callers (turn ids, conversation ids, agent names).
ID_PATTERN = re.compile(r"[A-Za-z0-9_.:@-]{1,200}\Z")
#: Separator of the runtime's own job-id suffixes; never allowed in caller ids (:data:`ID_PATTERN`).
JOB_SUFFIX = "#"


@dataclass(frozen=True)
class Keys:
    """Names for one deployment prefix. All methods return ``str``."""

    prefix: str = "smith"

    @property
    def turns_queue(self) -> str:
        """The arq queue that turn workers serve."""
        return f"{self.prefix}:turns"

    @property
    def tools_queue(self) -> str:
        """The arq queue that tool workers serve."""
        return f"{self.prefix}:tools"

    def turn_job_id(self, turn_id: str) -> str:
        """arq job id of a turn: one job per turn id, so enqueue is idempotent."""
        return f"{self.prefix}:turn:{turn_id}"

    def tool_job_id(self, turn_id: str, step: int, index: int) -> str:
        """arq job id of a tool call: turn id + step + position in ``tool_calls``.

        Built from the position, not the server's call id, because servers may
        send empty or repeated ids (DESIGN.md §4 step 4).
        """
        return f"{self.prefix}:tool:{turn_id}:{step}:{index}"

    def turn_events_channel(self, turn_id: str) -> str:
        """Pub/sub channel of a turn's live events."""
        return f"{self.prefix}:turn:{turn_id}:events"

    def turn_log(self, turn_id: str) -> str:
        """Redis Stream holding a turn's events (entry id ``0-<seq>``), for replay."""
        return f"{self.prefix}:turn:{turn_id}:log"

    def turn_seq(self, turn_id: str) -> str:
        """Counter assigning a turn's event sequence numbers."""
        return f"{self.prefix}:turn:{turn_id}:seq"

    def turn_state(self, turn_id: str) -> str:
        """Hash of a turn's state (see :mod:`smith_client.turns`)."""
        return f"{self.prefix}:turn:{turn_id}:state"

    def tree_iterations(self, root_turn_id: str) -> str:
        """Counter of model calls made by a root turn and all its sub-agents (seed §14.2, §15.3)."""
        return f"{self.prefix}:tree:{root_turn_id}:iterations"

    def history(self, conversation_id: str) -> str:
        """List of a conversation's messages (stored form)."""
        return f"{self.prefix}:conv:{conversation_id}:history"

    def conversation_skills(self, conversation_id: str) -> str:
        """List of the skill names active in a conversation, in activation order (see :mod:`smith_client.skills`).

        Part of the conversation's state: a conversation clear deletes it with the history.
        """
        return f"{self.prefix}:conv:{conversation_id}:skills"

    def history_trimmed(self, conversation_id: str) -> str:
        """Counter of messages trimmed from the head of the history: list index + this = absolute position."""
        return f"{self.prefix}:conv:{conversation_id}:trimmed"

    def conversation_summary(self, conversation_id: str) -> str:
        """Hash of ``SummaryMemory``'s state: ``text`` and ``covers`` (absolute position it summarises up to)."""
        return f"{self.prefix}:conv:{conversation_id}:summary"

    def conversation_state(self, conversation_id: str) -> list[str]:
        """Every key of a conversation's own state: messages, memory state, active skills (what
        ``SmithClient.clear`` deletes)."""
        return [self.history(conversation_id), self.history_trimmed(conversation_id),
                self.conversation_summary(conversation_id), self.conversation_skills(conversation_id)]

    def tool_result(self, turn_id: str, step: int, index: int) -> str:
        """A tool call's outcome (:class:`~smith_client.jobs.ToolOutcome` JSON); first writer wins."""
        return f"{self.prefix}:toolres:{turn_id}:{step}:{index}"

    @property
    def workers(self) -> str:
        """ZSET of live workers: worker id → registration expiry (epoch ms)."""
        return f"{self.prefix}:workers"

    def worker(self, worker_id: str) -> str:
        """One worker's registration (JSON: queue, agents, skills, tools, pid, host)."""
        return f"{self.prefix}:worker:{worker_id}"

    def mcp_tools(self, alias: str) -> str:
        """Cached tool schemas of MCP server ``alias``, for turn workers (written with a TTL)."""
        return f"{self.prefix}:mcp:{alias}:tools"

    def worker_replies_channel(self, worker_id: str) -> str:
        """Pub/sub channel on which tool workers notify a turn worker of finished tool jobs."""
        return f"{self.prefix}:worker:{worker_id}:replies"

    @property
    def running(self) -> str:
        """ZSET of running turns: turn id → lease expiry (epoch ms); the sweeper re-enqueues expired ones."""
        return f"{self.prefix}:running"

    def conversation_turns(self, conversation_id: str) -> str:
        """List of the conversation's unfinished turn ids, oldest first: the FIFO of ``multitask="enqueue"``."""
        return f"{self.prefix}:conv:{conversation_id}:turns"

    def turn_inbox(self, turn_id: str) -> str:
        """User messages merged into a running turn (``multitask="merge"``)."""
        return f"{self.prefix}:turn:{turn_id}:inbox"

    def tool_started(self, turn_id: str, step: int, index: int) -> str:
        """Marker: which tool worker started a call (tells a live runner from a dead one on resume)."""
        return f"{self.tool_result(turn_id, step, index)}:started"

    def tool_reruns(self, turn_id: str, step: int, index: int) -> str:
        """Counter: re-runs of an idempotent call after its tool worker died (bounded, issue 8)."""
        return f"{self.tool_result(turn_id, step, index)}:reruns"

    @property
    def control_channel(self) -> str:
        """Pub/sub channel of control messages to turn workers (a turn id to cancel)."""
        return f"{self.prefix}:control"

    def turn_rerun_job_id(self, turn_id: str, attempt: int) -> str:
        """arq job id of a re-enqueued turn (a crash or a handed-off turn); unique per re-enqueue.

        Runtime suffixes start with :data:`JOB_SUFFIX` (``#``), which :data:`ID_PATTERN`
        refuses in caller ids, so a caller's turn id ``X:r1`` never names a re-run of ``X``.
        """
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}r{attempt}"

    def turn_park_job_id(self, turn_id: str, at_ms: int) -> str:
        """arq job id of a parked turn's re-check, enqueued at epoch ms ``at_ms``."""
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}w{at_ms}"

    def turn_kick_job_id(self, turn_id: str) -> str:
        """arq job id of the wake-up of a conversation's next turn (fixed: arq keeps at most one pending)."""
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}kick"

    def tool_rerun_job_id(self, turn_id: str, step: int, index: int, at_ms: int) -> str:
        """arq job id of an idempotent tool call re-run after its tool worker died (epoch ms ``at_ms``)."""
        return f"{self.tool_job_id(turn_id, step, index)}{JOB_SUFFIX}r{at_ms}"

    def tool_result_published(self, turn_id: str, step: int, index: int) -> str:
        """Marker set atomically with a call's ``tool.result`` event, so the event is published once."""
        return f"{self.tool_result(turn_id, step, index)}:published"

    @property
    def acl_patterns(self) -> list[str]:
        """Redis ACL key (``~``) and channel (``&``) patterns covering everything this prefix uses.

        Its own keys and channels, plus arq's per-job keys of its job ids (which
        all start with the prefix) and arq's abort set, which arq shares per
        database. A plain ``~arq:*`` would also let a tenant read another
        tenant's queued job payloads. See :mod:`smith_client.acl`.
        """
        return [*(f"~{pattern}" for pattern in self.key_patterns), f"~{abort_jobs_ss}", f"&{self.prefix}:*"]

    @property
    def key_patterns(self) -> list[str]:
        """Glob patterns (``SCAN MATCH``) of every key of this prefix: its own and arq's per-job keys.

        Not arq's abort set, which all prefixes of the database share.
        """
        p = self.prefix
        arq_keys = [f"{kind}{p}:*" for kind in (job_key_prefix, in_progress_key_prefix, result_key_prefix,
                                                 retry_key_prefix)]
        return [f"{p}:*", *arq_keys]
