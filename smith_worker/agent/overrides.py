"""A turn's overrides applied to its agent (docs/architecture.md, Per-turn overrides).

The client checked each override's shape (:mod:`smith_client.overrides`); what only a worker knows is
checked here as the turn's agent starts, and a name it does not know fails the turn with
:class:`~smith_client.errors.ConfigurationError` whose ``setting`` is the field (as a malformed per-turn
``sampling`` does): ``tools`` and a named ``tool_choice`` must be tools of the agent, ``max_iterations`` and
``max_tokens`` within the agent's ``max_iterations`` and ``max_total_tokens``, ``model`` a configured model.

:func:`for_turn` gives the agent as this turn runs it: a copy of its :class:`~smith_worker.app.AgentSpec`
(``instructions`` appended to its system prompt, ``tool_choice``, the limits), its model settings, and the
tool names the turn allows. Nothing is stored: the next turn runs the agent as declared.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from smith_client.errors import ConfigurationError
from smith_client.overrides import TOOL_CHOICE_KEYWORDS, TurnOverrides
from smith_worker.app import AgentSpec, SmithApp, handoff_tool
from smith_worker.config import RATE_FIELDS, Settings
from smith_worker.llm.types import LlmClientConfig


@dataclass(frozen=True)
class TurnAgent:
    """An agent as one turn runs it: ``spec`` (overrides applied), ``llm`` (its model settings) and
    ``allowed`` (the tool names the turn may offer and call; None: all of the agent's)."""

    spec: AgentSpec
    llm: LlmClientConfig
    allowed: frozenset[str] | None = None


def configured_models(app: SmithApp, settings: Settings) -> dict[str, LlmClientConfig]:
    """The models a turn may name, each with the settings that reach it: the environment's
    (``SMITH_LLM_MODEL``) and every agent's ``llm`` model; the first configuration of a name wins."""
    models: dict[str, LlmClientConfig] = {}
    for config in [settings.llm_config(None), *(settings.llm_config(a.llm) for a in app.agents.values())]:
        models.setdefault(config.model, config)
    return models


def _own_tool(app: SmithApp, spec: AgentSpec, name: str) -> bool:
    """Whether ``name`` may be a tool of ``spec``: one of its Python or external tools, sub-agents or handoff
    tools, a tool its sources own, or a prefixed name (``<skill>__<tool>``, ``mcp_<alias>__<tool>``) that only
    a step's listing resolves."""
    own = {*spec.tools, *spec.subagents, *(handoff_tool(t) for t in spec.handoffs)}
    return name in own or "__" in name or any(app.sources[s].owns(name) for s in spec.sources)


def for_turn(app: SmithApp, settings: Settings, spec: AgentSpec, overrides: TurnOverrides | None) -> TurnAgent:
    """``spec`` as a turn with ``overrides`` runs it (None: as declared), on the worker's ``settings``.

    Raises :class:`ConfigurationError` (``setting`` = the field) for a tool, ``tool_choice`` or ``model`` the
    worker does not know, or a limit over the agent's own.
    """
    llm = settings.llm_config(spec.llm)
    if overrides is None:
        return TurnAgent(spec, llm)
    changes: dict[str, object] = {}
    config = spec.config
    if overrides.instructions is not None:
        prompt = spec.system_prompt
        changes["system_prompt"] = f"{prompt}\n\n{overrides.instructions}" if prompt else overrides.instructions
    for name in overrides.tools or []:
        if not _own_tool(app, spec, name):
            raise ConfigurationError(f"tools: {name!r} is not a tool of agent {spec.name!r}", setting="tools")
    choice = overrides.tool_choice
    if choice is not None:
        if choice not in TOOL_CHOICE_KEYWORDS and not _own_tool(app, spec, choice):
            raise ConfigurationError(
                f"tool_choice: {choice!r} is not a tool of agent {spec.name!r}", setting="tool_choice"
            )
        changes["tool_choice"] = choice
    if overrides.max_iterations is not None:
        if overrides.max_iterations > config.max_iterations:
            raise ConfigurationError(
                f"max_iterations={overrides.max_iterations} is over agent {spec.name!r}'s {config.max_iterations}",
                setting="max_iterations",
            )
        config = dataclasses.replace(config, max_iterations=overrides.max_iterations)
    if overrides.max_tokens is not None:
        cap = config.max_total_tokens
        if cap is not None and overrides.max_tokens > cap:
            raise ConfigurationError(
                f"max_tokens={overrides.max_tokens} is over agent {spec.name!r}'s max_total_tokens={cap}",
                setting="max_tokens",
            )
        config = dataclasses.replace(config, max_total_tokens=overrides.max_tokens)
    if overrides.model is not None:
        models = configured_models(app, settings)
        reach = models.get(overrides.model)
        if reach is None:
            raise ConfigurationError(
                f"model {overrides.model!r} is not a configured model (configured: {sorted(models)})", setting="model"
            )
        reached = {name: getattr(reach, name) for name in ("model", "base_url", "api_key", *RATE_FIELDS)}
        llm = llm.model_copy(update=reached)  # the endpoint and its fleet-wide limits (Model rate limits)
    changes["config"] = config
    allowed = None if overrides.tools is None else frozenset(overrides.tools)
    return TurnAgent(dataclasses.replace(spec, **changes), llm, allowed)  # type: ignore[arg-type]
