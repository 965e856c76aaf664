"""Skills: a prompt, native tools, MCP servers and context data, activated per conversation.

See docs/architecture.md, Skills.

Declare them on the app and activate them from any client::

    app.skill(Skill("notes", system_prompt="Keep notes.", tools=[lookup]))
    app.skill("skills/pdf-tools")          # a directory with SKILL.md or skill.json
    app.agent("default", skills=["notes"])  # optional default skills of an agent

    await client.activate_skill("c1", "pdf-tools")

Modules, one concern each: :mod:`.model` (``Skill``, name normalization,
context size), :mod:`.loader` (``load_skill``), :mod:`.catalog` (the app's
registered skills), :mod:`.active` (a conversation's active skills at one
step and their composed system prompt). Their tools reach a step through
:mod:`smith_worker.agent.toolset`. The activation record itself is :mod:`smith_client.skills`.
"""

from smith_worker.skills.active import ConversationSkills, compose_system_prompt
from smith_worker.skills.catalog import SkillCatalog
from smith_worker.skills.loader import load_skill
from smith_worker.skills.model import DEFAULT_SKILL_CONTEXT_MAX_BYTES, Skill, SkillTool, normalize_skill_name

__all__ = [
    "DEFAULT_SKILL_CONTEXT_MAX_BYTES",
    "ConversationSkills",
    "Skill",
    "SkillCatalog",
    "SkillTool",
    "compose_system_prompt",
    "load_skill",
    "normalize_skill_name",
]
