"""Minimal stdio MCP servers on the SDK's low-level ``Server``, one per ``--mode``.

* ``tools-only``: tools ``echo`` and ``pid`` listed over three pages (cursor
  pagination); no resources; advertises ``prompts`` but has no
  ``prompts/list`` handler (the request fails with METHOD_NOT_FOUND).
* ``broken-list``: ``tools/list`` fails with an internal error; one resource
  ``broken://readme``.
* ``tasks``: tools ``echo`` (no ``execution``), ``render`` (``taskSupport: "optional"``) and
  ``batch_job`` (``taskSupport: "required"``, MCP 2025-11-25 tasks: a plain call fails with
  METHOD_NOT_FOUND, as in ``@modelcontextprotocol/server-everything``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.server.lowlevel.server import Server
from mcp.server.stdio import stdio_server

_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}
_PAGES = {None: (["echo"], "p2"), "p2": (["pid"], "p3"), "p3": (["noop"], None)}


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    names, next_cursor = _PAGES[params.cursor if params else None]
    tools = [types.Tool(name=n, description=f"{n} tool", input_schema=_SCHEMA) for n in names]
    return types.ListToolsResult(tools=tools, next_cursor=next_cursor)


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    args = params.arguments or {}
    text = {"echo": str(args.get("text", "")), "pid": str(os.getpid()), "noop": ""}.get(params.name)
    if text is None:
        return types.CallToolResult(content=[types.TextContent(type="text", text="unknown")], is_error=True)
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


_TASK_SUPPORT = {"echo": None, "render": "optional", "batch_job": "required"}


async def list_task_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name=name, description=f"{name} tool", input_schema=_SCHEMA,
                   execution=types.ToolExecution(task_support=support) if support else None)
        for name, support in _TASK_SUPPORT.items()])


async def call_task_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    if _TASK_SUPPORT.get(params.name) == "required":
        raise MCPError(code=types.METHOD_NOT_FOUND, message=f"{params.name} must be called as a task")
    return await call_tool(ctx, params)


async def broken_list(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    raise MCPError(code=types.INTERNAL_ERROR, message="tools exploded")


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[types.Resource(uri="broken://readme", name="readme")])


async def read_resource(ctx: Any, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    return types.ReadResourceResult(contents=[types.TextResourceContents(uri=params.uri, text="still readable")])


class PromptlessServer(Server):
    """Advertises prompts without serving them."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        caps = super().get_capabilities(*args, **kwargs)
        return caps.model_copy(update={"prompts": types.PromptsCapability()})


def build(mode: str) -> Server:
    if mode == "tools-only":
        return PromptlessServer("tools-only", on_list_tools=list_tools, on_call_tool=call_tool)
    if mode == "tasks":
        return Server("tasks", on_list_tools=list_task_tools, on_call_tool=call_task_tool)
    return Server("broken-list", on_list_tools=broken_list, on_call_tool=call_tool,
                  on_list_resources=list_resources, on_read_resource=read_resource)


async def serve(mode: str) -> None:
    server = build(mode)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["tools-only", "broken-list", "tasks"], required=True)
    anyio.run(serve, parser.parse_args().mode)
