"""Configuration: environment variables with the ``SMITH_`` prefix (docs/architecture.md, Limits and
defaults), checked at worker start (:class:`Settings`), and the per-agent loop limits (``AgentConfig``).

All durations are seconds (floats).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

from pydantic import AfterValidator, Field, ValidationError, model_validator
from redis.asyncio import Redis

from smith_client.connection import connect_redis
from smith_client.errors import ConfigurationError, InvalidRequestError
from smith_client.keys import MAX_SHARDS, Keys, shard_prefix
from smith_client.settings import (
    Accepts,
    ClientSettings,
    ConnectionCap,
    Count,
    Flag,
    OptionalId,
    OptionalText,
    Seconds,
    Secret,
    Text,
)
from smith_client.tenants import MAX_WEIGHT, MIN_WEIGHT
from smith_client.validation import check_tenant
from smith_worker.llm.types import DEFAULT_MAX_CONNECTIONS, LlmClientConfig, check_base_url
from smith_worker.memory.history import DEFAULT_HISTORY_MAX_MESSAGES, DEFAULT_VIEW_MAX_BYTES
from smith_worker.ops.metrics import DEFAULT_TENANT_LABELS_MAX
from smith_worker.tools.function import DEFAULT_RESULT_MAX_BYTES, DEFAULT_TOOL_RETRIES, DEFAULT_TOOL_TIMEOUT
from smith_worker.tools.isolation import DEFAULT_OVERRUN_LIMIT, DEFAULT_TOOL_PROCESSES


def log_level_name(value: str) -> str:
    """``value`` in capitals if it is the name of a :mod:`logging` level (``debug``, ``INFO``, ``warning``, …);
    raises ``ValueError`` otherwise."""
    name = value.strip().upper()
    if name not in logging.getLevelNamesMapping():
        raise ValueError(f"unknown log level {value!r}")
    return name


#: The level names :func:`log_level_name` accepts, for messages (the standard ones; aliases such as WARN work too).
LOG_LEVELS = "DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)"

#: Default cap on one worker process's pooled Redis connections (``SMITH_WORKER_REDIS_MAX_CONNECTIONS``): a command
#: holds a connection for one round trip, so a few dozen serve thousands of turns in flight (bench/in_flight.py,
#: BENCHMARKS.md), where a pool without a cap opened one per command waiting at once.
DEFAULT_WORKER_MAX_CONNECTIONS = 64

HttpUrl = Annotated[
    str,
    AfterValidator(lambda url: check_base_url(url).rstrip("/")),
    Accepts("an http:// or https:// URL with a host, e.g. http://127.0.0.1:8080/v1"),
]
LogLevel = Annotated[str, AfterValidator(log_level_name), Accepts(f"a log level: {LOG_LEVELS}")]
NonNegativeSeconds = Annotated[float, Field(ge=0), Accepts("a number of seconds >= 0")]
Shard = Annotated[int | None, Field(ge=0, lt=MAX_SHARDS), Accepts(f"a shard number from 0 to {MAX_SHARDS - 1}")]
OptionalPort = Annotated[int | None, Field(ge=1, le=65535), Accepts("a TCP port number from 1 to 65535")]
ToolCalling = Annotated[Literal["native", "json_schema"], Accepts("native or json_schema")]
Temperature = Annotated[float | None, Field(ge=0, le=2), Accepts("a number from 0 to 2")]
PerMinute = Annotated[int | None, Field(ge=1), Accepts("a whole number per minute of at least 1")]

#: The fields of an endpoint's identity: an agent's ``llm`` override that changes one of them names another
#: endpoint, which does not inherit the environment's limits (:data:`RATE_FIELDS`).
ENDPOINT_FIELDS = ("base_url", "model")
#: The fleet-wide limits of the environment's endpoint (docs/architecture.md, Model rate limits).
RATE_FIELDS = ("rpm", "tpm", "rate_burst")


def parse_tenant_weights(text: str) -> dict[str, float]:
    """``SMITH_TENANT_WEIGHTS``: ``"acme=2,beta=0.5"`` → ``{"acme": 2.0, "beta": 0.5}`` (each tenant's share of
    turn pickup, docs/architecture.md, Fair pickup; a tenant not named has 1). Raises ``ValueError`` for an
    entry that is not ``tenant=number`` with a number from :data:`~smith_client.tenants.MIN_WEIGHT` to
    :data:`~smith_client.tenants.MAX_WEIGHT` (the bounds of a weight set with ``smith tenant``), a tenant
    outside ``check_tenant``'s rule, or a tenant named twice."""
    weights: dict[str, float] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        tenant, sep, number = entry.partition("=")
        try:
            weight = float(number) if sep else 0.0
        except ValueError:
            weight = 0.0
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:  # NaN compares false
            raise ValueError(f"{entry!r} is not tenant=weight with a weight from {MIN_WEIGHT} to {MAX_WEIGHT:g}")
        try:
            check_tenant(tenant.strip())
        except InvalidRequestError as exc:
            raise ValueError(f"{entry!r}: {exc}") from None
        if tenant.strip() in weights:
            raise ValueError(f"tenant {tenant.strip()!r} is named twice")
        weights[tenant.strip()] = weight
    return weights


TenantWeights = Annotated[
    str,
    AfterValidator(lambda text: parse_tenant_weights(text) and text),
    Accepts("tenant=weight pairs separated by commas, each weight >= 0.001, e.g. acme=2,beta=0.5"),
]


class Settings(ClientSettings):
    """Deployment settings of a worker: the shared ones (:class:`~smith_client.settings.ClientSettings`)
    and the worker's own, one field per ``SMITH_*`` variable (``fallback_poll`` is ``SMITH_FALLBACK_POLL``).

    Read from the environment by :meth:`from_env` when ``smith-worker`` starts, so a bad value ends the
    worker at once with one :class:`ConfigurationError` line (naming the variable, quoting the value,
    saying what is accepted) instead of failing every turn. Each field's description says what it is; the
    README's Configuration section lists them all with their defaults. Durations are seconds.
    ``SMITH_TURN_MAX_ATTEMPTS`` counts the attempts whose worker died (or lost Redis past the lease) while
    running that turn alone; hand-offs, workers that died with other turns in flight and fleet-wide Redis
    outages are not counted (the rule: :mod:`smith_worker.turn.lifecycle`). ``SMITH_VIEW_MAX_BYTES`` bounds the
    memory of one turn's history view: a history read of more bytes (the messages' stored form, 16 MiB by
    default) fails the turn with ``ContextOverflowError`` instead of reaching the worker
    (:mod:`smith_worker.memory.history`).
    """

    llm_base_url: HttpUrl = Field("http://127.0.0.1:8080/v1", description="chat-completions base URL, with /v1")
    llm_model: Text = Field("local", description="model name sent with every request")
    llm_api_key: Annotated[OptionalText, Secret()] = Field(None, description="bearer token (never sent in jobs)")
    llm_tool_calling: ToolCalling = Field(
        "native", description="how tools reach the model (smith_worker/llm/json_schema_tools.py)"
    )
    llm_temperature: Temperature = Field(None, description="default sampling temperature (unset: the server's)")
    llm_rpm: PerMinute = Field(None, description="requests per minute to the model, fleet-wide (unset: no limit)")
    llm_tpm: PerMinute = Field(None, description="tokens per minute to the model, fleet-wide (unset: no limit)")
    llm_rate_burst: NonNegativeSeconds = Field(
        60.0, description="seconds' worth of SMITH_LLM_RPM / SMITH_LLM_TPM that may be spent at once"
    )
    turn_max_jobs: Count = Field(100, description="concurrent turns per turn worker")
    worker_redis_max_connections: ConnectionCap = Field(
        DEFAULT_WORKER_MAX_CONNECTIONS,
        description="cap on one worker process's pooled Redis connections (its job slots share them)",
    )
    llm_max_connections: Count = Field(
        DEFAULT_MAX_CONNECTIONS, description="connections a turn worker opens at once to one model endpoint (host:port)"
    )
    tool_max_jobs: Count = Field(20, description="concurrent tool calls per tool worker")
    turn_job_timeout: Seconds = Field(600.0, description="hard cap on one turn job")
    tool_job_timeout: Seconds = Field(300.0, description="hard cap on one tool job")
    turn_max_attempts: Count = Field(3, description="deaths of a worker running the turn alone that fail it")
    fallback_poll: Seconds = Field(
        2.0, description="longest wait between two polls of a queue (workers are woken by enqueues; pickup.py)"
    )
    token_coalesce: NonNegativeSeconds = Field(
        0.0, description="window in which a stream's token deltas are merged into one event; 0 = off"
    )
    tool_max_overruns: Count = Field(
        DEFAULT_OVERRUN_LIMIT, description="overrunning sync-tool threads that make a tool worker drain and restart"
    )
    tool_processes: Count = Field(DEFAULT_TOOL_PROCESSES, description='processes for isolation="process" tools')
    metrics_port: OptionalPort = Field(None, description="port of Prometheus /metrics (unset: no metrics)")
    tenant_labels_max: Count = Field(
        DEFAULT_TENANT_LABELS_MAX, description="distinct tenants with a metrics label value of their own (then other)"
    )
    tenant_weights: TenantWeights = Field(
        "", description="default share of turn pickup per tenant (its limits hash overrides; docs/architecture.md)"
    )
    heartbeat_file: OptionalText = Field(None, description="liveness file touched every 5 s (smith_worker/health.py)")
    history_max_messages: Count = Field(
        DEFAULT_HISTORY_MAX_MESSAGES, description="messages a conversation's stored history keeps"
    )
    view_max_bytes: Count = Field(
        DEFAULT_VIEW_MAX_BYTES, description="bytes (stored form) one history read of a turn may return (history.py)"
    )
    log_level: LogLevel = Field("INFO", description="level of smith-worker's log (--log-level)")
    log_jobs: Flag = Field(False, description="log every job and model request at INFO too (--log-jobs)")
    otel: Flag = Field(False, description="export OpenTelemetry spans (the otel extra; docs/architecture.md, Tracing)")
    worker_id: OptionalId = Field(
        None, description="this process's worker id, claimed in Redis (default <host>:<pid>:<queue>:<random>)"
    )
    shard: Shard = Field(
        None, description="the shard this worker serves, 0 to SMITH_SHARDS - 1 (unset: a process per shard)"
    )

    @model_validator(mode="after")
    def _shard_in_range(self) -> Self:
        """A worker serves one of the deployment's shards."""
        if self.shard is not None and self.shard >= self.shards:
            raise ConfigurationError(
                f"SMITH_SHARD must be one of the {self.shards} shard(s) of SMITH_SHARDS, 0 to {self.shards - 1}, "
                f"got {self.shard}",
                setting="SMITH_SHARD",
            )
        return self

    def connect_redis(self, socket_timeout: float | None = None, *, fleet: bool = False) -> Redis:
        """A Redis client for these settings (URL, Sentinel or Redis Cluster when configured), its pool capped at
        ``SMITH_WORKER_REDIS_MAX_CONNECTIONS`` (a command finding them all in use waits for one up to the
        socket timeout, then raises ``PoolTimeoutError``, a ``redis.exceptions.ConnectionError``).

        ``socket_timeout`` (seconds) overrides ``SMITH_REDIS_SOCKET_TIMEOUT``, for blocking commands. On Redis
        Cluster the client's connections go to the master of the worker's shard's slot (:meth:`keys`), or with
        ``fleet`` to that of the keys every shard shares (:meth:`fleet_keys`).
        """
        return connect_redis(
            self.redis_url,
            sentinels=self.redis_sentinels,
            sentinel_master=self.redis_sentinel_master,
            socket_timeout=self.redis_socket_timeout if socket_timeout is None else socket_timeout,
            max_connections=self.worker_redis_max_connections,
            cluster_key=(self.fleet_keys() if fleet else self.keys()).cluster_slot_key,
        )

    def keys(self) -> Keys:
        """The key names of these settings: those of shard ``SMITH_SHARD`` of ``SMITH_PREFIX``'s ``SMITH_SHARDS``
        (:func:`~smith_client.keys.shard_prefix`: the prefix itself when there is one shard), the two lifetimes
        and ``SMITH_REDIS_CLUSTER``."""
        if self.shard is None and self.shards > 1:
            raise ConfigurationError(
                f"SMITH_SHARD is not set: which of the {self.shards} shards of SMITH_SHARDS?", setting="SMITH_SHARD"
            )
        prefix = shard_prefix(self.prefix, self.shard or 0, self.shards)
        return Keys(prefix, self.turn_ttl, self.history_ttl, self.redis_cluster)

    def each_shard(self) -> list[Settings]:
        """The settings of each shard this process stands for: its own with ``SMITH_SHARD`` (or one shard), else
        one per shard of ``SMITH_SHARDS``, with ``SMITH_SHARD`` set and a ``SMITH_HEARTBEAT_FILE`` of its own
        (``<file>.s<k>``) when one is set (``smith-worker`` then runs a process per shard:
        :mod:`smith_worker.shard_processes`)."""
        if self.shard is not None or self.shards == 1:
            return [self]
        return [
            self.model_copy(
                update={"shard": shard, "heartbeat_file": self.heartbeat_file and f"{self.heartbeat_file}.s{shard}"}
            )
            for shard in range(self.shards)
        ]

    def fleet_keys(self) -> Keys:
        """The key names every shard of the deployment shares (``SMITH_PREFIX`` itself): the model endpoints' rate
        limits, fleet-wide whatever the shards (docs/cluster.md, Shards). :meth:`keys` when there is one shard."""
        return Keys(self.prefix, self.turn_ttl, self.history_ttl, self.redis_cluster)

    def llm_config(self, override: dict[str, Any] | LlmClientConfig | None = None) -> LlmClientConfig:
        """The LLM settings of the environment, with an agent's ``llm`` override applied on top.

        The environment's rate limits (``SMITH_LLM_RPM``, ``SMITH_LLM_TPM``, ``SMITH_LLM_RATE_BURST``) are its
        endpoint's: an override naming another ``base_url`` or ``model`` has only the limits it sets itself."""
        if isinstance(override, LlmClientConfig):
            return override
        base: dict[str, Any] = {
            "base_url": self.llm_base_url,
            "model": self.llm_model,
            "api_key": self.llm_api_key,
            "tool_calling": self.llm_tool_calling,
            "rpm": self.llm_rpm,
            "tpm": self.llm_tpm,
            "rate_burst": self.llm_rate_burst,
        }
        if self.llm_temperature is not None:
            base["default_sampling"] = {"temperature": self.llm_temperature}
        override = override or {}
        if any(name in override and override[name] != base[name] for name in ENDPOINT_FIELDS):
            for name in RATE_FIELDS:
                del base[name]
        base.update(override)
        try:
            return LlmClientConfig(**base)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigurationError(f"invalid LLM settings: {problems}", setting="llm") from exc


@dataclass(frozen=True)
class AgentConfig:
    """Loop limits of one agent (docs/architecture.md, Agent loop and stop conditions; defaults in Limits and defaults).

    ``deadline`` is seconds for the whole turn (None = none);
    ``max_total_tokens`` uses server-reported usage (best effort when a server
    reports none); ``tool_result_max_bytes`` is UTF-8 bytes;
    ``default_tool_timeout`` (seconds) is the budget of each of the agent's
    tools registered without a ``timeout`` of its own.

    Sub-agents (docs/architecture.md, Sub-agents): ``max_subagent_depth`` is the deepest child
    allowed (the root is depth 0; 0 disables sub-agents);
    ``tree_max_iterations`` bounds the model calls of the whole tree and
    ``tree_max_total_tokens`` (None = no bound) its server-reported tokens.
    These three are read from the root agent only: a sub-agent's own values
    never widen its root's budget, its ``max_iterations`` bounds its own loop.

    ``approval_timeout`` (seconds, None = forever) is how long a paused turn's calls wait for a person
    (docs/architecture.md, Pausing for a person): then the undecided ones are rejected with
    "approval timed out" and the turn goes on.

    ``tool_retries`` is how many corrections in a row a tool may ask of the model within a turn by raising
    :class:`~smith_worker.tools.function.RetryWithMessage` (default 1, as pydantic-ai's ``retries``); past it
    the call's tool message is an ordinary tool error (docs/architecture.md, Tool calls).
    ``keep_reasoning`` keeps a reply's ``reasoning_content`` on its stored :class:`AssistantMessage`
    (it is always streamed as ``reasoning`` events; docs/architecture.md, Events).
    """

    max_iterations: int = 16
    tree_max_iterations: int = 50
    max_subagent_depth: int = 3
    tree_max_total_tokens: int | None = None
    deadline: float | None = None
    max_total_tokens: int | None = None
    default_tool_timeout: float = DEFAULT_TOOL_TIMEOUT
    tool_result_max_bytes: int = DEFAULT_RESULT_MAX_BYTES
    stream_default: bool = True
    approval_timeout: float | None = 24 * 3600.0
    tool_retries: int = DEFAULT_TOOL_RETRIES
    keep_reasoning: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.tool_retries, bool) or not isinstance(self.tool_retries, int) or self.tool_retries < 0:
            raise ConfigurationError(
                f"tool_retries must be an int >= 0, got {self.tool_retries!r}", setting="tool_retries"
            )
