"""The thin client a web app uses: enqueue turns, follow their events.

``send()`` validates the request, subscribes to the turn's event channel
*before* enqueueing (so no event is missed), enqueues ``run_turn`` on the turns
queue with the turn id as the arq job id, and follows the events until
``turn.completed`` or ``turn.failed`` (docs/architecture.md, One turn, send to turn.completed).

:class:`SmithClient` (asyncio) and :class:`~smith_client.sync_client.SyncSmithClient`
(blocking, for WSGI apps) have the same methods, arguments and errors: each
method is one operation of :mod:`smith_client.operations`, built once in
:class:`ClientBase`, which each client runs (:mod:`smith_client.runners`). Only
the signatures differ, written out per client as httpx does for its two
clients, so a type checker sees what each returns: an awaitable of the value
and an async generator of events (``SmithClient``), or the value and a plain
generator (``SyncSmithClient``).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, Self, Unpack, overload

from arq.connections import ArqRedis

from smith_client import approvals, inputs, skills, tenants
from smith_client import operations as ops
from smith_client import turn_record as record
from smith_client import usage as usage_ops
from smith_client.approvals import REJECTED, Decision
from smith_client.connection import client_max_connections, connect_redis
from smith_client.errors import ConfigurationError
from smith_client.eventlog import EventLog
from smith_client.events import Event, PendingItem
from smith_client.inputs import InputResponse
from smith_client.keys import Keys
from smith_client.messages import AssistantMessage, Message
from smith_client.output import M, OutputMessage, check_output_type, with_output
from smith_client.protocol import Operation
from smith_client.registry import ServedAgents
from smith_client.runners import AsyncRunner, SyncRunner
from smith_client.settings import ClientSettings
from smith_client.tenants import QuotaStatus, TenantLimits
from smith_client.turns import cancel_turn, read_state
from smith_client.usage import AgentUsage
from smith_client.validation import TurnOptions, check_id, check_tenant


class ClientBase:
    """What :class:`SmithClient` and :class:`SyncSmithClient` share: construction, keys, and each public
    method's operation (``_op_<method>``), which a client's method runs on its runner.

    Redis failures raise :class:`~smith_client.errors.TransportError`.
    """

    redis: Any
    keys: Keys
    runner: AsyncRunner | SyncRunner
    #: The agents live turn workers served lately, for the ``smith`` command's checks before a chat.
    served: ServedAgents
    #: Opens the client's Redis connections from a URL (``connect_redis`` or ``connect_sync_redis``).
    _connect: Callable[..., Any]
    #: The runner of operations on that Redis client.
    _runner: Callable[[Any], AsyncRunner | SyncRunner]

    def __init__(
        self,
        redis: Any,
        *,
        prefix: str = "smith",
        owns_redis: bool = False,
        turn_ttl: int | None = None,
        history_ttl: int | None = None,
        context_max_bytes: int | None = None,
        tenant: str | None = None,
        cluster: bool = False,
    ) -> None:
        self.redis = redis
        #: The tenant of the turns this client sends without one (docs/architecture.md, Tenants; None: none).
        self.tenant = check_tenant(tenant)
        env = ClientSettings.from_env(only=("turn_ttl", "history_ttl", "context_max_bytes"))
        self.keys = Keys(prefix, turn_ttl or env.turn_ttl, history_ttl or env.history_ttl, cluster)
        #: Cap on a turn's caller context, bytes of compact JSON (``SMITH_CONTEXT_MAX_BYTES``, 64 KiB).
        self.context_max_bytes = context_max_bytes or env.context_max_bytes
        self.runner = self._runner(redis)
        self.served = ServedAgents()
        self._owns_redis = owns_redis

    @classmethod
    def from_url(
        cls,
        redis_url: str | None = None,
        *,
        prefix: str | None = None,
        sentinels: str | Sequence[str | tuple[str, int]] | None = None,
        sentinel_master: str | None = None,
        socket_timeout: float | None = None,
        turn_ttl: int | None = None,
        history_ttl: int | None = None,
        max_connections: int | None = None,
        pool_timeout: float | None = None,
        context_max_bytes: int | None = None,
        tenant: str | None = None,
        cluster: bool | None = None,
        shards: int | None = None,
    ) -> Self:
        """Connect lazily to ``redis_url`` (e.g. ``redis://127.0.0.1:6379/0``, ``rediss://user:pw@host:6380/0``;
        default ``SMITH_REDIS_URL``, else ``redis://127.0.0.1:6379/0``), the workers' keys under ``prefix`` (default
        ``SMITH_PREFIX``, else ``smith``): a client started beside ``make demo``'s printed variables finds its workers.

        With ``sentinels`` (``"host:port,host:port"``) and ``sentinel_master``
        the client follows the master through Sentinel (see :func:`connect_redis`).
        ``socket_timeout`` (seconds) bounds every Redis connect and command
        (default ``SMITH_REDIS_SOCKET_TIMEOUT``, else 5 s): with Redis not
        answering, a call raises :class:`TransportError` after it instead of blocking.
        ``max_connections`` caps the client's Redis connections, its one shared
        pub/sub connection included (default ``SMITH_REDIS_MAX_CONNECTIONS``, else 50;
        at least 2, else :class:`ConfigurationError`): a command finding all in use
        waits for one up to ``pool_timeout`` seconds (default ``socket_timeout``),
        then raises :class:`SmithTimeoutError` (operation ``redis.pool``).
        ``turn_ttl`` / ``history_ttl`` (seconds) are the lifetimes of what the client
        writes (a turn's state, a conversation's FIFO and skills); None reads
        ``SMITH_TURN_TTL`` / ``SMITH_HISTORY_TTL`` (defaults 24 h / 30 days, docs/architecture.md, Lifetimes).
        ``context_max_bytes`` caps a turn's caller context (bytes of JSON; None reads ``SMITH_CONTEXT_MAX_BYTES``,
        default 64 KiB). ``tenant`` is the tenant of the turns sent without one (``send(..., tenant=)``; 1-200
        of ``[A-Za-z0-9_.@-]``, else :class:`InvalidRequestError`; docs/architecture.md, Tenants).
        With ``cluster`` (default ``SMITH_REDIS_CLUSTER``) ``redis_url`` names any node of a Redis Cluster: every
        key the client uses carries the prefix as a hash tag (:attr:`Keys.cluster`) and its connections go to
        the master holding that slot, following failovers and slot moves (docs/cluster.md, One hash slot).
        The client closes these connections when it is closed.
        ``shards`` (default ``SMITH_SHARDS``, else 1) is the deployment's count of shards: a client serves one
        (``prefix`` being the deployment's, or one shard's :func:`~smith_client.keys.shard_prefix`), so more
        than 1 raises :class:`ConfigurationError`: a sharded deployment's client is
        :class:`~smith_client.sharding.ShardedSmithClient` (docs/cluster.md, Shards).
        """
        given = {"redis_url": redis_url, "prefix": prefix, "redis_socket_timeout": socket_timeout,
                 "redis_max_connections": max_connections, "redis_cluster": cluster, "shards": shards}  # fmt: skip
        env = ClientSettings.from_env(only=[name for name, value in given.items() if value is None])
        if (env.shards if shards is None else shards) != 1:
            raise ConfigurationError(
                f"SMITH_SHARDS={env.shards if shards is None else shards}: the deployment is sharded; its client "
                "is ShardedSmithClient.from_url; one SmithClient (the smith command too) serves one shard's prefix, "
                "<prefix>:s<k>, with shards=1 (SMITH_SHARDS unset)",
                setting="SMITH_SHARDS",
            )
        cluster = env.redis_cluster if cluster is None else cluster
        redis_url = redis_url or env.redis_url
        prefix = prefix or env.prefix
        socket_timeout = env.redis_socket_timeout if socket_timeout is None else socket_timeout
        max_connections = env.redis_max_connections if max_connections is None else max_connections
        redis = cls._connect(
            redis_url,
            sentinels=sentinels,
            sentinel_master=sentinel_master,
            socket_timeout=socket_timeout,
            max_connections=client_max_connections(max_connections),
            pool_timeout=pool_timeout,
            cluster_key=Keys(prefix, cluster=True).cluster_slot_key if cluster else None,
        )
        return cls(
            redis,
            prefix=prefix,
            owns_redis=True,
            turn_ttl=turn_ttl,
            history_ttl=history_ttl,
            context_max_bytes=context_max_bytes,
            tenant=tenant,
            cluster=cluster,
        )

    def with_tenant(self, options: TurnOptions) -> dict[str, Any]:
        """``options`` with the client's tenant when they name none (what a turn is sent with)."""
        given = dict(options)
        if given.get("tenant") is None and self.tenant is not None:
            given["tenant"] = self.tenant
        return given

    def _op_send(self, text: str, timeout: float | None, options: TurnOptions) -> Operation[AssistantMessage]:
        return ops.send(self.keys, text, timeout, self.with_tenant(options), self.context_max_bytes)

    def _op_stream(self, text: str, timeout: float | None, options: TurnOptions) -> Operation[None]:
        return ops.stream(self.keys, text, timeout, self.with_tenant(options), self.context_max_bytes)

    def _op_submit(self, text: str, options: TurnOptions) -> Operation[str]:
        return ops.submit(self.keys, text, self.with_tenant(options), self.context_max_bytes)

    def _op_follow(self, turn_id: str, after_seq: int, timeout: float | None) -> Operation[None]:
        return ops.follow(self.keys, turn_id, after_seq, timeout)

    def _op_clear(self, conversation_id: str) -> Operation[None]:
        return ops.clear(self.keys, conversation_id)

    def _op_history(self, conversation_id: str) -> Operation[list[Message]]:
        return ops.history(self.keys, conversation_id)

    def _op_conversation_agent(self, conversation_id: str) -> Operation[str | None]:
        return ops.conversation_agent(self.keys, conversation_id)

    def _op_activate_skill(self, conversation_id: str, name: str) -> Operation[None]:
        return skills.activate_checked(self.keys, conversation_id, name)

    def _op_deactivate_skill(self, conversation_id: str, name: str) -> Operation[None]:
        return skills.deactivate_checked(self.keys, conversation_id, name)

    def _op_active_skills(self, conversation_id: str) -> Operation[list[str]]:
        return skills.active_checked(self.keys, conversation_id)

    def _op_pending(self, turn_id: str) -> Operation[list[PendingItem]]:
        return approvals.pending(self.keys, turn_id)

    def _op_approve(self, turn_id: str, call_id: str, arguments: dict[str, Any] | None) -> Operation[Decision]:
        return approvals.decide(self.keys, turn_id, call_id, approvals.approval(arguments))

    def _op_reject(self, turn_id: str, call_id: str, message: str) -> Operation[Decision]:
        return approvals.decide(self.keys, turn_id, call_id, approvals.rejection(message))

    def _op_submit_tool_result(self, turn_id: str, call_id: str, result: Any, is_error: bool) -> Operation[Decision]:
        return approvals.decide(self.keys, turn_id, call_id, approvals.tool_result(result, is_error))

    def _op_respond(
        self, turn_id: str, request_id: str, action: str, content: dict[str, Any] | None
    ) -> Operation[InputResponse]:
        return inputs.respond(self.keys, turn_id, request_id, action, content)

    def _op_usage(
        self, window_seconds: float, agent: str | None, tenant: str | None
    ) -> Operation[dict[str, AgentUsage]]:
        return usage_ops.usage(self.keys, window_seconds, agent, tenant=tenant)

    def _op_usage_by_tenant(
        self, window_seconds: float, agent: str | None, tenant: str | None
    ) -> Operation[dict[str, dict[str, AgentUsage]]]:
        return usage_ops.usage_by_tenant(self.keys, window_seconds, agent, tenant=tenant)

    def _op_set_tenant_limits(self, tenant: str, limits: TenantLimits) -> Operation[None]:
        return tenants.set_limits(self.keys, tenant, limits)

    def _op_update_tenant_limits(self, tenant: str, changes: dict[str, Any]) -> Operation[None]:
        return tenants.update_limits(self.keys, tenant, changes)

    def _op_tenant_limits(self, tenant: str) -> Operation[TenantLimits]:
        return tenants.read_limits(self.keys, tenant)

    def _op_clear_tenant_limits(self, tenant: str) -> Operation[bool]:
        return tenants.clear_limits(self.keys, tenant)

    def _op_tenant_quota(self, tenant: str) -> Operation[QuotaStatus]:
        return tenants.quota_status(self.keys, tenant)


class HandleBase:
    """What :class:`TurnHandle` and :class:`~smith_client.sync_client.SyncTurnHandle` share: the turn id
    and each method's operation (``_op_<method>``), run on the handle's client."""

    def __init__(self, keys: Keys, turn_id: str) -> None:
        self.keys = keys
        self.turn_id = turn_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.turn_id!r})"

    def _op_state(self) -> Operation[dict[str, str]]:
        return read_state(self.keys, self.turn_id)

    def _op_status(self) -> Operation[str]:
        return _status(self.keys, self.turn_id)

    def _op_result(self, timeout: float | None) -> Operation[AssistantMessage]:
        return ops.result(self.keys, self.turn_id, timeout)

    def _op_cancel(self, reason: str) -> Operation[str]:
        return cancel_turn(self.keys, self.turn_id, reason)


def _status(keys: Keys, turn_id: str) -> Operation[str]:
    return (yield from read_state(keys, turn_id)).get(record.STATUS, record.MISSING)


class SmithClient(ClientBase):
    """Asyncio client for one Agent Smith deployment (one Redis database, one key prefix).

    Use ``SmithClient.from_url(url, prefix=...)``, as ``async with`` or closing
    with :meth:`aclose`. Safe to share between concurrent tasks of one event loop.
    Every method raises :class:`TransportError` when Redis fails; times are seconds.
    """

    _connect = staticmethod(connect_redis)
    _runner = AsyncRunner
    redis: ArqRedis
    runner: AsyncRunner

    @overload
    async def send(
        self, text: str, *, timeout: float | None = None, output_type: None = None, **options: Unpack[TurnOptions]
    ) -> AssistantMessage: ...

    @overload
    async def send(
        self, text: str, *, timeout: float | None = None, output_type: type[M], **options: Unpack[TurnOptions]
    ) -> OutputMessage[M]: ...

    async def send(
        self,
        text: str,
        *,
        timeout: float | None = None,
        output_type: type[M] | None = None,
        **options: Unpack[TurnOptions],
    ) -> AssistantMessage | OutputMessage[M]:
        """Run one turn and return its final :class:`AssistantMessage`; with ``output_type`` (a pydantic model,
        for an agent declared with an ``output_type``: docs/architecture.md, Structured output) an
        :class:`~smith_client.output.OutputMessage` whose ``output`` is the answer parsed into it
        (:class:`OutputValidationError` when it does not parse).

        ``text``: the user message (non-blank, at most 1 000 000 UTF-8 bytes).
        ``options`` are :class:`TurnOptions`: ``conversation_id`` (required),
        ``agent``, ``turn_id`` (an idempotency key: the same id sent again with
        the same request attaches to the existing turn instead of starting
        another), ``multitask`` (the policy when the conversation already has
        an unfinished turn, see :mod:`smith_client.turns`), ``sampling`` and
        ``stream`` (per-turn model options), ``context`` (the caller context: a JSON
        object or a pydantic model, at most ``SMITH_CONTEXT_MAX_BYTES`` (64 KiB) as JSON,
        never sent to the model; the turn's tools, hooks and sub-agents get it as
        ``ctx.context``: docs/architecture.md, Caller context). ``timeout`` (seconds, None = wait
        forever) bounds the wait, Redis commands included, not the turn.

        Raises :class:`InvalidRequestError` / :class:`UnknownAgentError` /
        :class:`ConversationBusyError` / :class:`ConflictError` before
        enqueueing; the turn's own typed error (e.g. ``ParseError``,
        ``LlmApiError``) when it fails; :class:`TurnCancelledError` when it is
        cancelled; :class:`TurnPausedError` when it pauses for a person (decide its
        ``pending`` calls, then :meth:`follow` or ``turn(...).result()``); :class:`SmithTimeoutError` on ``timeout``.
        """
        check_output_type(output_type)
        message = await self.runner.run(self._op_send(text, timeout, options), bound=timeout)
        return message if output_type is None else with_output(message, output_type)

    def stream(
        self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]
    ) -> AsyncGenerator[Event, None]:
        """Run one turn and iterate its :class:`Event` objects (``async for``), ending with ``turn.completed``,
        ``turn.failed``, ``turn.cancelled``, or ``turn.paused`` when it waits for a person (:meth:`follow` it on).

        Options, ``timeout`` (seconds) and errors as for :meth:`send`; the
        errors are raised at the first iteration, validation errors before
        anything is enqueued. A caller attaching to an existing turn (same
        ``turn_id``) gets all of its events from the start; a ``merge`` caller
        gets the events of the turn it joined from the moment it joined. Leaving
        the loop early (or ``aclose()``) unsubscribes; the turn goes on.
        """
        return self.runner.iterate(self._op_stream(text, timeout, options))

    async def submit(self, text: str, **options: Unpack[TurnOptions]) -> TurnHandle:
        """Start a background turn and return its :class:`TurnHandle` at once (the turn queued, not awaited).

        Options and the errors raised before enqueueing as for :meth:`send`.
        """
        return self.turn(await self.runner.run(self._op_submit(text, options)))

    def turn(self, turn_id: str) -> TurnHandle:
        """A handle on an existing turn, from any process (e.g. a web request after a reload).

        Raises :class:`InvalidRequestError` for a malformed id; an unknown turn is
        found out by the handle's methods.
        """
        return TurnHandle(self, check_id(turn_id, "turn_id"))

    def follow(self, turn_id: str, after_seq: int = 0, timeout: float | None = None) -> AsyncGenerator[Event, None]:
        """Iterate the events of ``turn_id`` with ``seq > after_seq``: replayed from the log, then live, until terminal
        (through ``turn.paused``: the events of the resumed turn follow once its calls are decided).

        ``after_seq`` is the ``seq`` of the last event the caller has (an SSE
        ``Last-Event-ID``); 0 replays everything. ``timeout`` (seconds, None = forever)
        bounds the whole iteration. Raises :class:`InvalidRequestError`
        for a bad argument, :class:`TurnNotFoundError` for an unknown turn,
        :class:`EventsTrimmedError`, :class:`SmithTimeoutError`.
        """
        return self.runner.iterate(self._op_follow(turn_id, after_seq, timeout))

    async def clear(self, conversation_id: str) -> None:
        """Remove a conversation's messages, memory state (its summary) and active skills, in one atomic step.

        Raises :class:`ConversationBusyError` (``active_turn_id`` set) and
        changes nothing while the conversation has an unfinished (queued or
        running) turn; :class:`InvalidRequestError` for a bad id. Finished
        turns keep their own state (results, events) until it expires.
        """
        await self.runner.run(self._op_clear(conversation_id))

    async def history(self, conversation_id: str) -> list[Message]:
        """All messages of a conversation, oldest first (stored form, ``is_error`` included); ``[]`` for an
        unknown or cleared conversation. Raises :class:`InvalidRequestError` for a bad id."""
        return await self.runner.run(self._op_history(conversation_id))

    async def conversation_agent(self, conversation_id: str) -> str | None:
        """The agent that answers the conversation's next turn sent without ``agent=``: the target of its
        last handoff (docs/architecture.md, Handoffs), or None when no handoff happened (such a turn runs
        ``"default"``). Raises :class:`InvalidRequestError` for a bad id."""
        return await self.runner.run(self._op_conversation_agent(conversation_id))

    async def activate_skill(self, conversation_id: str, name: str) -> None:
        """Activate skill ``name`` (its declared name) on a conversation, after the skills active already.

        Any registered skill can be activated on any conversation, whatever
        agent runs it; the activation is stored in Redis, so every worker's next
        step sees it (a running turn at its next model call), and lives as long
        as the conversation's history. Activating an active skill
        does nothing (it keeps its place in the activation order).

        Raises :class:`InvalidRequestError` for a bad id or name and
        :class:`UnknownSkillError` when live turn workers are registered and
        none serves ``name``; in both cases nothing changes. With no turn
        worker registered at all it logs a warning and accepts.
        """
        await self.runner.run(self._op_activate_skill(conversation_id, name))

    async def deactivate_skill(self, conversation_id: str, name: str) -> None:
        """Deactivate skill ``name`` on a conversation; deactivating an inactive skill does nothing.

        Takes effect at the next step of any turn, like an activation. An
        agent's default skills (``app.agent(..., skills=[...])``) stay active
        for that agent. Raises :class:`InvalidRequestError` for a bad id or name.
        """
        await self.runner.run(self._op_deactivate_skill(conversation_id, name))

    async def active_skills(self, conversation_id: str) -> list[str]:
        """Declared names of the skills activated on a conversation, in activation order.

        An agent's default skills are not listed: they belong to the agent, not
        to the conversation. Raises :class:`InvalidRequestError` for a bad id.
        """
        return await self.runner.run(self._op_active_skills(conversation_id))

    async def pending(self, turn_id: str) -> list[PendingItem]:
        """The calls paused turn ``turn_id`` waits on, in call order (docs/architecture.md, Pausing for a person):
        each a :class:`PendingItem` (``call_id``, ``tool``, ``arguments``, ``agent_path``, ``kind``
        ``approval`` | ``external``, the tool's ``parameters`` schema); then the open MCP elicitations of its
        running tool calls (``kind`` ``input``, with ``request_id``, ``message`` and the server's
        ``requestedSchema`` as ``parameters``; answer them with :meth:`respond`). ``[]`` when nothing waits.
        Raises :class:`InvalidRequestError` for a bad id, :class:`TurnNotFoundError` for a turn Redis does not
        have (never submitted under this prefix, or expired)."""
        return await self.runner.run(self._op_pending(turn_id))

    async def approve(self, turn_id: str, call_id: str, arguments: dict[str, Any] | None = None) -> Decision:
        """Approve pending call ``call_id`` of ``turn_id`` (the pending item's ``call_id``, path-qualified for a
        sub-agent's call): it runs once the turn resumes, with ``arguments`` when given (edited: checked against
        the tool's schema; a dict of at most 1 000 000 bytes as JSON), else the model's.

        When this was the step's last undecided call the turn is queued again and resumes on any turn worker.
        Returns the decision that stands: deciding a call twice changes nothing and returns the first decision,
        also after the turn resumed or ended. Compare it with what you asked (``action``, ``arguments``;
        ``message`` for :meth:`reject`; ``content`` and ``is_error`` for :meth:`submit_tool_result`): when they
        differ, an earlier decision stands and yours was ignored.
        Raises :class:`TurnNotFoundError` for a turn Redis does not have; :class:`NoPendingCallError` (its
        ``pending`` names the calls still waiting) when the turn never waited on such a call or ended without
        deciding it (cancelled); :class:`InvalidRequestError` (its ``field`` named) for arguments that are not
        a dict, too large or do not fit the tool's JSON Schema (``field``: the path to the value, e.g.
        ``arguments.target``), or for a call of an external tool (use
        :meth:`submit_tool_result`).
        """
        return await self.runner.run(self._op_approve(turn_id, call_id, arguments))

    async def reject(self, turn_id: str, call_id: str, message: str = REJECTED) -> Decision:
        """Reject pending call ``call_id`` of ``turn_id``: the model gets an error tool message with ``message``
        (a string of at most 1 000 000 UTF-8 bytes, else :class:`InvalidRequestError`) instead of its result.
        Returns, resumes and raises as :meth:`approve`."""
        return await self.runner.run(self._op_reject(turn_id, call_id, message))

    async def submit_tool_result(self, turn_id: str, call_id: str, result: Any, is_error: bool = False) -> Decision:
        """Give the result of pending call ``call_id`` of an external tool (``app.external_tool``): ``result``
        (text as it is, another JSON-able value as compact JSON; at most 1 000 000 UTF-8 bytes) becomes its tool
        message, an error one with ``is_error`` (a bool). Returns, resumes and raises as :meth:`approve`
        (:class:`InvalidRequestError` for a call that waits for an approval, a ``result`` that is not JSON-able
        or too large, or an ``is_error`` that is not a bool)."""
        return await self.runner.run(self._op_submit_tool_result(turn_id, call_id, result, is_error))

    async def respond(
        self, turn_id: str, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> InputResponse:
        """Answer open MCP elicitation ``request_id`` of ``turn_id`` (a pending item of kind ``input``, announced
        by ``input.requested``): ``action`` ``accept`` with ``content`` (a JSON object, checked against the
        request's ``requestedSchema``), ``decline`` or ``cancel`` (no content); an item whose ``method`` is
        ``sampling/createMessage`` (a sampling waiting for approval) takes ``accept`` with no content. The tool
        worker holding the MCP request passes it to the server at once; the turn was never paused. Returns the
        answer sent.

        Raises :class:`NoPendingCallError` (its ``pending`` names the open request ids) when no such request is
        open (answered already, or its ``elicitation_timeout`` ran out and it was declined);
        :class:`TurnNotFoundError` for a turn Redis does not have; :class:`InvalidRequestError` for a bad
        action, content with ``decline``/``cancel``, content larger than 1 000 000 bytes as JSON, or content
        that does not fit the schema.
        """
        return await self.runner.run(self._op_respond(turn_id, request_id, action, content))

    async def usage(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, AgentUsage]:
        """What each agent's model calls used over the last ``window_seconds`` (to the minute; at most 24 h):
        agent name → :class:`~smith_client.usage.AgentUsage` (``requests``: model calls answered; ``prompt``,
        ``completion``, ``total``: server-reported tokens), only ``agent``'s when given, agents in name order,
        those with nothing counted absent. Counts every model call the workers made for an agent: its replies, its
        memory's summaries and the MCP sampling its tool calls served (docs/architecture.md, Token usage). One
        round trip. With ``tenant``, only the model calls of that tenant's turns (docs/architecture.md, Tenants).
        Raises :class:`InvalidRequestError` for a window outside (0, 86 400] or a bad agent or tenant name."""
        return await self.runner.run(self._op_usage(window_seconds, agent, tenant))

    async def usage_by_tenant(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, dict[str, AgentUsage]]:
        """:meth:`usage` grouped by tenant: tenant (``""`` for the turns with none) → agent →
        :class:`~smith_client.usage.AgentUsage`, tenants and agents in name order; the same rules and errors."""
        return await self.runner.run(self._op_usage_by_tenant(window_seconds, agent, tenant))

    async def set_tenant_limits(self, tenant: str, limits: TenantLimits) -> None:
        """Replace tenant ``tenant``'s limits with ``limits`` (:class:`~smith_client.tenants.TenantLimits`: pickup
        ``weight``, ``max_running``, ``token_quota`` tokens per ``quota_window_seconds``; docs/tenants.md), for the
        whole fleet at once: a send checks the quota as it is when it runs, a running turn at its next model call.
        Raises :class:`InvalidRequestError` for a bad tenant name (None included: the turns without a tenant have no
        limits) or a value of ``limits`` out of its range."""
        await self.runner.run(self._op_set_tenant_limits(tenant, limits))

    async def update_tenant_limits(self, tenant: str, **changes: Any) -> None:
        """Change only the limits given (``weight=``, ``max_running=``, ``token_quota=``, ``quota_window_seconds=``;
        a field's default, None for ``max_running`` and ``token_quota``, resets it), keeping the tenant's others,
        in one transaction: concurrent updates of different fields all stand (docs/tenants.md).
        :meth:`set_tenant_limits`'s errors, and :class:`InvalidRequestError` when no change is given."""
        await self.runner.run(self._op_update_tenant_limits(tenant, changes))

    async def tenant_limits(self, tenant: str) -> TenantLimits:
        """Tenant ``tenant``'s limits (every default when none are set); :meth:`set_tenant_limits`'s errors."""
        return await self.runner.run(self._op_tenant_limits(tenant))

    async def clear_tenant_limits(self, tenant: str) -> bool:
        """Delete tenant ``tenant``'s limits (back to every default: no quota); True when it had some. The tokens
        counted in its current window stay until the window's counter expires."""
        return await self.runner.run(self._op_clear_tenant_limits(tenant))

    async def tenant_quota(self, tenant: str) -> QuotaStatus:
        """Tenant ``tenant``'s :class:`~smith_client.tenants.QuotaStatus`: the tokens (prompt + completion) its
        turns used in the current quota window, its ``token_quota`` (None: none) and when the window resets
        (``reset_at``, epoch seconds). One round trip; :meth:`set_tenant_limits`'s errors."""
        return await self.runner.run(self._op_tenant_quota(tenant))

    @functools.cached_property
    def events(self) -> EventLog:
        """Publish and read turns' events (the worker side's :class:`EventLog`, on this client's Redis)."""
        return EventLog(self.redis, self.keys)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the Redis connections this client created; later calls raise :class:`TransportError`."""
        await self.runner.aclose()
        if self._owns_redis:
            await self.redis.aclose(close_connection_pool=True)


class TurnHandle(HandleBase):
    """A turn seen from any process through a :class:`SmithClient`: its status, events, result, and cancel.

    Get one from :meth:`SmithClient.submit` or :meth:`SmithClient.turn`
    (:class:`~smith_client.sync_client.SyncTurnHandle` is the blocking one).
    Its methods raise :class:`TransportError` when Redis fails.
    """

    def __init__(self, client: SmithClient, turn_id: str) -> None:
        super().__init__(client.keys, turn_id)
        self.client = client

    async def state(self) -> dict[str, str]:
        """The raw state hash, field to value (empty when the turn is unknown or expired)."""
        return await self.client.runner.run(self._op_state())

    async def status(self) -> str:
        """``queued``, ``running``, ``paused``, ``completed``, ``failed``, ``cancelled``, or ``missing`` (Redis has
        no such turn: never sent, or expired; as :meth:`cancel` answers)."""
        return await self.client.runner.run(self._op_status())

    def events(self, after_seq: int = 0, timeout: float | None = None) -> AsyncGenerator[Event, None]:
        """Every event with ``seq > after_seq``, exactly once and in order, then live ones until the end
        (``async for``; ``timeout`` in seconds, None = forever).

        Raises as :meth:`SmithClient.follow`, e.g. :class:`EventsTrimmedError` when the asked-for events are
        no longer kept.
        """
        return self.client.follow(self.turn_id, after_seq, timeout)

    @overload
    async def result(self, timeout: float | None = None, *, output_type: None = None) -> AssistantMessage: ...

    @overload
    async def result(self, timeout: float | None = None, *, output_type: type[M]) -> OutputMessage[M]: ...

    async def result(
        self, timeout: float | None = None, *, output_type: type[M] | None = None
    ) -> AssistantMessage | OutputMessage[M]:
        """Wait for the final :class:`AssistantMessage` (``timeout`` seconds, None = forever); with ``output_type``
        (a pydantic model) an :class:`~smith_client.output.OutputMessage` whose ``output`` is the answer parsed
        into it, as ``send`` returns (docs/architecture.md, Structured output).

        Raises the turn's typed error, :class:`TurnCancelledError` for a
        cancelled turn, :class:`TurnPausedError` for a paused one, :class:`TurnNotFoundError` for an unknown
        one, :class:`OutputValidationError` for an answer that does not parse into ``output_type``, or
        :class:`SmithTimeoutError`.
        """
        check_output_type(output_type)
        message = await self.client.runner.run(self._op_result(timeout), bound=timeout)
        return message if output_type is None else with_output(message, output_type)

    async def cancel(self, reason: str = "cancel") -> str:
        """Ask for the turn to stop; returns what happened: ``cancelled_queued`` (it never started),
        ``cancelling`` (a turn worker stops it, answering its tool calls with the results of those that ran,
        and publishes ``turn.cancelled``: the worker running it, or for a paused turn whichever takes it),
        a terminal status
        (nothing to do), or ``missing``. Raises :class:`InvalidRequestError` for an empty ``reason``."""
        return await self.client.runner.run(self._op_cancel(reason))
