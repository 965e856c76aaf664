"""The skills an app serves, by declared name.

Registration refuses two skills whose names normalize to the same tool prefix
(:class:`ConfigurationError`) and context data over the app's
``skill_context_max_bytes`` (:class:`SkillError`).
"""

from __future__ import annotations

import logging
from typing import Any

from smith_client.errors import ConfigurationError
from smith_worker.skills.model import DEFAULT_SKILL_CONTEXT_MAX_BYTES, Skill

logger = logging.getLogger("agent_smith.skill")


class SkillCatalog:
    """Registered skills in registration order. ``context_max_bytes`` is UTF-8 bytes."""

    def __init__(self, context_max_bytes: int = DEFAULT_SKILL_CONTEXT_MAX_BYTES) -> None:
        self.context_max_bytes = context_max_bytes
        self._skills: dict[str, Skill] = {}
        self._warned: set[tuple[Any, ...]] = set()

    def add(self, skill: Skill) -> Skill:
        """Register ``skill``. Raises :class:`SkillError` for oversized context data and
        :class:`ConfigurationError` when a registered skill has the same normalized name."""
        skill.check_context(self.context_max_bytes)
        for other in self._skills.values():
            if other.normalized_name == skill.normalized_name:
                raise ConfigurationError(
                    f"skills {other.name!r} and {skill.name!r} both normalize to the tool prefix "
                    f"{skill.normalized_name!r}",
                    setting="skills",
                )
        self._skills[skill.name] = skill
        logger.info("skill %r registered: %d tools, MCP servers %s", skill.name, len(skill.native), skill.aliases)
        return skill

    def get(self, name: str) -> Skill | None:
        """The skill declared as ``name``, or None."""
        return self._skills.get(name)

    def names(self) -> list[str]:
        """Declared names, in registration order."""
        return list(self._skills)

    def __contains__(self, name: object) -> bool:
        return name in self._skills

    def warn_once(self, key: tuple[Any, ...], message: str, *args: Any) -> None:
        """Log a warning the first time ``key`` is seen in this process (per-step rebuilds would repeat it)."""
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)
