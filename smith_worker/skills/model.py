"""A skill: a system prompt, native tools, MCP servers and context data (docs/architecture.md, Skills).

Names: a skill is activated, listed and headed
in the system prompt by its declared ``name``; the *normalized* name (each
character outside ``[A-Za-z0-9_]`` replaced by ``_``) is only the prefix of
its native tools, ``<normalized_name>__<tool>``. A name whose normalized form
is empty or only ``_`` cannot prefix anything and is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from smith_client.errors import ConfigurationError, SkillError
from smith_client.skills import skill_name_problem
from smith_worker.tools.function import Tool, make_tool

if TYPE_CHECKING:
    from smith_worker.mcp.config import ServerConfig

#: Default cap on a skill's serialized ``context_data``, in UTF-8 bytes.
DEFAULT_SKILL_CONTEXT_MAX_BYTES = 16 * 1024
#: Provider limit on a function name (OpenAI: ``^[a-zA-Z0-9_-]{1,64}$``); prefixed tool names must fit.
MAX_TOOL_NAME = 64

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")


def normalize_skill_name(name: str) -> str:
    """The tool prefix of skill ``name``: each character outside ``[A-Za-z0-9_]`` becomes ``_``.

    Raises :class:`SkillError` when the result is empty or only ``_``.
    """
    normalized = _NOT_NAME.sub("_", name)
    if not normalized.strip("_"):
        raise SkillError(
            f"skill name {name!r} normalizes to {normalized!r}, which cannot prefix tool names", skill_name=name
        )
    return normalized


@dataclass(frozen=True)
class SkillTool:
    """One native tool of a skill as the model sees it.

    ``name`` is the prefixed name ``<normalized_skill>__<tool>``; ``timeout``
    is seconds, or None for a plain callable, which gets the running agent's
    ``default_tool_timeout``.
    """

    name: str
    tool: Tool
    timeout: float | None


@dataclass
class Skill:
    """A skill, built in code or by :func:`~smith_worker.skills.load_skill`.

    * ``system_prompt``: text added under ``# Skill: <name>`` (docs/architecture.md, Skills).
    * ``tools``: plain callables (they get the running agent's
      ``default_tool_timeout``) or :class:`~smith_worker.tools.function.Tool` objects
      from :func:`~smith_worker.make_tool` (they keep their own timeout and
      ``idempotent`` flag). The model sees them as ``<normalized_name>__<tool>``.
    * ``mcp_servers``: :class:`~smith_worker.mcp.ServerConfig` objects or dicts
      of their fields; their tools keep the MCP prefix ``mcp_<alias>__``.
    * ``context_data``: any JSON value, serialized compactly under
      ``# Skill Context: <name>``; at most ``skill_context_max_bytes`` once
      serialized (checked by :meth:`check_context`), never truncated.
    * ``description``: what the skill does and when to use it (Agent Skills' ``description``).

    Raises :class:`SkillError` for a bad name, a tool name that is duplicated or
    longer than 64 characters once prefixed, an invalid MCP server config, or
    context data that is not JSON-able.
    """

    name: str
    system_prompt: str = ""
    tools: list[Callable[..., Any] | Tool] = field(default_factory=list)
    mcp_servers: list[ServerConfig | dict[str, Any]] = field(default_factory=list)
    context_data: Any = None
    description: str = ""
    #: The tool prefix (derived, see :func:`normalize_skill_name`).
    normalized_name: str = field(init=False)
    #: The native tools by prefixed name (derived).
    native: dict[str, SkillTool] = field(init=False, repr=False)
    #: ``context_data`` serialized (compact JSON), or None when there is none (derived).
    context_json: str | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        problem = skill_name_problem(self.name)
        if problem is not None:
            raise SkillError(problem, skill_name=str(self.name))
        self.normalized_name = normalize_skill_name(self.name)
        self.native = {}
        for entry in self.tools:
            self._add_tool(entry)
        self.mcp_servers = [self._server_config(entry) for entry in self.mcp_servers]
        self.context_json = self._serialize_context()

    @property
    def servers(self) -> list[ServerConfig]:
        """The MCP server configs, in declaration order (dicts given at construction are converted)."""
        return self.mcp_servers  # type: ignore[return-value]

    @property
    def aliases(self) -> list[str]:
        """Aliases of the skill's MCP servers, in declaration order."""
        return [config.alias for config in self.servers]

    def check_context(self, max_bytes: int) -> None:
        """Raise :class:`SkillError` when the serialized context is over ``max_bytes`` UTF-8 bytes."""
        size = len(self.context_json.encode()) if self.context_json is not None else 0
        if size > max_bytes:
            raise SkillError(
                f"skill {self.name!r}: context_data is {size} bytes serialized, over the "
                f"skill_context_max_bytes limit of {max_bytes}; it is never truncated",
                skill_name=self.name,
            )

    def _add_tool(self, entry: Callable[..., Any] | Tool) -> None:
        if isinstance(entry, Tool):
            tool, timeout = entry, entry.timeout
        elif callable(entry):
            tool, timeout = make_tool(entry), None
        else:
            raise SkillError(
                f"skill {self.name!r}: a tool must be a callable or a Tool, got {entry!r}", skill_name=self.name
            )
        name = f"{self.normalized_name}__{tool.name}"
        if name in self.native:
            raise SkillError(f"skill {self.name!r} has two tools named {tool.name!r}", skill_name=self.name)
        if len(name) > MAX_TOOL_NAME:
            raise SkillError(
                f"skill {self.name!r}: tool name {name!r} is longer than {MAX_TOOL_NAME} characters",
                skill_name=self.name,
            )
        self.native[name] = SkillTool(name, tool, timeout)

    def _server_config(self, entry: ServerConfig | dict[str, Any]) -> ServerConfig:
        from smith_worker.mcp.config import ServerConfig  # keeps the MCP modules out of skills without MCP

        if isinstance(entry, ServerConfig):
            return entry
        if not isinstance(entry, dict):
            raise SkillError(
                f"skill {self.name!r}: an MCP server must be a ServerConfig or a dict, got {entry!r}",
                skill_name=self.name,
            )
        try:
            return ServerConfig(**entry)
        except (TypeError, ConfigurationError) as exc:  # an unknown or missing field; the config's own checks
            raise SkillError(
                f"skill {self.name!r}: invalid MCP server {entry.get('alias')!r}: {exc}", skill_name=self.name
            ) from exc

    def _serialize_context(self) -> str | None:
        if self.context_data is None:
            return None
        try:
            return orjson.dumps(self.context_data).decode()
        except TypeError as exc:
            raise SkillError(
                f"skill {self.name!r}: context_data is not JSON-able: {exc}", skill_name=self.name
            ) from exc
