"""The app object a worker is pointed at (``smith-worker package.module:app``).

It declares tools and agents in Python::

    app = SmithApp()

    @app.tool(timeout=5.0)
    def calculator(expression: str) -> float: ...

    app.agent("default", system_prompt="You are helpful.", tools=[calculator])

Skills (:mod:`smith_worker.skills`) are registered with :meth:`SmithApp.skill`.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, Unpack, cast, get_args, overload

from pydantic import BaseModel

from smith_client.errors import ConfigurationError
from smith_client.keys import ID_PATTERN
from smith_worker.config import AgentConfig, Settings
from smith_worker.hooks import Hooks
from smith_worker.llm.types import LlmClientConfig, ToolChoice, ToolSchema
from smith_worker.memory import FullMemory, Memory
from smith_worker.skills import DEFAULT_SKILL_CONTEXT_MAX_BYTES, Skill, SkillCatalog, load_skill
from smith_worker.tools.external import ExternalTools
from smith_worker.tools.function import (
    DEFAULT_TOOL_BACKOFF,
    TOOL_NAME,
    Approval,
    Backoff,
    Isolation,
    Tool,
    ToolOptions,
    ToolRegistry,
    make_tool,
)
from smith_worker.tools.native import NativeTools
from smith_worker.tools.source import APP_TOOLS, ToolSource, skill_id
from smith_worker.tools.source import source_id as added_source_id

_F = TypeVar("_F", bound=Callable[..., Any])

#: An agent's ``tool_choice``: the chat-completions values (:data:`ToolChoice`) or one of its tools' names.
AgentToolChoice = str | dict[str, Any]
#: How an agent with an ``output_type`` asks for it (docs/architecture.md, Structured output).
OutputMode = Literal["auto", "response_format", "tool", "prompted"]
#: An agent's ``output_type``: a pydantic model, or a JSON Schema (a dict).
OutputType = type[BaseModel] | dict[str, Any]


@dataclass
class AgentSpec:
    """One agent: its prompt, the tools it may call, and its model settings.

    ``llm`` overrides the environment's model settings (a dict of
    :class:`LlmClientConfig` fields, or a full config). ``tool_choice`` is sent
    on the first model call ("auto", "required", "none", or a tool name, which
    becomes a named choice); with ``reset_tool_choice`` it becomes
    ``tool_choice_after_tools`` ("auto" by default) after a tool round, as the
    OpenAI Agents SDK does to avoid loops. ``skills`` are the declared names of
    skills active in every conversation this agent runs, before the
    conversation's own. ``memory`` computes what of the
    conversation the model sees at each step (:mod:`smith_worker.memory`).
    ``description`` is what a parent agent's model reads about this agent when
    it is a sub-agent; ``subagents`` names the agents this one may call as
    tools (docs/architecture.md, Sub-agents; resolved at worker start by :meth:`SmithApp.resolve_subagents`);
    ``needs_approval`` (:data:`~smith_worker.tools.function.Approval`) makes a parent's call of this agent
    wait for a person's approval before it runs (docs/architecture.md, Pausing for a person).
    ``output_type``, ``output_mode`` and ``output_retries``: the structured output its final answer must
    validate against (docs/architecture.md, Structured output; :mod:`smith_worker.agent.output`).
    ``handoffs`` names the agents this one may hand the conversation to, each offered as a
    ``transfer_to_<agent>`` tool (docs/architecture.md, Handoffs; :mod:`smith_worker.agent.handoffs`).
    """

    name: str
    system_prompt: str = ""
    description: str = ""
    subagents: list[str] = field(default_factory=list)
    tools: list[str] = field(default_factory=list)
    llm: dict[str, Any] | LlmClientConfig | None = None
    config: AgentConfig = field(default_factory=AgentConfig)
    tool_choice: AgentToolChoice | None = None
    reset_tool_choice: bool = True
    tool_choice_after_tools: AgentToolChoice = "auto"
    hooks: Hooks = field(default_factory=Hooks)
    sources: list[str] = field(default_factory=list)
    skills: list[str] = field(default_factory=list)
    memory: Memory = field(default_factory=FullMemory)
    needs_approval: Approval = False
    output_type: OutputType | None = None
    output_mode: OutputMode = "auto"
    output_retries: int = 2
    handoffs: list[str] = field(default_factory=list)

    def tool_choice_for(self, tool_rounds: int) -> ToolChoice | None:
        """The ``tool_choice`` to send after ``tool_rounds`` completed tool rounds.

        None (the server's default) when the agent sets no ``tool_choice``.
        """
        if self.tool_choice is None:
            return None
        choice = self.tool_choice_after_tools if tool_rounds > 0 and self.reset_tool_choice else self.tool_choice
        if choice in ("auto", "required", "none"):
            return cast(ToolChoice, choice)
        if isinstance(choice, str):  # a tool's name
            return {"type": "function", "function": {"name": choice}}
        return choice


class SmithApp:
    """Tools, skills and agents served by a worker process.

    ``settings`` defaults to :meth:`Settings.from_env` (read when first used,
    so importing the app module never touches the environment early).
    ``skill_context_max_bytes`` caps a skill's serialized context data (UTF-8
    bytes; 16 KiB). ``context_type`` (a pydantic model class) is the type of the caller context
    (``send(..., context=...)``): each turn's is validated into it as the turn starts (a context that does
    not fit fails the turn with ``ContextValidationError``) and tools get the instance as ``ctx.context``;
    the values of its ``SecretStr`` fields are redacted everywhere but the context's own record
    (docs/architecture.md, Caller context). Without it tools get the JSON object as sent.
    Raises :class:`ConfigurationError` for a ``context_type`` that is not a pydantic model class.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        skill_context_max_bytes: int = DEFAULT_SKILL_CONTEXT_MAX_BYTES,
        context_type: type[BaseModel] | None = None,
    ) -> None:
        if context_type is not None and not (isinstance(context_type, type) and issubclass(context_type, BaseModel)):
            raise ConfigurationError(
                f"context_type must be a pydantic model class, got {context_type!r}", setting="context_type"
            )
        #: The caller context's type (None: tools get the JSON object as sent).
        self.context_type = context_type
        self._settings = settings
        self.tools = ToolRegistry()
        #: The app's Python tools as a tool source (started with the other sources at worker start-up).
        self.native = NativeTools(self.tools)
        #: The app's external tools (:meth:`external_tool`), a source whose calls wait for a client's result.
        self.external = ExternalTools()
        self.skills = SkillCatalog(skill_context_max_bytes)
        self.agents: dict[str, AgentSpec] = {}
        self.hooks = Hooks()
        self.sources: dict[str, ToolSource] = {}

    @property
    def settings(self) -> Settings:
        """The deployment settings (from the environment unless given)."""
        if self._settings is None:
            self._settings = Settings.from_env()
        return self._settings

    @overload
    def tool(self, fn: _F, /) -> _F: ...

    @overload
    def tool(
        self, fn: None = None, *, name: str | None = None, description: str | None = None,
        parameters: dict[str, Any] | None = None, timeout: float | None = None, idempotent: bool = False,
        isolation: Isolation = "thread", needs_approval: Approval = False, retries: int = 0,
        retry_on: type[BaseException] | tuple[type[BaseException], ...] = (), backoff: Backoff = DEFAULT_TOOL_BACKOFF,
    ) -> Callable[[_F], _F]: ...  # fmt: skip

    def tool(self, fn: _F | None = None, **options: Unpack[ToolOptions]) -> _F | Callable[[_F], _F]:
        """Register a tool; usable as ``@app.tool`` or ``@app.tool(timeout=5.0)``.

        ``timeout`` is seconds; without one, each agent calling the tool gives it
        its ``AgentConfig.default_tool_timeout`` (30 s by default). A sync tool runs in a thread, which Python
        cannot stop: past its timeout it runs on (counted; too many make the
        tool worker restart). ``isolation="process"`` runs it in a pool
        process killed at its timeout instead (module-level function, picklable
        arguments and result). ``needs_approval`` (True, or ``callable(ctx, arguments) -> bool`` or an
        awaitable bool, deciding per call) makes a call wait for a person: the turn pauses until a client
        approves or rejects it (docs/architecture.md, Pausing for a person). ``retries`` re-runs an
        ``idempotent=True`` tool whose attempt raised one of ``retry_on`` (none by default), after ``backoff``
        (base seconds, or ``callable(retry) -> seconds``), within its timeout; a tool raising
        :class:`~smith_worker.tools.function.RetryWithMessage` hands the model a correction instead
        (:func:`~smith_worker.tools.function.make_tool`). Raises :class:`ConfigurationError` on a name
        collision and for inconsistent options.
        """

        def register(func: _F) -> _F:
            tool = make_tool(func, **options)
            if tool.name in self.external or not self.tools.add(tool):
                raise ConfigurationError(f"tool {tool.name!r} is already registered", setting="tools")
            func.__smith_tool__ = tool  # type: ignore[attr-defined]
            return func

        return register(fn) if fn is not None else register

    def external_tool(self, name: str, *, description: str, parameters: dict[str, Any] | type[BaseModel]) -> ToolSchema:
        """Declare a tool the model may call whose result comes from outside (a browser, another service):
        agents list ``name`` in their ``tools``; a call pauses the turn (kind ``external``) until a client
        gives its result with ``submit_tool_result`` (docs/architecture.md, Pausing for a person).

        ``parameters`` is a JSON Schema or a pydantic model (its schema). Returns the schema the model sees.
        Raises :class:`ConfigurationError` for a bad name or a name taken by another tool.
        """
        if name in self.tools:
            raise ConfigurationError(f"tool {name!r} is already registered", setting="tools")
        return self.external.add(name, description, parameters)

    def agent(
        self,
        name: str,
        *,
        system_prompt: str = "",
        tools: list[str | Callable[..., Any]] | None = None,
        llm: dict[str, Any] | LlmClientConfig | None = None,
        config: AgentConfig | None = None,
        tool_choice: AgentToolChoice | None = None,
        reset_tool_choice: bool = True,
        tool_choice_after_tools: AgentToolChoice = "auto",
        hooks: Hooks | None = None,
        sources: list[str] | None = None,
        skills: list[str] | None = None,
        memory: Memory | None = None,
        description: str = "",
        subagents: list[str] | None = None,
        needs_approval: Approval = False,
        output_type: OutputType | None = None,
        output_mode: OutputMode = "auto",
        output_retries: int = 2,
        handoffs: list[str] | None = None,
    ) -> AgentSpec:
        """Declare an agent. ``tools`` are tool names or registered functions; ``sources``
        names tool sources added with :meth:`add_source` (e.g. MCP server aliases);
        ``skills`` names registered skills active by default, in this order;
        ``memory`` is a :class:`~smith_worker.memory.Memory` (default :class:`FullMemory`).
        ``subagents`` names agents (this one included) the agent may call as a tool
        named after the agent, with one ``task`` string parameter and the
        sub-agent's ``description``; the names are resolved when the
        worker starts (:meth:`resolve_subagents`), so they may be declared later.
        ``needs_approval`` (True, or ``callable(ctx, arguments) -> bool`` or an awaitable bool) makes a call
        of this agent by a parent agent wait for a person's approval before the agent runs
        (docs/architecture.md, Pausing for a person).
        ``output_type`` (a pydantic model or a JSON Schema dict) is what the agent's final answer must validate
        against; ``output_mode`` how it is asked for: ``"response_format"`` (the server's ``response_format``
        JSON schema), ``"tool"`` (a ``final_result`` tool whose call ends the turn), ``"prompted"`` (the schema
        in the system prompt), or ``"auto"``: ``response_format`` when the model config says the server supports
        it, else ``tool``. An answer that fails validation goes back to the model with its errors, up to
        ``output_retries`` times, then the turn fails with ``OutputValidationError``
        (docs/architecture.md, Structured output).
        ``handoffs`` names agents (resolved at worker start like ``subagents``) the model may hand the
        conversation to with a ``transfer_to_<agent>`` tool described by the target's ``description``:
        the target answers the rest of the turn and the conversation's next turns (docs/architecture.md, Handoffs).

        Raises :class:`ConfigurationError` for a bad name, a duplicate agent, an
        unregistered tool, an unknown source, an unregistered skill, a ``memory``
        that is not a Memory, or a bad ``output_type``, ``output_mode`` or ``output_retries``.
        """
        _check_output(output_type, output_mode, output_retries)
        _require_registered("skill", skills, self.skills, "skills")
        if memory is not None and not isinstance(memory, Memory):
            raise ConfigurationError(
                f"agent memory must be a Memory (e.g. RollingWindowMemory), got {memory!r}", setting="memory"
            )
        _require_registered("source", sources, self.sources, "sources")
        if not ID_PATTERN.match(name):
            raise ConfigurationError(f"invalid agent name {name!r}", setting="agent")
        if name in self.agents:
            raise ConfigurationError(f"agent {name!r} is already declared", setting="agent")
        spec = AgentSpec(
            name=name,
            system_prompt=system_prompt,
            tools=[self._tool_name(t) for t in tools or []],
            llm=llm,
            config=config or AgentConfig(),
            tool_choice=tool_choice,
            reset_tool_choice=reset_tool_choice,
            tool_choice_after_tools=tool_choice_after_tools,
            hooks=hooks or Hooks(),
            sources=list(sources or []),
            memory=memory if memory is not None else FullMemory(),
            skills=list(skills or []),
            description=description,
            subagents=list(subagents or []),
            needs_approval=needs_approval,
            output_type=output_type,
            output_mode=output_mode,
            output_retries=output_retries,
            handoffs=list(handoffs or []),
        )
        self.agents[name] = spec
        return spec

    def _tool_name(self, ref: str | Callable[..., Any]) -> str:
        tool: Tool | None = getattr(ref, "__smith_tool__", None)
        name = tool.name if tool is not None else ref if isinstance(ref, str) else None
        if name is None or (name not in self.tools and name not in self.external):
            raise ConfigurationError(f"agent tool {ref!r} is not a registered tool", setting="tools")
        return name

    def resolve_subagents(self) -> None:
        """Check every agent's ``subagents`` (worker start-up).

        Raises :class:`ConfigurationError` for an undeclared agent, a name that
        is not a valid tool name (``^[A-Za-z0-9_-]{1,64}$``), or one that clashes
        with another tool of the calling agent (its native tools, its sources'
        tools, its other sub-agents); and for a Python tool of an agent named as
        one of its sources' tools (``mcp_<alias>__…``), which that source would run.
        """
        for spec in self.agents.values():
            _check_own_tools(spec, self.sources_for(spec)[1:])
            _check_handoffs(spec, self.agents, self.sources_for(spec))
            for name in spec.subagents:
                if name not in self.agents:
                    raise ConfigurationError(
                        f"agent {spec.name!r}: sub-agent {name!r} is not a declared agent", setting="subagents"
                    )
                if not TOOL_NAME.match(name):  # offered to the model as a tool named after the agent
                    raise ConfigurationError(
                        f"agent {spec.name!r}: sub-agent {name!r} is not a valid tool name ({TOOL_NAME.pattern})",
                        setting="subagents",
                    )
                if any(source.owns(name) for source in self.sources_for(spec)) or spec.subagents.count(name) > 1:
                    raise ConfigurationError(
                        f"agent {spec.name!r}: sub-agent {name!r} clashes with another tool of the agent",
                        setting="subagents",
                    )

    def get_agent(self, name: str) -> AgentSpec | None:
        """The agent declared as ``name``, or None."""
        return self.agents.get(name)

    def add_source(self, source: ToolSource) -> ToolSource:
        """Register a tool source under ``source.name``. Raises :class:`ConfigurationError` on a duplicate."""
        if source.name in self.sources:
            raise ConfigurationError(f"tool source {source.name!r} is already registered", setting="sources")
        self.sources[source.name] = source
        return source

    def skill(self, skill_or_path: Skill | str | Path) -> Skill:
        """Register a skill: a :class:`Skill`, or a directory loaded with :func:`load_skill`.

        Its native tools reach the model as ``<normalized_name>__<tool>`` and
        run on tool workers; its MCP servers become tool sources pooled like any
        other (a server alias already registered must have the same config, and
        is then shared). Conversations activate it by its declared name.
        Raises :class:`SkillError` (bad directory, oversized context data) or
        :class:`ConfigurationError` (normalized name or MCP alias already taken).
        """
        skill = (
            skill_or_path
            if isinstance(skill_or_path, Skill)
            else load_skill(skill_or_path, context_max_bytes=self.skills.context_max_bytes)
        )
        for config in skill.servers:
            existing = self.sources.get(config.alias)
            if existing is not None and getattr(existing, "config", None) != config:
                raise ConfigurationError(
                    f"skill {skill.name!r}: MCP server alias {config.alias!r} is registered with another configuration",
                    setting="mcp_servers",
                )
        self.skills.add(skill)
        for config in skill.servers:
            if config.alias not in self.sources:
                from smith_worker.mcp import McpServerSource  # only apps with MCP servers load the MCP modules

                self.add_source(McpServerSource(config))
        return skill

    def mcp_server(
        self,
        alias: str,
        *,
        command: str | None = None,
        args: list[str] | tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        url: str | None = None,
        bearer_token: str | None = None,
        headers: dict[str, str] | None = None,
        request_timeout: float = 30.0,
        allow: list[str] | None = None,
        deny: list[str] | None = None,
        tools_required: bool = True,
        reconnect_on_transport_error: bool = True,
        needs_approval: bool | Sequence[str] = False,
        sampling: bool = False,
        sampling_needs_approval: bool = False,
        elicitation_timeout: float = 300.0,
        **pool_options: Any,
    ) -> ToolSource:
        """Declare an MCP server (docs/architecture.md, MCP) as a tool source named ``alias``; agents use it with
        ``sources=[alias]`` and see its tools as ``mcp_<alias>__<tool>``.

        A stdio server takes ``command`` (+ ``args``, ``env``, ``cwd``); a
        Streamable HTTP server takes ``url`` (+ ``bearer_token``, ``headers``).
        ``request_timeout`` is seconds; ``allow`` / ``deny`` filter original
        tool names (deny wins). ``needs_approval`` (True, or original tool names) makes those calls wait for a
        person's approval first (docs/architecture.md, Pausing for a person). ``sampling=True`` answers the
        server's ``sampling/createMessage`` during a tool call with the calling agent's model (its tokens count
        toward the turn's and the tree's budgets); off, it is refused. ``sampling_needs_approval=True`` (with
        ``sampling``) asks a person first, as an elicitation. An ``elicitation/create`` during a call asks a person
        (a pending item of kind ``input``, answered with ``client.respond``) and is declined after
        ``elicitation_timeout`` seconds, which do not count against ``request_timeout``. ``pool_options`` are the
        other fields of :class:`~smith_worker.mcp.ServerConfig` (e.g. ``connect_timeout``,
        ``idempotent_tools``, ``max_concurrency``, ``idle_timeout``). Nothing
        starts here: each worker process starts the server on first use and
        pools it. Raises :class:`ConfigurationError` for an invalid
        configuration or a duplicate source name.
        """
        from smith_worker.mcp import McpServerSource, ServerConfig  # keeps the MCP modules out of apps without MCP

        config = ServerConfig(
            alias=alias,
            command=command,
            args=tuple(args),
            env=env,
            cwd=cwd,
            url=url,
            bearer_token=bearer_token,
            headers=headers,
            request_timeout=request_timeout,
            allow=allow,
            deny=deny,
            tools_required=tools_required,
            reconnect_on_transport_error=reconnect_on_transport_error,
            needs_approval=needs_approval,
            sampling=sampling,
            sampling_needs_approval=sampling_needs_approval,
            elicitation_timeout=elicitation_timeout,
            **pool_options,
        )
        return self.add_source(McpServerSource(config))

    def all_sources(self) -> list[ToolSource]:
        """Every tool source of the app: its Python tools, then the added sources (worker start-up and shutdown)."""
        return [self.native, *self.sources.values()]

    def sources_for(self, spec: AgentSpec) -> list[ToolSource]:
        """The tool sources of one agent, in the order its tools are offered: its Python tools
        (``spec.tools``), then its ``spec.sources`` in declaration order."""
        return [self.native.restricted(spec.tools), *(self.sources[name] for name in spec.sources)]

    def skill_tools(self, skill: Skill) -> NativeTools:
        """The Python tools of ``skill`` as a source, by their prefixed names (a view of :attr:`native`:
        it runs them on the tool worker's pools)."""
        return self.native.named({name: own.tool for name, own in skill.native.items()})

    def source(self, source_id: str) -> ToolSource | None:
        """The source named by ``source_id`` (a tool job's, see :mod:`smith_worker.agent.toolset`): the app's
        Python tools, an added source, or a skill's Python tools; None when this app has no such source."""
        if source_id == APP_TOOLS:
            return self.native
        name = source_id.partition(":")[2]
        if source_id == added_source_id(name):
            return self.sources.get(name)
        skill = self.skills.get(name) if source_id == skill_id(name) else None
        return self.skill_tools(skill) if skill is not None else None


#: The prefix of a handoff tool's name: ``transfer_to_<agent>`` (docs/architecture.md, Handoffs).
HANDOFF_PREFIX = "transfer_to_"


def handoff_tool(agent: str) -> str:
    """The name of the tool that hands a conversation to ``agent``: ``transfer_to_<agent>``."""
    return f"{HANDOFF_PREFIX}{agent}"


def _check_handoffs(spec: AgentSpec, agents: Container[str], sources: list[ToolSource]) -> None:
    """Refuse a handoff target of ``spec`` that is not a declared agent, whose tool name is not a valid tool
    name (``^[A-Za-z0-9_-]{1,64}$``), named twice, or clashing with another tool of the agent (its
    Python tools, its sources' tools, its sub-agents). Raises :class:`ConfigurationError` (``handoffs``)."""
    for target in spec.handoffs:
        name = handoff_tool(target)
        if target not in agents:
            raise ConfigurationError(
                f"agent {spec.name!r}: handoff {target!r} is not a declared agent", setting="handoffs"
            )
        if not TOOL_NAME.match(name):
            raise ConfigurationError(
                f"agent {spec.name!r}: handoff tool {name!r} is not a valid tool name ({TOOL_NAME.pattern})",
                setting="handoffs",
            )
        clash = spec.handoffs.count(target) > 1 or name in spec.subagents
        if clash or any(source.owns(name) for source in sources):
            raise ConfigurationError(
                f"agent {spec.name!r}: handoff tool {name!r} clashes with another tool of the agent",
                setting="handoffs",
            )


def _check_own_tools(spec: AgentSpec, sources: list[ToolSource]) -> None:
    """Refuse a Python tool of ``spec`` that one of its ``sources`` owns by name: a step routes a name to
    its last owner (:mod:`smith_worker.agent.toolset`), so the tool would never run."""
    for tool in spec.tools:
        owner = next((source for source in sources if source.owns(tool)), None)
        if owner is not None:
            raise ConfigurationError(
                f"agent {spec.name!r}: tool {tool!r} is named as a tool of its source {owner.name!r}",
                setting="tools",
            )


def _require_registered(kind: str, names: Sequence[str] | None, registered: Container[str], setting: str) -> None:
    """Raise :class:`ConfigurationError` (``setting``) for the first of an agent's ``names`` of ``kind``
    (skill, source) that is not in ``registered``."""
    for name in names or []:
        if name not in registered:
            raise ConfigurationError(f"agent {kind} {name!r} is not a registered {kind}", setting=setting)


def _check_output(output_type: Any, mode: Any, retries: Any) -> None:
    """Raise :class:`ConfigurationError` for an ``output_type`` that is neither a pydantic model nor a valid JSON
    Schema (its ``$schema``'s draft, else 2020-12), an unknown ``output_mode``, or ``output_retries`` that is not
    an integer >= 0."""
    if isinstance(output_type, dict):
        import jsonschema  # loaded only by apps with a JSON Schema output

        try:
            jsonschema.validators.validator_for(output_type, default=jsonschema.Draft202012Validator).check_schema(
                output_type
            )
        except jsonschema.SchemaError as exc:
            raise ConfigurationError(
                f"output_type is not a valid JSON Schema: {exc.message}", setting="output_type"
            ) from exc
    elif output_type is not None and not (isinstance(output_type, type) and issubclass(output_type, BaseModel)):
        raise ConfigurationError(
            f"output_type must be a pydantic model or a JSON Schema dict, got {output_type!r}", setting="output_type"
        )
    if mode not in get_args(OutputMode):
        raise ConfigurationError(
            f"output_mode must be one of {get_args(OutputMode)}, got {mode!r}", setting="output_mode"
        )
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigurationError(f"output_retries must be an integer >= 0, got {retries!r}", setting="output_retries")
