"""What a tool job requires and what a worker serves (smith_worker/routing.py), on apps of two versions.

A job requires what the tool worker resolves its call to (smith_worker/tool_runner.py ``_target``), so a
worker serves a requirement exactly when it can run the call: checked here for every kind of tool.
"""

from __future__ import annotations

from types import SimpleNamespace

from smith_client.jobs import ToolJob
from smith_client.messages import ToolCall
from smith_worker import Skill, SmithApp
from smith_worker.routing import capabilities, capability_digest, tool_requirement
from smith_worker.tool_runner import _target


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


#: (skill, tool name) of a call of each kind: a Python tool, an MCP tool, a skill's own tool, a skill's MCP tool.
CALLS = [("", "add"), ("", "mcp_files__read"), ("notes", "notes__lookup"), ("notes", "mcp_notes-db__query")]


def runs(app: SmithApp, skill: str, name: str) -> bool:
    """Whether a tool worker of ``app`` finds the call's tool (an "unknown tool" error otherwise)."""
    job = ToolJob(turn_id="t", conversation_id="c", agent="default", step=1, index=0, call=ToolCall(id="1", name=name),
                  timeout=1.0, reply_channel="r", result_key="k", skill=skill)  # fmt: skip
    return _target(SimpleNamespace(app=app), job) is not None  # type: ignore[arg-type]


def test_every_call_a_tool_worker_runs_requires_something_its_set_holds():
    app = v2_app()
    served = capabilities(app, "tools")
    for skill, name in [*CALLS, ("", "convert")]:
        assert runs(app, skill, name)
        assert tool_requirement(app, skill, name) in served, (skill, name)
    assert [tool_requirement(app, s, n) for s, n in CALLS] == [
        "tool:add", "source:files", "skill:notes/tool:notes__lookup", "skill:notes/source:notes-db",
    ]  # fmt: skip


def test_a_tool_only_v2_has_is_required_from_a_set_only_v2_workers_hold():
    v1, v2 = v1_app(), v2_app()
    requires = tool_requirement(v2, "", "convert")
    assert requires == "tool:convert" and requires in capabilities(v2, "tools")
    assert requires not in capabilities(v1, "tools") and not runs(v1, "", "convert")
    for skill, name in CALLS:  # the tools both versions have: both sets hold them
        assert tool_requirement(v2, skill, name) in capabilities(v1, "tools")


def test_a_tool_the_app_does_not_have_requires_nothing():
    app = v1_app()
    assert tool_requirement(app, "", "nowhere") == "" and tool_requirement(app, "unknown-skill", "x") == ""


def test_turn_workers_serve_their_agents():
    assert capabilities(v1_app(), "turns") == ["default"]
    assert capabilities(v2_app(), "turns") == ["default", "v2agent"]


def test_workers_of_one_version_share_a_set_and_versions_do_not():
    v1, v2 = v1_app(), v2_app()
    assert capability_digest(capabilities(v1, "tools")) == capability_digest(reversed(capabilities(v1_app(), "tools")))
    assert capability_digest(capabilities(v1, "tools")) != capability_digest(capabilities(v2, "tools"))
    assert len(capability_digest([])) == 16
