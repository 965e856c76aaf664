"""Tool sources: where an agent's tools come from (the app's Python tools, MCP servers).

A source contributes tool schemas to the agents that use it (turn side) and
runs calls of the tools it owns (tool-worker side). Tool names of a source
carry its own prefix, e.g. ``mcp_<alias>__<tool>`` (docs/architecture.md, MCP), so
:meth:`ToolSource.owns` is a cheap name test. A source gets what it may use
of its worker process as a :class:`SourceContext` at :meth:`ToolSource.start`
(worker start-up), never the whole runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from smith_client.eventlog import EventLog
from smith_client.keys import Keys
from smith_worker.hooks import Hooks
from smith_worker.llm.rate_limit import RateLimits
from smith_worker.llm.types import LlmClientConfig, ToolSchema
from smith_worker.ops.metrics import WorkerMetrics
from smith_worker.tools.function import Approval, ToolContext, ToolResult

if TYPE_CHECKING:
    from smith_worker.tools.isolation import ToolExecutors  # pebble only where tools run


#: The source id of the app's Python tools.
APP_TOOLS = "app"
#: The source id of an agent's sub-agents (they never run on a tool worker).
SUBAGENTS = "agents"


def source_id(name: str) -> str:
    """The source id (and the capability) of the added source ``name`` (an MCP server's alias)."""
    return f"source:{name}"


def skill_id(skill: str) -> str:
    """The source id of the Python tools of the skill declared as ``skill``."""
    return f"skill:{skill}"


def tool_unit(tool_name: str) -> str:
    """The capability of the app's Python tool ``tool_name``."""
    return f"tool:{tool_name}"


def in_skill(skill: str, unit: str) -> str:
    """The capability of ``unit`` (:func:`tool_unit`, :func:`source_id`) as skill ``skill`` offers it."""
    return f"skill:{skill}/{unit}"


@dataclass(frozen=True)
class SourceContext:
    """What a tool source may use in its worker process.

    ``redis`` and ``keys`` (caches such as ``Keys.mcp_tools``), ``events`` (to
    publish on a turn's stream), ``app_hooks`` and ``agent_hooks`` (each agent's
    hooks by name), ``worker_id``, ``executors``, a tool worker's sync-tool
    pools (None on turn workers), and ``llm_config(agent)``, the model settings of
    agent ``agent`` (the environment's for an agent this app does not declare), for
    a source that asks the calling agent's model (MCP sampling), the process's ``metrics``, where such a
    call is counted (None: not counted), and its ``rate_limits``, the gates such a call goes through as the
    agent loops' calls do (docs/architecture.md, Model rate limits; None: none).
    """

    redis: Any
    keys: Keys
    events: EventLog
    worker_id: str
    app_hooks: Hooks
    agent_hooks: Mapping[str, Hooks]
    executors: ToolExecutors | None = None
    llm_config: Callable[[str], LlmClientConfig] | None = None
    metrics: WorkerMetrics | None = None
    rate_limits: RateLimits | None = None


@runtime_checkable
class ToolSource(Protocol):
    """What the loop and the tool worker need from a source of tools."""

    name: str

    async def start(self, ctx: SourceContext) -> None:
        """Worker start-up: keep ``ctx`` for later calls (no server is started here)."""
        ...

    def owns(self, tool_name: str) -> bool:
        """True when ``tool_name`` belongs to this source."""
        ...

    def timeout_for(self, tool_name: str) -> float | None:
        """The call budget of ``tool_name``, in seconds; None: the calling agent's
        ``default_tool_timeout`` (a Python tool registered without a timeout)."""
        ...

    def idempotent(self, tool_name: str) -> bool:
        """Whether a call of ``tool_name`` may be re-run when its tool worker died.

        See docs/architecture.md, Fault model.
        """
        ...

    def approval(self, tool_name: str) -> Approval:
        """Whether a call of ``tool_name`` waits for a person's approval first (docs/architecture.md, Pausing
        for a person): False, True, or a callable deciding per call (:data:`~smith_worker.tools.function.Approval`)."""
        ...

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """The tools this source offers now (turn worker; may read a cache in Redis).

        ``asking`` names the turn asking (``turn_id``, ``agent``), so events of a
        discovery it triggers reach that turn's stream.
        """
        ...

    async def call(self, tool_name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run one call on a tool worker. Errors become error results; never raises except cancellation."""
        ...

    async def close(self) -> None:
        """Release what the source holds in this process (worker shutdown)."""
        ...
