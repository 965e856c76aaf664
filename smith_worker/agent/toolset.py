"""One model step's tools: the names, schemas, shadowing and routes of every tool a step offers.

The order and shadowing rules are those of docs/architecture.md, Skills.

Each step builds one :class:`Toolset` (:func:`step_toolset`) from layers, each
a tool source as the step offers it, in this order:

1. the agent's Python tools (``AgentSpec.tools``);
2. the agent's sources (``AgentSpec.sources``: MCP servers), in declaration order;
3. the agent's sub-agents (``AgentSpec.subagents``), which run here, in the turn worker, then its handoff tools
   (``transfer_to_<agent>``, :mod:`smith_worker.agent.handoffs`), which run here too;
4. the Python tools of the active skills, ``<normalized_name>__<tool>``, skills in activation order
   (the agent's default skills, then the conversation's);
5. the MCP servers of the active skills, in the same skill order, each skill's servers in declaration order.

**A name offered twice keeps the last layer offering it** ("last registered
wins"), for the schema sent to the model and for the route of a call alike;
the schema keeps the place of the name's first appearance, and each
collision logs one warning per process naming both owners. So deactivating a
skill brings back a tool it shadowed. A call is routed by name ownership
(:meth:`ToolSource.owns`), not by this step's listing, so a step that listed
nothing (a re-run resuming at its tool calls) or a server that offered no
tools this step still routes its calls.

A route also carries the call's **policy** (docs/architecture.md, Pausing for a person): whether it waits for a
person's approval first (``approval``, its source's word: a Python tool's ``needs_approval``, an MCP server's
``needs_approval``, a sub-agent's ``needs_approval`` for its use as a tool) and whether it runs outside the fleet
(``external``: an external tool, whose result a client gives). The agent loop asks
:mod:`smith_worker.agent.approvals` what becomes of such calls; the toolset only says which they are.

A route (:class:`ToolRoute`) names the source that runs the call by a
**source id** (:mod:`smith_worker.tools.source`): :data:`APP_TOOLS` (the app's Python tools), :func:`source_id`
(an added source such as an MCP server), :func:`skill_id` (a skill's Python
tools) or :data:`SUBAGENTS`. A tool job carries it, and the tool worker runs
the job through that source (:meth:`smith_worker.app.SmithApp.source`)
without choosing again. The route also says what a tool worker must serve to
take the job (``requires``: the capability strings of
:mod:`smith_worker.routing`, the same as workers older than source ids
register). A new kind of tool is one more layer here and its source.

A turn's ``tools`` override (docs/architecture.md, Per-turn overrides) narrows a toolset to the names it
allows (``allowed``): the others are neither offered nor routed (a call of one is an unknown tool).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from smith_client.jobs import ToolJob, ToolOutcome
from smith_worker.config import AgentConfig
from smith_worker.llm.types import ToolSchema
from smith_worker.skills import Skill
from smith_worker.tools.external import EXTERNAL, ExternalTools
from smith_worker.tools.function import Approval, ToolContext, error_content
from smith_worker.tools.native import NativeTools
from smith_worker.tools.source import APP_TOOLS, SUBAGENTS, ToolSource, in_skill, skill_id, source_id, tool_unit

#: The source id of handoff tools (their calls run in the turn worker, :mod:`smith_worker.agent.handoffs`).
HANDOFFS = "handoffs"


@dataclass(frozen=True)
class ToolRoute:
    """How one call of a step runs.

    ``source``: the source id of the source running it (see the module doc);
    ``timeout``: its budget, seconds; ``idempotent``: whether it may be re-run
    after its tool worker died (docs/architecture.md, Fault model); ``requires``: what a tool worker
    must serve to take its job ("" for a call that never becomes one);
    ``skill``: the declared name of the skill offering the tool ("" for the
    agent's own), which workers older than source ids resolve a job by; ``approval``: whether a call waits
    for a person's approval (:data:`~smith_worker.tools.function.Approval`); ``external``: the call's result
    comes from a client, it never becomes a job.
    """

    source: str
    timeout: float
    idempotent: bool = False
    requires: str = ""
    skill: str = ""
    approval: Approval = False
    external: bool = False

    @property
    def gated(self) -> bool:
        """True when a call may wait for a person (an approval policy other than False, or an external tool)."""
        return self.external or self.approval is not False


#: Runs a routed call's job: its outcome and whether it was produced here (else the tool worker published it).
RunCall = Callable[[ToolJob, ToolRoute], Awaitable[tuple[ToolOutcome, bool]]]
#: Logs a warning once per process for a key (:meth:`smith_worker.skills.SkillCatalog.warn_once`).
WarnOnce = Callable[..., None]


class OffersTools(Protocol):
    """What a step asks of a layer's source (a :class:`ToolSource` has it; so do sub-agents)."""

    def owns(self, tool_name: str) -> bool: ...

    def timeout_for(self, tool_name: str) -> float | None: ...

    def idempotent(self, tool_name: str) -> bool: ...

    def approval(self, tool_name: str) -> Approval: ...

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]: ...


class RunsHere(OffersTools, Protocol):
    """A source whose calls run in the turn worker (sub-agents), not as tool jobs."""

    async def run(self, job: ToolJob, route: ToolRoute) -> tuple[ToolOutcome, bool]: ...


@dataclass(frozen=True)
class Layer:
    """One source as a step offers it: ``tools`` (which also give each tool's approval policy), its
    ``source_id``, ``owner`` (who offers it, for the collision warning), ``requires`` (a tool name → what a
    tool worker must serve to run it), ``skill`` (the offering skill, "" for the agent's own) and ``run``
    (how a call of it runs)."""

    tools: OffersTools
    source_id: str
    owner: str
    requires: Callable[[str], str]
    run: RunCall
    skill: str = ""


class Toolset:
    """The tools of one step: ``layers`` in shadowing order (a later layer wins a name); ``default_timeout``
    (seconds) is the budget of a tool without its own; ``warn`` logs a collision once per process;
    ``allowed`` (None: every tool) are the only names offered and routed (a turn's ``tools`` override)."""

    def __init__(
        self,
        layers: Sequence[Layer],
        default_timeout: float,
        warn: WarnOnce,
        allowed: Collection[str] | None = None,
    ) -> None:
        self._layers = list(layers)
        self._default_timeout = default_timeout
        self._warn = warn
        self._allowed = None if allowed is None else frozenset(allowed)
        self._run_by_source = {layer.source_id: layer.run for layer in self._layers}

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """The schemas sent to the model this step: every layer's, a name once (see the module doc).

        ``asking`` names the turn asking, so an MCP discovery reports on its stream.
        Raises what a required MCP server's listing raises.
        """
        table: dict[str, tuple[ToolSchema, str]] = {}
        for layer in self._layers:
            for schema in await layer.tools.schemas(asking):
                previous = table.get(schema.name)
                if previous is not None and previous[1] != layer.owner:
                    self._warn(
                        ("collision", schema.name, previous[1], layer.owner),
                        "tool name collision: %r of %s replaces the one of %s (last registered wins)",
                        schema.name,
                        layer.owner,
                        previous[1],
                    )
                table[schema.name] = (schema, layer.owner)
        return [schema for schema, _ in table.values() if self._allows(schema.name)]

    def _allows(self, tool_name: str) -> bool:
        return self._allowed is None or tool_name in self._allowed

    def route(self, tool_name: str) -> ToolRoute | None:
        """How a call of ``tool_name`` runs this step (the last layer owning the name), or None when no
        layer owns it or the turn does not allow it (the call's answer is an unknown-tool error)."""
        if not self._allows(tool_name):
            return None
        for layer in reversed(self._layers):
            if layer.tools.owns(tool_name):
                timeout = layer.tools.timeout_for(tool_name)
                return ToolRoute(
                    layer.source_id,
                    timeout if timeout is not None else self._default_timeout,
                    layer.tools.idempotent(tool_name),
                    layer.requires(tool_name),
                    layer.skill,
                    layer.tools.approval(tool_name),
                    layer.source_id == EXTERNAL,
                )
        return None

    async def schema(self, tool_name: str) -> ToolSchema | None:
        """The schema of ``tool_name`` from the layer that owns it (as :meth:`route`), None when none does."""
        for layer in reversed(self._layers):
            if layer.tools.owns(tool_name):
                return next((s for s in await layer.tools.schemas() if s.name == tool_name), None)
        return None

    async def run(self, job: ToolJob, route: ToolRoute | None) -> tuple[ToolOutcome, bool]:
        """Run ``job`` as ``route`` says (:meth:`route` of its call's name): its outcome, and whether it was
        produced here (True) or by a tool worker, which published it. Raises what the source's ``run`` raises."""
        if route is None:
            return ToolOutcome(content=error_content(f"unknown tool: {job.call.name}"), is_error=True), True
        return await self._run_by_source[route.source](job, route)


class AgentTools(Protocol):
    """What a toolset reads of an agent (:class:`smith_worker.app.AgentSpec` has it)."""

    @property
    def tools(self) -> list[str]: ...

    @property
    def sources(self) -> list[str]: ...

    @property
    def config(self) -> AgentConfig: ...


class ToolCatalog(Protocol):
    """What a toolset reads of the app (:class:`smith_worker.app.SmithApp` has it)."""

    native: NativeTools
    external: ExternalTools

    @property
    def sources(self) -> Mapping[str, ToolSource]: ...

    def skill_tools(self, skill: Skill) -> NativeTools: ...


def _fixed(requirement: str) -> Callable[[str], str]:
    return lambda _tool_name: requirement


def _skill_tool(skill: str) -> Callable[[str], str]:
    return lambda tool_name: in_skill(skill, tool_unit(tool_name))


def step_toolset(
    app: ToolCatalog,
    agent: AgentTools,
    skills: Sequence[Skill],
    subagents: RunsHere,
    run_job: RunCall,
    warn: WarnOnce,
    handoffs: RunsHere | None = None,
    allowed: Collection[str] | None = None,
) -> Toolset:
    """The toolset of one step of ``agent``: its layers in the module doc's order.

    ``skills`` are the step's active skills in order; ``subagents`` the agent's
    sub-agents; ``run_job`` runs a call as a tool job (every layer but the
    sub-agents', the handoffs' and the external tools', whose calls never run here); ``handoffs`` the agent's
    handoff tools; ``allowed`` the turn's ``tools`` override (None: none). Raises ``KeyError`` for a source name
    the app does not have (agents and skills are checked when declared).
    """
    native = app.native.restricted(agent.tools)
    layers = [
        Layer(native, APP_TOOLS, "the agent", tool_unit, run_job),
        Layer(app.external.restricted(agent.tools), EXTERNAL, "the agent (external tool)", _fixed(""), run_job),
        *(
            Layer(app.sources[name], source_id(name), f"the agent (source {name!r})", _fixed(source_id(name)), run_job)
            for name in agent.sources
        ),
        Layer(subagents, SUBAGENTS, "the agent (sub-agent)", _fixed(""), subagents.run),
    ]
    if handoffs is not None:
        layers.append(Layer(handoffs, HANDOFFS, "the agent (handoff)", _fixed(""), handoffs.run))
    for skill in skills:
        own = app.skill_tools(skill)
        owner = f"skill {skill.name!r}"
        layers.append(Layer(own, skill_id(skill.name), owner, _skill_tool(skill.name), run_job, skill.name))
    for skill in skills:
        for alias in skill.aliases:
            layers.append(
                Layer(
                    app.sources[alias],
                    source_id(alias),
                    f"skill {skill.name!r} (MCP server {alias!r})",
                    _fixed(in_skill(skill.name, source_id(alias))),
                    run_job,
                    skill.name,
                )
            )
    return Toolset(layers, agent.config.default_tool_timeout, warn, allowed)
