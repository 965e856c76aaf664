"""What one MCP server offers to agents: filtered, prefixed tool schemas (docs/architecture.md, MCP).

:func:`build_catalog` turns a discovery result (plain JSON dicts, as the
server sent them) into a :class:`Catalog`: the allow/deny filter on original
names (deny wins), public names from :mod:`smith_worker.mcp.naming`, the
synthetic ``mcp_<alias>__read_resource`` tool when the server has resources,
and the prompt list. Tools whose definition requires task-augmented
execution (``execution.taskSupport: "required"``, MCP 2025-11-25 tasks) are
not offered: this client does not support tasks, so every call would fail
(the server answers -32601); they are listed in :attr:`Catalog.task_required`.
A catalog is built once per connection generation and rebuilt on
``notifications/*/list_changed``; it is never re-listed per turn.

Catalogs serialize to JSON (:meth:`Catalog.to_json`) for the Redis cache
that lets turn workers see the tools without connecting.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import orjson

from smith_worker.llm.types import ToolSchema
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.naming import READ_RESOURCE, public_names, read_resource_name

logger = logging.getLogger("agent_smith.mcp")

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
        """The schema part, for the Redis cache."""
        return orjson.dumps({"v": 1, "alias": self.alias, "tools": [s.model_dump() for s in self.schemas]})

    @staticmethod
    def schemas_from_json(raw: bytes | str) -> list[ToolSchema]:
        """Tool schemas from :meth:`to_json` output. Raises ``ValueError`` on a bad payload."""
        data = orjson.loads(raw)
        if not isinstance(data, dict) or data.get("v") != 1:
            raise ValueError("unknown MCP tool cache format")
        return [ToolSchema.model_validate(item) for item in data["tools"]]


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
    """Warn about allow/deny entries the server does not offer (typos)."""
    offered = offered | {READ_RESOURCE}
    for label, names in (("allow", config.allow or ()), ("deny", config.deny or ())):
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
