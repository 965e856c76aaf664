"""The app's Python tools as a tool source, so the loop and the tool worker treat every tool alike.

:class:`NativeTools` wraps a :class:`~smith_worker.tools.function.ToolRegistry` in the
:class:`~smith_worker.tools.source.ToolSource` protocol (compare pydantic-ai's
``FunctionToolset`` beside its MCP toolsets): schemas, budget, idempotency and
``call``. :meth:`NativeTools.restricted` is the view an agent gets (the tools it
lists), :meth:`NativeTools.named` a skill's (its tools under their prefixed names);
views share the worker's sync-tool pools, given at :meth:`start`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from smith_worker.llm.types import ToolSchema
from smith_worker.tools.function import Approval, Tool, ToolContext, ToolRegistry, ToolResult, error_result
from smith_worker.tools.source import SourceContext

if TYPE_CHECKING:
    from smith_worker.tools.isolation import ToolExecutors  # pebble only where tools run


@dataclass
class _Pools:
    """The tool worker's sync-tool pools, shared by every view (None on turn workers and in tests)."""

    executors: ToolExecutors | None = None


class NativeTools:
    """The tools of ``registry`` (only ``allowed`` names when given) as a :class:`ToolSource`."""

    name = ""

    def __init__(self, registry: ToolRegistry, allowed: list[str] | None = None, pools: _Pools | None = None) -> None:
        self._registry = registry
        self._allowed = None if allowed is None else set(allowed)
        self._order = allowed
        self._pools = pools or _Pools()
        self._named: dict[str, Tool] = {}  # tools outside the registry, by the name they are called

    def restricted(self, allowed: list[str]) -> NativeTools:
        """The view of the tools named in ``allowed`` (an agent's ``tools``), in that order."""
        return NativeTools(self._registry, allowed, self._pools)

    def named(self, tools: Mapping[str, Tool]) -> NativeTools:
        """A view of tools outside the registry, each called (and offered) by its key in ``tools``
        (a skill's own Python tools, under their prefixed names)."""
        view = NativeTools(ToolRegistry(), [], self._pools)
        view._named = dict(tools)
        return view

    async def start(self, ctx: SourceContext) -> None:
        """Keep the worker's sync-tool pools (tool workers)."""
        self._pools.executors = ctx.executors

    def _tool(self, tool_name: str) -> Tool | None:
        if tool_name in self._named:
            return self._named[tool_name]
        if self._allowed is not None and tool_name not in self._allowed:
            return None
        return self._registry.find(tool_name)

    def owns(self, tool_name: str) -> bool:
        """True for a registered tool (an allowed one, in a view)."""
        return self._tool(tool_name) is not None

    def timeout_for(self, tool_name: str) -> float | None:
        """The tool's own ``timeout``, seconds; None when registered without one (the calling
        agent's ``default_tool_timeout`` applies)."""
        tool = self._tool(tool_name)
        if tool is None:
            raise KeyError(tool_name)
        return tool.timeout

    def idempotent(self, tool_name: str) -> bool:
        """Whether the tool was declared safe to re-run after its tool worker died."""
        tool = self._tool(tool_name)
        return tool is not None and tool.idempotent

    def approval(self, tool_name: str) -> Approval:
        """Whether a call of the tool waits for a person's approval (its ``needs_approval``)."""
        tool = self._tool(tool_name)
        return tool is not None and tool.needs_approval

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """The schemas of the (allowed) tools, in registration order (a view: in its ``allowed`` order),
        then those of the :meth:`named` tools under their names."""
        renamed = [tool.schema.model_copy(update={"name": name}) for name, tool in self._named.items()]
        return self._registry.schemas(self._order) + renamed

    async def call(self, tool_name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run the tool within ``ctx.budget`` seconds on the worker's pools; never raises except cancellation."""
        tool = self._tool(tool_name)
        if tool is None:
            return error_result(f"unknown tool: {tool_name}")
        return await tool.invoke(arguments, ctx, timeout=ctx.budget, executors=self._pools.executors)

    async def close(self) -> None:
        """Nothing to release: the pools belong to the worker."""
