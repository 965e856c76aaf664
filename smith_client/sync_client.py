"""``SyncSmithClient``: the blocking twin of :class:`~smith_client.client.SmithClient`, for WSGI apps.

Same methods, arguments, events and errors (each method runs the operation
:class:`~smith_client.client.ClientBase` builds for both clients), run on
redis-py's blocking client: no event loop is started. One instance can be
shared by all threads of a WSGI server (Flask, Django): commands take pooled
connections and every ``stream`` / ``follow`` shares the client's one pub/sub
connection (read by a daemon thread, :class:`~smith_client.fanout.SyncFanout`),
unsubscribing its channel when the iterator ends or is closed. Under WSGI every
open stream holds a worker thread; fan out to many browsers with the ASGI relay
in ``examples/web/`` instead.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Self, Unpack, overload

import redis

from smith_client.approvals import REJECTED, Decision
from smith_client.client import ClientBase, HandleBase
from smith_client.connection import connect_sync_redis
from smith_client.events import Event, PendingItem
from smith_client.inputs import InputResponse
from smith_client.messages import AssistantMessage, Message
from smith_client.output import M, OutputMessage, check_output_type, with_output
from smith_client.runners import SyncRunner
from smith_client.tenants import QuotaStatus, TenantLimits
from smith_client.usage import AgentUsage
from smith_client.validation import TurnOptions, check_id


class SyncSmithClient(ClientBase):
    """Blocking client for one Agent Smith deployment (one Redis database, one key prefix).

    Use ``SyncSmithClient.from_url(url, prefix=...)``, as ``with`` or closing
    with :meth:`close`. Thread-safe. Every method raises :class:`TransportError`
    when Redis fails (each command within the socket timeout); times are seconds.
    """

    _connect = staticmethod(connect_sync_redis)
    _runner = SyncRunner
    redis: redis.Redis
    runner: SyncRunner

    @overload
    def send(
        self, text: str, *, timeout: float | None = None, output_type: None = None, **options: Unpack[TurnOptions]
    ) -> AssistantMessage: ...

    @overload
    def send(
        self, text: str, *, timeout: float | None = None, output_type: type[M], **options: Unpack[TurnOptions]
    ) -> OutputMessage[M]: ...

    def send(
        self,
        text: str,
        *,
        timeout: float | None = None,
        output_type: type[M] | None = None,
        **options: Unpack[TurnOptions],
    ) -> AssistantMessage | OutputMessage[M]:
        """Blocking :meth:`SmithClient.send <smith_client.client.SmithClient.send>`: the same ``text``, ``options``
        (:class:`TurnOptions`), ``timeout`` (seconds), ``output_type`` and errors; returns the final
        :class:`AssistantMessage`, or with ``output_type`` an :class:`~smith_client.output.OutputMessage`."""
        check_output_type(output_type)
        message = self.runner.run(self._op_send(text, timeout, options), bound=timeout)
        return message if output_type is None else with_output(message, output_type)

    def stream(
        self, text: str, *, timeout: float | None = None, **options: Unpack[TurnOptions]
    ) -> Generator[Event, None, None]:
        """Blocking :meth:`SmithClient.stream <smith_client.client.SmithClient.stream>`: the same arguments, events
        and errors, as a plain iterator; leaving the loop early (or ``close()``) unsubscribes, the turn goes on."""
        return self.runner.iterate(self._op_stream(text, timeout, options))

    def submit(self, text: str, **options: Unpack[TurnOptions]) -> SyncTurnHandle:
        """Blocking :meth:`SmithClient.submit <smith_client.client.SmithClient.submit>`: returns a
        :class:`SyncTurnHandle` at once; the same options and errors."""
        return self.turn(self.runner.run(self._op_submit(text, options)))

    def turn(self, turn_id: str) -> SyncTurnHandle:
        """A handle on an existing turn, from any process (e.g. a web request after a reload).

        Raises :class:`InvalidRequestError` for a malformed id; an unknown turn is
        found out by the handle's methods.
        """
        return SyncTurnHandle(self, check_id(turn_id, "turn_id"))

    def follow(self, turn_id: str, after_seq: int = 0, timeout: float | None = None) -> Generator[Event, None, None]:
        """Blocking :meth:`SmithClient.follow <smith_client.client.SmithClient.follow>` (``after_seq``: the last
        ``seq`` the caller has; ``timeout`` in seconds), as a plain iterator; the same errors."""
        return self.runner.iterate(self._op_follow(turn_id, after_seq, timeout))

    def clear(self, conversation_id: str) -> None:
        """Blocking :meth:`SmithClient.clear <smith_client.client.SmithClient.clear>`: the same rules and errors."""
        self.runner.run(self._op_clear(conversation_id))

    def history(self, conversation_id: str) -> list[Message]:
        """Blocking :meth:`SmithClient.history <smith_client.client.SmithClient.history>`: a conversation's
        messages, oldest first; ``[]`` for an unknown one."""
        return self.runner.run(self._op_history(conversation_id))

    def conversation_agent(self, conversation_id: str) -> str | None:
        """Blocking :meth:`SmithClient.conversation_agent <smith_client.client.SmithClient.conversation_agent>`."""
        return self.runner.run(self._op_conversation_agent(conversation_id))

    def activate_skill(self, conversation_id: str, name: str) -> None:
        """Blocking :meth:`SmithClient.activate_skill <smith_client.client.SmithClient.activate_skill>`: the
        same rules and errors."""
        self.runner.run(self._op_activate_skill(conversation_id, name))

    def deactivate_skill(self, conversation_id: str, name: str) -> None:
        """Blocking :meth:`SmithClient.deactivate_skill <smith_client.client.SmithClient.deactivate_skill>`."""
        self.runner.run(self._op_deactivate_skill(conversation_id, name))

    def active_skills(self, conversation_id: str) -> list[str]:
        """Blocking :meth:`SmithClient.active_skills <smith_client.client.SmithClient.active_skills>`: declared
        names in activation order."""
        return self.runner.run(self._op_active_skills(conversation_id))

    def pending(self, turn_id: str) -> list[PendingItem]:
        """Blocking :meth:`SmithClient.pending <smith_client.client.SmithClient.pending>`: the calls a paused turn
        waits on, in call order."""
        return self.runner.run(self._op_pending(turn_id))

    def approve(self, turn_id: str, call_id: str, arguments: dict[str, Any] | None = None) -> Decision:
        """Blocking :meth:`SmithClient.approve <smith_client.client.SmithClient.approve>`: the same rules and
        errors; returns the decision that stands."""
        return self.runner.run(self._op_approve(turn_id, call_id, arguments))

    def reject(self, turn_id: str, call_id: str, message: str = REJECTED) -> Decision:
        """Blocking :meth:`SmithClient.reject <smith_client.client.SmithClient.reject>`."""
        return self.runner.run(self._op_reject(turn_id, call_id, message))

    def submit_tool_result(self, turn_id: str, call_id: str, result: Any, is_error: bool = False) -> Decision:
        """Blocking :meth:`SmithClient.submit_tool_result <smith_client.client.SmithClient.submit_tool_result>`:
        an external tool's result."""
        return self.runner.run(self._op_submit_tool_result(turn_id, call_id, result, is_error))

    def respond(
        self, turn_id: str, request_id: str, action: str, content: dict[str, Any] | None = None
    ) -> InputResponse:
        """Blocking :meth:`SmithClient.respond <smith_client.client.SmithClient.respond>`: answer an open MCP
        elicitation; the same rules and errors."""
        return self.runner.run(self._op_respond(turn_id, request_id, action, content))

    def usage(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, AgentUsage]:
        """Blocking :meth:`SmithClient.usage <smith_client.client.SmithClient.usage>`: agent name → what its
        model calls used over the last ``window_seconds`` (only ``tenant``'s turns' when given); the same rules
        and errors."""
        return self.runner.run(self._op_usage(window_seconds, agent, tenant))

    def usage_by_tenant(
        self, window_seconds: float = 3600, agent: str | None = None, tenant: str | None = None
    ) -> dict[str, dict[str, AgentUsage]]:
        """Blocking :meth:`SmithClient.usage_by_tenant <smith_client.client.SmithClient.usage_by_tenant>`:
        tenant → agent → use; the same rules and errors."""
        return self.runner.run(self._op_usage_by_tenant(window_seconds, agent, tenant))

    def set_tenant_limits(self, tenant: str, limits: TenantLimits) -> None:
        """Blocking :meth:`SmithClient.set_tenant_limits <smith_client.client.SmithClient.set_tenant_limits>`:
        replace a tenant's limits; the same rules and errors."""
        self.runner.run(self._op_set_tenant_limits(tenant, limits))

    def update_tenant_limits(self, tenant: str, **changes: Any) -> None:
        """Blocking :meth:`SmithClient.update_tenant_limits
        <smith_client.client.SmithClient.update_tenant_limits>`: change only the limits given; the same rules and
        errors."""
        self.runner.run(self._op_update_tenant_limits(tenant, changes))

    def tenant_limits(self, tenant: str) -> TenantLimits:
        """Blocking :meth:`SmithClient.tenant_limits <smith_client.client.SmithClient.tenant_limits>`."""
        return self.runner.run(self._op_tenant_limits(tenant))

    def clear_tenant_limits(self, tenant: str) -> bool:
        """Blocking :meth:`SmithClient.clear_tenant_limits <smith_client.client.SmithClient.clear_tenant_limits>`."""
        return self.runner.run(self._op_clear_tenant_limits(tenant))

    def tenant_quota(self, tenant: str) -> QuotaStatus:
        """Blocking :meth:`SmithClient.tenant_quota <smith_client.client.SmithClient.tenant_quota>`: the tokens used
        in the tenant's current window, its quota and the window's end."""
        return self.runner.run(self._op_tenant_quota(tenant))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the Redis connections this client created; later calls raise :class:`TransportError`."""
        self.runner.close()
        if self._owns_redis:
            self.redis.close()
            self.redis.connection_pool.disconnect()


class SyncTurnHandle(HandleBase):
    """A turn seen from any process through a :class:`SyncSmithClient`: its status, events, result, and cancel.

    Get one from :meth:`SyncSmithClient.submit` or :meth:`SyncSmithClient.turn`
    (:class:`~smith_client.client.TurnHandle` is the asyncio one). Its methods
    raise :class:`TransportError` when Redis fails.
    """

    def __init__(self, client: SyncSmithClient, turn_id: str) -> None:
        super().__init__(client.keys, turn_id)
        self.client = client

    def state(self) -> dict[str, str]:
        """The raw state hash, field to value (empty when the turn is unknown or expired)."""
        return self.client.runner.run(self._op_state())

    def status(self) -> str:
        """``queued``, ``running``, ``paused``, ``completed``, ``failed``, ``cancelled``, or ``missing`` (Redis has
        no such turn: never sent, or expired; as :meth:`cancel` answers)."""
        return self.client.runner.run(self._op_status())

    def events(self, after_seq: int = 0, timeout: float | None = None) -> Generator[Event, None, None]:
        """Every event with ``seq > after_seq``, exactly once and in order, then live ones until the end
        (a plain ``for``; ``timeout`` in seconds, None = forever).

        Raises as :meth:`SyncSmithClient.follow`, e.g. :class:`EventsTrimmedError` when the asked-for events
        are no longer kept.
        """
        return self.client.follow(self.turn_id, after_seq, timeout)

    @overload
    def result(self, timeout: float | None = None, *, output_type: None = None) -> AssistantMessage: ...

    @overload
    def result(self, timeout: float | None = None, *, output_type: type[M]) -> OutputMessage[M]: ...

    def result(
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
        message = self.client.runner.run(self._op_result(timeout), bound=timeout)
        return message if output_type is None else with_output(message, output_type)

    def cancel(self, reason: str = "cancel") -> str:
        """Ask for the turn to stop; returns what happened: ``cancelled_queued`` (it never started),
        ``cancelling`` (a turn worker stops it, answering its tool calls with the results of those that ran,
        and publishes ``turn.cancelled``: the worker running it, or for a paused turn whichever takes it),
        a terminal status
        (nothing to do), or ``missing``. Raises :class:`InvalidRequestError` for an empty ``reason``."""
        return self.client.runner.run(self._op_cancel(reason))
