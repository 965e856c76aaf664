"""Handshake and capability discovery on a fresh ``ClientSession`` (MCP 2025-06-18, lifecycle: https://modelcontextprotocol.io/specification/2025-06-18/basic/lifecycle).

1. ``initialize`` offering protocol revision 2025-06-18 (the SDK would offer
   its newest), accepting any
   handshake revision the SDK knows as a counter-offer, then
   ``notifications/initialized``.
2. ``tools/list`` with pagination (repeated-cursor guard, page cap). A
   failure raises when ``tools_required``, else warns and continues with no
   tools.
3. ``resources/list`` (+ ``resources/templates/list``) and ``prompts/list``
   when the server advertises the capability. Failures warn and leave an
   empty list (optional lists).

Every request carries ``request_timeout``; the caller bounds the whole
sequence with ``connect_timeout`` in the same task.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from smith_client.errors import McpProtocolError
from smith_worker.mcp.catalog import Discovery
from smith_worker.mcp.config import PROTOCOL_VERSION, ServerConfig
from smith_worker.mcp.errors import METHOD_NOT_FOUND, is_connection_loss, rpc_code

logger = logging.getLogger("agent_smith.mcp")

#: Most pages read from one listing before giving up on a server that never ends it.
MAX_PAGES = 100

CLIENT_NAME = "agent_smith"
CLIENT_VERSION = "0.1.0"


async def initialize(session: Any, config: ServerConfig) -> Any:
    """Run the handshake; return the SDK ``InitializeResult``.

    Raises ``McpProtocolError`` when the server answers with a revision the SDK does not speak.
    """
    import mcp_types as types
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    request = types.InitializeRequest(
        params=types.InitializeRequestParams(
            protocol_version=PROTOCOL_VERSION,
            capabilities=types.ClientCapabilities(),
            client_info=types.Implementation(name=CLIENT_NAME, version=CLIENT_VERSION),
        )
    )
    result = await session.send_request(
        request, types.InitializeResult, request_read_timeout_seconds=config.connect_timeout
    )
    if result.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
        raise McpProtocolError(
            f"MCP server {config.alias!r} answered unsupported protocol revision {result.protocol_version!r}",
            server=config.alias,
        )
    session.adopt(result)
    await session.send_notification(types.InitializedNotification())
    return result


async def paginate(fetch: Callable[[str | None], Awaitable[Any]], items: str, alias: str) -> list[dict[str, Any]]:
    """All items of a paginated listing as JSON dicts; ``fetch(cursor)`` returns one SDK result page."""
    out: list[dict[str, Any]] = []
    cursor: str | None = None
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        page = await fetch(cursor)
        out += [item.model_dump(by_alias=True, mode="json", exclude_none=True) for item in getattr(page, items)]
        cursor = page.next_cursor
        if not cursor:
            return out
        if cursor in seen:
            logger.warning("MCP server %r repeated a %s cursor; listing stopped", alias, items)
            return out
        seen.add(cursor)
    logger.warning("MCP server %r: %s listing exceeded %d pages; truncated", alias, items, MAX_PAGES)
    return out


def _page_params(cursor: str | None) -> Any:
    import mcp_types as types

    return None if cursor is None else types.PaginatedRequestParams(cursor=cursor)


async def list_tools(session: Any, config: ServerConfig) -> list[dict[str, Any]]:
    """All tools, as JSON dicts."""
    return await paginate(lambda c: session.list_tools(params=_page_params(c)), "tools", config.alias)


async def _optional(
    what: str,
    config: ServerConfig,
    fetch: Callable[[], Awaitable[list[dict[str, Any]]]],
    quiet_if_missing: bool = False,
) -> list[dict[str, Any]] | None:
    """``await fetch()``; on a server error warn and return None (connection losses propagate).

    With ``quiet_if_missing`` an unsupported method (METHOD_NOT_FOUND) is only a debug line.
    """
    try:
        return await fetch()
    except Exception as exc:
        if is_connection_loss(exc):
            raise
        level = logging.DEBUG if quiet_if_missing and rpc_code(exc) == METHOD_NOT_FOUND else logging.WARNING
        logger.log(
            level,
            "MCP server %r: %s unavailable (%s); continuing without it",
            config.alias,
            what,
            f"JSON-RPC {rpc_code(exc)}" if rpc_code(exc) is not None else exc,
        )
        return None


async def discover(session: Any, config: ServerConfig) -> Discovery:
    """Listings of an initialized session (see module doc). Raises when ``tools_required`` and tools fail."""
    caps = session.server_capabilities
    found = Discovery()
    if config.tools_required:
        found.tools = await list_tools(session, config)
    else:
        found.tools = await _optional("tools/list", config, lambda: list_tools(session, config)) or []
    if caps is not None and caps.resources is not None:
        resources = await _optional(
            "resources/list",
            config,
            lambda: paginate(lambda c: session.list_resources(params=_page_params(c)), "resources", config.alias),
        )
        found.resources_supported = resources is not None
        found.resources = resources or []
        if resources is not None:
            found.templates = (
                await _optional(
                    "resources/templates/list",
                    config,
                    lambda: paginate(
                        lambda c: session.list_resource_templates(params=_page_params(c)),
                        "resource_templates",
                        config.alias,
                    ),
                    quiet_if_missing=True,
                )
                or []
            )
    if caps is not None and caps.prompts is not None:
        found.prompts = (
            await _optional(
                "prompts/list",
                config,
                lambda: paginate(lambda c: session.list_prompts(params=_page_params(c)), "prompts", config.alias),
            )
            or []
        )
    return found
