"""Handoffs: an agent hands the conversation to another with a ``transfer_to_<agent>`` tool.

The rules are those of docs/architecture.md, Handoffs.

``app.agent("triage", handoffs=["billing", "support"])`` gives ``triage`` one tool per target,
``transfer_to_billing`` and ``transfer_to_support``, each described by its target's ``description`` and
taking no arguments. :class:`HandoffTools` is a source of the step's toolset
(:mod:`smith_worker.agent.toolset`) whose calls run here, never as tool jobs: a call's outcome says the
conversation was transferred, and the step's tool round then

* appends the call's tool message, publishes a ``handoff`` event (:class:`~smith_client.events.HandoffData`)
  and, for the turn's root agent, sets the conversation's current agent
  (:meth:`~smith_client.keys.Keys.conversation_agent`, ``history_ttl``; fenced by the attempt like the append),
  all in one round trip (:meth:`HandoffTools.queue_record`);
* makes the loop go on with the target agent (:meth:`HandoffTools.take`): its prompt, tools and model
  answer the rest of the turn, and the events that follow carry its name in ``agent_path``.

The conversation's next turns sent without ``agent=`` run the current agent (the turn worker reads it as the
turn starts). A re-run after a crash finds the handoff in the turn's stored messages (:func:`handed_to`)
and sets the current agent again (:meth:`HandoffTools.restore`).
Several transfers in one step: the last one wins. Cycles (A → B → A …) are bounded by the turn's iteration
budget: the model calls of every agent of the turn count together.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

import orjson

from smith_client.events import HandoffData
from smith_client.jobs import ToolJob, ToolOutcome
from smith_client.messages import Message, ToolMessage
from smith_client.roundtrip import RoundTrip
from smith_client.scripts import LuaScript
from smith_worker.agent.context import AgentContext
from smith_worker.agent.toolset import ToolRoute
from smith_worker.app import HANDOFF_PREFIX, AgentSpec, handoff_tool
from smith_worker.llm.types import ToolSchema
from smith_worker.memory.fencing import StaleAttemptError
from smith_worker.tools.function import Approval, ToolContext

_NO_PARAMETERS = {"type": "object", "properties": {}}
#: Sets the conversation's current agent, fenced by the turn's attempt (``lua/handoff.lua``).
HANDOFF = LuaScript("handoff", __package__)


def handed_to(messages: Sequence[Message], handoffs: Container[str]) -> str | None:
    """The target of the last successful ``transfer_to_<agent>`` tool message among ``messages`` (a turn's
    stored messages), or None. ``handoffs`` are every agent name a handoff may reach."""
    for message in reversed(messages):
        if isinstance(message, ToolMessage) and not message.is_error and message.name.startswith(HANDOFF_PREFIX):
            target = message.name.removeprefix(HANDOFF_PREFIX)
            if target in handoffs:
                return target
    return None


class HandoffTools:
    """The handoff tools of one agent loop (``ctx.spec.handoffs``) as a source of its step's toolset: its calls
    run here (:meth:`run`) and only record the transfer asked; the loop takes it after the tool round."""

    def __init__(self, ctx: AgentContext) -> None:
        self.ctx = ctx
        #: The transfers of the current step: (call index, tool call id, target agent).
        self._asked: list[tuple[int, str, str]] = []

    def _target(self, tool_name: str) -> str | None:
        target = tool_name.removeprefix(HANDOFF_PREFIX)
        return target if tool_name.startswith(HANDOFF_PREFIX) and target in self.ctx.spec.handoffs else None

    def owns(self, tool_name: str) -> bool:
        """True for ``transfer_to_<agent>`` of one of the agent's ``handoffs``."""
        return self._target(tool_name) is not None

    def timeout_for(self, tool_name: str) -> float | None:
        """None: a transfer runs at once, here."""
        return None

    def idempotent(self, tool_name: str) -> bool:
        """True: a transfer only records the target; a re-run records it again."""
        return True

    def approval(self, tool_name: str) -> Approval:
        """False: a transfer never waits for a person."""
        return False

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """One ``transfer_to_<agent>`` tool per target, described by the target's ``description``."""
        agents = self.ctx.runtime.app.agents
        return [
            ToolSchema(
                name=handoff_tool(target),
                description=agents[target].description or f"Hand the conversation over to the {target} agent.",
                parameters=_NO_PARAMETERS,
            )
            for target in self.ctx.spec.handoffs
        ]

    async def run(self, job: ToolJob, route: ToolRoute) -> tuple[ToolOutcome, bool]:
        """Record the transfer of ``job``'s call; its outcome (``{"assistant": <target>}``) is produced here."""
        target = self._target(job.call.name)
        if target is None:  # not routed here (the toolset routes by owns)
            raise KeyError(job.call.name)
        self._asked.append((job.index, job.call.id, target))
        return ToolOutcome(content=orjson.dumps({"assistant": target}).decode(), structured={"assistant": target}), True

    def queue_record(self, rt: RoundTrip) -> None:
        """Add to ``rt`` (the round trip appending the step's tool messages) the step's last transfer: its
        ``handoff`` event and, for the root agent, the conversation's current agent (``history_ttl``).
        Nothing when the step made none; running it raises :class:`StaleAttemptError` when fenced off."""
        if not self._asked:
            return
        _, call_id, target = max(self._asked)  # the last in call order
        ctx = self.ctx
        data = HandoffData(from_agent=ctx.spec.name, to_agent=target, tool_call_id=call_id)
        ctx.queue_publish(rt, [data])
        self._queue_current(rt, target)

    async def restore(self, target: str) -> None:
        """Set the conversation's current agent again to ``target``, the handoff a resumed attempt found in the
        turn's stored messages: the attempt that made it may have stopped between its append and its
        ``handoff.lua`` (one pipeline, two scripts). Raises :class:`StaleAttemptError` when fenced off."""
        if self.ctx.position:
            return
        rt = RoundTrip()
        self._queue_current(rt, target)
        await rt.run(self.ctx.runtime.redis)

    def _queue_current(self, rt: RoundTrip, target: str) -> None:
        """For the root agent, add ``handoff.lua`` (the conversation's current agent := ``target``) to ``rt``."""
        ctx = self.ctx
        if not ctx.position:
            keys = ctx.runtime.keys
            script_keys = [keys.turn_state(ctx.root_turn_id), keys.conversation_agent(ctx.job.conversation_id)]
            rt.script(HANDOFF, script_keys, [ctx.attempt.attempt, target, keys.history_ttl], parse=self._fenced)

    def _fenced(self, reply: int) -> None:
        if reply < 0:
            raise StaleAttemptError(self.ctx.turn_id)

    @property
    def pending(self) -> bool:
        """True when the current step asked for a transfer (not taken yet)."""
        return bool(self._asked)

    def take(self) -> AgentSpec | None:
        """The agent the step's last transfer named (None: no transfer); forgets the step's transfers."""
        asked, self._asked = self._asked, []
        return self.ctx.runtime.app.agents[max(asked)[2]] if asked else None
