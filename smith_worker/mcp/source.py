"""An MCP server as a :class:`~smith_worker.tools.source.ToolSource` (docs/architecture.md, MCP).

* **Turn workers** need schemas before the model sees the tools
  (:meth:`McpServerSource.schemas`): the live catalog of this process's own
  connection if there is one, else the copy cached in Redis
  (``Keys.mcp_tools(alias)``, TTL ``schema_cache_ttl``), else discovery in
  this process's pool (a cold start), which also fills the cache.
* **Tool workers** run the calls (:meth:`McpServerSource.call`) through
  their own pool. Every process that (re)discovers a server, after a
  connect or a ``notifications/tools/list_changed``, rewrites the cache.
* The server's requests during a call (sampling, elicitation) are answered for that call
  (:mod:`~smith_worker.mcp.requests`).
* Events of a call go to the turn's stream as ``mcp.event`` and to the
  agent's ``on_mcp_event`` hook; the app-level hook gets every event once.

Tool names are ``mcp_<alias>__<tool>``; ``mcp_<alias>__read_resource(uri)``
reads a resource. Every failure becomes an error :class:`ToolResult`.

``needs_approval`` (:class:`ServerConfig`) is the source's approval policy (:meth:`McpServerSource.approval`,
docs/architecture.md, Pausing for a person): True gates every call; a list of original tool names gates
theirs, the call's public name resolved through the catalog's routes (this process's, else the cached ones).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from smith_client.errors import SmithError
from smith_client.eventlog import EventLog
from smith_client.events import McpEventData
from smith_worker.hooks import Hooks, fire
from smith_worker.llm.types import ToolSchema
from smith_worker.mcp.catalog import READ_RESOURCE, Catalog
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.events import McpEvent
from smith_worker.mcp.requests import ClientRequests
from smith_worker.mcp.server import CallClock, ServerHandle
from smith_worker.tools.function import Approval, ToolContext, ToolResult, error_result
from smith_worker.tools.source import SourceContext

logger = logging.getLogger("agent_smith.mcp")

#: Seconds of the tool job's budget kept back so the pool's own (typed) timeout fires before the job's.
JOB_MARGIN = 0.25
#: Seconds a finished call waits for its queued events to reach the turn's stream (before ``tool.result``).
EVENT_FLUSH_TIMEOUT = 0.5


@dataclass(eq=False)
class TurnSink:
    """Events of the requests of one turn: its stream (``mcp.event``) and its agent's hooks."""

    events: EventLog
    turn_id: str
    agent_path: list[str]
    hooks: Hooks | None

    @property
    def key(self) -> str:
        return self.turn_id

    async def emit(self, event: McpEvent) -> None:
        await self.events.publish(self.turn_id, McpEventData.model_validate(event.to_data()), self.agent_path)
        if self.hooks is not None:
            await fire("on_mcp_event", event, self.hooks)


class McpServerSource:
    """The tools of one MCP server for the agents that list its alias in ``sources``.

    ``config`` is its :class:`ServerConfig`; ``handle`` (the pooled server of
    this process) is created on first use unless given.
    """

    def __init__(self, config: ServerConfig, handle: ServerHandle | None = None) -> None:
        self.config = config
        self.name = config.alias
        self.handle = handle or ServerHandle(config)
        self._ctx: SourceContext | None = None
        self.requests = ClientRequests(config, lambda: self._ctx)
        self.handle.catalog_listeners.append(self._cache_catalog)
        self.handle.events.listeners.append(self._app_hooks)
        self.handle.supervisor.session_callbacks.update(self.requests.callbacks())

    # ---- ToolSource -------------------------------------------------------------

    async def start(self, ctx: SourceContext) -> None:
        """Keep the worker's context (the server itself starts on first use)."""
        self._ctx = ctx

    def owns(self, tool_name: str) -> bool:
        """Names starting with ``mcp_<alias>__``."""
        return tool_name.startswith(self.config.tool_prefix)

    def timeout_for(self, tool_name: str) -> float:
        """``connect_timeout + request_timeout + elicitation_timeout`` seconds: a call may have to start the
        server first, and may wait for a person's answers besides its request's own budget
        (:class:`~smith_worker.mcp.server.CallClock`; docs/architecture.md, MCP)."""
        return self.config.connect_timeout + self.config.request_timeout + self.config.elicitation_timeout

    def idempotent(self, tool_name: str) -> bool:
        """False: a call may have had effects on the server, so it is never silently re-run."""
        return False

    def approval(self, tool_name: str) -> Approval:
        """The server's ``needs_approval`` for a call of ``tool_name``: True or False as given; for a list of
        tool names, a per-call check of the call's original name (see the module doc)."""
        gate = self.config.needs_approval
        if isinstance(gate, bool) or not gate:
            return bool(gate)
        return self._listed

    async def _listed(self, ctx: ToolContext, arguments: dict[str, Any]) -> bool:
        """Whether the call ``ctx`` names is of a tool listed in ``needs_approval``; True when its public name
        does not resolve (a failing check never lets a call through)."""
        routes = await self._routes()
        if ctx.tool_name not in routes:
            return True
        return self.config.gated(routes[ctx.tool_name] or READ_RESOURCE)

    async def _routes(self) -> dict[str, str | None]:
        """Public name → original name: this process's catalog, else the cached one, else a discovery here."""
        conn = self.handle.connection
        if conn is not None:
            return conn.catalog.routes
        raw = await self._cached()
        routes = Catalog.routes_from_json(raw) if raw else None
        return routes if routes is not None else (await self.handle.catalog(None, None)).routes

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """The server's tools now (see module doc).

        With ``asking`` (the turn asking), a discovery started here reports its
        lifecycle events on that turn's stream. A server that cannot be reached
        raises its typed error when ``tools_required``, else it offers no tools
        this time (logged).
        """
        conn = self.handle.connection
        if conn is not None:
            return list(conn.catalog.schemas)
        cached = await self._read_cache()
        if cached is not None:
            return cached
        try:
            catalog = await self.handle.catalog(None, self._sink(asking) if asking is not None else None)
        except SmithError as exc:
            if self.config.tools_required:
                raise
            logger.warning("MCP server %r unavailable; its tools are not offered this turn: %s", self.name, exc.message)
            return []
        return list(catalog.schemas)

    async def call(self, tool_name: str, arguments: dict[str, Any], ctx: ToolContext) -> ToolResult:
        """Run one call on this process's pooled server. Never raises except cancellation."""
        sink = self._sink(ctx)
        deadline = ctx.deadline - JOB_MARGIN if ctx.deadline else None
        try:
            with self.requests.inflight.track(ctx, arguments) as caller:  # the server's requests serve this call
                result = await self._call(tool_name, arguments, deadline, sink, caller.clock)
        except SmithError as exc:
            result = error_result(exc.message)
        except Exception as exc:  # a bug must not crash the tool job: it becomes an error result
            logger.exception("MCP server %r: call of %s failed unexpectedly", self.name, tool_name)
            result = error_result(f"{type(exc).__name__}: {exc}")
        await self.handle.events.drain(EVENT_FLUSH_TIMEOUT)  # the call's events precede its tool.result
        return result

    async def close(self) -> None:
        """Stop this process's server (worker shutdown)."""
        await self.handle.close()

    # ---- extras -------------------------------------------------------------------

    async def get_prompt(
        self, name: str, arguments: dict[str, Any] | None = None, timeout: float | None = None
    ) -> list[Any]:
        """Prompt ``name`` rendered as Smith messages. Raises :class:`McpError` on non-text content."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return await self.handle.get_prompt(name, arguments, deadline=deadline)

    # ---- internals ------------------------------------------------------------------

    async def _call(
        self,
        tool_name: str,
        arguments: dict[str, Any],
        deadline: float | None,
        sink: TurnSink | None,
        clock: CallClock,
    ) -> ToolResult:
        catalog = await self.handle.catalog(deadline, sink)
        if tool_name not in catalog.routes:
            return error_result(f"unknown tool: {tool_name}")
        if catalog.is_reader(tool_name):
            uri = arguments.get("uri")
            if not isinstance(uri, str) or not uri:
                return error_result("read_resource needs a 'uri' string argument")
            return await self.handle.read_resource(uri, deadline=deadline, sink=sink, clock=clock)
        original = catalog.resolve(tool_name)
        assert original is not None
        if not self.config.allowed(original):  # the filter holds at call time too
            return error_result(f"tool {tool_name!r} is not allowed")
        return await self.handle.call_tool(original, arguments, deadline=deadline, sink=sink, clock=clock)

    def _sink(self, ctx: ToolContext) -> TurnSink | None:
        if not ctx.turn_id or self._ctx is None:
            return None
        hooks = self._ctx.agent_hooks.get(ctx.agent) if ctx.agent else None
        return TurnSink(self._ctx.events, ctx.turn_id, [ctx.agent] if ctx.agent else [], hooks)

    async def _app_hooks(self, event: McpEvent) -> None:
        if self._ctx is not None:
            await fire("on_mcp_event", event, self._ctx.app_hooks)

    async def _read_cache(self) -> list[ToolSchema] | None:
        try:
            raw = await self._cached()
            return Catalog.schemas_from_json(raw) if raw else None
        except Exception as exc:  # a cache problem only costs a discovery
            logger.warning("MCP server %r: tool cache unreadable: %s", self.name, exc)
            return None

    async def _cached(self) -> bytes | None:
        """The cached catalog (:meth:`Catalog.to_json`), None when there is none or no worker context."""
        if self._ctx is None:
            return None
        raw: bytes | None = await self._ctx.redis.get(self._ctx.keys.mcp_tools(self.name))
        return raw

    async def _cache_catalog(self, catalog: Catalog) -> None:
        ctx = self._ctx
        if ctx is None:
            return
        key = ctx.keys.mcp_tools(self.name)
        await ctx.redis.set(key, catalog.to_json(), ex=max(1, int(self.config.schema_cache_ttl)))
