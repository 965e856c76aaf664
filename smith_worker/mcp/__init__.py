"""MCP client subsystem (docs/architecture.md, MCP).

MCP servers (stdio children or Streamable HTTP endpoints) are declared on
the app and attached to agents as tool sources::

    app.mcp_server("example", command=sys.executable, args=["server.py"])
    app.agent("default", sources=["example"])

Their tools reach the model as ``mcp_<alias>__<tool>`` plus
``mcp_<alias>__read_resource``. Each worker process pools one connection
per server (:mod:`~smith_worker.mcp.server`); nothing here imports the
``mcp`` SDK until a server is first used.

Modules, one concern each: :mod:`.config` (``ServerConfig``),
:mod:`.catalog` (handshake + listings, public names, filter + schemas),
:mod:`.transport` (SDK transports, stderr),
:mod:`.launcher` (the parent-death launcher script of stdio servers),
:mod:`.http` (Streamable HTTP retries, lost sessions), :mod:`.link`
(read/write pumps), :mod:`.supervisor` (owner task, health, restarts),
:mod:`.server` (requests, results → Smith values), :mod:`.events`,
:mod:`.errors` (JSON-RPC and transport failures → typed errors),
:mod:`.source` (the ``ToolSource``).
"""

from typing import TYPE_CHECKING

from smith_worker.lazy import lazy_exports

if TYPE_CHECKING:  # the names for type checkers; at run time each loads its module on first use
    from smith_worker.mcp.catalog import (
        Catalog as Catalog,
    )
    from smith_worker.mcp.config import (
        PROTOCOL_VERSION as PROTOCOL_VERSION,
    )
    from smith_worker.mcp.config import (
        ServerConfig as ServerConfig,
    )
    from smith_worker.mcp.events import (
        LifecycleEvent as LifecycleEvent,
    )
    from smith_worker.mcp.events import (
        LifecycleKind as LifecycleKind,
    )
    from smith_worker.mcp.events import (
        McpEvent as McpEvent,
    )
    from smith_worker.mcp.events import (
        Notification as Notification,
    )
    from smith_worker.mcp.server import (
        ServerHandle as ServerHandle,
    )
    from smith_worker.mcp.source import (
        McpServerSource as McpServerSource,
    )
    from smith_worker.mcp.supervisor import (
        State as State,
    )

_EXPORTS = {
    "Catalog": "catalog",
    "LifecycleEvent": "events",
    "LifecycleKind": "events",
    "McpEvent": "events",
    "McpServerSource": "source",
    "Notification": "events",
    "PROTOCOL_VERSION": "config",
    "ServerConfig": "config",
    "ServerHandle": "server",
    "State": "supervisor",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
