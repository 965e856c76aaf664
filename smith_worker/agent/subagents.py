"""Sub-agents: an agent offered to another agent as a tool, run as a nested agent loop.

The rules are those of docs/architecture.md, Sub-agents.

``app.agent("lead", subagents=["researcher"])`` gives ``lead`` a tool named
``researcher`` with one ``task`` string parameter and the description of
``app.agent("researcher", description=...)``. The loop uses this
module through :class:`SubAgentTools` only, a source of the step's toolset
(:mod:`smith_worker.agent.toolset`) whose calls run here.

A call runs the child's loop as a task of the parent's turn worker (inside the
parent's step, so parallel calls of one step run concurrently), never as a job
waiting on jobs of its own pool (that can deadlock a full pool). The child gets
a :class:`~smith_worker.agent.context.AgentContext` of its own:

* fresh memory: a message list of its own under the root turn
  (:meth:`Keys.subagent_history`, ``turn_ttl``) starting with the task as the
  user message, appended fenced by the root turn's attempt, so after a crash of
  the turn worker the next attempt resumes the child where it was (its
  completed tool calls are not run again: their results are stored under keys
  that carry the child's tree position, :func:`smith_client.keys.tree_position`);
* the root turn's stream (same turn id and ``seq``) with ``agent_path`` = the chain and
  ``call_path`` = the ids of the calls along it (parallel calls of one sub-agent differ there);
* the root's tree limits and cancel flag (:attr:`AgentContext.limits`).

A child whose step waits for a person (docs/architecture.md, Pausing for a person) raises
:class:`~smith_worker.agent.approvals.TurnPaused` once its other calls ran; it passes through here to the
parent's step, which pauses in turn, up to the root turn. The resumed root step calls the child again, which
resumes from its checkpointed messages and finds its decisions. A child's call of an agent declared with
``needs_approval`` waits for approval like any gated call (:meth:`SubAgentTools.approval`).

Outcomes: a call deeper than the root's
``max_subagent_depth`` returns the error tool result
``sub-agent depth limit reached``; the child's final content is the tool
result; a child's failure is an error tool result for its parent, except what
ends the whole tree (the tree budget, the tenant's token quota, a cancel, a superseded attempt), which
propagates. A child cancelled by the caller's cancel settles its outstanding
tool calls and aborts their jobs before its parent ends the turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel

from smith_client import turn_record as record
from smith_client.errors import QuotaExceededError, TurnCancelledError, error_from_exception
from smith_client.events import EventData
from smith_client.jobs import ToolJob, ToolOutcome
from smith_client.keys import tree_position
from smith_client.messages import AssistantMessage, TokenUsage, ToolCall, UserMessage, message_to_json
from smith_client.roundtrip import Pending, RoundTrip
from smith_worker.agent.approvals import TurnPaused
from smith_worker.agent.context import AgentContext, CancelRequested
from smith_worker.agent.toolset import ToolRoute
from smith_worker.llm.types import ToolSchema
from smith_worker.memory.fencing import StaleAttemptError
from smith_worker.memory.history import APPEND, ConversationStore
from smith_worker.ops import tracing
from smith_worker.ops.redaction import redact_error
from smith_worker.tools.function import Approval, ToolContext, error_content
from smith_worker.tools.waiter import settle_call

#: The error tool result of a call past the root's ``max_subagent_depth``.
DEPTH_LIMIT_REACHED = "sub-agent depth limit reached"
#: ``TurnCancelledError.operation`` of the tree budget: it ends the root turn, not only the child.
TREE_LIMITS = frozenset({"tree_max_iterations", "tree_max_total_tokens"})

_TASK_PARAMETERS = {
    "type": "object",
    "properties": {"task": {"type": "string", "description": "Instruction for the sub-agent"}},
    "required": ["task"],
}

#: Runs an agent loop for a context from its first message (``AgentLoop(ctx).run(0)``, given by the loop).
RunLoop = Callable[[AgentContext], Awaitable[AssistantMessage]]


class SubAgentHistory:
    """A sub-agent's fenced writes (:class:`~smith_worker.memory.fencing.AttemptWrites`): its own message list,
    fenced by the root turn's attempt. It has no inbox: merged user messages go to the root agent.

    ``lists`` are the history key and its trimmed-message counter (:meth:`Keys.subagent_history`);
    ``ttl`` is seconds (the turn's); ``max_messages`` trims the list like a conversation's history.
    """

    def __init__(
        self, redis: Any, state_key: str, lists: tuple[str, str], attempt: int, ttl: int, max_messages: int
    ) -> None:
        self._redis = redis
        self._max = max_messages
        self._state = state_key
        self._lists = lists  # the history and its trimmed-message counter
        self._attempt = attempt
        self._ttl = ttl

    @property
    def attempt(self) -> int:
        """The root turn's attempt number (the fencing token)."""
        return self._attempt

    async def append(self, *messages: BaseModel) -> None:
        """Append whole messages to the sub-agent's history. Raises :class:`StaleAttemptError`."""
        if messages:
            rt = RoundTrip()
            self.queue_append(rt, *messages)
            await rt.run(self._redis)

    def queue_append(self, rt: RoundTrip, *messages: BaseModel) -> Pending[None]:
        """Add :meth:`append` of (at least one of) ``messages`` to ``rt``; running it raises
        :class:`StaleAttemptError` when the root turn's attempt moved on."""
        args = [self._attempt, "", self._ttl, self._max, *(message_to_json(m) for m in messages)]  # any end
        return rt.script(APPEND, [self._state, *self._lists], args, parse=self._appended)

    def _appended(self, reply: int) -> None:
        if reply < 0:
            raise StaleAttemptError(self._state)

    def queue_drain_inbox(self, rt: RoundTrip) -> Pending[list[bytes]]:
        """Add a read of the root's attempt instead (a sub-agent has no inbox), so a superseded attempt
        stops at the step's round trip (:class:`StaleAttemptError`); the handle gets no messages."""
        return rt.call("hget", self._state, record.ATTEMPT, parse=self._drained)

    def queue_close(
        self, rt: RoundTrip, final: AssistantMessage, output: Any = None, usage: TokenUsage | None = None
    ) -> Pending[list[bytes]]:
        """A sub-agent's answer ends only its own run (its caller's tool call): as :meth:`queue_drain_inbox`."""
        return self.queue_drain_inbox(rt)

    def _drained(self, reply: bytes | None) -> list[bytes]:
        if reply is None or int(reply) != self._attempt:
            raise StaleAttemptError(self._state)
        return []


class SubAgentTools:
    """The sub-agents of one agent loop as a source of its step's toolset (``ctx`` is the calling agent's
    context, ``ctx.spec`` the agent): a source whose calls run here (:meth:`run`), never on a tool worker."""

    def __init__(self, ctx: AgentContext, run_loop: RunLoop) -> None:
        self.ctx = ctx
        self._run_loop = run_loop

    def owns(self, tool_name: str) -> bool:
        """True when ``tool_name`` is one of the agent's sub-agents."""
        return tool_name in self.ctx.spec.subagents

    def timeout_for(self, tool_name: str) -> float | None:
        """None: a sub-agent call has no budget of its own (the tree's limits bound it)."""
        return None

    def idempotent(self, tool_name: str) -> bool:
        """False: a sub-agent resumes from its checkpointed messages, it is never re-run."""
        return False

    def approval(self, tool_name: str) -> Approval:
        """The sub-agent's ``needs_approval``: whether a call of it waits for a person's approval first."""
        return self.owns(tool_name) and self.ctx.runtime.app.agents[tool_name].needs_approval

    def checkpoint(self, step: int, index: int) -> tuple[str, str]:
        """The keys of the checkpoint of the child that call ``index`` of step ``step`` runs: its history and
        its trimmed-message counter (:meth:`Keys.subagent_history`)."""
        keys, position = self.ctx.runtime.keys, tree_position(self.ctx.position, step, index)
        return (
            keys.subagent_history(self.ctx.root_turn_id, position),
            keys.subagent_history_trimmed(self.ctx.root_turn_id, position),
        )

    async def schemas(self, asking: ToolContext | None = None) -> list[ToolSchema]:
        """One tool per sub-agent of the agent: its name, its description, a ``task`` string.
        Offered at every depth: past the depth limit the refusal is the call's result."""
        agents = self.ctx.runtime.app.agents
        return [
            ToolSchema(name=name, description=agents[name].description, parameters=_TASK_PARAMETERS)
            for name in self.ctx.spec.subagents
        ]

    async def run(self, job: ToolJob, route: ToolRoute) -> tuple[ToolOutcome, bool]:
        """Run the call of ``job`` here (:meth:`call`); its outcome is always produced here."""
        return await self.call(job.step, job.index, job.call), True

    async def call(self, step: int, index: int, call: ToolCall) -> ToolOutcome:
        """Run call ``index`` of step ``step`` (a sub-agent tool call) and return its outcome.

        Raises only what ends or stops the whole tree: the tree budget's
        ``TurnCancelledError``, :class:`CancelRequested`, :class:`StaleAttemptError`, cancellation, and
        :class:`TurnPaused` (the child waits for a person).
        """
        task = call.arguments.get("task")
        if not isinstance(task, str) or not task.strip():
            return _error(f"sub-agent {call.name!r} needs a non-empty string 'task'")
        if self.ctx.depth + 1 > self.ctx.limits.max_subagent_depth:
            return _error(DEPTH_LIMIT_REACHED)
        await self._mark_started(step, index)
        position = tree_position(self.ctx.position, step, index)
        child = await self._child(call, position, self.checkpoint(step, index), task)
        # its span: a pause, a cancel, a superseded attempt are not its errors (docs/architecture.md, Tracing)
        span = tracing.span(f"invoke_agent {call.name}", attributes=_span_attributes(child, call)).__enter__()
        try:
            final = await self._run_loop(child)
        except asyncio.CancelledError:
            await asyncio.shield(_stop_if_cancelled(child))
            raise
        except (CancelRequested, StaleAttemptError, TurnPaused, QuotaExceededError):  # the root turn's, not the child's
            raise
        except TurnCancelledError as exc:
            span.error(exc)
            if exc.fields.get("operation") in TREE_LIMITS:
                raise
            return _failed(call.name, exc)
        except Exception as exc:  # the child's failure is its parent's tool result, not the turn's
            span.error(exc)
            return _failed(call.name, exc)
        finally:
            span.__exit__(None, None, None)
        return ToolOutcome(content=final.content or "")

    async def _mark_started(self, step: int, index: int) -> None:
        """Mark the call started by this turn worker, as a tool worker marks a tool job, so a cancel
        of the turn says the sub-agent was running (and may have partly run), not that it never started."""
        rt, ctx = self.ctx.runtime, self.ctx
        started = rt.keys.tool_started(ctx.turn_id, step, index, ctx.position)
        await rt.redis.set(started, rt.worker_id, ex=rt.keys.turn_ttl)

    async def _child(self, call: ToolCall, position: str, lists: tuple[str, str], task: str) -> AgentContext:
        """The context of the child ``call`` starts at tree ``position``, checkpointed in ``lists``
        (:meth:`checkpoint`); its history starts with ``task`` (once: a resumed child keeps its messages)."""
        parent, rt = self.ctx, self.ctx.runtime
        keys = rt.keys
        writes = SubAgentHistory(
            rt.redis,
            keys.turn_state(parent.root_turn_id),
            lists,
            parent.attempt.attempt,
            keys.turn_ttl,
            rt.settings.history_max_messages,
        )
        name = call.name
        path, call_path = [*parent.agent_path, name], [*parent.call_path, call.id]

        async def publish(data: EventData) -> int:
            seq = await rt.events.publish(parent.turn_id, data, path, attempt=writes.attempt, call_path=call_path)
            if seq < 0:
                raise StaleAttemptError(parent.turn_id)
            return seq

        spec = rt.app.agents[name]
        child = AgentContext(
            job=parent.job,
            spec=spec,
            agent_path=path,
            root_turn_id=parent.root_turn_id,
            turn_id=parent.turn_id,
            attempt=writes,
            store=ConversationStore(
                rt.redis, keys, parent.job.conversation_id, lists=lists, max_bytes=rt.settings.view_max_bytes
            ),
            publish=publish,
            runtime=rt,
            services=parent.services,
            position=position,
            tree_config=parent.limits,
            call_path=call_path,
            caller=parent.caller,
            quota=parent.quota,
        )
        if not await rt.redis.exists(lists[0]):
            await child.append(UserMessage(content=task))
        return child


def _span_attributes(child: AgentContext, call: ToolCall) -> dict[str, str]:
    """The sub-agent's ``invoke_agent`` span's attributes (docs/architecture.md, Tracing)."""
    return {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": call.name,
        "gen_ai.tool.call.id": call.id,
        "smith.turn.id": child.root_turn_id,
        "smith.agent.path": "/".join(child.agent_path),
        **({"smith.tenant": child.job.tenant} if child.job.tenant is not None else {}),
    }


def _error(message: str) -> ToolOutcome:
    return ToolOutcome(content=error_content(message), is_error=True)


def _failed(name: str, exc: BaseException) -> ToolOutcome:
    error = redact_error(error_from_exception(exc))
    return _error(f"sub-agent {name!r} failed: {error.kind}: {error.message}")


async def _stop_if_cancelled(child: AgentContext) -> None:
    """After a cancelled child task: when the caller cancelled the turn, give each of the child's
    outstanding tool calls its end (the stored result, or an error) and abort its job
    (docs/architecture.md, Sub-agents).

    Any other cancellation (a worker shutting down, a lost lease) leaves them: the turn's next
    attempt re-attaches to them.
    """
    rt, root = child.runtime, child.root_turn_id
    redis: Any = rt.redis  # redis-py's hget is typed for its sync and async clients at once
    if not await redis.hget(child.cancel_state, record.CANCEL_REQUESTED):
        return
    messages = (await child.store.read(0)).messages
    last = messages[-1] if messages else None
    if not isinstance(last, AssistantMessage) or not last.tool_calls:
        return
    step = sum(isinstance(m, AssistantMessage) for m in messages)
    ended = _error("the turn was cancelled while this tool call was outstanding; it was stopped")
    keys = rt.keys
    await asyncio.gather(
        *(
            settle_call(
                rt.redis,
                keys,
                keys.tool_job_id(root, step, index, child.position),
                keys.tool_result(root, step, index, child.position),
                ended,
            )
            for index in range(len(last.tool_calls))
        )
    )
