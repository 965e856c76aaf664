"""Per-process state of a worker: Redis, the event log, identity, and the services of its role.

Created at worker start-up and closed at shutdown. What one kind of worker
adds is its :class:`WorkerRole` (:class:`~smith_worker.turn.role.TurnRole`:
one ``httpx.AsyncClient`` per worker process, the worker's
subscription, the tool-job waiter, its running turns;
:class:`~smith_worker.tool_worker.role.ToolRole`: its sync-tool pools). Job
functions find the runtime in the arq context as ``ctx["runtime"]``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from smith_client import scripts
from smith_client.errors import ConfigurationError
from smith_client.eventlog import EventLog
from smith_client.keys import REGISTRATION_TTL, Keys, now_ms
from smith_client.sharding import check_shard_count
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.health import heartbeat_forever, heartbeat_path, live_heartbeats, remove_heartbeat
from smith_worker.llm.rate_limit import RateLimits
from smith_worker.llm.types import LlmClientConfig
from smith_worker.ops import tracing
from smith_worker.ops.auto_pipeline import AutoPipeline
from smith_worker.ops.heap import trim_forever
from smith_worker.ops.metrics import WorkerMetrics
from smith_worker.ops.redaction import SENSITIVE_HEADERS, install_log_redaction, register_secrets, url_credentials
from smith_worker.ops.redis_health import RedisHealth
from smith_worker.ops.registration import CapabilitySet, Holder, register_worker, unregister_worker
from smith_worker.ops.tasks import cancel_and_wait
from smith_worker.routing import capability_digest
from smith_worker.tools.source import SourceContext

logger = logging.getLogger("agent_smith.worker")

Queue = Literal["turns", "tools"]

#: An arq job function: ``(ctx, payload)``, ``ctx`` being arq's context (``ctx["runtime"]``, ``ctx["job_id"]``).
JobFunction = Callable[..., Coroutine[Any, Any, Any]]


@dataclass(frozen=True)
class RoleJob:
    """A role's one arq job function and how its worker runs it (:func:`~smith_worker.queue.worker.build_worker`).

    ``timeout`` is arq's bound on one job and ``keep_result`` how long arq keeps its result, both in
    seconds; ``max_jobs`` the jobs one process runs at once; ``completion_wait`` the seconds a stopping
    worker waits for its running jobs (0: it stops at once); ``aborts_channel`` the pub/sub channel
    where aborts of its jobs are announced, or None when its jobs are never aborted (arq's abort check off);
    ``admitted`` whether its jobs due now wait for admission (docs/architecture.md, Fair pickup) rather than
    join the queue, so the queue's own ready jobs need reading only now and then (``lua/claim.lua``).
    """

    name: str
    function: JobFunction
    timeout: float
    max_tries: int
    keep_result: int
    max_jobs: int
    completion_wait: int
    aborts_channel: str | None
    admitted: bool = False


class WorkerRole:
    """What one kind of worker adds to the :class:`WorkerRuntime` every worker shares: its queue, its job,
    what it serves and registers, its own services and their shutdown. The defaults add nothing; the
    methods without one raise ``NotImplementedError``."""

    #: The queue this role serves, by its short name (``smith-worker --queue``).
    queue: Queue

    def queue_name(self, keys: Keys) -> str:
        """The arq queue (Redis sorted set) of this role."""
        raise NotImplementedError

    def capabilities(self, app: SmithApp) -> list[str]:
        """What a worker of this role serves for ``app``, sorted (:mod:`smith_worker.routing`)."""
        raise NotImplementedError

    def job(self, settings: Settings, keys: Keys) -> RoleJob:
        """The role's arq job function and its options."""
        raise NotImplementedError

    def registration(self, app: SmithApp) -> dict[str, Any]:
        """The role's fields of the worker's registration: ``agents``, ``tools`` (names, sorted lists) and
        ``overrunning_threads`` (an int)."""
        raise NotImplementedError

    def check(self, app: SmithApp, settings: Settings) -> None:
        """Raise :class:`ConfigurationError` for settings this role cannot run ``app`` with; log a warning when
        ``app`` gives it nothing to serve."""

    def open(self, runtime: WorkerRuntime) -> None:
        """Open what must exist before Redis is waited for and the tool sources start."""

    async def start(self, runtime: WorkerRuntime) -> None:
        """Start what needs Redis, once the tool sources started."""

    def source_context(self, shared: SourceContext) -> SourceContext:
        """What the app's tool sources may use of this process: ``shared``, plus what this role adds."""
        return shared

    def running(self) -> int:
        """Turns running in this process now (for the metrics)."""
        return 0

    def stop_now(self) -> None:
        """The worker stops at once (arq's immediate stop, on a signal): make sure its jobs end."""

    def threads_left(self) -> int:
        """Threads of this role's jobs still running, which a stopped worker abandons at exit."""
        return 0

    async def close(self) -> None:
        """Close what :meth:`open` and :meth:`start` opened."""


#: Seconds between two looks at a worker id another process holds, at start-up (:meth:`WorkerRuntime.start`).
CLAIM_POLL = 0.5


def new_worker_id(queue: str) -> str:
    """``<host>:<pid>:<queue>:<random>``: unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{queue}:{uuid.uuid4().hex[:6]}"


@dataclass
class WorkerRuntime:
    """Everything one worker process shares between its jobs."""

    app: SmithApp
    role: WorkerRole
    settings: Settings
    redis: Redis
    worker_id: str = ""
    #: Readiness: whether Redis answers this process now (docs/architecture.md, Fault model).
    health: RedisHealth = field(default_factory=RedisHealth)
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    #: Called (on the event loop) to make the arq worker stop taking jobs and drain; set by ``build_worker``.
    stop_taking_jobs: Callable[[], None] | None = None
    #: Set when the worker drains to restart (:meth:`request_restart`): the CLI re-executes it.
    restart_requested: bool = False
    #: Set when another process took this worker's id (see :meth:`_lose_id`): it drains, then exits with an error.
    id_lost: bool = False
    #: This process start's token in its registration: who holds the worker id (smith_worker/ops/registration.py).
    instance: str = field(default_factory=lambda: uuid.uuid4().hex)
    _background: list[asyncio.Task[None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.keys = self.settings.keys()
        self.metrics.tenant_labels.limit = self.settings.tenant_labels_max  # docs/architecture.md, Tenants
        self.events = EventLog(self.redis, self.keys)
        #: The names every shard shares (:meth:`Settings.fleet_keys`), and the connection to them: this worker's own
        #: unless its shard's are in another hash slot of a Redis Cluster (docs/cluster.md, Shards).
        self.fleet_keys = self.settings.fleet_keys()
        self.fleet_redis = (
            self.redis
            if self.fleet_keys.cluster_slot_key == self.keys.cluster_slot_key
            else self.settings.connect_redis(fleet=True)
        )
        #: The process's gates to the model endpoints' fleet-wide rate limits, for its agent loops and its MCP
        #: sampling alike (docs/architecture.md, Model rate limits), shared by every shard's workers.
        self.rate_limits = RateLimits(self.fleet_redis, self.fleet_keys)
        self.pipeline = AutoPipeline(self.redis)
        self.worker_id = self.worker_id or self.settings.worker_id or new_worker_id(self.queue)
        served = self.role.capabilities(self.app)
        #: What this worker serves (smith_worker/routing.py): it claims only the jobs whose requirement this holds.
        self.capability_set = CapabilitySet(self.queue_name, capability_digest(served), served)

    @property
    def queue(self) -> Queue:
        """The queue this worker serves, by its short name (its role's)."""
        return self.role.queue

    @property
    def queue_name(self) -> str:
        """The arq queue (Redis sorted set) this worker serves."""
        return self.role.queue_name(self.keys)

    def source_context(self) -> SourceContext:
        """What the app's tool sources may use of this process (its role adds its own: a tool worker's pools)."""
        shared = SourceContext(
            self.redis,
            self.keys,
            self.events,
            self.worker_id,
            self.app.hooks,
            {name: spec.hooks for name, spec in self.app.agents.items()},
            llm_config=self.agent_llm_config,
            metrics=self.metrics,
            rate_limits=self.rate_limits,
        )
        return self.role.source_context(shared)

    def agent_llm_config(self, agent: str) -> LlmClientConfig:
        """The model settings of agent ``agent``: the environment's, with its ``llm`` override when this app
        declares it. Raises :class:`ConfigurationError` for invalid settings."""
        spec = self.app.agents.get(agent)
        return self.settings.llm_config(spec.llm if spec is not None else None)

    def protect_secrets(self) -> None:
        """Register this deployment's secrets for redaction and filter every log line
        (docs/architecture.md, Hooks and logs): the LLM API keys (environment and agents), credentials in
        the LLM base URL and the Redis password."""
        _, _, llm_password = url_credentials(self.settings.llm_base_url)
        _, _, redis_password = url_credentials(self.settings.redis_url)
        agent_keys = [
            getattr(spec.llm, "api_key", None) if not isinstance(spec.llm, dict) else spec.llm.get("api_key")
            for spec in self.app.agents.values()
        ]
        register_secrets(self.settings.llm_api_key, llm_password, redis_password, *agent_keys, *self._source_secrets())
        install_log_redaction()

    def _source_secrets(self) -> list[str]:
        """Bearer tokens and sensitive header values of the tool sources (MCP servers over HTTP)."""
        secrets = []
        for source in self.app.sources.values():
            config = getattr(source, "config", None)
            secrets.append(getattr(config, "bearer_token", None))
            headers = getattr(config, "headers", None) or {}
            secrets += [value for name, value in headers.items() if name.lower() in SENSITIVE_HEADERS]
        return [s for s in secrets if s]

    def request_restart(self) -> bool:
        """Stop taking jobs, drain, then re-execute (see ``smith-worker``); False when a restart was requested
        already (nothing done then)."""
        if self.restart_requested:
            return False
        self.restart_requested = True
        self._background.append(asyncio.create_task(self._heartbeat()))  # readiness: "draining"
        if self.stop_taking_jobs is not None:
            self.stop_taking_jobs()
        return True

    async def start(self) -> None:
        """Open what the role opens (:meth:`WorkerRole.open`, :meth:`WorkerRole.start`), start the sources; register.

        Waits (backing off) while Redis does not answer, instead of failing.
        """
        # first: liveness and /metrics are process-local and must work while start-up waits on Redis
        if not self.settings.heartbeat_file:
            live_heartbeats(self.settings, self.queue)  # deletes the files of this queue's killed workers
        self._background.append(asyncio.create_task(heartbeat_forever(heartbeat_path(self.settings, self.queue))))
        self._background.append(asyncio.create_task(trim_forever()))  # bursts of large turns leave no high-water mark
        if self.settings.metrics_port:
            self.metrics.serve(self.settings.metrics_port, self.redis, self.keys, self.queue_name, self.role.running)
        self.protect_secrets()
        # SMITH_OTEL=1: spans exported OTLP/HTTP (docs/architecture.md, Tracing); after the log filters
        tracing.setup(self.settings.otel, **{"smith.worker.id": self.worker_id, "smith.worker.queue": str(self.queue)})
        self.role.open(self)
        await self.health.until_ok("start-up", self._warn_on_eviction)
        # before any pipeline sends EVALSHA (see smith_client.scripts)
        await self.health.until_ok("loading the scripts", lambda: scripts.load_all(self.redis))
        await self.health.until_ok("the shard count", self._claim_shard_count)
        for source in self.app.all_sources():  # after the pools: the Python tools run on them
            await source.start(self.source_context())
        await self.role.start(self)
        await self._claim_id()
        self._background.append(asyncio.create_task(self._heartbeat_loop()))
        logger.info("worker %s started on queue %s", self.worker_id, self.queue)

    def run_in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` until :meth:`stop` cancels it (e.g. the crash-recovery sweeper, started by the worker)."""
        self._background.append(asyncio.create_task(work))

    async def stop(self, deadline: float | None = None) -> None:
        """Unregister and close what :meth:`start` opened; the unregistration gives up at ``deadline`` (event loop
        time; None: no limit), as a registration ends by its TTL anyway."""
        for task in self._background:
            await cancel_and_wait(task)
        remove_heartbeat(heartbeat_path(self.settings, self.queue))
        self.metrics.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout_at(deadline):
                await unregister_worker(self.redis, self.keys, self.worker_id, self.instance)
        for source in self.app.all_sources():
            try:
                await source.close()
            except Exception:  # one failing source must not keep the others open
                logger.warning("closing tool source %s failed", source.name, exc_info=True)
        await self.role.close()
        if self.fleet_redis is not self.redis:
            await self.fleet_redis.aclose()
        logger.info("worker %s stopped", self.worker_id)
        await asyncio.to_thread(tracing.shutdown)  # exports the spans still buffered

    async def _claim_shard_count(self) -> None:
        """Raise :class:`ConfigurationError` (the worker exits) when the deployment runs another count of shards than
        ``SMITH_SHARDS``: the one its workers set (:attr:`Keys.shard_count`), or 1 when workers are registered under
        its prefix itself. A sharded worker then sets the count unless one did, renewing its life; an unsharded one
        only reads it (its deployment has no such key). The check comes before the write: a sharded worker refused
        by an unsharded deployment's live workers must not leave a count there, which would refuse that deployment's
        own workers at their next start (docs/cluster.md, One count per deployment)."""
        key = self.fleet_keys.shard_count
        async with self.fleet_redis.pipeline(transaction=True) as pipe:
            pipe.get(key)
            pipe.zcount(self.fleet_keys.workers, now_ms(), "+inf")
            stored, unsharded_workers = await pipe.execute()
        check_shard_count(stored, self.settings.shards, self.settings.prefix, unsharded_workers)
        if self.settings.shards > 1:
            async with self.fleet_redis.pipeline(transaction=True) as pipe:
                pipe.set(key, self.settings.shards, nx=True)
                pipe.expire(key, self.settings.history_ttl)
                pipe.get(key)
                *_, stored = await pipe.execute()
            check_shard_count(stored, self.settings.shards, self.settings.prefix)  # another worker set one since

    async def _warn_on_eviction(self) -> None:
        """Warn unless Redis's ``maxmemory-policy`` is ``noeviction``: evicting a turn's keys loses the turn."""
        try:
            reply = await self.redis.config_get("maxmemory-policy")
        except ResponseError:  # CONFIG is disabled on some managed Redis services
            logger.info("could not read Redis maxmemory-policy (CONFIG GET refused); make sure it is noeviction")
            return
        policy = next(iter(reply.values()), b"noeviction")
        policy = policy.decode() if isinstance(policy, bytes) else policy
        if policy != "noeviction":
            logger.warning(
                "Redis maxmemory-policy is %r, not 'noeviction': under memory pressure Redis may evict "
                "turn state and queued jobs (such turns fail with TurnNotFoundError)",
                policy,
            )

    async def _register(self) -> Holder | None:
        """Claim or renew the worker id; the other process holding it, if one does (nothing written then)."""
        info = {
            "id": self.worker_id,
            "instance": self.instance,
            "queue": self.queue,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "skills": self.app.skills.names(),
            "capabilities": self.capability_set.digest,
            "draining": self.restart_requested,
            **self.role.registration(self.app),
        }
        return await register_worker(self.redis, self.keys, self.worker_id, info, self.capability_set, REGISTRATION_TTL)

    async def _claim_id(self) -> None:
        """Register, claiming the worker id; waits (backing off) while Redis does not answer.

        An id another process holds is waited for, up to one registration
        lifetime (:data:`REGISTRATION_TTL`, 15 s): a holder that died without
        unregistering (kill -9, a crash, a lost host) renews it no more, so it
        lapses and this process takes the id; a restart after a graceful stop
        (which unregisters) starts at once. A holder that renews it meanwhile
        (every ``REGISTRATION_TTL / 3`` s) is alive: :class:`ConfigurationError`
        naming it, and ``smith-worker`` exits 1, since two processes sharing an
        id would pass for each other (a dead one's tool calls would look alive).
        """
        deadline = time.monotonic() + REGISTRATION_TTL + 1
        seen: Holder | None = None
        while (holder := await self.health.until_ok("registration", self._register)) is not None:
            if seen is None:
                logger.warning(
                    "worker id %s is registered by %s; waiting up to %d s for that registration to lapse",
                    self.worker_id, holder.describe(), REGISTRATION_TTL,
                )  # fmt: skip
            elif _renewed(seen, holder) or time.monotonic() > deadline:
                raise ConfigurationError(
                    f"worker id {self.worker_id!r} is held by a live worker ({holder.describe()}): "
                    "give each worker process its own SMITH_WORKER_ID, or leave it unset",
                    setting="SMITH_WORKER_ID",
                )
            seen = holder
            await asyncio.sleep(CLAIM_POLL)

    def _lose_id(self, holder: Holder) -> None:
        """Another process took this worker's id while its registration had lapsed (this process was frozen or
        cut off from Redis for over :data:`REGISTRATION_TTL` s): it stops taking jobs, drains and exits with
        :meth:`check_id_kept`'s error, so the two never run side by side."""
        logger.error(
            "worker %s: the id was taken by %s while this worker could not renew it; draining and exiting",
            self.worker_id, holder.describe(),
        )  # fmt: skip
        self.id_lost = True
        if self.stop_taking_jobs is not None:
            self.stop_taking_jobs()

    def check_id_kept(self) -> None:
        """Raise :class:`ConfigurationError` when this worker stopped because another process took its id."""
        if self.id_lost:
            raise ConfigurationError(
                f"worker {self.worker_id!r} stopped: another process took its id (SMITH_WORKER_ID)",
                setting="SMITH_WORKER_ID",
            )

    async def _heartbeat(self) -> None:
        """Renew the registration once; another process holding the id makes this one lose it (:meth:`_lose_id`)."""
        try:
            holder = await self._register()
        except Exception as exc:  # Redis blip: the next beat retries (it re-registers after a Redis restart)
            self.health.failed("the worker heartbeat", exc)
            return
        self.health.ok()
        if holder is not None and not self.id_lost:
            self._lose_id(holder)

    async def _heartbeat_loop(self) -> None:
        while not self.id_lost:
            await asyncio.sleep(REGISTRATION_TTL / 3)
            await self._heartbeat()


def _renewed(before: Holder, now: Holder) -> bool:
    """Whether the id's registration was written again between two looks (its holder is alive): another
    process instance holds it, or its lifetime went up."""
    return now.registration.get("instance") != before.registration.get("instance") or now.ttl_ms > before.ttl_ms
