"""Which worker may run a job, in a fleet whose workers serve different things (a rolling deploy).

During a rolling deploy, workers of two app versions serve one queue: v2 may
add a tool or an agent that v1 workers do not have. So a job names what it
**requires** and each worker registers what it **serves**, its capability set:

* a turn job requires its agent (``TurnJob.agent``, set by every enqueuer of a
  turn); a turn worker serves the agents of its app;
* a tool job requires what its route names (``ToolRoute.requires``, given by
  the step's toolset, :mod:`smith_worker.agent.toolset`): ``tool:<name>`` for a
  Python tool of the app, ``source:<alias>`` for a tool of an added source (an
  MCP server), and for a skill's tool ``skill:<skill>/tool:<name>`` or
  ``skill:<skill>/source:<alias>``; a tool worker serves those of its app
  (:func:`tool_capabilities`; a turn worker, :func:`turn_capabilities`).

A worker registers its set with its heartbeat (:mod:`smith_worker.ops.registration`)
as a Redis SET named by :func:`capability_digest`, shared by the workers of
one app version. The enqueue lists each job's requirement
(:meth:`~smith_client.keys.Keys.job_requirements`) and wakes only workers
whose set holds it; the claim (``lua/claim.lua``) leaves a job whose
requirement its worker's set does not hold to the workers that serve it, so
nothing waits and nothing runs on a worker without its tool or agent. A tool
call no live tool worker serves is answered at once with an unknown-tool error
(:mod:`smith_worker.tools.waiter`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from smith_worker.app import SmithApp
from smith_worker.tools.source import in_skill, source_id, tool_unit

#: Hex digits of a capability set's digest (a SHA-1 prefix: sets of different versions never share one).
DIGEST_LENGTH = 16


def turn_capabilities(app: SmithApp) -> list[str]:
    """What a turn worker of ``app`` serves, sorted: its agents."""
    return sorted(app.agents)


def tool_capabilities(app: SmithApp) -> list[str]:
    """What a tool worker of ``app`` serves, sorted: every requirement a route of ``app``'s tools can name
    (:class:`~smith_worker.agent.toolset.ToolRoute`)."""
    served = [tool_unit(name) for name in app.tools.names()] + [source_id(alias) for alias in app.sources]
    for name in app.skills.names():
        skill = app.skills.get(name)
        if skill is not None:
            served += [in_skill(name, tool_unit(tool)) for tool in skill.native]
            served += [in_skill(name, source_id(alias)) for alias in skill.aliases]
    return sorted(set(served))


def capability_digest(names: Iterable[str]) -> str:
    """The name of the capability set holding ``names``: a digest of them (order and repeats do not count),
    :data:`DIGEST_LENGTH` hex digits, the same in every worker serving the same things."""
    text = "\n".join(sorted(set(names)))
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:DIGEST_LENGTH]
