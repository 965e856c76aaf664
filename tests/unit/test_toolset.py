"""One toolset per step (smith_worker/agent/toolset.py): the schemas sent to the model, the shadowing order,
the route of each call, and the tool worker running a job through the source it names (old jobs included)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from smith_client.errors import ConfigurationError
from smith_client.jobs import ToolJob, ToolOutcome
from smith_client.messages import ToolCall
from smith_worker import AgentConfig, Skill, SmithApp, make_tool
from smith_worker.agent.toolset import ToolRoute, Toolset, step_toolset
from smith_worker.llm.types import ToolSchema
from smith_worker.tool_worker.job import _invoke, legacy_source_id
from smith_worker.tools.function import ToolContext


def lookup(key: str) -> str:
    """Look a note up."""
    return f"skill:{key}"


class FakeSource:
    """A tool source with one fixed tool (the MCP source's interface, without a server)."""

    def __init__(self, alias: str, tool: str) -> None:
        self.name = alias
        self.tool = tool

    def owns(self, tool_name: str) -> bool:
        return tool_name.startswith(f"mcp_{self.name}__")

    def timeout_for(self, tool_name: str) -> float:
        return 12.0

    def idempotent(self, tool_name: str) -> bool:
        return False

    def approval(self, tool_name: str) -> bool:
        return False

    async def schemas(self, ctx=None):
        return [ToolSchema(name=self.tool, description=f"MCP {self.tool}")]


class FakeSubAgents:
    """Sub-agents as a source that runs here (the interface of smith_worker.agent.subagents.SubAgentTools)."""

    def __init__(self, *names: str, gated: tuple[str, ...] = ()) -> None:
        self.names = list(names)
        self.gated = gated
        self.ran: list[str] = []

    def owns(self, tool_name: str) -> bool:
        return tool_name in self.names

    def timeout_for(self, tool_name: str) -> None:
        return None

    def idempotent(self, tool_name: str) -> bool:
        return False

    def approval(self, tool_name: str) -> bool:
        return tool_name in self.gated

    async def schemas(self, asking=None):
        return [ToolSchema(name=name, description=f"sub-agent {name}") for name in self.names]

    async def run(self, job: ToolJob, route: ToolRoute) -> tuple[ToolOutcome, bool]:
        self.ran.append(job.call.name)
        return ToolOutcome(content="from the sub-agent"), True


class Jobs:
    """Records the calls run as tool jobs (what the loop would enqueue)."""

    def __init__(self) -> None:
        self.enqueued: list[tuple[str, str]] = []

    async def __call__(self, job: ToolJob, route: ToolRoute) -> tuple[ToolOutcome, bool]:
        self.enqueued.append((job.source, route.requires))
        return ToolOutcome(content="from a tool worker"), False


def app_with(skills: list[Skill], agent_sources: tuple[str, ...] = ()) -> SmithApp:
    app = SmithApp()
    for skill in skills:
        app.skill(skill)
    for alias in [*agent_sources, *(a for s in skills for a in s.aliases)]:
        app.sources[alias] = FakeSource(alias, f"mcp_{alias}__search")  # stands in for the pooled server
    return app


def toolset_of(app: SmithApp, spec, active: list[str], subagents=None, jobs=None) -> Toolset:
    skills = [app.skills.get(name) for name in active]
    return step_toolset(app, spec, skills, subagents or FakeSubAgents(), jobs or Jobs(), app.skills.warn_once)


def job_of(name: str, route: ToolRoute | None = None, **arguments: str) -> ToolJob:
    route = route or ToolRoute("", 1.0)
    call = ToolCall(id="1", name=name, arguments=arguments)
    return ToolJob(turn_id="t", conversation_id="c", agent="a", step=1, index=0, call=call, timeout=route.timeout,
                   reply_channel="r", result_key="k", source=route.source)  # fmt: skip


async def test_schemas_order_collisions_and_routes_of_skill_tools(caplog):
    def search(q: str) -> str:
        """Skill search."""
        return q

    notes = Skill("notes", tools=[lookup, make_tool(search, timeout=3.0, idempotent=True)],
                  mcp_servers=[{"alias": "web", "command": "web-server"}])  # fmt: skip
    other = Skill("other", tools=[make_tool(lookup, name="lookup", description="Other's lookup.")])
    app = app_with([notes, other, Skill("notes.v2", tools=[lookup])])  # notes.v2: a different prefix
    app.tool(lookup, name="notes__lookup", description="The app's lookup.")
    app.tool(lookup, name="add")
    spec = app.agent("a", tools=["notes__lookup", "add"], config=AgentConfig(default_tool_timeout=7.0))
    toolset = toolset_of(app, spec, ["notes", "other"])
    with caplog.at_level(logging.WARNING, logger="agent_smith.skill"):
        tools = await toolset.schemas(ToolContext(call_id="", tool_name=""))
        await toolset.schemas()
    assert [t.name for t in tools] == ["notes__lookup", "add", "notes__search", "other__lookup", "mcp_web__search"]
    assert tools[0].description == "Look a note up."  # the skill's, registered last, wins
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == ["tool name collision: 'notes__lookup' of skill 'notes' replaces the one of the agent "
                        "(last registered wins)"]  # named both, once per process  # fmt: skip
    assert toolset.route("notes__lookup") == ToolRoute("skill:notes", 7.0, False, "skill:notes/tool:notes__lookup",
                                                       "notes")  # a plain callable: the agent's default  # fmt: skip
    assert toolset.route("notes__search") == ToolRoute("skill:notes", 3.0, True, "skill:notes/tool:notes__search",
                                                       "notes")  # fmt: skip
    assert toolset.route("mcp_web__search") == ToolRoute("source:web", 12.0, False, "skill:notes/source:web", "notes")
    assert toolset.route("add") == ToolRoute("app", 7.0, False, "tool:add", "")  # the agent's own
    assert toolset.route("other__lookup").source == "skill:other" and toolset.route("nowhere") is None
    assert toolset_of(app, spec, []).route("notes__lookup") == ToolRoute("app", 7.0, False, "tool:notes__lookup")


async def test_mcp_tools_of_active_skills_come_last_and_win(caplog):
    def search(q: str) -> str:
        """Native search."""
        return q

    native = Skill("mcp_web", tools=[search])  # prefixes its tool exactly like MCP server "web" does
    bound = Skill("bound", mcp_servers=[{"alias": "web", "command": "web-server"}])
    app = app_with([native, bound])
    toolset = toolset_of(app, app.agent("a"), ["bound", "mcp_web"])
    tools = await toolset.schemas()
    assert [(t.name, t.description) for t in tools] == [("mcp_web__search", "MCP mcp_web__search")]
    assert "'mcp_web__search' of skill 'bound' (MCP server 'web') replaces the one of skill 'mcp_web'" in caplog.text
    assert toolset.route("mcp_web__search") == ToolRoute("source:web", 12.0, False, "skill:bound/source:web", "bound")


async def test_one_order_decides_the_schema_and_the_route_of_a_shared_name():
    """An agent's Python tool, its MCP server's tool, its sub-agent and an active skill's MCP tool all named
    ``mcp_web__search``: the model sees the last one's schema and the call runs the last one, whatever is active."""
    app = app_with([Skill("bound", mcp_servers=[{"alias": "web", "command": "web-server"}])], ("agentweb",))
    app.sources["agentweb"] = FakeSource("web", "mcp_web__search")  # the agent's server, offering the same name
    app.tool(lookup, name="mcp_web__search", description="The app's.")
    spec = app.agent("a", tools=["mcp_web__search"], sources=["agentweb"])
    subagents, jobs = FakeSubAgents("mcp_web__search"), Jobs()

    async def seen_and_run(active: list[str]) -> tuple[str, str]:
        toolset = toolset_of(app, spec, active, subagents, jobs)
        (schema,) = await toolset.schemas()
        route = toolset.route("mcp_web__search")
        outcome, _ = await toolset.run(job_of("mcp_web__search", route), route)
        return schema.description, outcome.content

    assert await seen_and_run([]) == ("sub-agent mcp_web__search", "from the sub-agent")
    assert await seen_and_run(["bound"]) == ("MCP mcp_web__search", "from a tool worker")
    assert jobs.enqueued == [("source:web", "skill:bound/source:web")] and subagents.ran == ["mcp_web__search"]
    without_subagent = toolset_of(app, spec, [], FakeSubAgents(), jobs)
    assert without_subagent.route("mcp_web__search").source == "source:agentweb"  # the agent's server, declared last
    assert (await without_subagent.schemas())[0].description == "MCP mcp_web__search"


async def test_a_call_no_layer_owns_is_answered_here_as_an_unknown_tool():
    jobs = Jobs()
    toolset = toolset_of(app_with([]), SmithApp().agent("a"), [], jobs=jobs)
    outcome, produced_here = await toolset.run(job_of("nowhere"), toolset.route("nowhere"))
    assert (outcome.is_error, produced_here, jobs.enqueued) == (True, True, [])
    assert "unknown tool: nowhere" in outcome.content


async def test_the_tool_worker_runs_a_job_through_the_source_it_names():
    def app_lookup(key: str) -> str:
        """The app's lookup."""
        return f"app:{key}"

    app = app_with([Skill("notes", tools=[lookup])])
    app.tool(app_lookup, name="notes__lookup")
    spec = app.agent("a", tools=["notes__lookup"])
    rt = SimpleNamespace(app=app, worker_id="w")

    async def ran(job: ToolJob) -> str:
        return (await _invoke(rt, job)).content

    with_skill, without = toolset_of(app, spec, ["notes"]), toolset_of(app, spec, [])
    assert await ran(job_of("notes__lookup", with_skill.route("notes__lookup"), key="k")) == "skill:k"
    job = job_of("notes__lookup", without.route("notes__lookup"), key="k")
    assert await ran(job) == "app:k"  # the same name, the source the job names
    assert "unknown tool" in await ran(job.model_copy(update={"source": "skill:gone"}))
    assert "unknown tool" in await ran(job.model_copy(update={"source": "agents"}))  # sub-agents never run there


async def test_a_job_enqueued_before_source_ids_is_routed_by_its_tool_and_skill():
    """A job as the previous version enqueued it (no ``source``; ``skill`` set for a skill's tool)."""

    def app_lookup(key: str) -> str:
        """The app's lookup."""
        return f"app:{key}"

    app = app_with([Skill("notes", tools=[lookup], mcp_servers=[{"alias": "web", "command": "web-server"}])])
    app.tool(app_lookup, name="notes__lookup")
    rt = SimpleNamespace(app=app, worker_id="w")
    old = {"turn_id": "t", "conversation_id": "c", "agent": "a", "step": 1, "index": 0, "timeout": 1.0,
           "reply_channel": "r", "result_key": "k", "idempotent": False,
           "call": {"id": "1", "name": "notes__lookup", "arguments": {"key": "k"}}}  # fmt: skip
    assert ToolJob.model_validate({**old, "skill": "notes"}).source == ""
    assert (await _invoke(rt, ToolJob.model_validate({**old, "skill": "notes"}))).content == "skill:k"
    assert (await _invoke(rt, ToolJob.model_validate({**old, "skill": ""}))).content == "app:k"
    assert legacy_source_id(app, "notes", "mcp_web__search") == "source:web"
    assert legacy_source_id(app, "", "mcp_web__search") == "source:web"
    assert legacy_source_id(app, "gone", "notes__lookup") == legacy_source_id(app, "", "nowhere") == ""


def test_a_worker_refuses_an_agent_tool_named_as_a_tool_of_its_own_mcp_server():
    """Its server would own the name (a step routes a name to its last owner), so the tool could never run."""
    app = app_with([])
    app.sources["agentweb"] = FakeSource("web", "mcp_web__search")
    app.tool(lookup, name="mcp_web__search", description="The app's.")
    app.agent("a", tools=["mcp_web__search"], sources=["agentweb"])
    with pytest.raises(ConfigurationError, match="tool 'mcp_web__search' is named as a tool of its source 'web'"):
        app.resolve_subagents()


async def test_approval_and_external_tools_are_policy_and_source_of_the_route():
    """needs_approval rides on the route; an external tool is a source of its own whose calls are never jobs
    (docs/architecture.md, Pausing for a person)."""
    from pydantic import BaseModel

    from smith_worker.tools.external import EXTERNAL

    class Pick(BaseModel):
        hint: str

    app = SmithApp()

    @app.tool(needs_approval=True)
    def drop(name: str) -> str:
        return name

    def outside(_ctx: ToolContext, arguments: dict) -> bool:
        return not arguments["path"].startswith("tmp/")

    @app.tool(needs_approval=outside)
    def write(path: str) -> str:
        return path

    app.external_tool("pick", description="Pick one.", parameters=Pick)
    with pytest.raises(ConfigurationError):
        app.external_tool("drop", description="taken", parameters={"type": "object"})
    with pytest.raises(ConfigurationError):
        app.tool(lambda: None, name="pick")
    with pytest.raises(ConfigurationError):
        app.tool(lookup, needs_approval="yes")  # type: ignore[arg-type]
    app.tool(lookup)
    spec = app.agent("a", tools=[drop, write, "pick", lookup])
    toolset = toolset_of(app, spec, [])
    assert sorted(s.name for s in await toolset.schemas()) == ["drop", "lookup", "pick", "write"]
    drop_route, write_route, pick_route = toolset.route("drop"), toolset.route("write"), toolset.route("pick")
    assert drop_route.approval is True and drop_route.gated and not drop_route.external
    ctx = ToolContext(call_id="1", tool_name="write")
    assert write_route.gated and write_route.approval(ctx, {"path": "home/x"})  # the policy decides per call
    assert not write_route.approval(ctx, {"path": "tmp/x"})
    assert pick_route.external and pick_route.source == EXTERNAL and pick_route.requires == ""
    assert (await toolset.schema("pick")).parameters["required"] == ["hint"]
    assert not toolset.route("lookup").gated


async def test_a_sub_agents_and_an_mcp_servers_approval_policy_ride_on_their_routes():
    """``app.agent(..., needs_approval=True)`` gates the calls of that agent as a sub-agent; an MCP server's
    ``needs_approval`` gates all its calls (True) or those of the listed tools (docs/architecture.md, Pausing for
    a person); an invalid value is refused."""
    app = SmithApp()
    assert app.agent("vetted", needs_approval=True).needs_approval is True
    app.tool(lookup)
    app.sources["web"] = FakeSource("web", "mcp_web__search")
    spec = app.agent("a", tools=[lookup], sources=["web"], subagents=["vetted", "free"])
    toolset = toolset_of(app, spec, [], subagents=FakeSubAgents("vetted", "free", gated=("vetted",)))
    assert toolset.route("vetted").approval is True and toolset.route("vetted").gated
    assert not toolset.route("free").gated and not toolset.route("mcp_web__search").gated
    with pytest.raises(ConfigurationError):
        app.mcp_server("bad", command="x", needs_approval="echo")  # type: ignore[arg-type]
    assert app.mcp_server("every", command="x", needs_approval=True).approval("mcp_every__any") is True
    assert app.mcp_server("none", command="x", needs_approval=[]).approval("mcp_none__any") is False
