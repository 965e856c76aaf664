"""What a tool job requires and what a worker serves (smith_worker/routing.py), on apps of two versions.

A job requires what its route in the step's toolset names (smith_worker/agent/toolset.py), and a tool worker runs it
through the source the route names, so a worker serves a requirement exactly when it can run the call: checked
here for every kind of tool.
"""

from __future__ import annotations

from smith_worker import Skill, SmithApp
from smith_worker.agent.toolset import ToolRoute, step_toolset
from smith_worker.routing import capability_digest, tool_capabilities, turn_capabilities
from tests.unit.test_toolset import FakeSubAgents, Jobs


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def lookup(key: str) -> str:
    """Look a note up."""
    return key


def convert(amount: float) -> float:
    """Convert an amount (a tool only v2 has)."""
    return amount


def v1_app() -> SmithApp:
    app = SmithApp()
    app.tool(add)
    app.mcp_server("files", command="files-server")
    app.skill(Skill("notes", tools=[lookup], mcp_servers=[{"alias": "notes-db", "command": "notes-server"}]))
    app.agent("default", tools=[add], sources=["files"], skills=["notes"])
    return app


def v2_app() -> SmithApp:
    app = v1_app()
    app.tool(convert)
    app.agent("v2agent", tools=[add, convert])
    return app


#: (active skill, tool name) of a call of each kind: a Python tool, an MCP tool, a skill's own tool, a skill's MCP tool.
CALLS = [("", "add"), ("", "mcp_files__read"), ("notes", "notes__lookup"), ("notes", "mcp_notes-db__query")]


def route(app: SmithApp, skill: str, name: str, agent: str = "default") -> ToolRoute | None:
    """The route of the call in a step of ``agent`` with ``skill`` active (besides the agent's default skills)."""
    spec = app.agents[agent]
    active = [app.skills.get(s) for s in dict.fromkeys([*spec.skills, *([skill] if skill else [])])]
    toolset = step_toolset(app, spec, active, FakeSubAgents(), Jobs(), app.skills.warn_once)
    return toolset.route(name)


def runs(app: SmithApp, found: ToolRoute | None) -> bool:
    """Whether a tool worker of ``app`` has the source a job of this route names (an "unknown tool" error otherwise)."""
    return found is not None and app.source(found.source) is not None


def test_every_call_a_tool_worker_runs_requires_something_its_set_holds():
    app = v2_app()
    served = tool_capabilities(app)
    for skill, name, agent in [*((s, n, "default") for s, n in CALLS), ("", "convert", "v2agent")]:
        found = route(app, skill, name, agent)
        assert runs(app, found) and found.requires in served, (skill, name)
    assert [route(app, s, n).requires for s, n in CALLS] == [
        "tool:add", "source:files", "skill:notes/tool:notes__lookup", "skill:notes/source:notes-db",
    ]  # the requirements workers older than source ids register  # fmt: skip


def test_a_tool_only_v2_has_is_required_from_a_set_only_v2_workers_hold():
    v1, v2 = v1_app(), v2_app()
    found = route(v2, "", "convert", "v2agent")
    assert found.requires == "tool:convert" and found.requires in tool_capabilities(v2)
    assert found.requires not in tool_capabilities(v1) and not v1.native.owns("convert")
    for skill, name in CALLS:  # the tools both versions have: both sets hold them
        assert route(v2, skill, name).requires in tool_capabilities(v1)


def test_turn_workers_serve_their_agents():
    assert turn_capabilities(v1_app()) == ["default"]
    assert turn_capabilities(v2_app()) == ["default", "v2agent"]


def test_workers_of_one_version_share_a_set_and_versions_do_not():
    v1, v2 = v1_app(), v2_app()
    assert capability_digest(tool_capabilities(v1)) == capability_digest(reversed(tool_capabilities(v1_app())))
    assert capability_digest(tool_capabilities(v1)) != capability_digest(tool_capabilities(v2))
    assert len(capability_digest([])) == 16
