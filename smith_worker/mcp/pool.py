"""The per-process MCP pool: pooled servers by alias (DESIGN.md §7; research/mcp-notes.md §7).

Each worker process holds one :class:`~smith_worker.mcp.server.ServerHandle`
per configured server: the app's :class:`~smith_worker.mcp.source.McpServerSource`
objects own them, and :meth:`McpPool.from_app` gathers them. A standalone
pool serves scripts, tests and benchmarks::

    async with McpPool([ServerConfig("example", command=sys.executable, args=[path])]) as pool:
        result = await pool.call_tool("example", "echo", {"text": "hi"})
        messages = await pool.get_prompt("example", "greet", {"name": "Neo"})

Timeouts are seconds; ``None`` means the server's ``request_timeout``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from smith_client.errors import ConfigurationError
from smith_worker.mcp.catalog import Catalog
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.server import ServerHandle
from smith_worker.tools import ToolResult

if TYPE_CHECKING:
    from smith_worker.app import SmithApp


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


class McpPool:
    """Pooled MCP servers keyed by alias. Raises :class:`ConfigurationError` for an unknown or duplicate alias."""

    def __init__(self, servers: Iterable[ServerConfig | ServerHandle] = ()) -> None:
        self._handles: dict[str, ServerHandle] = {}
        for server in servers:
            self.add(server)

    @classmethod
    def from_app(cls, app: SmithApp) -> McpPool:
        """A pool over the handles of ``app``'s MCP sources (shares their connections)."""
        from smith_worker.mcp.source import McpServerSource

        return cls(s.handle for s in app.sources.values() if isinstance(s, McpServerSource))

    def add(self, server: ServerConfig | ServerHandle) -> ServerHandle:
        """Add a server (a config or an existing handle); return its handle."""
        handle = server if isinstance(server, ServerHandle) else ServerHandle(server)
        if handle.alias in self._handles:
            raise ConfigurationError(f"MCP server {handle.alias!r} is already in the pool", setting="alias")
        self._handles[handle.alias] = handle
        return handle

    def handle(self, alias: str) -> ServerHandle:
        """The handle of ``alias``."""
        try:
            return self._handles[alias]
        except KeyError:
            raise ConfigurationError(f"no MCP server {alias!r} in the pool", setting="alias") from None

    @property
    def aliases(self) -> list[str]:
        return list(self._handles)

    async def catalog(self, alias: str, timeout: float | None = None) -> Catalog:
        """The catalog of ``alias`` (connects if needed)."""
        return await self.handle(alias).catalog(_deadline(timeout))

    async def call_tool(self, alias: str, tool: str, arguments: dict[str, Any] | None = None, *,
                        timeout: float | None = None) -> ToolResult:
        """Call MCP tool ``tool`` (original name) of ``alias``; see :meth:`ServerHandle.call_tool`."""
        return await self.handle(alias).call_tool(tool, arguments or {}, deadline=_deadline(timeout))

    async def read_resource(self, alias: str, uri: str, *, timeout: float | None = None) -> ToolResult:
        """Read resource ``uri`` of ``alias``; see :meth:`ServerHandle.read_resource`."""
        return await self.handle(alias).read_resource(uri, deadline=_deadline(timeout))

    async def get_prompt(self, alias: str, name: str, arguments: dict[str, Any] | None = None, *,
                         timeout: float | None = None) -> list[Any]:
        """Prompt ``name`` of ``alias`` as Smith messages (seed §11.8); raises :class:`McpError` on non-text."""
        return await self.handle(alias).get_prompt(name, arguments, deadline=_deadline(timeout))

    async def close(self) -> None:
        """Stop every server concurrently (each bounded; see :meth:`ServerHandle.close`)."""
        await asyncio.gather(*(handle.close() for handle in self._handles.values()))

    async def __aenter__(self) -> McpPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
