"""What one agent loop receives: :class:`AgentContext`, built by the turn lifecycle.

The lifecycle (:mod:`smith_worker.turn.lifecycle`) owns attempts, fencing and terminal
events; it builds an :class:`AgentContext` and hands it to
:class:`~smith_worker.agent.loop.AgentLoop`, which never calls back into it. Every
write the loop makes goes through the context: fenced ``publish``, ``append``
(history + ``message`` event + ``on_message`` hooks), the attempt's inbox.

The context is ready for nested agents (docs/architecture.md, Sub-agents): the loop reads its agent
path, the root turn whose budget counter and cancel flag it shares, and the
turn whose stream it publishes on from here, never from ``job.agent`` /
``job.turn_id``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from smith_client.events import EventData, MessageData
from smith_client.jobs import TurnJob
from smith_client.roundtrip import Command, Pending, RoundTrip
from smith_worker.agent.quota import NO_QUOTA, TurnQuota
from smith_worker.app import AgentSpec
from smith_worker.config import AgentConfig
from smith_worker.hooks import fire
from smith_worker.llm.rate_limit import RateLimits
from smith_worker.memory.fencing import AttemptWrites, StaleAttemptError
from smith_worker.memory.history import ConversationStore
from smith_worker.runtime import WorkerRuntime
from smith_worker.tools.caller import NO_CONTEXT, CallerContext
from smith_worker.tools.waiter import ToolJobWaiter


class Cancellable(Protocol):
    """A running turn that takes cancel requests (:class:`smith_worker.turn.lifecycle.TurnExecution`)."""

    def request_cancel(self) -> None:
        """Stop the turn's running step now; its state says why."""
        ...

    def hand_off_soon(self) -> None:
        """The worker stops at once: make sure the turn is handed off, even if arq's cancel is lost."""
        ...


#: Turn attempts of one worker process in their first round trip at once. A worker claims as many queued turns
#: as it has free slots, thousands at once with a large ``SMITH_TURN_MAX_JOBS``; started together, their
#: commands would all wait for the worker's Redis connections (``SMITH_WORKER_REDIS_MAX_CONNECTIONS``) and
#: for its CPU, past the pool's wait and the running turns' lease renewals (bench/in_flight.py, BENCHMARKS.md).
#: Admitted this many at a time, they start as fast as the worker can start them and the rest wait their
#: turn, holding no connection.
STARTING_AT_ONCE = 32


@dataclass
class TurnServices:
    """What a turn worker's turns share (:class:`smith_worker.turn.role.TurnRole` opens them): the LLM
    HTTP client, the tool-job waiter, the gates to the model endpoints' fleet-wide rate limits
    (docs/architecture.md, Model rate limits), the turns running in this process by turn id, and ``starting``,
    which admits :data:`STARTING_AT_ONCE` attempts at a time to their first round trip
    (:meth:`smith_worker.turn.lifecycle.TurnExecution.run`)."""

    http: httpx.AsyncClient
    tool_waiter: ToolJobWaiter
    rate_limits: RateLimits
    running_turns: dict[str, Cancellable] = field(default_factory=dict)
    starting: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(STARTING_AT_ONCE))


class CancelRequested(Exception):
    """The turn's state asks it to stop (found between steps); ``reason`` is cancel or interrupt."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class AgentContext:
    """Everything one agent loop needs for one attempt of one turn.

    ``agent_path`` names the agent (root first); ``root_turn_id`` is the turn
    whose agent tree shares the iteration budget and whose cancel flag stops
    every loop of the tree; ``turn_id`` is the turn whose stream and tool-result
    keys this loop uses. ``publish`` is fenced by the attempt.

    A sub-agent's context (:mod:`smith_worker.agent.subagents`) has its chain in
    ``agent_path`` and the ids of the calls that started each agent of it in
    ``call_path`` (see :mod:`smith_client.events`), its tree ``position`` (``""`` for the root; see
    :func:`smith_client.keys.tree_position`), its own checkpointed history in
    ``store``/``attempt``, and ``tree_config``: the root agent's config, whose
    tree limits govern every agent of the tree (docs/architecture.md, Sub-agents). ``caller`` is the
    turn's caller context, which every agent of the tree shares (docs/architecture.md, Caller context), as they
    share ``quota``, the token quota of the turn's tenant (docs/tenants.md).
    """

    job: TurnJob
    spec: AgentSpec
    agent_path: list[str]
    root_turn_id: str
    turn_id: str
    attempt: AttemptWrites
    store: ConversationStore
    publish: Callable[[EventData], Awaitable[int]]
    runtime: WorkerRuntime
    services: TurnServices
    position: str = ""
    tree_config: AgentConfig | None = None
    call_path: list[str] = field(default_factory=list)
    caller: CallerContext = NO_CONTEXT
    quota: TurnQuota = NO_QUOTA

    @property
    def limits(self) -> AgentConfig:
        """The config whose tree limits (``tree_max_iterations``, ``tree_max_total_tokens``,
        ``max_subagent_depth``) apply: the root agent's."""
        return self.tree_config or self.spec.config

    @property
    def depth(self) -> int:
        """This agent's depth in the tree: 0 for the root; bounded by the root's ``max_subagent_depth``."""
        return len(self.agent_path) - 1

    async def append(self, *messages: Any, preceding: Sequence[EventData] = (), rt: RoundTrip | None = None) -> None:
        """Append to the history and publish a ``message`` event for each, in one round trip (both fenced),
        then fire ``on_message`` for each. ``preceding`` events of this loop are published first, in the
        same script call. ``rt``: a round trip holding other commands to send with them (their handles are
        read once this returns). Raises :class:`StaleAttemptError`."""
        if not messages:
            return
        events = [*preceding, *(MessageData(message=m.model_dump(mode="json")) for m in messages)]
        trip = RoundTrip()
        self.attempt.queue_append(trip, *messages)
        self.queue_publish(trip, events)
        if rt is not None:
            trip.extend(rt)
        await trip.run(self.runtime.redis)
        for message in messages:
            await fire("on_message", message, self.runtime.app.hooks, self.spec.hooks)

    def queue_publish(self, rt: RoundTrip, events: list[EventData]) -> Pending[None]:
        """Add to ``rt`` the publish of consecutive ``events`` of this loop in one script call, fenced by the
        attempt (:meth:`EventLog.publish_many_command`); running it raises :class:`StaleAttemptError` when
        fenced off."""
        return rt.add(self._publish_command(events))

    def submit_publish(self, take: Callable[[], list[EventData]]) -> asyncio.Future[None]:
        """Queue for the worker's next auto-pipeline (:class:`~smith_worker.ops.auto_pipeline.AutoPipeline`: the
        publishes of the turns streaming at once share one round trip) the publish of the consecutive events
        ``take()`` returns when that pipeline is built, in one script call fenced by the attempt. The future
        raises :class:`StaleAttemptError` when fenced off."""
        return self.runtime.pipeline.submit(lambda: self._publish_command(take()))

    def _publish_command(self, events: list[EventData]) -> Command[None]:
        return self.runtime.events.publish_many_command(
            self.turn_id, events, self.agent_path, self.attempt.attempt, self.call_path, self._published
        )

    def _published(self, seq: int) -> None:
        if seq < 0:
            raise StaleAttemptError(self.turn_id)

    async def announce(self, message: Any) -> None:
        """Publish a ``message`` event and fire ``on_message`` for a message now in the history."""
        await self.publish(MessageData(message=message.model_dump(mode="json")))
        await fire("on_message", message, self.runtime.app.hooks, self.spec.hooks)

    @property
    def tree_counter(self) -> str:
        """The Redis counter of the model calls of this agent's tree (docs/architecture.md, Keys)."""
        return self.runtime.keys.tree_iterations(self.root_turn_id)

    @property
    def memory_scope(self) -> str:
        """The conversation id under which the agent's memory strategy keeps its state (a summary):
        the conversation's for the root agent, one of its own for a sub-agent (whose memory is its
        own message list), so a child never overwrites the conversation's summary."""
        if not self.position:
            return self.job.conversation_id
        return self.runtime.keys.subagent_memory_scope(self.job.conversation_id, self.root_turn_id, self.position)

    @property
    def tree_tokens(self) -> str:
        """The Redis counter of the tokens reported for this agent's tree."""
        return self.runtime.keys.tree_tokens(self.root_turn_id)

    @property
    def cancel_state(self) -> str:
        """The state hash whose ``cancel_requested`` field stops this loop: the root turn's."""
        return self.runtime.keys.turn_state(self.root_turn_id)
