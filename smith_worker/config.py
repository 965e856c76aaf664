"""Configuration: environment variables with the ``SMITH_`` prefix (DESIGN.md §9)
and the per-agent loop limits of the seed (§15.1 ``AgentConfig``).

All durations are seconds (floats).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from arq.connections import ArqRedis
from pydantic import ValidationError

from smith_client.connection import connect_redis
from smith_client.errors import ConfigurationError
from smith_client.keys import DEFAULT_HISTORY_TTL, DEFAULT_TURN_TTL, lifetimes_from_env
from smith_worker.history import DEFAULT_HISTORY_MAX_MESSAGES
from smith_worker.isolation import DEFAULT_OVERRUN_LIMIT, DEFAULT_TOOL_PROCESSES
from smith_worker.llm.types import LlmClientConfig
from smith_worker.tools import DEFAULT_RESULT_MAX_BYTES, DEFAULT_TOOL_TIMEOUT


def _env_float(name: str, default: float) -> float:
    value = _env_optional_float(name)
    return default if value is None else value


def _env_optional_float(name: str) -> float | None:
    """``name`` as a float, None when unset or empty. Raises :class:`ConfigurationError` on a malformed number."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise ConfigurationError(f"{name} must be a number, got {raw!r}", setting=name) from exc


def _env_int(name: str, default: int) -> int:
    return int(_env_float(name, default))


def _env_count(name: str, default: int) -> int:
    """``name`` as a whole number of at least 1 (job slots, attempts). Raises :class:`ConfigurationError`."""
    value = _env_int(name, default)
    if value < 1:
        raise ConfigurationError(f"{name} must be at least 1, got {value}", setting=name)
    return value


@dataclass(frozen=True)
class Settings:
    """Deployment settings, read from the environment by :meth:`from_env`.

    ===========================  =====================================  ==================
    variable                     meaning                                default
    ===========================  =====================================  ==================
    ``SMITH_REDIS_URL``          Redis URL                              ``redis://127.0.0.1:6379/0``
    ``SMITH_PREFIX``             key / queue prefix                     ``smith``
    ``SMITH_LLM_BASE_URL``       chat-completions base URL, with /v1    ``http://127.0.0.1:8080/v1``
    ``SMITH_LLM_MODEL``          model name                             ``local``
    ``SMITH_LLM_API_KEY``        bearer token (never sent in jobs)      unset
    ``SMITH_LLM_TOOL_CALLING``   ``native`` or ``json_schema``          ``native``
    ``SMITH_LLM_TEMPERATURE``    default sampling temperature           unset (server's)
    ``SMITH_TURN_MAX_JOBS``      concurrent turns per turn worker       100
    ``SMITH_TOOL_MAX_JOBS``      concurrent tool calls per tool worker  20
    ``SMITH_TURN_JOB_TIMEOUT``   hard cap on one turn job, seconds      600
    ``SMITH_TOOL_JOB_TIMEOUT``   hard cap on one tool job, seconds      300
    ``SMITH_TURN_MAX_ATTEMPTS``  runs of one turn (crashes, timeouts)   3
    ``SMITH_FALLBACK_POLL``      longest wait between two polls of a    2
                                 queue, seconds (workers are woken by
                                 enqueues; smith_worker/pickup.py)
    ``SMITH_TOKEN_COALESCE``     window, seconds, in which a stream's   0 (off)
                                 token deltas are merged into one
                                 ``token`` event (smith_worker/event_batch.py)
    ``SMITH_TOOL_MAX_OVERRUNS``  overrunning sync-tool threads that     10
                                 make a tool worker drain and restart
    ``SMITH_TOOL_PROCESSES``     processes for ``isolation="process"``  4
                                 tools, per tool worker
    ``SMITH_TURN_TTL``           lifetime of a turn's keys after its    86400 (24 h)
                                 last write, seconds (DESIGN.md §8)
    ``SMITH_HISTORY_TTL``        idle lifetime of a conversation's      2592000 (30 days)
                                 keys, seconds (DESIGN.md §8)
    ``SMITH_REDIS_SENTINELS``    Sentinel ``host:port`` list (commas)   unset (no Sentinel)
    ``SMITH_REDIS_SENTINEL_MASTER``  name of the Sentinel-monitored master  unset
    ``SMITH_METRICS_PORT``       Prometheus ``/metrics`` port           unset (no metrics)
    ``SMITH_HEARTBEAT_FILE``     liveness file touched every 5 s        ``<tmp>/smith-<queue>-<pid>.heartbeat``
    ``SMITH_WORKER_ID``          this process's worker id, claimed in   ``<host>:<pid>:<queue>:<random>``
                                 Redis (smith_worker/registration.py)
    ===========================  =====================================  ==================

    ``SMITH_HISTORY_MAX_MESSAGES`` (default 10000): messages a conversation's
    stored history keeps; the oldest are trimmed, whole tool-call groups at a time.

    ``SMITH_REDIS_URL`` may be ``rediss://`` (TLS) and carry an ACL user and
    password; see :mod:`smith_client.connection`.
    ``SMITH_REDIS_SOCKET_TIMEOUT`` (seconds, default 5) bounds every Redis
    connect and command of clients and workers alike, so it is read where
    connections are built (:func:`smith_client.connection.connect_redis`).
    ``SMITH_TURN_MAX_ATTEMPTS`` counts runs ended by a crash, a lost lease or
    a Redis failure; hand-offs at a graceful shutdown are not counted (issue 8).
    """

    redis_url: str = "redis://127.0.0.1:6379/0"
    prefix: str = "smith"
    llm_base_url: str = "http://127.0.0.1:8080/v1"
    llm_model: str = "local"
    llm_api_key: str | None = None
    llm_tool_calling: str = "native"
    llm_temperature: float | None = None
    turn_max_jobs: int = 100
    tool_max_jobs: int = 20
    turn_job_timeout: float = 600.0
    tool_job_timeout: float = 300.0
    turn_max_attempts: int = 3
    fallback_poll: float = 2.0
    token_coalesce: float = 0.0
    tool_max_overruns: int = DEFAULT_OVERRUN_LIMIT
    tool_processes: int = DEFAULT_TOOL_PROCESSES
    turn_ttl: int = DEFAULT_TURN_TTL
    history_ttl: int = DEFAULT_HISTORY_TTL
    redis_sentinels: str | None = None
    redis_sentinel_master: str | None = None
    metrics_port: int | None = None
    heartbeat_file: str | None = None
    history_max_messages: int = DEFAULT_HISTORY_MAX_MESSAGES
    worker_id: str | None = None

    @classmethod
    def from_env(cls) -> Settings:
        """Read ``SMITH_*`` variables; raises :class:`ConfigurationError` on a malformed number, or a count
        (job slots, attempts) below 1."""
        env = os.environ
        turn_ttl, history_ttl = lifetimes_from_env(env)
        return cls(
            redis_url=env.get("SMITH_REDIS_URL") or cls.redis_url,
            prefix=env.get("SMITH_PREFIX") or cls.prefix,
            llm_base_url=(env.get("SMITH_LLM_BASE_URL") or cls.llm_base_url).rstrip("/"),
            llm_model=env.get("SMITH_LLM_MODEL") or cls.llm_model,
            llm_api_key=env.get("SMITH_LLM_API_KEY") or None,
            llm_tool_calling=env.get("SMITH_LLM_TOOL_CALLING") or cls.llm_tool_calling,
            llm_temperature=_env_optional_float("SMITH_LLM_TEMPERATURE"),
            turn_max_jobs=_env_count("SMITH_TURN_MAX_JOBS", cls.turn_max_jobs),
            tool_max_jobs=_env_count("SMITH_TOOL_MAX_JOBS", cls.tool_max_jobs),
            turn_job_timeout=_env_float("SMITH_TURN_JOB_TIMEOUT", cls.turn_job_timeout),
            tool_job_timeout=_env_float("SMITH_TOOL_JOB_TIMEOUT", cls.tool_job_timeout),
            turn_max_attempts=_env_count("SMITH_TURN_MAX_ATTEMPTS", cls.turn_max_attempts),
            fallback_poll=_env_float("SMITH_FALLBACK_POLL", cls.fallback_poll),
            token_coalesce=_env_float("SMITH_TOKEN_COALESCE", cls.token_coalesce),
            tool_max_overruns=_env_int("SMITH_TOOL_MAX_OVERRUNS", cls.tool_max_overruns),
            tool_processes=_env_int("SMITH_TOOL_PROCESSES", cls.tool_processes),
            turn_ttl=turn_ttl,
            history_ttl=history_ttl,
            redis_sentinels=env.get("SMITH_REDIS_SENTINELS") or None,
            redis_sentinel_master=env.get("SMITH_REDIS_SENTINEL_MASTER") or None,
            metrics_port=_env_int("SMITH_METRICS_PORT", 0) or None,
            heartbeat_file=env.get("SMITH_HEARTBEAT_FILE") or None,
            history_max_messages=_env_int("SMITH_HISTORY_MAX_MESSAGES", cls.history_max_messages),
            worker_id=env.get("SMITH_WORKER_ID") or None,
        )

    def connect_redis(self, socket_timeout: float | None = None) -> ArqRedis:
        """A Redis client for these settings (URL, or Sentinel when configured).

        ``socket_timeout`` (seconds) overrides ``SMITH_REDIS_SOCKET_TIMEOUT``, for blocking commands.
        """
        return connect_redis(
            self.redis_url,
            sentinels=self.redis_sentinels,
            sentinel_master=self.redis_sentinel_master,
            socket_timeout=socket_timeout,
        )

    def llm_config(self, override: dict[str, Any] | LlmClientConfig | None = None) -> LlmClientConfig:
        """The LLM settings of the environment, with an agent's ``llm`` override applied on top."""
        if isinstance(override, LlmClientConfig):
            return override
        base: dict[str, Any] = {
            "base_url": self.llm_base_url,
            "model": self.llm_model,
            "api_key": self.llm_api_key,
            "tool_calling": self.llm_tool_calling,
        }
        if self.llm_temperature is not None:
            base["default_sampling"] = {"temperature": self.llm_temperature}
        base.update(override or {})
        try:
            return LlmClientConfig(**base)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigurationError(f"invalid LLM settings: {problems}", setting="llm") from exc


@dataclass(frozen=True)
class AgentConfig:
    """Loop limits of one agent, with the seed's defaults (§15.1, §15.3).

    ``deadline`` is seconds for the whole turn (None = none);
    ``max_total_tokens`` uses server-reported usage (best effort when a server
    reports none); ``tool_result_max_bytes`` is UTF-8 bytes;
    ``default_tool_timeout`` (seconds) is the budget of each of the agent's
    tools registered without a ``timeout`` of its own.

    Sub-agents (seed §14.2): ``max_subagent_depth`` is the deepest child
    allowed (the root is depth 0; 0 disables sub-agents);
    ``tree_max_iterations`` bounds the model calls of the whole tree and
    ``tree_max_total_tokens`` (None = no bound) its server-reported tokens.
    These three are read from the root agent only: a sub-agent's own values
    never widen its root's budget, its ``max_iterations`` bounds its own loop.
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
