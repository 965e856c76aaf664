"""Public tool names of an MCP server: ``mcp_<alias>__<tool>`` within 64 characters (docs/architecture.md, MCP).

Rules:

* characters outside ``[A-Za-z0-9_-]`` in the tool part become ``_`` (MCP
  names may contain ``.`` or ``/``; provider function names may not);
* a name longer than :data:`MAX_TOOL_NAME`, one that collides with an
  earlier (sorted) tool after sanitizing, or the reserved
  ``mcp_<alias>__read_resource`` gets a ``_<sha1(alias\\0tool)[:8]>`` suffix
  after a truncated stem;
* tools are processed in sorted order, so the mapping depends only on the
  set of names: identical on every worker and across reconnects (names are
  stored in checkpointed histories).

Routing always goes through the returned ``public → original`` mapping,
never by splitting strings.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable

from smith_worker.mcp.config import MAX_TOOL_NAME, tool_prefix

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
    """Map each public name to its original MCP tool name, deterministically (see module doc)."""
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
