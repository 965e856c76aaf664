"""Which worker may run a job, in a fleet whose workers serve different things (a rolling deploy).

During a rolling deploy, workers of two app versions serve one queue: v2 may
add a tool or an agent that v1 workers do not have. So a job names what it
**requires** and each worker registers what it **serves**, its capability set:

* a turn job requires its agent (``TurnJob.agent``, set by every enqueuer of a
  turn); a turn worker serves the agents of its app;
* a tool job requires what the tool worker resolves the call to
  (:func:`tool_requirement`, the same resolution as
  ``smith_worker/tool_runner.py``): ``tool:<name>`` for a Python tool of the
  app, ``source:<alias>`` for a tool of an added source (an MCP server), and
  for a skill's tool ``skill:<skill>/tool:<name>`` or
  ``skill:<skill>/source:<alias>``; a tool worker serves those of its app
  (:func:`capabilities`).

A worker registers its set with its heartbeat (:mod:`smith_worker.registration`)
as a Redis SET named by :func:`capability_digest`, shared by the workers of
one app version. The enqueue lists each job's requirement
(:meth:`~smith_client.keys.Keys.job_requirements`) and wakes only workers
whose set holds it; the claim (``lua/claim.lua``) leaves a job whose
requirement its worker's set does not hold to the workers that serve it, so
nothing waits and nothing runs on a worker without its tool or agent. A tool
call no live tool worker serves is answered at once with an unknown-tool error
(:mod:`smith_worker.dispatch`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from smith_worker.app import SmithApp

#: Hex digits of a capability set's digest (a SHA-1 prefix: sets of different versions never share one).
DIGEST_LENGTH = 16


def _tool(name: str) -> str:
    return f"tool:{name}"


def _source(alias: str) -> str:
    return f"source:{alias}"


def _skill(skill: str, unit: str) -> str:
    return f"skill:{skill}/{unit}"


def tool_requirement(app: SmithApp, skill: str, tool_name: str) -> str:
    """What a tool worker must serve to run a call of ``tool_name`` (owned by skill ``skill``, "" for the
    agent's own tools), as ``app`` resolves it; "" when ``app`` has no such tool (any tool worker may take
    the job, which fails it as an unknown tool). The resolution is the tool worker's
    (``smith_worker/tool_runner.py``): a skill's Python tool, then the skill's MCP servers; else a Python
    tool of the app, then its other sources."""
    if skill:
        found = app.skills.get(skill)
        if found is None:
            return ""
        if tool_name in found.native:
            return _skill(skill, _tool(tool_name))
        alias = next((a for a in found.aliases if app.sources[a].owns(tool_name)), None)
        return _skill(skill, _source(alias)) if alias is not None else ""
    source = app.owner_of(tool_name)
    if source is None:
        return ""
    return _tool(tool_name) if source is app.native else _source(source.name)


def capabilities(app: SmithApp, queue: str) -> list[str]:
    """What a worker of ``app`` on ``queue`` (``"turns"`` or ``"tools"``) serves, sorted: the agents, or
    every requirement :func:`tool_requirement` can give for ``app``."""
    if queue == "turns":
        return sorted(app.agents)
    served = [_tool(name) for name in app.tools.names()] + [_source(alias) for alias in app.sources]
    for name in app.skills.names():
        skill = app.skills.get(name)
        if skill is not None:
            served += [_skill(name, _tool(tool)) for tool in skill.native]
            served += [_skill(name, _source(alias)) for alias in skill.aliases]
    return sorted(set(served))


def capability_digest(names: Iterable[str]) -> str:
    """The name of the capability set holding ``names``: a digest of them (order and repeats do not count),
    :data:`DIGEST_LENGTH` hex digits, the same in every worker serving the same things."""
    text = "\n".join(sorted(set(names)))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:DIGEST_LENGTH]
