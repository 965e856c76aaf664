"""The app of the tracing tests (tests/integration/test_tracing.py) and bench (bench/tracing.py): an agent with a
Python tool, a sub-agent and the bundled example MCP server (``tests.support.tracing_app:app``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import smith_worker
from smith_client.errors import ToolError
from smith_worker import SmithApp

#: The bundled example MCP server (smith_worker/demo/mcp_server_example.py), run as a script.
EXAMPLE_SERVER = str(Path(smith_worker.__file__).parent / "demo" / "mcp_server_example.py")

app = SmithApp()


@app.tool(timeout=5.0)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool(timeout=5.0)
def refuse(reason: str) -> str:
    """Always fails, in its own words."""
    raise ToolError(f"refused: {reason}")


# PYTHONPATH: the server imports smith_worker (its tracing) from this checkout, as the workers do
app.mcp_server("example", command=sys.executable, args=[EXAMPLE_SERVER], request_timeout=10.0,
               env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
app.agent("traced", system_prompt="You trace.", tools=[add], subagents=["helper"], sources=["example"])
app.agent("helper", system_prompt="You help.", tools=[add], description="Helps.")
app.agent("plain", system_prompt="No tools here.")
app.agent("adder", system_prompt="You add.", tools=[add])
app.agent("refuser", system_prompt="You refuse.", tools=[refuse])
