"""MCP server configuration: what a server is and how to reach it, plus the pool's tuning knobs.

One :class:`ServerConfig` describes one server: a stdio child (``command`` +
``args``, ``env``, ``cwd``) or a Streamable HTTP endpoint (``url``, optional
bearer token and extra headers), the per-request timeout, the tool filter
(``allow`` / ``deny`` on the server's original tool names; deny wins; no
allow list means every tool), ``tools_required``,
``reconnect_on_transport_error``, ``needs_approval``, ``sampling``, ``sampling_needs_approval`` and
``elicitation_timeout``. The
remaining fields tune the per-process pool. All durations are seconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from smith_client.errors import ConfigurationError
from smith_worker.ops.redaction import SENSITIVE_HEADERS, SENSITIVE_KEY, redact_text

#: The protocol revision offered in ``initialize`` (MCP 2025-06-18, lifecycle).
PROTOCOL_VERSION = "2025-06-18"

#: Provider limit on a function name (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``).
MAX_TOOL_NAME = 64

#: Longest alias accepted, so ``mcp_<alias>__`` leaves room for a tool name and a hash suffix.
MAX_ALIAS = 32

ALIAS_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")

# Environment variable names whose values are treated as secrets in logs and events.
_SECRET_ENV = re.compile(r"token|secret|password|passwd|api[-_]?key|auth|credential", re.IGNORECASE)

Kind = Literal["stdio", "http"]


def _check_positive(name: str, value: float | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ConfigurationError(f"MCP server option {name} must be positive, got {value!r}", setting=name)


def tool_prefix(alias: str) -> str:
    """``mcp_<alias>__``: the prefix of the tool names of MCP server ``alias`` (docs/architecture.md, MCP)."""
    return f"mcp_{alias}__"


@dataclass
class ServerConfig:
    """One MCP server.

    Transport: exactly one of ``command`` (stdio; ``args``, ``env`` and ``cwd``
    apply; the child inherits only ``HOME, LOGNAME, PATH, SHELL, TERM, USER``
    plus ``env``) or ``url`` (Streamable HTTP; ``bearer_token`` becomes an
    ``Authorization: Bearer`` header, ``headers`` are added to every request).

    Behaviour (seconds where a duration):

    * ``request_timeout``: budget of one MCP request (a tool call, a resource read), not counting
      the time its call waits for a person (docs/architecture.md, MCP).
    * ``allow`` / ``deny``: original MCP tool names (``read_resource`` names the
      synthetic resource reader); deny wins; no (or an empty) allow list allows all.
    * ``needs_approval``: True (every call), or original tool names whose calls wait
      for a person's approval first (docs/architecture.md, Pausing for a person).
    * ``sampling``: answer the server's ``sampling/createMessage`` during a tool call with
      the calling agent's model (docs/architecture.md, MCP); off: the capability is not
      declared and such requests are refused.
    * ``sampling_needs_approval`` (needs ``sampling``): each ``sampling/createMessage`` first asks a
      person, as an elicitation does (a pending item of kind ``input``, ``method``
      ``sampling/createMessage``); declined or unanswered, the server gets an error.
    * ``elicitation_timeout``: seconds a tool call may wait in all for a person's answers (its
      elicitations, its sampling approvals) before the open one is declined; this time does not
      count against ``request_timeout`` (docs/architecture.md, Pausing for a person and MCP).
    * ``tools_required``: a failing ``tools/list`` fails the connection instead
      of leaving the server without tools.
    * ``reconnect_on_transport_error``: retry once after a transport error when
      the request cannot have run twice.
    * ``idempotent_tools``: original names that may be re-sent after a
      transport error even if the first attempt reached the server.
    * ``max_retries`` (HTTP): retries of one HTTP request after a connect
      failure, 5xx or 429, with the backoff of docs/architecture.md, HTTP retry policy (``0.5 s·2^(n-1) +
      U(0, 0.25 s)``, cap 8 s, ``Retry-After`` up to 8 s honoured); a
      ``tools/call`` is retried only when it could not be sent
      (:mod:`smith_worker.mcp.http`).

    Pool tuning: ``connect_timeout`` (spawn + handshake + discovery),
    ``max_concurrency`` (requests in flight per server; default 8 for stdio,
    16 for HTTP), ``idle_timeout`` (stop an unused server; None = never),
    ``health_interval`` / ``ping_timeout`` (ping after that much silence; two
    failed pings restart the server), ``max_timeouts`` (consecutive request
    timeouts that restart the server), ``max_restarts`` within
    ``restart_window`` before the circuit opens for ``circuit_cooldown``,
    ``backoff_base`` / ``backoff_max`` (restart delay, doubled per consecutive
    failure, ±20 % jitter), ``pdeathsig`` (stdio children get SIGKILL when the
    worker dies; Linux), ``schema_cache_ttl`` (lifetime of the tool list cached
    in Redis for turn workers).

    Raises :class:`ConfigurationError` when invalid (bad alias, both or neither
    transport, non-positive durations, bad URL scheme).
    """

    alias: str
    command: str | None = None
    args: Sequence[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    url: str | None = None
    bearer_token: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] | None = field(default=None, repr=False)
    request_timeout: float = 30.0
    allow: Sequence[str] | None = None
    deny: Sequence[str] | None = None
    tools_required: bool = True
    reconnect_on_transport_error: bool = True
    needs_approval: bool | Sequence[str] = False
    sampling: bool = False
    sampling_needs_approval: bool = False
    elicitation_timeout: float = 300.0
    idempotent_tools: Sequence[str] = ()
    max_retries: int = 3
    connect_timeout: float = 20.0
    max_concurrency: int | None = None
    idle_timeout: float | None = 600.0
    health_interval: float = 30.0
    ping_timeout: float = 5.0
    max_timeouts: int = 3
    max_restarts: int = 5
    restart_window: float = 300.0
    circuit_cooldown: float = 30.0
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    pdeathsig: bool = True
    schema_cache_ttl: float = 300.0

    def __post_init__(self) -> None:
        self.args = tuple(self.args)
        self.allow = None if self.allow is None else tuple(self.allow)
        self.deny = tuple(self.deny or ())
        self.idempotent_tools = tuple(self.idempotent_tools)
        self._check_approval()
        if self.sampling_needs_approval and not self.sampling:
            raise ConfigurationError(
                f"MCP server {self.alias!r}: sampling_needs_approval needs sampling=True",
                setting="sampling_needs_approval",
            )
        self._check_alias()
        self._check_transport()
        for name in (
            "request_timeout",
            "connect_timeout",
            "health_interval",
            "ping_timeout",
            "restart_window",
            "circuit_cooldown",
            "backoff_base",
            "backoff_max",
            "schema_cache_ttl",
            "elicitation_timeout",
        ):
            _check_positive(name, getattr(self, name))
        _check_positive("idle_timeout", self.idle_timeout, allow_none=True)
        _check_positive("max_concurrency", self.max_concurrency, allow_none=True)
        for name in ("max_restarts", "max_timeouts"):
            _check_positive(name, getattr(self, name))
        if self.max_retries < 0:
            raise ConfigurationError(
                f"MCP server option max_retries must be >= 0, got {self.max_retries!r}", setting="max_retries"
            )

    def _check_alias(self) -> None:
        alias = self.alias
        if not ALIAS_PATTERN.match(alias) or "__" in alias or len(alias) > MAX_ALIAS:
            raise ConfigurationError(
                f"invalid MCP server alias {alias!r}: use [a-z0-9][a-z0-9_-]*, no '__', at most {MAX_ALIAS} characters",
                setting="alias",
            )

    def _check_approval(self) -> None:
        gate = self.needs_approval
        if isinstance(gate, bool):
            return
        if not isinstance(gate, (list, tuple)) or not all(isinstance(name, str) for name in gate):
            raise ConfigurationError(
                f"MCP server {self.alias!r}: needs_approval must be a bool or a list of tool names, got {gate!r}",
                setting="needs_approval",
            )
        self.needs_approval = tuple(gate)

    def gated(self, original_name: str) -> bool:
        """Whether a call of the tool ``original_name`` waits for approval (``needs_approval``)."""
        gate = self.needs_approval
        return gate if isinstance(gate, bool) else original_name in gate

    def _check_transport(self) -> None:
        if (self.command is None) == (self.url is None):
            raise ConfigurationError(
                f"MCP server {self.alias!r}: give exactly one of command or url", setting="command"
            )
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ConfigurationError(f"MCP server {self.alias!r}: url must be http(s), got {self.url!r}", setting="url")
        if self.command is not None and (self.bearer_token or self.headers):
            raise ConfigurationError(f"MCP server {self.alias!r}: bearer_token and headers need a url", setting="url")

    @property
    def kind(self) -> Kind:
        """``"stdio"`` or ``"http"``."""
        return "stdio" if self.command is not None else "http"

    @property
    def concurrency(self) -> int:
        """Requests allowed in flight at once on this server."""
        if self.max_concurrency is not None:
            return self.max_concurrency
        return 8 if self.kind == "stdio" else 16

    @property
    def tool_prefix(self) -> str:
        """``mcp_<alias>__``: the prefix of every tool name of this server."""
        return tool_prefix(self.alias)

    def argv(self) -> list[str]:
        """The stdio command line (without the parent-death launcher)."""
        assert self.command is not None
        return [self.command, *self.args]

    def http_headers(self) -> dict[str, str]:
        """Headers sent with every HTTP request: the extra headers, then ``Authorization``."""
        headers = dict(self.headers or {})
        if self.bearer_token:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return headers

    def secrets(self) -> list[str]:
        """Values never to log: the token, sensitive header values, secret-looking env values.

        See docs/architecture.md, Hooks and logs.
        """
        found = [self.bearer_token or ""]
        found += [
            v for k, v in (self.headers or {}).items() if k.lower() in SENSITIVE_HEADERS or SENSITIVE_KEY.search(k)
        ]
        found += [v for k, v in (self.env or {}).items() if _SECRET_ENV.search(k)]
        return [s for s in found if s]

    def redact(self, text: str) -> str:
        """``text`` with every secret of this config replaced by ``<redacted>``."""
        return redact_text(text, self.secrets())

    def describe(self) -> str:
        """A one-line, secret-free description for logs: ``stdio: <argv>`` or ``http: <url>``."""
        target = " ".join(self.argv()) if self.kind == "stdio" else str(self.url)
        return self.redact(f"{self.kind}: {target}")

    def allowed(self, original_name: str) -> bool:
        """Whether the filter lets ``original_name`` through (deny wins; an empty allow list = all)."""
        if original_name in (self.deny or ()):
            return False
        return not self.allow or original_name in self.allow
