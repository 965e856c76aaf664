"""The skills active in one conversation at one step: the loop's interface to skills (seed §12.3, §12.4).

Per step the loop reads the conversation's active skill names from Redis
(:meth:`ConversationSkills.queue_read` joins its per-step round trip), then
asks for the composed system prompt (:func:`compose_system_prompt`), the
effective tool set (:meth:`ConversationSkills.tools`) and, per tool call,
how it runs (:meth:`ConversationSkills.route`). The active skills of a step
are the agent's default skills in declaration order, then the
conversation's in activation order; a name this worker does not serve is
skipped with a warning.

The effective tool set is rebuilt at every step in the seed's order (§12.3):
the agent's own tools, then the native tools of the active skills with their
``<normalized_name>__`` prefix, then the MCP tools of the active skills with
their ``mcp_<alias>__`` prefix. After prefixing, a name seen twice keeps the
last one registered and a warning names both, so deactivating a skill makes
a tool it shadowed visible again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from smith_client import skills as skill_state
from smith_client.keys import Keys
from smith_worker.config import AgentConfig
from smith_worker.llm.types import ToolSchema
from smith_worker.skills.catalog import SkillCatalog
from smith_worker.skills.model import Skill
from smith_worker.sources import ToolSource
from smith_worker.tools import ToolContext, ToolRoute


class AgentSpec(Protocol):
    """What the active skills read of an agent (:class:`smith_worker.app.AgentSpec` has it): its default
    skills and its config (the default tool timeout)."""

    @property
    def skills(self) -> list[str]: ...

    @property
    def config(self) -> AgentConfig: ...


def compose_system_prompt(base: str, skills: list[Skill]) -> str:
    """The system message text of seed §12.4: ``base``, then per skill in order ``# Skill: <name>``
    and its prompt, ``# Skill Context: <name>`` and its serialized context data; sections are
    separated by a blank line and empty sections are omitted."""
    sections = [base]
    for skill in skills:
        sections.append(f"# Skill: {skill.name}\n{skill.system_prompt}" if skill.system_prompt.strip() else "")
        sections.append(f"# Skill Context: {skill.name}\n{skill.context_json}" if skill.context_json else "")
    return "\n\n".join(section for section in sections if section.strip())


class ConversationSkills:
    """The active skills of one conversation for the steps of one turn attempt.

    ``catalog`` and ``sources`` are the app's; the activation record's TTL
    (``keys.history_ttl``) is refreshed at every step so it expires with the history.
    """

    def __init__(
        self, catalog: SkillCatalog, sources: Mapping[str, ToolSource], keys: Keys, conversation_id: str
    ) -> None:
        self._catalog = catalog
        self._sources = sources
        self._keys = keys
        self._conversation_id = conversation_id
        #: The skills of the current step, in order (None until read).
        self.active: list[Skill] | None = None

    def queue_read(self, pipe: Any) -> None:
        """Queue this step's read as the last commands of ``pipe``."""
        skill_state.queue_read(pipe, self._keys, self._conversation_id)

    def take(self, spec: AgentSpec, replies: list[Any]) -> None:
        """Set the step's active skills from the pipeline's replies to :meth:`queue_read` (all of them, in order)."""
        self.active = self._resolve(spec, skill_state.decode(replies[0]))

    async def ensure(self, spec: AgentSpec, redis: Any) -> None:
        """Read the active skills unless this attempt did already (a re-run resuming with tool calls)."""
        if self.active is None:
            self.active = self._resolve(spec, await skill_state.active(redis, self._keys, self._conversation_id))

    def system_prompt(self, base: str) -> str:
        """``base`` with the sections of the active skills (:func:`compose_system_prompt`)."""
        return compose_system_prompt(base, self.active or [])

    async def tools(self, base: list[ToolSchema], ctx: ToolContext) -> list[ToolSchema]:
        """The step's effective tool set: ``base`` (the agent's own), then the active skills' tools (see module doc).

        ``ctx`` names the turn asking, so an MCP discovery reports on its stream.
        """
        table: dict[str, tuple[ToolSchema, str]] = {schema.name: (schema, "the agent") for schema in base}
        skills = self.active or []
        for skill in skills:
            for tool in skill.native.values():
                self._put(table, tool.schema(), f"skill {skill.name!r}")
        for skill in skills:
            for alias in skill.aliases:
                for schema in await self._sources[alias].schemas(ctx):
                    self._put(table, schema, f"skill {skill.name!r} (MCP server {alias!r})")
        return [schema for schema, _ in table.values()]

    def route(self, spec: AgentSpec, tool_name: str) -> ToolRoute | None:
        """How a call of ``tool_name`` runs when an active skill owns it, else None (the agent's own tool, if any).

        Precedence follows :meth:`tools` (last registered wins): MCP tools of
        the active skills, latest first, then their native tools. A plain
        callable gets the agent's ``default_tool_timeout``; an MCP tool its
        server's budget.
        """
        skills = list(reversed(self.active or []))
        for skill in skills:
            for alias in reversed(skill.aliases):
                if self._sources[alias].owns(tool_name):
                    timeout = self._sources[alias].timeout_for(tool_name) or spec.config.default_tool_timeout
                    return ToolRoute(timeout, skill=skill.name)
        for skill in skills:
            native = skill.native.get(tool_name)
            if native is not None:
                timeout = native.timeout if native.timeout is not None else spec.config.default_tool_timeout
                return ToolRoute(timeout, native.tool.idempotent, skill.name)
        return None

    def _resolve(self, spec: AgentSpec, names: list[str]) -> list[Skill]:
        skills = []
        for name in dict.fromkeys([*spec.skills, *names]):  # defaults first; a name counts once
            skill = self._catalog.get(name)
            if skill is None:
                self._catalog.warn_once(
                    ("unknown", name),
                    "skill %r is active in a conversation but this worker does not serve it; skipped",
                    name,
                )
            else:
                skills.append(skill)
        return skills

    def _put(self, table: dict[str, tuple[ToolSchema, str]], schema: ToolSchema, owner: str) -> None:
        previous = table.get(schema.name)
        if previous is not None:
            self._catalog.warn_once(
                ("collision", schema.name, previous[1], owner),
                "tool name collision: %r of %s replaces the one of %s (last registered wins)",
                schema.name,
                owner,
                previous[1],
            )
        table[schema.name] = (schema, owner)
