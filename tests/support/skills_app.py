"""The app of the skills integration tests (``tests.support.skills_app:app``).

Three skills: ``research`` (a ``skill.json`` with a context file), ``pdf-tools``
(an Agent Skills ``SKILL.md``) and ``notes``, built in code with a native tool
whose prefixed name ``notes__lookup`` shadows the app's own tool of that name,
and the lab MCP server.
"""

from __future__ import annotations

import sys
from pathlib import Path

from smith_worker import AgentConfig, Skill, SmithApp, ToolContext
from tests.support.mcp_servers import LAB_SERVER

SKILLS = Path(__file__).resolve().parent / "skills"

app = SmithApp()


@app.tool(name="notes__lookup", timeout=5.0)
def app_lookup(key: str) -> str:
    """The app's own lookup (shadowed while skill notes is active)."""
    return f"app lookup: {key}"


def lookup(key: str, ctx: ToolContext) -> dict:
    """Look a note up in the notes skill."""
    return {"note": f"skill note for {key}", "worker": ctx.worker_id, "budget": ctx.budget}


app.skill(SKILLS / "research")
app.skill(str(SKILLS / "pdf-tools"))
app.skill(Skill("notes", system_prompt="Keep notes short.", tools=[lookup], description="Notes.",
                mcp_servers=[{"alias": "lab", "command": sys.executable, "args": [LAB_SERVER],
                              "request_timeout": 10.0, "allow": ["echo"]}]))

# a plain callable skill tool gets the running agent's default_tool_timeout (7 s here)
app.agent("default", system_prompt="You are a test agent.", tools=[app_lookup],
          config=AgentConfig(default_tool_timeout=7.0))
app.agent("researcher", system_prompt="You research.", skills=["research"])
