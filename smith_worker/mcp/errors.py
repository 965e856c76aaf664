"""Mapping SDK failures to Smith's typed errors (docs/architecture.md, Errors).

* JSON-RPC error responses → :class:`McpProtocolError` (``rpc_code`` set);
* a request timeout (``-32001``) → :class:`SmithTimeoutError`;
* a lost connection (``-32000``, closed/broken streams, the pool's own
  loss signal) → :class:`TransportError`; :class:`ConnectionLost` carries
  whether the request may have reached the server, which decides a retry;
* an invalid result (schema or pydantic validation) → :class:`McpProtocolError`.
"""

from __future__ import annotations

import re

import anyio
from pydantic import ValidationError

from smith_client.errors import McpError, McpProtocolError, SmithError, SmithTimeoutError, TransportError

#: The end reason of a connection whose HTTP session the server no longer knows.
SESSION_EXPIRED = "session expired"

_SESSION_GONE = re.compile(
    r"session\b.*\b(terminated|not found|unknown|expired|invalid)"
    r"|\b(unknown|invalid|expired|no valid) session",
    re.IGNORECASE,
)

#: JSON-RPC codes the SDK uses for its own conditions.
CONNECTION_CLOSED = -32000
REQUEST_TIMEOUT = -32001
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601


class ConnectionLost(Exception):
    """Internal: a request failed because its connection ended. Never leaves the pool.

    ``maybe_sent`` is True when the request may have reached the server
    (then a ``tools/call`` is not retried).
    """

    def __init__(self, reason: str, maybe_sent: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.maybe_sent = maybe_sent


def rpc_code(exc: BaseException) -> int | None:
    """The JSON-RPC code of an SDK ``MCPError``, else None."""
    from mcp.shared.exceptions import MCPError

    return exc.code if isinstance(exc, MCPError) else None


def is_session_terminated(exc: BaseException) -> bool:
    """A JSON-RPC error saying the server does not know our session (the SDK's "Session terminated" for
    HTTP 404, "Session not found", "No valid session ID provided"…)."""
    return rpc_code(exc) is not None and bool(_SESSION_GONE.search(str(exc)))


def is_session_gone(kind: str, exc: BaseException) -> bool:
    """Whether an HTTP server's (``kind`` ``"http"``) JSON-RPC error says it does not know our session
    (stdio has no sessions)."""
    return kind == "http" and is_session_terminated(exc)


def is_connection_loss(exc: BaseException) -> bool:
    """Whether ``exc`` means the connection is gone (not a server answer)."""
    if rpc_code(exc) == CONNECTION_CLOSED:
        return True
    return isinstance(
        exc, (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, ConnectionError, EOFError)
    )


def transport_error(alias: str, operation: str, detail: str) -> TransportError:
    """A :class:`TransportError` naming the server and what was attempted."""
    return TransportError(f"MCP server {alias!r}: {operation}: {detail}", operation=operation, endpoint_or_server=alias)


def timeout_error(alias: str, operation: str, budget: float) -> SmithTimeoutError:
    """A :class:`SmithTimeoutError` for ``operation`` after ``budget`` seconds."""
    return SmithTimeoutError(
        f"MCP server {alias!r}: {operation} timed out after {budget:g} s", operation=f"mcp:{operation}", budget=budget
    )


def map_error(alias: str, operation: str, exc: BaseException, budget: float) -> SmithError:
    """A typed error for a failed request that is not a connection loss (see module doc)."""
    code = rpc_code(exc)
    if code == REQUEST_TIMEOUT or isinstance(exc, TimeoutError):
        return timeout_error(alias, operation, budget)
    if isinstance(exc, SmithError):
        return exc
    if code is not None:
        return McpProtocolError(
            f"MCP server {alias!r}: {operation} failed: {exc} (JSON-RPC {code})", server=alias, rpc_code=code
        )
    if isinstance(exc, (ValidationError, RuntimeError, ValueError)):
        return McpProtocolError(f"MCP server {alias!r}: {operation}: invalid reply: {exc}", server=alias)
    if is_connection_loss(exc):
        return transport_error(alias, operation, "connection lost")
    return McpError(f"MCP server {alias!r}: {operation} failed: {type(exc).__name__}: {exc}", server=alias)
