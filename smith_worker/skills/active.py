"""The skills active in one conversation at one step: the loop's interface to skills (docs/architecture.md, Skills).

Per step the loop reads the conversation's active skill names from Redis
(:meth:`ConversationSkills.queue_read` joins its per-step round trip), then
asks for the composed system prompt (:func:`compose_system_prompt`). The
active skills of a step are the agent's default skills in declaration order,
then the conversation's in activation order; a name this worker does not
serve is skipped with a warning. Their tools join the step's toolset
(:mod:`smith_worker.agent.toolset`), which owns names, shadowing and routes.
"""

from __future__ import annotations

from typing import Any, Protocol

from smith_client import skills as skill_state
from smith_client.keys import Keys
from smith_client.roundtrip import Pending, RoundTrip
from smith_worker.skills.catalog import SkillCatalog
from smith_worker.skills.model import Skill


class AgentSpec(Protocol):
    """What the active skills read of an agent (:class:`smith_worker.app.AgentSpec` has it): its default skills."""

    @property
    def skills(self) -> list[str]: ...


def compose_system_prompt(base: str, skills: list[Skill]) -> str:
    """The system message text (docs/architecture.md, Skills): ``base``, then per skill in order ``# Skill: <name>``
    and its prompt, ``# Skill Context: <name>`` and its serialized context data; sections are
    separated by a blank line and empty sections are omitted."""
    sections = [base]
    for skill in skills:
        sections.append(f"# Skill: {skill.name}\n{skill.system_prompt}" if skill.system_prompt.strip() else "")
        sections.append(f"# Skill Context: {skill.name}\n{skill.context_json}" if skill.context_json else "")
    return "\n\n".join(section for section in sections if section.strip())


class ConversationSkills:
    """The active skills of one conversation for the steps of one turn attempt.

    ``catalog`` is the app's; the activation record's TTL (``keys.history_ttl``)
    is refreshed at every step so it expires with the history.
    """

    def __init__(self, catalog: SkillCatalog, keys: Keys, conversation_id: str) -> None:
        self._catalog = catalog
        self._keys = keys
        self._conversation_id = conversation_id
        #: The skills of the current step, in order (None until read).
        self.active: list[Skill] | None = None

    def queue_read(self, rt: RoundTrip) -> Pending[list[str]]:
        """Add this step's read of the active skill names to ``rt``; pass its value to :meth:`take`."""
        return skill_state.read_in(rt, self._keys, self._conversation_id)

    def take(self, spec: AgentSpec, names: list[str]) -> None:
        """Set the step's active skills from the names :meth:`queue_read` read."""
        self.active = self._resolve(spec, names)

    async def ensure(self, spec: AgentSpec, redis: Any) -> None:
        """Read the active skills unless this attempt did already (a re-run resuming with tool calls)."""
        if self.active is None:
            self.active = self._resolve(spec, await skill_state.active(redis, self._keys, self._conversation_id))

    def system_prompt(self, base: str) -> str:
        """``base`` with the sections of the active skills (:func:`compose_system_prompt`)."""
        return compose_system_prompt(base, self.active or [])

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
