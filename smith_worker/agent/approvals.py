"""Calls that wait for a person: what becomes of each call of a step (docs/architecture.md, Pausing for a person).

The toolset says which calls are gated (their route's ``approval`` policy, or an ``external`` tool,
:mod:`smith_worker.agent.toolset`); :func:`plan_calls` decides, before the step's calls run, what becomes
of each from the turn's decisions (``{p}:turn:{t}:decisions``, written by clients through
``smith_client/lua/decide.lua``):

* not gated, or an approval policy that says no for this call: it runs as usual;
* approved: it runs, with the arguments a person edited when they did (:class:`CallPlan.call`);
* rejected (or timed out): its outcome is an error tool message with the decision's message, no job;
* an external tool's call with a result given: that result is its outcome, no job;
* undecided: it is pending (:class:`~smith_client.events.PendingItem`); the step's other calls still run,
  then the loop raises :class:`TurnPaused` and the turn lifecycle pauses the turn (``lua/pause.lua``).

A resumed turn plans the same step again: the calls that ran before reuse their stored results (their
enqueue is skipped), so nothing runs twice.

A sub-agent's calls are planned alike, from the root turn's decisions: its pending items carry its
``agent_path`` and ``call_path`` and are keyed by :func:`decision_id` (its call id behind the ids of the
sub-agent calls leading to it), so they never collide with another agent's. Its :class:`TurnPaused` reaches
its parent's step (:mod:`smith_worker.agent.subagents`), whose own pause joins it (:meth:`TurnPaused.joined`),
up to the root turn.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

from smith_client.approvals import Decision
from smith_client.events import PendingItem, PendingKind, ToolCallDecidedData
from smith_client.jobs import ToolOutcome
from smith_client.messages import ToolCall
from smith_client.roundtrip import RoundTrip
from smith_worker.agent.context import AgentContext
from smith_worker.agent.toolset import ToolRoute, Toolset
from smith_worker.tools.function import Approval, ToolContext, error_content

logger = logging.getLogger("agent_smith.agent")


class TurnPaused(Exception):
    """A step has calls that wait for a person (its other calls ran): ``pending`` lists them (a sub-agent's
    too), ``kept_keys`` are the keys the resumed step needs (its tool results and their ``tool.result``
    markers, its sub-agents' checkpoints, theirs): kept while the turn is paused, so nothing that ran runs
    again."""

    def __init__(self, pending: list[PendingItem], kept_keys: list[str]) -> None:
        super().__init__(", ".join(item.call_id for item in pending))
        self.pending = pending
        self.kept_keys = kept_keys

    @classmethod
    def joined(cls, pending: list[PendingItem], kept_keys: list[str], children: list[TurnPaused]) -> TurnPaused:
        """A step's pause: its own ``pending`` calls and ``kept_keys``, then those of its sub-agents' pauses."""
        return cls(
            [*pending, *(item for child in children for item in child.pending)],
            [*kept_keys, *(key for child in children for key in child.kept_keys)],
        )


def decision_id(ctx: AgentContext, call: ToolCall) -> str:
    """The id a person decides ``call`` of the agent of ``ctx`` by: the model's call id for the root agent's
    call, ``"<call_path[0]>/…/<call id>"`` for a sub-agent's (:attr:`AgentContext.call_path`)."""
    return "/".join([*ctx.call_path, call.id])


@dataclass(frozen=True)
class CallPlan:
    """What becomes of one call this step: ``call`` as it runs (an approved call's edited arguments), unless
    ``outcome`` answers it without a job (rejected, an external result) or it is ``pending``; ``decided`` is
    the ``tool_call.decided`` event of a decision taken this step (None: no decision was needed)."""

    call: ToolCall
    outcome: ToolOutcome | None = None
    pending: PendingItem | None = None
    decided: ToolCallDecidedData | None = None


async def plan_calls(
    ctx: AgentContext, toolset: Toolset, step: int, calls: list[ToolCall], routes: list[ToolRoute | None]
) -> list[CallPlan]:
    """One :class:`CallPlan` per call of step ``step`` (see the module doc), ``routes`` being the calls' routes.

    Reads the turn's decisions (one round trip) only when a route is gated.
    """
    if not any(route is not None and route.gated for route in routes):
        return [CallPlan(call) for call in calls]
    rt = RoundTrip()
    read = rt.call("hgetall", ctx.runtime.keys.turn_decisions(ctx.root_turn_id), parse=_decisions)
    await rt.run(ctx.runtime.redis)
    decisions = read.value
    return [
        await _plan(ctx, toolset, step, index, call, route, decisions.get(decision_id(ctx, call)))
        for index, (call, route) in enumerate(zip(calls, routes, strict=True))
    ]


async def _plan(
    ctx: AgentContext,
    toolset: Toolset,
    step: int,
    index: int,
    call: ToolCall,
    route: ToolRoute | None,
    decision: Decision | None,
) -> CallPlan:
    if route is None or not route.gated:
        return CallPlan(call)
    if decision is not None:
        return _decided(index, call, decision)
    if not route.external and not await needs_approval(route.approval, _tool_context(ctx, call), call.arguments):
        return CallPlan(call)
    kind: PendingKind = "external" if route.external else "approval"
    schema = await toolset.schema(call.name)
    item = PendingItem(
        call_id=decision_id(ctx, call),
        tool=call.name,
        arguments=call.arguments,
        agent_path=ctx.agent_path,
        call_path=ctx.call_path,
        kind=kind,
        parameters=schema.parameters if schema is not None else {},
        step=step,
        index=index,
    )
    return CallPlan(call, pending=item)


def _decided(index: int, call: ToolCall, decision: Decision) -> CallPlan:
    """The plan of a decided call, and its ``tool_call.decided`` event."""
    arguments = call.arguments if decision.arguments is None else decision.arguments
    event = ToolCallDecidedData(
        id=call.id, name=call.name, index=index, action=decision.action, arguments=arguments, message=decision.message
    )
    if decision.action == "approve":
        return CallPlan(call.model_copy(update={"arguments": arguments}), decided=event)
    if decision.action == "reject":
        return CallPlan(call, outcome=_error(decision.message), decided=event)
    return CallPlan(call, outcome=ToolOutcome(content=decision.content, is_error=decision.is_error), decided=event)


async def needs_approval(policy: Approval, ctx: ToolContext, arguments: dict[str, object]) -> bool:
    """Whether a call with ``arguments`` waits for approval under ``policy``: a bool as it is, a callable's
    verdict (awaited when it returns an awaitable). A callable that raises is logged and taken as True: a
    failing check never lets a call through."""
    if isinstance(policy, bool):
        return policy
    try:
        verdict = policy(ctx, dict(arguments))
        if inspect.isawaitable(verdict):
            verdict = await verdict
    except Exception:
        logger.warning("needs_approval of %r raised; the call waits for approval", ctx.tool_name, exc_info=True)
        return True
    return bool(verdict)


def _decisions(raw: dict[bytes, bytes]) -> dict[str, Decision]:
    return {key.decode(): Decision.model_validate_json(value) for key, value in raw.items()}


def _tool_context(ctx: AgentContext, call: ToolCall) -> ToolContext:
    return ToolContext(
        call_id=call.id,
        tool_name=call.name,
        turn_id=ctx.turn_id,
        conversation_id=ctx.job.conversation_id,
        agent=ctx.spec.name,
        worker_id=ctx.runtime.worker_id,
        context=ctx.caller.value,
        tenant=ctx.job.tenant,
    )


def _error(message: str) -> ToolOutcome:
    return ToolOutcome(content=error_content(message), is_error=True)
