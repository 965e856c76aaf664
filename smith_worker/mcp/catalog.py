"""What one MCP server offers to agents: its listings, then filtered, prefixed tool schemas (docs/architecture.md, MCP).

Discovery runs on a fresh ``ClientSession`` (MCP 2025-06-18, lifecycle:
https://modelcontextprotocol.io/specification/2025-06-18/basic/lifecycle),
:func:`initialize` then :func:`discover`:

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

:func:`build_catalog` turns a discovery result (plain JSON dicts, as the
server sent them) into a :class:`Catalog`: the allow/deny filter on original
names (deny wins), public names (:func:`public_names`, below), the
synthetic ``mcp_<alias>__read_resource`` tool when the server has resources,
and the prompt list. Tools whose definition requires task-augmented
execution (``execution.taskSupport: "required"``, MCP 2025-11-25 tasks) are
not offered: this client does not support tasks, so every call would fail
(the server answers -32601); they are listed in :attr:`Catalog.task_required`.
A catalog is built once per connection generation and rebuilt on
``notifications/*/list_changed``; it is never re-listed per turn.

Catalogs serialize to JSON (:meth:`Catalog.to_json`) for the Redis cache
that lets turn workers see the tools without connecting.

Public tool names are ``mcp_<alias>__<tool>`` within 64 characters:

* characters outside ``[A-Za-z0-9_-]`` in the tool part become ``_`` (MCP
  names may contain ``.`` or ``/``; provider function names may not);
* a name longer than :data:`MAX_TOOL_NAME`, one that collides with an
  earlier (sorted) tool after sanitizing, or the reserved
  ``mcp_<alias>__read_resource`` gets a ``_<sha1(alias\\0tool)[:8]>`` suffix
  after a truncated stem;
* tools are processed in sorted order, so the mapping depends only on the
  set of names: identical on every worker and across reconnects (names are
  stored in checkpointed histories).

Routing always goes through the catalog's ``public → original`` mapping
(:attr:`Catalog.routes`), never by splitting strings.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from smith_client.errors import McpProtocolError
from smith_worker.llm.types import ToolSchema
from smith_worker.mcp.config import MAX_TOOL_NAME, PROTOCOL_VERSION, ServerConfig, tool_prefix
from smith_worker.mcp.errors import METHOD_NOT_FOUND, is_connection_loss, rpc_code

logger = logging.getLogger("agent_smith.mcp")

#: The tool part of the synthetic resource reader (docs/architecture.md, MCP).
READ_RESOURCE = "read_resource"

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_HASH_LEN = 8


def read_resource_name(alias: str) -> str:
    """The public name of the synthetic resource reader: ``mcp_<alias>__read_resource``."""
    return tool_prefix(alias) + READ_RESOURCE


def sanitize(tool: str) -> str:
    """``tool`` with every character outside ``[A-Za-z0-9_-]`` replaced by ``_`` (``_`` when empty)."""
    return _UNSAFE.sub("_", tool) or "_"


def hashed_name(alias: str, tool: str) -> str:
    """``mcp_<alias>__<stem>_<sha1(alias\\0tool)[:8]>`` cut to :data:`MAX_TOOL_NAME` characters."""
    prefix = tool_prefix(alias)
    digest = hashlib.sha1(f"{alias}\0{tool}".encode()).hexdigest()[:_HASH_LEN]
    room = MAX_TOOL_NAME - len(prefix) - _HASH_LEN - 1
    return f"{prefix}{sanitize(tool)[:room]}_{digest}"


def public_names(alias: str, tools: Iterable[str]) -> dict[str, str]:
    """Map each public name to its original MCP tool name, deterministically (module doc, public names)."""
    prefix = tool_prefix(alias)
    taken = {read_resource_name(alias)}
    mapping: dict[str, str] = {}
    for tool in sorted(set(tools)):
        name = prefix + sanitize(tool)
        if len(name) > MAX_TOOL_NAME or name in taken:
            if name == read_resource_name(alias):
                logger.warning(
                    "MCP server %r: tool %r clashes with the synthetic resource reader; renamed", alias, tool
                )
            name = hashed_name(alias, tool)
            salt = tool
            while name in taken:  # a hash suffix that equals another tool's plain name: re-hash
                salt += "\0"
                name = hashed_name(alias, salt)
        taken.add(name)
        mapping[name] = tool
    return mapping


#: Most pages read from one listing before giving up on a server that never ends it.
MAX_PAGES = 100

CLIENT_NAME = "agent_smith"
CLIENT_VERSION = "0.1.0"


#: Resources listed in the reader's description; the text is cut at :data:`MAX_RESOURCE_DESCRIPTION` characters.
MAX_LISTED_RESOURCES = 20
MAX_RESOURCE_DESCRIPTION = 2048

READ_RESOURCE_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"uri": {"type": "string", "description": "URI of the resource to read."}},
    "required": ["uri"],
    "additionalProperties": False,
}

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass
class Discovery:
    """A server's listings as JSON dicts (MCP wire field names), after pagination.

    ``resources_supported`` is False when the server has no resources
    capability or its ``resources/list`` failed (then no reader tool exists).
    """

    tools: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    resources_supported: bool = False


async def initialize(session: Any, config: ServerConfig) -> Any:
    """Run the handshake; return the SDK ``InitializeResult``.

    Raises ``McpProtocolError`` when the server answers with a revision the SDK does not speak.
    """
    import mcp_types as types
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    request = types.InitializeRequest(
        params=types.InitializeRequestParams(
            protocol_version=PROTOCOL_VERSION,
            capabilities=client_capabilities(config),
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


def client_capabilities(config: ServerConfig) -> Any:
    """What the client declares in ``initialize`` (MCP 2025-06-18, lifecycle): form elicitation always (a person
    answers through ``respond``), sampling when the server's config turns it on."""
    import mcp_types as types

    sampling = types.SamplingCapability() if config.sampling else None
    return types.ClientCapabilities(elicitation=types.ElicitationCapability(), sampling=sampling)


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
    """Listings of an initialized session (module doc, discovery). Raises when ``tools_required`` and tools fail."""
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


@dataclass
class Catalog:
    """Tools of one server as the model sees them, plus routing back to MCP names.

    ``routes`` maps a public name to the original MCP tool name; the reader
    tool maps to ``None``. ``schemas`` keep discovery order.
    ``task_required`` names (original names) the tools left out because they need tasks.
    """

    alias: str
    schemas: list[ToolSchema] = field(default_factory=list)
    routes: dict[str, str | None] = field(default_factory=dict)
    prompts: list[dict[str, Any]] = field(default_factory=list)
    resources: list[dict[str, Any]] = field(default_factory=list)
    task_required: list[str] = field(default_factory=list)

    def resolve(self, public_name: str) -> str | None:
        """The original MCP tool name of ``public_name`` (None for the reader tool). KeyError if unknown."""
        return self.routes[public_name]

    def is_reader(self, public_name: str) -> bool:
        """True for ``mcp_<alias>__read_resource``."""
        return public_name == read_resource_name(self.alias) and public_name in self.routes

    def tool_names(self) -> list[str]:
        """Public names, in discovery order."""
        return [schema.name for schema in self.schemas]

    def to_json(self) -> bytes:
        """The schema part and the routes, for the Redis cache."""
        tools = [s.model_dump() for s in self.schemas]
        return orjson.dumps({"v": 1, "alias": self.alias, "tools": tools, "routes": self.routes})

    @staticmethod
    def schemas_from_json(raw: bytes | str) -> list[ToolSchema]:
        """Tool schemas from :meth:`to_json` output. Raises ``ValueError`` on a bad payload."""
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError("unknown MCP tool cache format")
        return [ToolSchema.model_validate(item) for item in data["tools"]]

    @staticmethod
    def routes_from_json(raw: bytes | str) -> dict[str, str | None] | None:
        """The routes of :meth:`to_json` output; None when the payload has none (written by an older worker)."""
        data = orjson.loads(raw)
        routes = data.get("routes") if isinstance(data, dict) and data.get("v") == 1 else None
        return routes if isinstance(routes, dict) else None


def tool_schema(public: str, tool: dict[str, Any]) -> ToolSchema:
    """The function schema offered to the model for one MCP tool."""
    description = tool.get("description") or tool.get("title") or ""
    parameters = tool.get("inputSchema") or _EMPTY_OBJECT
    return ToolSchema(name=public, description=description, parameters=parameters)


def requires_task(tool: dict[str, Any]) -> bool:
    """Whether a tool (JSON dict) can only be called as a task (``execution.taskSupport == "required"``)."""
    execution = tool.get("execution")
    return isinstance(execution, dict) and execution.get("taskSupport") == "required"


def reader_description(alias: str, discovery: Discovery) -> str:
    """Description of the reader tool: what it does, then up to 20 resources and the URI templates (≤ 2 KB)."""
    lines = [f"Read a resource of MCP server {alias!r} by URI."]
    for res in discovery.resources[:MAX_LISTED_RESOURCES]:
        detail = f": {res['description']}" if res.get("description") else ""
        lines.append(f"- {res.get('uri')} — {res.get('name', '')}{detail}")
    if len(discovery.resources) > MAX_LISTED_RESOURCES:
        lines.append(f"- … and {len(discovery.resources) - MAX_LISTED_RESOURCES} more")
    for template in discovery.templates:
        lines.append(f"- template {template.get('uriTemplate')} — {template.get('name', '')}")
    return "\n".join(lines)[:MAX_RESOURCE_DESCRIPTION]


def warn_unknown_filter_names(config: ServerConfig, offered: set[str]) -> None:
    """Warn about allow/deny/needs_approval entries the server does not offer (typos)."""
    offered = offered | {READ_RESOURCE}
    gated = () if isinstance(config.needs_approval, bool) else config.needs_approval
    for label, names in (("allow", config.allow or ()), ("deny", config.deny or ()), ("needs_approval", gated)):
        missing = sorted(set(names) - offered)
        if missing:
            logger.warning("MCP server %r: %s list names tools it does not offer: %s", config.alias, label, missing)


def build_catalog(config: ServerConfig, discovery: Discovery) -> Catalog:
    """Filter, prefix and describe the tools of one discovery (see module doc)."""
    by_name = {tool["name"]: tool for tool in discovery.tools if isinstance(tool.get("name"), str)}
    warn_unknown_filter_names(config, set(by_name))
    task_required = [name for name, tool in by_name.items() if requires_task(tool)]
    allowed = [name for name in by_name if config.allowed(name) and name not in task_required]
    names = public_names(config.alias, allowed)
    original_to_public = {original: public for public, original in names.items()}
    catalog = Catalog(
        alias=config.alias,
        prompts=list(discovery.prompts),
        resources=list(discovery.resources),
        task_required=task_required,
    )
    for original in allowed:  # discovery order
        public = original_to_public[original]
        catalog.schemas.append(tool_schema(public, by_name[original]))
        catalog.routes[public] = original
    if discovery.resources_supported and config.allowed(READ_RESOURCE):
        reader = read_resource_name(config.alias)
        catalog.schemas.append(
            ToolSchema(
                name=reader,
                description=reader_description(config.alias, discovery),
                parameters=READ_RESOURCE_PARAMETERS,
            )
        )
        catalog.routes[reader] = None
    return catalog
