"""MCP observability events: lifecycle changes and server notifications (docs/architecture.md, Events: ``mcp.event``).

Two kinds of event reach ``on_mcp_event`` hooks and, as ``mcp.event``
stream events, the turns that use the server:

* :class:`LifecycleEvent`: ``connected``, ``disconnected``, ``reconnecting``,
  ``reconnect_failed`` of one server connection;
* :class:`Notification`: a notification the server sent (``*/list_changed``,
  ``notifications/message``, ``notifications/progress``, resource updates).

Both serialize with :meth:`to_data` to ``{alias, kind, message, fields}``,
the ``data`` of an ``mcp.event`` stream event (``kind`` is
``"notification"`` for notifications, whose ``fields`` are
``{method, params}``).

Delivery goes through an :class:`EventRouter`
per server: it logs every event on ``agent_smith.mcp``, calls the
process-wide listeners (app-level hooks, the Redis schema cache) once, and
hands the event to every :class:`EventSink` registered at the time it was
emitted (one per turn with a request in flight or waiting for the server).
Delivery runs on one background task in emission order, so neither the
owner task nor the SDK's receive loop ever waits for Redis or a hook, and a
failing listener is logged and ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Protocol

from smith_worker.ops.redaction import redact_json

logger = logging.getLogger("agent_smith.mcp")


class LifecycleKind(str, Enum):  # noqa: UP042 - the str mixin keeps how members format in logs and JSON
    """What happened to a server's connection."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    RECONNECTING = "reconnecting"
    RECONNECT_FAILED = "reconnect_failed"


@dataclass(frozen=True)
class LifecycleEvent:
    """A connection state change of server ``server_alias``; ``fields`` carry details (JSON-able)."""

    kind: LifecycleKind
    server_alias: str
    message: str
    fields: dict[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        """``{alias, kind, message, fields}``."""
        return {"alias": self.server_alias, "kind": self.kind.value, "message": self.message, "fields": self.fields}


@dataclass(frozen=True)
class Notification:
    """A server notification: its JSON-RPC ``method`` and ``params``."""

    server_alias: str
    method: str
    params: dict[str, Any] = field(default_factory=dict)

    def to_data(self) -> dict[str, Any]:
        """``{alias, kind: "notification", message: method, fields: {method, params}}``."""
        return {
            "alias": self.server_alias,
            "kind": "notification",
            "message": self.method,
            "fields": {"method": self.method, "params": self.params},
        }


McpEvent = LifecycleEvent | Notification

Listener = Callable[[McpEvent], Awaitable[None]]


class EventSink(Protocol):
    """Where the events of one turn go (its stream and its agent's hooks). ``key`` dedupes sinks."""

    @property
    def key(self) -> str:
        """What tells two sinks apart (a turn id)."""
        ...

    async def emit(self, event: McpEvent) -> None:
        """Deliver one event; may raise (the router logs and ignores failures)."""
        ...


@dataclass
class _Registered:
    sink: EventSink
    count: int = 0


class EventRouter:
    """Per-server event fan-out (see module doc). Bound to the running event loop on first emit."""

    def __init__(self, alias: str, redact: Callable[[str], str] = lambda text: text) -> None:
        self.alias = alias
        self._redact = redact
        self.listeners: list[Listener] = []
        self._sinks: dict[str, _Registered] = {}
        self._queue: asyncio.Queue[tuple[McpEvent, list[EventSink]]] | None = None
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def attached(self, sink: EventSink | None) -> Iterator[None]:
        """Register ``sink`` for the duration of a ``with`` block (no-op for None)."""
        if sink is None:
            yield
            return
        entry = self._sinks.setdefault(sink.key, _Registered(sink))
        entry.count += 1
        try:
            yield
        finally:
            entry.count -= 1
            if entry.count == 0:
                self._sinks.pop(sink.key, None)

    def emit(self, event: McpEvent, sink: EventSink | None = None, exclusive: bool = False) -> None:
        """Queue ``event`` for the listeners and the sinks registered now (plus ``sink``). Never blocks.

        With ``exclusive`` only ``sink`` gets it (an event scoped to one call, e.g. its progress).

        The event is redacted first (the config's secrets; sensitive JSON keys in fields and params).
        """
        event = self._redacted(event)
        self._log(event)
        sinks = [] if exclusive else [entry.sink for entry in self._sinks.values()]
        if sink is not None and sink.key not in {s.key for s in sinks}:
            sinks.append(sink)
        self._ensure_task()
        assert self._queue is not None
        self._queue.put_nowait((event, sinks))

    def _redacted(self, event: McpEvent) -> McpEvent:
        def clean(value: Any) -> Any:
            if isinstance(value, str):
                return self._redact(value)
            if isinstance(value, dict):
                return {k: clean(v) for k, v in redact_json(value).items()}
            if isinstance(value, list):
                return [clean(v) for v in value]
            return value

        if isinstance(event, LifecycleEvent):
            return replace(event, message=self._redact(event.message), fields=clean(event.fields))
        return replace(event, params=clean(event.params))

    def _log(self, event: McpEvent) -> None:
        if isinstance(event, LifecycleEvent):
            level = logging.WARNING if event.kind is LifecycleKind.RECONNECT_FAILED else logging.INFO
            logger.log(level, "MCP server %r: %s", self.alias, event.message)
        else:
            logger.debug("MCP server %r sent %s", self.alias, event.method)

    def _ensure_task(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._deliver(self._queue), name=f"mcp-events-{self.alias}")

    async def _deliver(self, queue: asyncio.Queue[tuple[McpEvent, list[EventSink]]]) -> None:
        while True:
            event, sinks = await queue.get()
            for target in [*self.listeners, *(sink.emit for sink in sinks)]:
                try:
                    await target(event)
                except Exception:  # observers never break the pool
                    logger.warning("MCP event listener failed for %r", self.alias, exc_info=True)
            queue.task_done()

    async def drain(self, timeout: float = 2.0) -> None:
        """Wait (at most ``timeout`` seconds) until queued events are delivered."""
        if self._queue is not None and self._task is not None and not self._task.done():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._queue.join()

    async def close(self) -> None:
        """Deliver what is queued (bounded), then stop the delivery task."""
        await self.drain()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, RuntimeError):
                await self._task
            self._task = None
