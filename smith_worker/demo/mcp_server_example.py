"""The bundled example MCP server (seed §19), built with the official ``mcp`` SDK.

Tools ``echo(text)`` and ``now()``, one resource (``example://info``) and one
prompt (``greet(name)``), served over stdio::

    python -m smith_worker.demo.mcp_server_example      # or: python path/to/mcp_server_example.py

The demo app registers it with ``app.mcp_server("example", command=sys.executable, args=[path])``;
its tools then reach the model as ``mcp_example__echo`` and ``mcp_example__now``.
"""

from __future__ import annotations

import datetime as _dt
import os

from mcp.server.mcpserver import MCPServer

server = MCPServer("agent-smith-example", version="1.0.0", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Return `text` unchanged."""
    return text


@server.tool()
def now() -> str:
    """The current UTC time, ISO 8601 (seconds)."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


@server.resource("example://info", name="info", description="What this server is.", mime_type="text/plain")
def info() -> str:
    """A short description of this server."""
    return f"Agent Smith example MCP server (pid {os.getpid()}): tools echo and now, prompt greet."


@server.prompt()
def greet(name: str) -> str:
    """A one-line greeting prompt for `name`."""
    return f"Say hello to {name} in one short sentence."


def main() -> None:
    """Serve over stdio until stdin closes."""
    server.run("stdio")


if __name__ == "__main__":
    main()
