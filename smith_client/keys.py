"""Redis key, channel, queue and job-id naming: the one place names are built.

Every name starts with the deployment's prefix (``SMITH_PREFIX``, default
``smith``) so several deployments or test runs can share one Redis database.
arq's own keys (``arq:job:<id>``, ``arq:result:<id>``, ``arq:in-progress:<id>``)
are global per database, so queue names and job ids carry the prefix too. arq's one
key that no job id names, its abort set ``arq:abort``, is replaced by the prefix's
own (:attr:`Keys.abort_set`): no process of this project touches ``arq:abort``. On Redis
Cluster the prefix is a hash tag, ``{smith}`` (:attr:`Keys.key_prefix`), and every
name below starts with it: the whole deployment lives in one hash slot. A deployment sharded by conversation
(``SMITH_SHARDS``; docs/cluster.md, Shards) has one set of these names per shard, under the prefix
``<prefix>:s<k>`` (:func:`shard_prefix`; a hash slot per shard on a cluster), but for the model endpoints' rate
limits (:meth:`Keys.llm_rate_limit`), which every shard's workers share under the prefix itself.

Lifetimes (docs/architecture.md, Keys and Lifetimes; every key has a TTL or an owner). ``turn_ttl`` and
``history_ttl`` are the two configurable ones (:attr:`Keys.turn_ttl`,
:attr:`Keys.history_ttl`; ``SMITH_TURN_TTL`` / ``SMITH_HISTORY_TTL``, read by
:class:`~smith_client.settings.ClientSettings` for workers and clients alike); the others are the
constants below the table.

=======================================  ==============================  =========================================
key                                      what                            lifetime
=======================================  ==============================  =========================================
``{p}:turns`` / ``{p}:tools``            arq queues (ZSET)               owned by arq and its workers (*)
``{p}:turns:wake`` / ``…:tools:wake``    wake-up tokens (list)           :data:`WAKE_TTL` after the last push,
                                                                         at most :data:`WAKE_CAP` entries
``{p}:turns:wake:{d}`` (and tools)       tokens for capability set d     :data:`WAKE_TTL`, :data:`WAKE_CAP` (as above)
``{p}:turns:requires`` (and tools)       job id → what the job needs     its longest-lived job's expiry; an entry
                                                                         goes when its job leaves the queue
``{p}:turns:capsets`` (and tools)        live capability sets (ZSET)     pruned by workers; :data:`WORKERS_TTL`
``{p}:turns:caps:{d}`` (and tools)       what set d's workers serve      :data:`REGISTRATION_TTL` (heartbeat)
``{p}:turn:{t}:seq``                     event sequence counter          ``turn_ttl`` after the last event
``{p}:turn:{t}:log``                     replay log (Redis Stream)       ``turn_ttl`` after the last event
``{p}:turn:{t}:state``                   turn status and result (hash)   ``turn_ttl``
``{p}:tree:{r}:iterations``              model calls of an agent tree    ``turn_ttl`` after the last step
``{p}:tree:{r}:tokens``                  tokens reported for that tree   ``turn_ttl`` after the last step
``{p}:turn:{r}:agent#{pos}:history``     a sub-agent's messages (list)   ``turn_ttl`` after the last write
``{p}:turn:{r}:agent#{pos}:trimmed``     its trimmed-message counter     ``turn_ttl`` after the last write
``{p}:conv:{c}:history``                 conversation messages (list)    ``history_ttl`` after the last write
``{p}:conv:{c}:trimmed``                 messages trimmed from the head  ``history_ttl`` after the last write
``{p}:conv:{c}:summary``                 SummaryMemory's summary         ``history_ttl`` after the last use
``{p}:toolres:{t}:{step}:{i}``           a tool call's result            ``turn_ttl``
``{p}:toolres:{t}#{pos}:{step}:{i}``     a sub-agent's call's result     ``turn_ttl``
``{p}:workers``                          live workers (ZSET)             pruned by workers; :data:`WORKERS_TTL`
``{p}:worker:{w}``                       one worker's registration       :data:`REGISTRATION_TTL` (heartbeat)
``{p}:worker-turns:{w}``                 turns worker w runs (SET)       3 turn leases after the last start or renewal
``{p}:mcp:{alias}:tools``                an MCP server's tool schemas    ``schema_cache_ttl`` (300 s)
``{p}:running``                          running turns (ZSET)            removed on finish; :data:`RUNNING_TTL`
``{p}:conv:{c}:turns``                   unfinished turns (FIFO list)    ``history_ttl``; finished turns removed
``{p}:conv:{c}:statuses``                unfinished turn id → status     ``history_ttl``; finished turns removed
``{p}:turn:{t}:inbox``                   messages merged into a turn     ``turn_ttl``
``{p}:turn:{t}:context``                 the caller's context (JSON)     ``turn_ttl`` (from the submit, each
                                                                         attempt's start and the turn's end;
                                                                         a pause's life while paused)
``{p}:turn:{t}:pending``                 a paused turn's pending calls   its pause's life (approval timeout +
                                                                         ``turn_ttl``; none: no TTL); the turn's
                                                                         end deletes it
``{p}:turn:{t}:decisions``               decisions on those calls        as ``pending``
``{p}:paused``                           paused turns (ZSET) by deadline owned (*): decide, cancel, the turn's end
                                                                         and the sweeper remove entries
``{p}:turn:{t}:inputs``                  open MCP elicitations (hash)    the newest one's wait + :data:`INPUT_GRACE`;
                                                                         each goes when answered or timed out
``{p}:turn:{t}:input:{r}``               the answer to elicitation r     :data:`INPUT_REPLY_TTL` (popped at once)
``{p}:toolres:{t}:{s}:{i}:started``      which tool worker started it    ``turn_ttl``
``{p}:conv:{c}:skills``                  active skills (list)            ``history_ttl`` after the last use
``{p}:conv:{c}:agent``                   current agent (handoffs)        ``history_ttl`` after the last handoff
``{p}:toolres:{t}:{s}:{i}:published``    its ``tool.result`` is out      ``turn_ttl``
``{p}:toolres:{t}:{s}:{i}:decided``      its decision was announced      ``turn_ttl``; its step's pause's life while
                                         (``tool_call.decided``)         that step pauses again
``{p}:toolres:{t}:{s}:{i}:reruns``       re-runs of an idempotent call   ``turn_ttl``
``{p}:usage:{m}``                        model calls and tokens of epoch :data:`USAGE_TTL` after the last count
                                         minute m, per agent (hash)
``{p}:turns:waiting:{t}``                tenant t's turn jobs waiting    its longest-lived job's expiry
                                         for admission (ZSET)
``{p}:turns:tenants``                    tenants with waiting jobs →     as above
                                         their pass (ZSET)
``{p}:turns:running:{t}``                capped tenant t's admitted jobs the in-progress TTL
                                         (ZSET)
``{p}:tenant:{t}:limits``                tenant t's limits (hash)        owned (*) by the operator: no TTL;
                                                                         ``clear_tenant_limits`` deletes it
``{p}:tenant:{t}:quota:{w}``             tokens tenant t used in the     its window + :data:`QUOTA_TTL_MARGIN`
                                         quota window starting at w      after the last count
``{p}:shard-count``                      a sharded deployment's          ``history_ttl`` after the last worker
                                         ``SMITH_SHARDS``                start
``{p}:turn-shard:{t}``                   the shard of caller-chosen      ``turn_ttl``
                                         turn id t (sharded)
``{p}:llm-rate:{e}``                     model endpoint e's fleet-wide   until its state says nothing more: the
                                         rate limit and pause (hash)     later of its theoretical arrival times
                                                                         and its pause (set by each change)
``{p}:abort-requests``                   abort requests of tool jobs     :data:`ABORT_ENTRY_TTL` after the last
                                         (ZSET job id → request ms), in  abort; each abort prunes entries older
                                         place of arq's ``arq:abort``    than that; a job's entry goes when its
                                                                         worker takes it or the job ends
``arq:job:{id}``, ``arq:in-progress:…``  arq's per-job keys              owned by arq
=======================================  ==============================  =========================================

(*) No TTL, by design (a tenant's limits are configuration, kept until ``clear_tenant_limits``): a worker
removes a job from its queue when it takes it, and Redis deletes the ZSET with its last member; a TTL would drop
queued jobs (and, for ``{p}:paused``, the deadlines of turns paused for longer than any TTL). A queue
that no worker serves therefore keeps its jobs (and the key) until a worker of it
starts; the hygiene report lists it with this owner
(:func:`smith_client.hygiene.owned_keys_without_ttl`).

``{p}:worker:{w}:replies``, ``{p}:control`` and ``{p}:tools:aborts`` are pub/sub channels (no key).

Sub-agents share their root turn's keys; their own tool calls are
told apart by ``pos``, the agent's position in the tree (:func:`tree_position`):
the chain of ``step.index`` of the calls that created it, root first
(``"1.0/2.1"``; ``""`` for the root agent). It follows :data:`JOB_SUFFIX`, which
caller ids cannot contain, so no caller turn id names a sub-agent's call.
"""

from __future__ import annotations

import binascii
import re
import time
from dataclasses import dataclass

from arq.constants import abort_jobs_ss, in_progress_key_prefix, job_key_prefix, result_key_prefix, retry_key_prefix

#: Idle lifetime of a conversation's keys (history, FIFO, statuses, active skills), seconds: 30 days.
DEFAULT_HISTORY_TTL = 30 * 24 * 3600
#: Lifetime of a turn's keys (state, log, counter, tool results) after its last write, seconds: 24 h.
DEFAULT_TURN_TTL = 24 * 3600
#: TTL of the ``{p}:running`` and ``{p}:workers`` ZSETs, refreshed on every write, seconds: 1 day.
RUNNING_TTL = 24 * 3600
WORKERS_TTL = 24 * 3600
#: A worker registration's lifetime without a heartbeat, seconds (renewed every third of it).
REGISTRATION_TTL = 15
#: How long an abort request stays in the abort set (:attr:`Keys.abort_set`), seconds: ``abort.lua`` prunes older
#: entries, since arq's own pruning removes nothing (https://github.com/python-arq/arq/issues/485).
ABORT_ENTRY_TTL = 60

#: Lifetime of a queue's wake-up list after its last push, seconds: a token only says "poll now", so an
#: unconsumed one is worthless after a few fallback polls (smith_worker/queue/pickup.py).
WAKE_TTL = 60
#: Most tokens a wake-up list keeps (a burst of enqueues with no worker listening must not grow it).
WAKE_CAP = 100
#: Lifetime of arq's try counter of a job (:meth:`Keys.arq_retry`), seconds: the value arq 0.28's ``run_job``
#: gives it, which the claim script (``lua/claim.lua``) sets in its place.
ARQ_RETRY_TTL = 88400

#: Seconds an open MCP elicitation's entry (:meth:`Keys.turn_inputs`) outlives its wait (a tool worker that
#: died while waiting leaves it behind for that long).
INPUT_GRACE = 60
#: Lifetime of an answer to an MCP elicitation (:meth:`Keys.turn_input_reply`), seconds: the waiting tool
#: worker pops it at once; an answer nobody waits for any more goes after this.
INPUT_REPLY_TTL = 60

#: Lifetime of a usage bucket (:meth:`Keys.usage_bucket`) after its last count, seconds: 25 h, an hour over
#: the longest window read (``smith_client.usage.USAGE_MAX_WINDOW``, 24 h), so a day's window finds every bucket.
USAGE_TTL = 25 * 3600

#: How long a tenant's quota counter (:meth:`Keys.tenant_quota`) outlives its window, seconds: an hour, so a
#: count that lands just before the window ends is still read whole while the window lasts.
QUOTA_TTL_MARGIN = 3600

#: The end of a tenant's limits key after the tenant (:meth:`Keys.tenant_limits`).
TENANT_LIMITS_SUFFIX = ":limits"

#: Allowed characters for ids chosen by callers (turn ids, conversation ids, agent names).
ID_PATTERN = re.compile(r"[A-Za-z0-9_.:@-]{1,200}\Z")
#: Separator of the runtime's own job-id suffixes; never allowed in caller ids (:data:`ID_PATTERN`).
JOB_SUFFIX = "#"


#: Most shards a deployment may have (``SMITH_SHARDS``; docs/cluster.md, Shards): beyond a few per master they only
#: add connections (each client holds one pub/sub connection per shard).
MAX_SHARDS = 256


def shard_of(conversation_id: str, shards: int) -> int:
    """The shard (0 … ``shards`` - 1) of a conversation: CRC16-CCITT (XMODEM) of its UTF-8 id mod ``shards``.

    The CRC is the one Redis Cluster hashes key names with (redis.io, "Redis cluster specification", Key
    distribution model), so a client in any language computes the same shard; unlike Python's ``hash`` it is
    the same in every process. Every turn of a conversation is in its shard (docs/cluster.md, Shards)."""
    return binascii.crc_hqx(conversation_id.encode(), 0) % shards


def shard_prefix(prefix: str, shard: int, shards: int) -> str:
    """The key prefix of shard ``shard`` of a deployment of ``shards`` shards under ``prefix``: ``prefix`` itself
    when there is one shard (the layout of an unsharded deployment), else ``<prefix>:s<shard>`` (``smith:s3``;
    on Redis Cluster the hash tag ``{smith:s3}``, a slot of its own). Raises ``ValueError`` for a shard out of
    range."""
    if not 0 <= shard < shards:
        raise ValueError(f"shard {shard} is not one of 0-{shards - 1}")
    return prefix if shards == 1 else f"{prefix}:s{shard}"


def tree_position(parent: str, step: int, index: int) -> str:
    """The tree position of the sub-agent created by call ``index`` of step ``step`` of the agent at ``parent``
    (``""`` for the root): ``"<step>.<index>"`` appended to ``parent`` with ``/``."""
    return f"{parent}/{step}.{index}" if parent else f"{step}.{index}"


def _scoped(turn_id: str, position: str) -> str:
    """``turn_id``, or for a sub-agent at ``position`` ``turn_id#position`` (see the module docstring)."""
    return f"{turn_id}{JOB_SUFFIX}{position}" if position else turn_id


def now_ms() -> int:
    """The current epoch time in milliseconds (lease expiries, registration expiries, job-id stamps)."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class Keys:
    """Names (and the two configurable lifetimes) for one deployment prefix. All name methods return ``str``.

    ``turn_ttl`` and ``history_ttl`` are seconds (see the module docstring's table).
    """

    prefix: str = "smith"
    turn_ttl: int = DEFAULT_TURN_TTL
    history_ttl: int = DEFAULT_HISTORY_TTL
    #: The deployment runs on Redis Cluster (``SMITH_REDIS_CLUSTER``): every name then starts with the prefix as a
    #: hash tag, ``{smith}``, so all of them hash to one slot (docs/cluster.md, One hash slot).
    cluster: bool = False

    @property
    def key_prefix(self) -> str:
        """The start of every key, channel and job id name: the prefix (``smith``), or with :attr:`cluster` the
        prefix as a Redis Cluster hash tag (``{smith}``: redis.io, "Redis cluster specification", Hash tags; the
        first ``{…}`` of a name decides its slot, so arq's ``arq:job:{smith}:…`` keys land there too). Prefixes
        cannot contain ``{`` or ``}`` (:data:`ID_PATTERN`), so no other braces come before the tag."""
        return f"{{{self.prefix}}}" if self.cluster else self.prefix

    @property
    def cluster_slot_key(self) -> str | None:
        """A name whose hash slot every name of these keys shares (the tag alone), for the slot-pinned connection
        of :func:`smith_client.connection.connect_redis`; ``None`` without :attr:`cluster`."""
        return self.key_prefix if self.cluster else None

    @property
    def turns_queue(self) -> str:
        """The arq queue that turn workers serve."""
        return f"{self.key_prefix}:turns"

    @property
    def tools_queue(self) -> str:
        """The arq queue that tool workers serve."""
        return f"{self.key_prefix}:tools"

    @staticmethod
    def wake_list(queue_name: str, capset: str = "") -> str:
        """List of wake-up tokens of arq queue ``queue_name``: every enqueue pushes one, idle workers of
        the queue block on it (``BLPOP``) instead of polling (smith_worker/queue/pickup.py). With ``capset``
        (a capability set's digest, :meth:`capability_set`), the tokens of the jobs only some live
        capability sets serve, one list per set that serves the job (``lua/lib.lua`` ``enqueue_job``)."""
        return f"{Keys.capability_prefixes(queue_name)[1]}{capset}" if capset else f"{queue_name}:wake"

    @staticmethod
    def job_requirements(queue_name: str) -> str:
        """Hash of the queued jobs of ``queue_name`` that need something to run → what they need (a turn
        job its agent, a tool job its tool, see smith_worker/routing.py), each prefixed by where its
        wake-up token went: ``*`` the queue's :meth:`wake_list`, ``@`` the lists of the capability sets
        that serve it. Written by the enqueue, read by the claim (``lua/claim.lua``): a worker claims
        only a job its capability set holds. A job's entry is deleted when the job leaves the queue."""
        return f"{queue_name}:requires"

    @staticmethod
    def capability_sets(queue_name: str) -> str:
        """ZSET of the capability sets of the live workers of ``queue_name``: digest → expiry (epoch ms)."""
        return f"{queue_name}:capsets"

    @staticmethod
    def capability_set(queue_name: str, digest: str) -> str:
        """SET of what the workers of capability set ``digest`` serve (agent names on the turns queue,
        tool requirements on the tools queue; smith_worker/routing.py). Workers of one app version share it:
        ``digest`` is a hash of its members."""
        return f"{Keys.capability_prefixes(queue_name)[0]}{digest}"

    @staticmethod
    def capability_prefixes(queue_name: str) -> list[str]:
        """The prefixes of :meth:`capability_set` and of a capability set's :meth:`wake_list`, in that
        order: the enqueue script (``lua/lib.lua``) appends to them the digests of the live sets it reads
        from :meth:`capability_sets`."""
        return [f"{queue_name}:caps:", f"{queue_name}:wake:"]

    @staticmethod
    def tenant_ring(queue_name: str) -> str:
        """ZSET of the tenants with turn jobs waiting on ``queue_name`` → their pass (start-time fair queuing,
        docs/architecture.md, Fair pickup): the claim admits the next job of the tenant with the lowest pass
        and adds 1/weight to it. The tenant of a turn without one is ``""``. A tenant leaves it when its
        :meth:`tenant_waiting` empties; it expires with the jobs' records (refreshed by each enqueue)."""
        return f"{queue_name}:tenants"

    @staticmethod
    def tenant_waiting(queue_name: str, tenant: str | None) -> str:
        """ZSET of one tenant's turn jobs waiting to be admitted to ``queue_name`` (job id → enqueue score, epoch
        ms), in the order they run; written by the enqueue (``lua/lib.lua``), emptied by the claim
        (``lua/claim.lua``); expires with the jobs' records. ``None``: turns without a tenant."""
        return f"{Keys.tenant_prefixes(queue_name)[0]}{tenant or ''}"

    @staticmethod
    def tenant_running(queue_name: str, tenant: str | None) -> str:
        """ZSET of one tenant's jobs admitted by the claim while the tenant has a ``max_running`` cap (job id →
        lease end, epoch ms); a member whose arq in-progress key is gone has ended and is dropped when the cap is
        next checked; the ZSET expires after the in-progress TTL. ``None``: turns without a tenant."""
        return f"{Keys.tenant_prefixes(queue_name)[1]}{tenant or ''}"

    def tenant_limits_affixes(self) -> list[str]:
        """The prefix and suffix of :meth:`tenant_limits`: the claim (``lua/claim.lua``) puts between them the
        tenants it reads from :meth:`tenant_ring`."""
        return [self.tenant_limits_prefix, TENANT_LIMITS_SUFFIX]

    @staticmethod
    def tenant_prefixes(queue_name: str) -> list[str]:
        """The prefixes of :meth:`tenant_waiting` and :meth:`tenant_running`, in that order: the scripts append
        the tenant they read from :meth:`tenant_ring` (``""`` for none)."""
        return [f"{queue_name}:waiting:", f"{queue_name}:running:"]

    def turn_job_id(self, turn_id: str) -> str:
        """arq job id of a turn: one job per turn id, so enqueue is idempotent."""
        return f"{self.key_prefix}:turn:{turn_id}"

    def tool_job_id(self, turn_id: str, step: int, index: int, position: str = "") -> str:
        """arq job id of a tool call: turn id (+ the calling sub-agent's tree ``position``) + step +
        position in ``tool_calls``.

        Built from the position, not the server's call id, because servers may
        send empty or repeated ids (docs/architecture.md, Tool calls).
        """
        return f"{self.key_prefix}:tool:{_scoped(turn_id, position)}:{step}:{index}"

    def turn_events_channel(self, turn_id: str) -> str:
        """Pub/sub channel of a turn's live events; with :attr:`cluster` a sharded pub/sub channel (``SPUBLISH`` /
        ``SSUBSCRIBE``, Redis 7), delivered within its slot's master and replicas (docs/cluster.md, Pub/sub)."""
        return f"{self.key_prefix}:turn:{turn_id}:events"

    def turn_log(self, turn_id: str) -> str:
        """Redis Stream holding a turn's events (entry id ``0-<seq>``), for replay."""
        return f"{self.key_prefix}:turn:{turn_id}:log"

    def turn_seq(self, turn_id: str) -> str:
        """Counter assigning a turn's event sequence numbers."""
        return f"{self.key_prefix}:turn:{turn_id}:seq"

    def turn_state(self, turn_id: str) -> str:
        """Hash of a turn's state (see :mod:`smith_client.turns`)."""
        return f"{self.key_prefix}:turn:{turn_id}:state"

    def tree_iterations(self, root_turn_id: str) -> str:
        """Counter of model calls made by a root turn and all its sub-agents (docs/architecture.md, Sub-agents)."""
        return f"{self.key_prefix}:tree:{root_turn_id}:iterations"

    def tree_tokens(self, root_turn_id: str) -> str:
        """Counter of the tokens the server reported for every model call of a root turn's agent tree."""
        return f"{self.key_prefix}:tree:{root_turn_id}:tokens"

    def tree_sampled(self, root_turn_id: str) -> str:
        """Hash of the tokens MCP servers' sampling used for each agent of a root turn's tree (docs/architecture.md,
        MCP): fields ``prompt:<position>``, ``completion:<position>``, ``total:<position>`` (position ``""`` for
        the root agent; :func:`tree_position`)."""
        return f"{self.key_prefix}:tree:{root_turn_id}:sampled"

    def usage_bucket(self, minute: int) -> str:
        """Hash of the model calls and reported tokens counted in epoch minute ``minute`` (Unix seconds // 60) by
        the deployment's workers: fields ``<agent>:<kind>`` (:mod:`smith_client.usage`; docs/architecture.md,
        Token usage). Lives :data:`USAGE_TTL` after its last count."""
        return f"{self.key_prefix}:usage:{minute}"

    @property
    def tenant_limits_prefix(self) -> str:
        """The start of every tenant's limits key: ``{p}:tenant:``; the key of tenant ``t`` is this + ``t`` +
        :data:`TENANT_LIMITS_SUFFIX` (:meth:`tenant_limits`), for a script that reads tenants from data."""
        return f"{self.key_prefix}:tenant:"

    def tenant_limits(self, tenant: str) -> str:
        """Hash of tenant ``tenant``'s limits (:class:`~smith_client.tenants.TenantLimits`; docs/tenants.md):
        fields ``weight``, ``max_running``, ``token_quota``, ``quota_window_seconds``, an absent one meaning its
        default. Operator configuration: no TTL, deleted by ``clear_tenant_limits``."""
        return f"{self.tenant_limits_prefix}{tenant}{TENANT_LIMITS_SUFFIX}"

    def tenant_quota_prefix(self, tenant: str) -> str:
        """The start of tenant ``tenant``'s quota counters: the counter of the window starting at epoch second
        ``w`` is this + ``w`` (:meth:`tenant_quota`); the scripts append the window they compute."""
        return f"{self.tenant_limits_prefix}{tenant}:quota:"

    def tenant_quota(self, tenant: str, window_start: int) -> str:
        """Counter of the tokens (prompt + completion) tenant ``tenant``'s turns used in the quota window starting
        at epoch second ``window_start`` (docs/tenants.md); lives its window + :data:`QUOTA_TTL_MARGIN`."""
        return f"{self.tenant_quota_prefix(tenant)}{window_start}"

    @property
    def shard_count(self) -> str:
        """String holding a sharded deployment's count of shards (``SMITH_SHARDS``), under its prefix itself (the
        keys of :meth:`smith_worker.config.Settings.fleet_keys`): the first worker sets it, a worker or a sharded
        client with another count refuses to start (docs/cluster.md, Shards). Lives ``history_ttl`` from the last
        worker start: a changed count splits conversations only after they all expired."""
        return f"{self.key_prefix}:shard-count"

    def turn_shard(self, turn_id: str) -> str:
        """String naming the shard of a caller-chosen turn id in a sharded deployment, under its prefix itself:
        the first send with the id claims it, so the id names one turn across the shards (a second send of it
        for a conversation of another shard is a :class:`ConflictError`). Lives ``turn_ttl``."""
        return f"{self.key_prefix}:turn-shard:{turn_id}"

    def llm_rate_limit(self, endpoint: str) -> str:
        """Hash of model endpoint ``endpoint``'s fleet-wide rate limit (``endpoint``: the digest
        :func:`smith_worker.llm.rate_limit.endpoint_id` makes of its URL and model): fields ``requests`` and
        ``tokens`` (GCRA theoretical arrival times) and ``paused`` (the end of a ``Retry-After`` pause), epoch
        milliseconds of the Redis server's clock (docs/architecture.md, Model rate limits). Its TTL, set by
        each change, ends when the last of them has passed."""
        return f"{self.key_prefix}:llm-rate:{endpoint}"

    def subagent_history(self, root_turn_id: str, position: str) -> str:
        """List of the messages of the sub-agent at tree ``position`` of a root turn (its checkpoint)."""
        return f"{self.key_prefix}:turn:{root_turn_id}:agent{JOB_SUFFIX}{position}:history"

    def subagent_memory_scope(self, conversation_id: str, root_turn_id: str, position: str) -> str:
        """The conversation id a sub-agent's memory strategy keeps its state under (e.g.
        :meth:`conversation_summary`): the sub-agent's own, never a caller's (:data:`JOB_SUFFIX`)."""
        return f"{conversation_id}{JOB_SUFFIX}{root_turn_id}{JOB_SUFFIX}{position}"

    def subagent_history_trimmed(self, root_turn_id: str, position: str) -> str:
        """Counter of the messages trimmed from the head of that sub-agent's history (as :meth:`history_trimmed`)."""
        return f"{self.key_prefix}:turn:{root_turn_id}:agent{JOB_SUFFIX}{position}:trimmed"

    def history(self, conversation_id: str) -> str:
        """List of a conversation's messages (stored form)."""
        return f"{self.key_prefix}:conv:{conversation_id}:history"

    def conversation_skills(self, conversation_id: str) -> str:
        """List of the skill names active in a conversation, in activation order (see :mod:`smith_client.skills`).

        Part of the conversation's state: a conversation clear deletes it with the history.
        """
        return f"{self.key_prefix}:conv:{conversation_id}:skills"

    def conversation_agent(self, conversation_id: str) -> str:
        """String: the name of the agent that answers a conversation's turns sent without ``agent=``, set by
        a handoff in the same round trip as the handoff's history append (docs/architecture.md, Handoffs).

        Part of the conversation's state: a conversation clear deletes it with the history.
        """
        return f"{self.key_prefix}:conv:{conversation_id}:agent"

    def history_trimmed(self, conversation_id: str) -> str:
        """Counter of messages trimmed from the head of the history: list index + this = absolute position."""
        return f"{self.key_prefix}:conv:{conversation_id}:trimmed"

    def conversation_summary(self, conversation_id: str) -> str:
        """Hash of ``SummaryMemory``'s state: ``text`` and ``covers`` (absolute position it summarises up to)."""
        return f"{self.key_prefix}:conv:{conversation_id}:summary"

    def conversation_state(self, conversation_id: str) -> list[str]:
        """Every key of a conversation's own state: messages, memory state, active skills (what
        ``SmithClient.clear`` deletes)."""
        return [
            self.history(conversation_id),
            self.history_trimmed(conversation_id),
            self.conversation_summary(conversation_id),
            self.conversation_skills(conversation_id),
            self.conversation_agent(conversation_id),
        ]

    def tool_result(self, turn_id: str, step: int, index: int, position: str = "") -> str:
        """A tool call's outcome (:class:`~smith_client.jobs.ToolOutcome` JSON); first writer wins.

        ``position`` is the calling sub-agent's tree position (``""`` for the root agent)."""
        return f"{self.key_prefix}:toolres:{_scoped(turn_id, position)}:{step}:{index}"

    @property
    def workers(self) -> str:
        """ZSET of live workers: worker id → registration expiry (epoch ms)."""
        return f"{self.key_prefix}:workers"

    def worker_turns(self, worker_id: str) -> str:
        """The turns turn worker ``worker_id`` runs (SET of turn ids): an attempt's start adds its turn, its end
        or hand-off removes it; it lives three turn leases past the last start or renewal, so the sweeper still
        reads it after the worker died (whether it ran a turn alone: smith_worker/turn/lifecycle.py, the attempt
        limit)."""
        return f"{self.key_prefix}:worker-turns:{worker_id}"

    def worker(self, worker_id: str) -> str:
        """One worker's registration (JSON: queue, agents, skills, tools, capability set digest, pid, host)."""
        return f"{self.key_prefix}:worker:{worker_id}"

    def mcp_tools(self, alias: str) -> str:
        """Cached tool schemas of MCP server ``alias``, for turn workers (written with a TTL)."""
        return f"{self.key_prefix}:mcp:{alias}:tools"

    def worker_replies_channel(self, worker_id: str) -> str:
        """Pub/sub channel on which tool workers notify a turn worker of finished tool jobs."""
        return f"{self.key_prefix}:worker:{worker_id}:replies"

    @property
    def running(self) -> str:
        """ZSET of running turns: turn id → lease expiry (epoch ms); the sweeper re-enqueues expired ones."""
        return f"{self.key_prefix}:running"

    def conversation_turns(self, conversation_id: str) -> str:
        """List of the conversation's unfinished turn ids, oldest first: the FIFO of ``multitask="enqueue"``."""
        return f"{self.key_prefix}:conv:{conversation_id}:turns"

    def conversation_statuses(self, conversation_id: str) -> str:
        """Hash of the conversation's unfinished turns: turn id → status, kept by the turn scripts.

        A turn leaves it when it ends, so walking the FIFO needs no other turn's key.
        """
        return f"{self.key_prefix}:conv:{conversation_id}:statuses"

    def turn_inbox(self, turn_id: str) -> str:
        """User messages merged into a running turn (``multitask="merge"``)."""
        return f"{self.key_prefix}:turn:{turn_id}:inbox"

    def turn_context(self, turn_id: str) -> str:
        """A turn's caller context: the JSON object given to ``send(..., context=...)``, written with the turn
        by the submit script, read by the workers that run its tools (docs/architecture.md, Caller context).
        The only Redis value that holds the context's secrets; sub-agents read their root turn's."""
        return f"{self.key_prefix}:turn:{turn_id}:context"

    def turn_pending(self, turn_id: str) -> str:
        """Hash of a paused turn's calls waiting for a person: call id → :class:`~smith_client.events.PendingItem`
        JSON (docs/architecture.md, Pausing for a person)."""
        return f"{self.key_prefix}:turn:{turn_id}:pending"

    def turn_decisions(self, turn_id: str) -> str:
        """Hash of the decisions on a paused turn's pending calls: call id → :class:`~smith_client.approvals.Decision`
        JSON; the first decision on a call stays."""
        return f"{self.key_prefix}:turn:{turn_id}:decisions"

    def turn_inputs(self, turn_id: str) -> str:
        """Hash of the open MCP elicitations of a turn's tool calls: request id →
        :class:`~smith_client.events.PendingItem` JSON (kind ``input``; docs/architecture.md, Pausing for a person)."""
        return f"{self.key_prefix}:turn:{turn_id}:inputs"

    def turn_input_reply(self, turn_id: str, request_id: str) -> str:
        """List holding the answer to elicitation ``request_id`` (:class:`~smith_client.inputs.InputResponse`
        JSON), which the tool worker holding the MCP request pops (``BLPOP``)."""
        return f"{self.key_prefix}:turn:{turn_id}:input:{request_id}"

    @property
    def paused(self) -> str:
        """ZSET of paused turns: turn id → deadline of their undecided calls (epoch ms; ``+inf`` for none); the
        sweeper rejects the calls of a turn past its deadline."""
        return f"{self.key_prefix}:paused"

    def tool_started(self, turn_id: str, step: int, index: int, position: str = "") -> str:
        """Marker: which tool worker started a call (tells a live runner from a dead one on resume)."""
        return f"{self.tool_result(turn_id, step, index, position)}:started"

    def tool_reruns(self, turn_id: str, step: int, index: int, position: str = "") -> str:
        """Counter: re-runs of an idempotent call after its tool worker died (bounded: at most once)."""
        return f"{self.tool_result(turn_id, step, index, position)}:reruns"

    @property
    def abort_set(self) -> str:
        """ZSET of the abort requests of this prefix's tool jobs: job id → request epoch ms. ``abort.lua`` adds
        them (smith_worker/tools/waiter.py ``abort_job``), pruning entries older than :data:`ABORT_ENTRY_TTL`, and
        the key expires that long after the last abort; a tool worker takes a job's request when it claims the job
        (``lua/claim.lua``) or cancels it (its abort check), and a job's end removes it
        (:class:`~smith_worker.queue.worker.SmithWorker`). It stands in for arq's global :meth:`arq_abort_set`,
        which every prefix of a database would share (one tenant reading and writing another's requests, a key
        outside the prefix's hash slot on a cluster). Not :attr:`tool_aborts_channel`, the pub/sub channel
        announcing them."""
        return f"{self.key_prefix}:abort-requests"

    @property
    def tool_aborts_channel(self) -> str:
        """Pub/sub channel of the ids of running tool jobs just aborted: every tool worker follows it and
        runs arq's abort check at once (a wake-up token would reach one worker, maybe not the job's)."""
        return f"{self.key_prefix}:tools:aborts"

    @property
    def control_channel(self) -> str:
        """Pub/sub channel of control messages to turn workers (a turn id to cancel)."""
        return f"{self.key_prefix}:control"

    def turn_rerun_job_id(self, turn_id: str, attempt: int) -> str:
        """arq job id of a re-enqueued turn (a crash or a handed-off turn); unique per re-enqueue.

        Runtime suffixes start with :data:`JOB_SUFFIX` (``#``), which :data:`ID_PATTERN`
        refuses in caller ids, so a caller's turn id ``X:r1`` never names a re-run of ``X``.
        """
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}r{attempt}"

    def turn_resume_job_id(self, turn_id: str, attempt: int) -> str:
        """arq job id of a paused turn resumed once every pending call is decided; ``attempt`` is the attempt
        that paused it, so each pause resumes under a job id of its own."""
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}p{attempt}"

    def turn_park_job_id(self, turn_id: str, at_ms: int) -> str:
        """arq job id of a parked turn's re-check, enqueued at epoch ms ``at_ms``."""
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}w{at_ms}"

    def turn_kick_job_id(self, turn_id: str) -> str:
        """arq job id of the wake-up of a conversation's next turn (fixed: arq keeps at most one pending)."""
        return f"{self.turn_job_id(turn_id)}{JOB_SUFFIX}kick"

    def tool_rerun_job_id(self, turn_id: str, step: int, index: int, at_ms: int, position: str = "") -> str:
        """arq job id of an idempotent tool call re-run after its tool worker died (epoch ms ``at_ms``)."""
        return f"{self.tool_job_id(turn_id, step, index, position)}{JOB_SUFFIX}r{at_ms}"

    def tool_result_published(self, turn_id: str, step: int, index: int, position: str = "") -> str:
        """Marker set atomically with a call's ``tool.result`` event, so the event is published once."""
        return f"{self.tool_result(turn_id, step, index, position)}:published"

    def tool_call_decided_published(self, turn_id: str, step: int, index: int, position: str = "") -> str:
        """Marker set atomically with a paused call's ``tool_call.decided`` event, so a decision is announced once
        (a resumed step run again after a crash, or a step that pauses again: docs/architecture.md, Pausing for a
        person)."""
        return f"{self.tool_result(turn_id, step, index, position)}:decided"

    # arq's own names (global per database), from arq.constants: arq 0.28 is pinned (pyproject.toml).

    @staticmethod
    def arq_job(job_id: str) -> str:
        """arq's key holding a queued job's payload."""
        return job_key_prefix + job_id

    @staticmethod
    def arq_in_progress(job_id: str) -> str:
        """arq's key that exists while a job runs."""
        return in_progress_key_prefix + job_id

    @staticmethod
    def arq_result(job_id: str) -> str:
        """arq's key holding a finished job's result."""
        return result_key_prefix + job_id

    @staticmethod
    def arq_retry(job_id: str) -> str:
        """arq's counter of a job's tries."""
        return retry_key_prefix + job_id

    @staticmethod
    def arq_abort_set() -> str:
        """arq's own ZSET of abort requests, global per database (``arq:abort``), which no process of this project
        reads or writes: :attr:`abort_set` takes its place. Named here only so that the claim's stand-in for
        ``run_job``'s first transaction recognises arq's command for it (smith_worker/queue/claim.py)."""
        return abort_jobs_ss

    @staticmethod
    def arq_claim_prefixes() -> list[str]:
        """The prefixes of arq's in-progress, job and retry keys, in that order: ``lua/claim.lua`` appends
        to them the ids of the jobs it claims, which it reads from the queue (so no caller can name those
        keys beforehand). ``prefix + job_id`` is exactly :meth:`arq_in_progress` / :meth:`arq_job` /
        :meth:`arq_retry` of the id."""
        return [in_progress_key_prefix, job_key_prefix, retry_key_prefix]

    # A deployment's data under other names (smith migrate-to-cluster: smith_client.migration).

    def moved(self, name: str, to: Keys) -> str:
        """``name``, a key name or job id of this prefix (it starts with :attr:`key_prefix` and ``:``), as ``to``
        names it: the same name after ``to``'s :attr:`key_prefix` (with ``Keys("smith")`` and
        ``Keys("smith", cluster=True)``: ``smith:conv:c1:history`` → ``{smith}:conv:c1:history``). Raises
        :class:`ValueError` for a name that does not start with this prefix."""
        head = f"{self.key_prefix}:"
        if not name.startswith(head):
            raise ValueError(f"{name!r} is no name of prefix {self.key_prefix!r}")
        return f"{to.key_prefix}:{name[len(head) :]}"

    @property
    def fleet_key_patterns(self) -> dict[str, list[str]]:
        """The keys of this prefix that only concern live processes or that the fleet writes again by itself, by
        kind → their glob patterns (``SCAN MATCH``): worker registrations and the live workers ZSET (a worker writes
        its own at start), the worker-turns sets (of running turns), the MCP tool-schema caches (read again from the
        servers), the abort requests (of running tool jobs), and each queue with every key named after it (wake-up
        lists, requirements hash, capability sets, tenant ring, waiting and admitted ZSETs: of queued and running
        jobs, or rewritten by each worker's heartbeat). A copy of a stopped and drained deployment leaves them out."""
        queues = (self.turns_queue, self.tools_queue)
        return {
            "worker registrations": [self.worker("*"), self.workers],
            "worker turn sets": [self.worker_turns("*")],
            "MCP tool schemas": [self.mcp_tools("*")],
            "abort requests": [self.abort_set],
            "queues and their routing": [name for queue in queues for name in (queue, f"{queue}:*")],
        }

    @property
    def data_key_patterns(self) -> dict[str, list[str]]:
        """The kinds of the keys of this prefix that hold the deployment's data → their glob patterns (``SCAN
        MATCH``), for reports: a key is of the first kind one of whose patterns matches it (so a conversation's
        history is not among its other keys: trimmed counter, summary, skills, agent, unfinished turns). The turn
        records are a turn's ``turn:`` keys (state, log, sequence counter, context, inbox, sub-agent checkpoints),
        the tool results its calls' ``toolres:`` keys (results and their markers)."""
        turn_records, tool_results = self.turn_patterns("*")
        return {
            "conversation histories": [self.history("*")],
            "other conversation keys": [f"{self.key_prefix}:conv:*"],
            "turn records": [turn_records],
            "tool results": [tool_results],
            "agent tree counters": [f"{self.key_prefix}:tree:*"],
            "usage buckets": [f"{self.key_prefix}:usage:*"],
            "tenant quota counters": [f"{self.tenant_quota_prefix('*')}*"],
            "tenant limits": [self.tenant_limits("*")],
            "model rate limits": [self.llm_rate_limit("*")],
            "count of shards": [self.shard_count],
            "turn shards": [self.turn_shard("*")],
            "running and paused turns": [self.running, self.paused],
        }

    # SCAN patterns (diagnostics and clean-up: smith_client.hygiene, the demo).

    @property
    def all_pattern(self) -> str:
        """Matches every key of this prefix."""
        return f"{self.key_prefix}:*"

    @property
    def arq_pattern(self) -> str:
        """Matches arq's keys of this prefix's jobs (``arq:job:{p}:…``, ``arq:in-progress:{p}:…``, …)."""
        return f"arq:*:{self.key_prefix}:*"

    def turn_patterns(self, turn_id: str) -> tuple[str, str]:
        """Match every key of one turn: its ``turn:`` keys (sub-agent histories included) and its tool calls'
        ``toolres:`` keys (its sub-agents' too)."""
        return f"{self.key_prefix}:turn:{turn_id}:*", f"{self.key_prefix}:toolres:{turn_id}[:#]*"

    def turn_id_of_state(self, state_key: str) -> str:
        """The turn id in a :meth:`turn_state` key name (the inverse of that method)."""
        head, tail = self.turn_state(""), ":state"
        return state_key[len(head) - len(tail) : -len(tail)]

    @property
    def acl_patterns(self) -> list[str]:
        """Redis ACL key (``~``) and channel (``&``) patterns covering everything this prefix uses.

        Its own keys and channels (its :attr:`abort_set` included), plus arq's per-job keys of its job ids
        (which all start with the prefix). A plain ``~arq:*`` would also let a tenant read another
        tenant's queued job payloads. See :mod:`smith_client.acl`.
        """
        return [*(f"~{pattern}" for pattern in self.key_patterns), f"&{self.key_prefix}:*"]

    @property
    def key_patterns(self) -> list[str]:
        """Glob patterns (``SCAN MATCH``) of every key of this prefix: its own (its :attr:`abort_set` included)
        and arq's per-job keys."""
        p = self.key_prefix
        arq_keys = [
            f"{kind}{p}:*" for kind in (job_key_prefix, in_progress_key_prefix, result_key_prefix, retry_key_prefix)
        ]
        return [f"{p}:*", *arq_keys]
