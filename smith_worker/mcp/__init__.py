"""MCP client subsystem (seed §11; DESIGN.md §7; issue 5).

MCP servers (stdio children or Streamable HTTP endpoints) are declared on
the app and attached to agents as tool sources::

    app.mcp_server("example", command=sys.executable, args=["server.py"])
    app.agent("default", sources=["example"])

Their tools reach the model as ``mcp_<alias>__<tool>`` plus
``mcp_<alias>__read_resource``. Each worker process pools one connection
per server (:mod:`~smith_worker.mcp.server`); nothing here imports the
``mcp`` SDK until a server is first used.

Modules, one concern each: :mod:`.config` (``ServerConfig``),
:mod:`.naming` (public names), :mod:`.catalog` (filter + schemas),
:mod:`.discovery` (handshake + listings), :mod:`.transport` (SDK
transports, stderr, parent-death launcher), :mod:`.link` (read/write pumps),
:mod:`.server` (owner task, restarts, requests),
:mod:`.adapt` (results → Smith values), :mod:`.events`, :mod:`.errors`,
:mod:`.source` (the ``ToolSource``).
"""

from smith_worker.mcp.catalog import Catalog
from smith_worker.mcp.config import PROTOCOL_VERSION, ServerConfig
from smith_worker.mcp.events import LifecycleEvent, LifecycleKind, McpEvent, Notification
from smith_worker.mcp.server import ServerHandle, State
from smith_worker.mcp.source import McpServerSource

__all__ = [
    "PROTOCOL_VERSION",
    "Catalog",
    "LifecycleEvent",
    "LifecycleKind",
    "McpEvent",
    "McpServerSource",
    "Notification",
    "ServerConfig",
    "ServerHandle",
    "State",
]
