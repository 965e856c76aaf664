"""Tool sources: tools that are not Python callables on the app (MCP servers, later skills).

A source contributes tool schemas to the agents that use it (turn side) and
runs calls of the tools it owns (tool-worker side). Tool names of a source
carry its own prefix, e.g. ``mcp_<alias>__<tool>`` (seed §11.7), so
:meth:`ToolSource.owns` is a cheap name test.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from smith_worker.llm.types import ToolSchema
from smith_worker.tools import ToolContext, ToolResult

if TYPE_CHECKING:
    from smith_worker.runtime import WorkerRuntime


@runtime_checkable
class ToolSource(Protocol):
    """What the loop and the tool runner need from a source of tools."""

    name: str

    def owns(self, tool_name: str) -> bool:
        """True when ``tool_name`` belongs to this source."""
        ...

    def timeout_for(self, tool_name: str) -> float:
        """The call budget of ``tool_name``, in seconds."""
        ...

    async def schemas(self, rt: "WorkerRuntime", ctx: ToolContext | None = None) -> list[ToolSchema]:
        """The tools this source offers now (turn worker; may read a cache in Redis).

        ``ctx`` names the turn asking (``turn_id``, ``agent``), so events of a
        discovery it triggers reach that turn's stream.
        """
        ...

    async def call(self, rt: "WorkerRuntime", tool_name: str, arguments: dict, ctx: ToolContext) -> ToolResult:
        """Run one call on a tool worker. Errors become error results; never raises except cancellation."""
        ...

    async def close(self) -> None:
        """Release what the source holds in this process (worker shutdown)."""
        ...
