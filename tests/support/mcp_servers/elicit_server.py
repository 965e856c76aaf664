"""A stdio MCP server whose tool asks the person for input (``elicitation/create``, form mode; MCP 2025-06-18,
https://modelcontextprotocol.io/specification/2025-06-18/client/elicitation), built with the official SDK.

Tool ``order_pen(purpose)`` asks for a pen: ``colour`` (an enum), ``width`` (an integer), ``bold`` (a boolean,
default false) and an optional ``note`` (a string); it answers ``accepted {...}`` with the content it got, as
JSON, or the action (``declined``, ``cancelled``).
"""

from __future__ import annotations

from typing import Literal

from mcp.server.mcpserver import Context, MCPServer
from pydantic import BaseModel, Field

server = MCPServer("elicit", version="1.0.0", log_level="WARNING")


class Pen(BaseModel):
    colour: Literal["red", "green", "blue"] = Field(description="the ink")
    width: int = Field(description="millimetres")
    bold: bool = False
    note: str | None = None


@server.tool()
async def order_pen(purpose: str, ctx: Context) -> str:
    """Ask the person which pen to order for `purpose`."""
    result = await ctx.elicit(f"Which pen for {purpose}?", schema=Pen)
    if result.action == "accept":
        return f"accepted {result.data.model_dump_json(exclude_none=True)}"
    return f"{result.action}d" if result.action == "decline" else "cancelled"


if __name__ == "__main__":
    server.run()
