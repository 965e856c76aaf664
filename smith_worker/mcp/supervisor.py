"""Supervision of one pooled MCP server: its process or session, connection generations, health and restarts.

A :class:`Supervisor` owns at most one live :class:`Connection` at a time and
hands it to the request path (:class:`~smith_worker.mcp.server.ServerHandle`)
through :meth:`Supervisor.ready`; the request path reports a connection it
found dead or hung with :meth:`Supervisor.end`.

* **Owner task.** Started lazily by the first :meth:`~Supervisor.ready`. It
  enters the transport, the pumps (:mod:`~smith_worker.mcp.link`) and the
  SDK ``ClientSession`` and exits them itself (the SDK's task groups must be
  exited by the task that entered them), runs the handshake
  and discovery under ``connect_timeout``, publishes the connection, then
  waits for its end: shutdown, idle, loss (read pump EOF, transport error),
  failed health pings or a report from the request path (repeated request
  timeouts, an HTTP session the server forgot). A hung server is SIGKILLed
  before the SDK's teardown, so a restart does not wait out its grace periods.
* **Restarts.** After an unexpected end the owner starts the next
  generation after ``backoff_base·2^(n-1)`` seconds (±20 %, capped at
  ``backoff_max``). ``max_restarts`` failures within ``restart_window``
  open a circuit for ``circuit_cooldown``: :meth:`~Supervisor.ready` then
  fails at once with :class:`TransportError`.
* **Health.** After ``health_interval`` seconds without an answer the
  connection is pinged; two failed pings in a row end it. Only successful
  answers count as activity, so failing requests never hold off the ping.
* **Notifications.** Server-wide notifications (logging, ``*/list_changed``)
  reach every turn attached to the server; a ``list_changed`` re-discovers
  the catalog. Progress notifications belong to one request (the SDK routes
  them by progress token) and are left to the request path.
* **Events**: lifecycle events and server notifications go through the
  :class:`~smith_worker.mcp.events.EventRouter` to hooks, logs and the turns
  with a request in flight.

A supervisor is bound to the event loop that first uses it; it may be used
again after :meth:`Supervisor.close`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any

import anyio

from smith_client.errors import SmithError, TransportError
from smith_worker.mcp.catalog import Catalog, Discovery, build_catalog, discover, initialize
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.errors import (
    SESSION_EXPIRED,
    is_connection_loss,
    is_session_gone,
    map_error,
    rpc_code,
    timeout_error,
    transport_error,
)
from smith_worker.mcp.events import EventRouter, LifecycleEvent, LifecycleKind, Notification
from smith_worker.mcp.link import Link
from smith_worker.mcp.transport import StderrCapture, open_transport
from smith_worker.ops import tracing

logger = logging.getLogger("agent_smith.mcp")

#: Seconds :meth:`Supervisor.close` waits for the owner (the SDK's stdio teardown takes at most ~6.5 s).
CLOSE_TIMEOUT = 8.0
#: Failed pings in a row that restart a server.
MAX_PING_FAILURES = 2

#: Connection end reasons after which the server is SIGKILLed before teardown.
HUNG_REASONS = frozenset({"health", "timeouts"})
#: Methods whose notifications trigger a re-discovery.
LIST_CHANGED = frozenset(
    {
        "notifications/tools/list_changed",
        "notifications/resources/list_changed",
        "notifications/prompts/list_changed",
    }
)

#: Notifications about one request: the SDK hands progress to that request's own callback (by progress
#: token, which is the request id), so the message handler must not broadcast them to every turn.
PER_REQUEST = frozenset({"notifications/progress", "notifications/cancelled"})

CatalogListener = Callable[[Catalog], Awaitable[None]]


class State(str, Enum):  # noqa: UP042 - the str mixin keeps how members format in logs
    """Where a server is in its life."""

    IDLE = "idle"
    STARTING = "starting"
    READY = "ready"
    BACKOFF = "backoff"
    OPEN = "circuit_open"


@dataclass
class Connection:
    """One live connection generation (session, catalog, loss future, bookkeeping).

    ``lost`` resolves with the end reason; ``inflight`` counts requests;
    ``last_used`` / ``last_activity`` are ``time.monotonic()`` instants of the
    last request and of the last answer (pings included); ``timeouts`` counts
    request timeouts in a row. The request path keeps the counters; supervision
    reads them (idle shutdown, health, the ``disconnected`` event).
    """

    generation: int
    session: Any
    init: Any
    catalog: Catalog
    link: Link
    lost: asyncio.Future[str]
    capture: StderrCapture | None
    started: float = field(default_factory=time.monotonic)
    last_used: float = field(default_factory=time.monotonic)
    last_activity: float = field(default_factory=time.monotonic)
    inflight: int = 0
    timeouts: int = 0


async def ping(conn: Connection, timeout: float) -> Any:
    """One ``ping`` round trip on ``conn`` within ``timeout`` seconds; raises the SDK's error on failure."""
    import mcp_types as types

    return await conn.session.send_request(types.PingRequest(), types.EmptyResult, request_read_timeout_seconds=timeout)


@dataclass
class _GenerationEnd:
    reason: str = "error"
    was_ready: bool = False
    error: BaseException | None = None


class _Breaker:
    """Restart failures within ``restart_window``; ``max_restarts`` of them open the circuit for
    ``circuit_cooldown`` seconds."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.failures: collections.deque[float] = collections.deque()
        self.open_until = 0.0

    def record(self) -> bool:
        """Count a failure now; True when it opens the circuit."""
        now = time.monotonic()
        self.failures.append(now)
        while self.failures and self.failures[0] < now - self.config.restart_window:
            self.failures.popleft()
        if len(self.failures) < self.config.max_restarts:
            return False
        self.open_until = now + self.config.circuit_cooldown
        return True

    def remaining(self) -> float:
        """Seconds until the circuit closes (0 when closed)."""
        return max(0.0, self.open_until - time.monotonic())


def _settle(future: asyncio.Future[Any], error: BaseException) -> None:
    """Fail ``future`` (if pending) without an 'exception never retrieved' warning."""
    if not future.done():
        future.set_exception(error)
        future.exception()


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _unwrap(exc: BaseException) -> BaseException:
    """The most telling leaf of an exception group (non-cancellation first)."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)] or list(exc.exceptions)
        exc = leaves[0]
    return exc


def _jitter(delay: float) -> float:
    return delay * random.uniform(0.8, 1.2)


class Supervisor:
    """The connection lifecycle of one pooled MCP server (see module doc). ``config`` is its :class:`ServerConfig`.

    ``catalog_listeners`` are awaited with every new catalog (after connect
    and after a ``list_changed`` re-discovery); ``events.listeners`` get every
    :data:`~smith_worker.mcp.events.McpEvent`. ``state`` is a :class:`State`;
    ``generation`` counts connection attempts. ``session_callbacks`` are keyword
    arguments of every new ``ClientSession`` (the server's requests to us:
    ``sampling_callback``, ``elicitation_callback``; :mod:`~smith_worker.mcp.requests`).
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.alias = config.alias
        self.events = EventRouter(config.alias, config.redact)
        self.catalog_listeners: list[CatalogListener] = []
        self.session_callbacks: dict[str, Any] = {}
        self.state = State.IDLE
        self.generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection | None = None
        self._capture: StderrCapture | None = None
        self._owner: asyncio.Task[None] | None = None
        self._next: asyncio.Future[Connection] | None = None
        self._stop = asyncio.Event()
        self._breaker = _Breaker(config)
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()
        self._refresh_pending: set[int] = set()
        self._last_tools: list[str] | None = None
        self._task_required_logged: list[str] = []

    # ---- the interface of the request path ------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pid of the current stdio server process, when known."""
        return self._capture.pid if self._capture is not None else None

    @property
    def connection(self) -> Connection | None:
        """The live connection, if any."""
        conn = self._conn
        return conn if conn is not None and not conn.lost.done() else None

    async def ready(self, deadline: float | None = None) -> Connection:
        """The live connection, starting or waiting for one until ``deadline`` (monotonic instant) or
        ``connect_timeout`` seconds from now, whichever comes first.

        A connect attempt that fails with a transport error is followed by one
        more (the owner's next generation) when ``reconnect_on_transport_error``.
        Raises :class:`TransportError` (shutting down, circuit open, connect
        failed), :class:`McpProtocolError` (handshake/discovery failed),
        :class:`SmithTimeoutError` (not ready by the deadline).
        """
        self._bind()
        limit = time.monotonic() + self.config.connect_timeout
        deadline = limit if deadline is None else min(limit, deadline)
        retry = self.config.reconnect_on_transport_error
        while True:
            pending = self._pending()
            if isinstance(pending, Connection):
                return pending
            try:
                conn = await self._wait_for(pending, deadline)
            except TransportError:
                if not retry:
                    raise
                retry = False  # a transport failure while connecting: wait for the owner's next attempt, once
                logger.info("MCP server %r: connect failed; waiting for one more attempt", self.alias)
                continue
            if not conn.lost.done():
                return conn

    def end(self, conn: Connection, reason: str) -> None:
        """End ``conn`` now: unpublish, emit ``disconnected`` (to the turns using it), wake its requests.

        The owner then restarts the server (after a backoff) unless ``reason`` is
        ``idle`` or ``shutdown``; for a reason in :data:`HUNG_REASONS` it SIGKILLs it first.
        """
        if conn.lost.done():
            return
        if self._conn is conn:
            self._conn = None
            self.state = State.IDLE if reason in ("idle", "shutdown") else State.BACKOFF
        tail = conn.capture.tail_text().splitlines()[-10:] if conn.capture is not None else []
        self.events.emit(
            LifecycleEvent(
                LifecycleKind.DISCONNECTED,
                self.alias,
                f"disconnected: {reason}",
                {"generation": conn.generation, "reason": reason, "inflight": conn.inflight, "stderr_tail": tail},
            )
        )
        conn.lost.set_result(reason)

    async def close(self) -> None:
        """Stop the server (graceful, bounded by :data:`CLOSE_TIMEOUT` seconds, then SIGKILL); never raises.

        In-flight requests see their connection lost; the supervisor can start again afterwards.
        """
        if self._loop is None or self._loop is not asyncio.get_running_loop():
            return
        self._closing = True
        try:
            await self._stop_owner()
            for task in list(self._background):
                task.cancel()
            await self.events.close()
        finally:
            self._closing = False
            self.state = State.IDLE if self.state is not State.OPEN else self.state

    # ---- starting and stopping the owner --------------------------------------------

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            logger.info("MCP server %r: used from a new event loop; starting afresh", self.alias)
        self._loop = loop
        self._conn = self._capture = self._owner = self._next = None
        self._stop = asyncio.Event()
        self.state = State.IDLE

    def _pending(self) -> Connection | asyncio.Future[Connection]:
        """The live connection, or the future of the next one (the owner started if needed).

        Raises :class:`TransportError` while closing or while the circuit is open.
        """
        if self._closing:
            raise transport_error(self.alias, "connect", "the pool is shutting down")
        conn = self.connection
        if conn is not None:
            return conn
        cooldown = self._breaker.remaining()
        if cooldown > 0:
            raise transport_error(
                self.alias, "connect", f"server unavailable after repeated failures; retry in {cooldown:.1f} s"
            )
        loop = asyncio.get_running_loop()
        if self._next is None or self._next.done():
            self._next = loop.create_future()
        if self._owner is None or self._owner.done():
            self._stop = asyncio.Event()
            # not in the trace of the call that starts it (docs/architecture.md, Tracing)
            context = tracing.background_context()
            self._owner = loop.create_task(self._run_owner(), name=f"mcp-owner-{self.alias}", context=context)
        return self._next

    async def _wait_for(self, pending: asyncio.Future[Connection], deadline: float) -> Connection:
        """``pending``'s connection, by ``deadline``; the future itself survives a caller's timeout."""
        budget = deadline - time.monotonic()
        if budget <= 0:
            raise timeout_error(self.alias, "connect", self.config.connect_timeout)
        try:
            async with asyncio.timeout(budget):
                return await asyncio.shield(pending)
        except TimeoutError:
            raise timeout_error(self.alias, "connect", round(budget, 3)) from None

    async def _stop_owner(self) -> None:
        owner = self._owner
        if owner is None or owner.done():
            return
        self._stop.set()
        conn = self._conn
        if conn is not None:
            self.end(conn, "shutdown")
        elif self.state is State.STARTING:
            owner.cancel()  # abort a handshake in progress; the SDK still stops the child (shielded)
        done, _ = await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT)
        if not done:
            logger.warning("MCP server %r did not stop within %g s; killing it", self.alias, CLOSE_TIMEOUT)
            if self._capture is not None:
                self._capture.kill()
            owner.cancel()
            await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT)

    # ---- the owner task ------------------------------------------------------------

    async def _run_owner(self) -> None:
        failures_in_row = 0
        try:
            while not self._stop.is_set():
                end = await self._run_generation()
                if end.reason == "idle" and self._next is not None and not self._next.done():
                    continue  # a request arrived while the idle server was stopping: start again
                if end.reason in ("shutdown", "idle") or self._stop.is_set():
                    break
                failures_in_row = 1 if end.was_ready else failures_in_row + 1
                if self._trip_breaker(end):
                    break
                await self._back_off(failures_in_row)
        finally:
            self._conn = None
            if self._next is not None:
                _settle(self._next, transport_error(self.alias, "connect", "the server was stopped"))
            if self.state is not State.OPEN:
                self.state = State.IDLE

    async def _back_off(self, failures_in_row: int) -> None:
        """Announce and wait out the delay before the next generation (a stop ends the wait)."""
        delay = _jitter(min(self.config.backoff_max, self.config.backoff_base * 2 ** (failures_in_row - 1)))
        self.state = State.BACKOFF
        self.events.emit(
            LifecycleEvent(
                LifecycleKind.RECONNECTING,
                self.alias,
                f"reconnecting in {delay:.2f} s (attempt {failures_in_row})",
                {"attempt": failures_in_row, "delay": round(delay, 3)},
            )
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await self._stop.wait()

    def _trip_breaker(self, end: _GenerationEnd) -> bool:
        """Record a failure; open the circuit (and say so) after too many in the window."""
        if not self._breaker.record():
            return False
        self.state = State.OPEN
        attempts, cooldown = len(self._breaker.failures), self.config.circuit_cooldown
        self.events.emit(
            LifecycleEvent(
                LifecycleKind.RECONNECT_FAILED,
                self.alias,
                f"giving up after {attempts} failures; circuit open for {cooldown:g} s",
                {"attempts": attempts, "last_error": self._failure_text(end), "circuit_open_for": cooldown},
            )
        )
        return True

    @staticmethod
    def _failure_text(end: _GenerationEnd) -> str:
        if end.error is None:
            return end.reason
        error = _unwrap(end.error)
        return error.message if isinstance(error, SmithError) else f"{type(error).__name__}: {error}"

    async def _run_generation(self) -> _GenerationEnd:
        """One connection: open, handshake, discover, publish, wait for the end, tear down (same task)."""
        self.generation += 1
        generation, config = self.generation, self.config
        end = _GenerationEnd()
        self.state = State.STARTING
        capture = self._capture = StderrCapture(config) if config.kind == "stdio" else None
        lost: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        try:
            on_lost = partial(self._on_lost, generation, lost)
            async with open_transport(config, capture, on_lost) as (t_read, t_write):
                link = Link(self.alias, t_read, t_write, on_lost=on_lost)
                async with anyio.create_task_group() as tg:
                    tg.start_soon(link.write_pump)
                    try:
                        await self._serve(generation, link, lost, capture, end, tg)
                    finally:
                        tg.cancel_scope.cancel()
        except BaseException as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # the owner itself is being cancelled (close)
                raise
            self._generation_failed(end, exc, capture)
        finally:
            conn = self._conn
            if conn is not None and conn.generation == generation:  # ended by an error: never leave it published
                self.end(conn, end.reason)
            if capture is not None:
                await capture.close()
        return end

    def _generation_failed(self, end: _GenerationEnd, exc: BaseException, capture: StderrCapture | None) -> None:
        """Record why a generation failed; one that never became ready fails the requests waiting for it."""
        end.error = exc
        if not end.was_ready:
            error = self._connect_error(exc, capture)
            logger.warning("%s", error.message)
            if self._next is not None:
                _settle(self._next, error)

    async def _serve(
        self,
        generation: int,
        link: Link,
        lost: asyncio.Future[str],
        capture: StderrCapture | None,
        end: _GenerationEnd,
        tg: Any,
    ) -> None:
        from mcp.client.session import ClientSession

        handler = partial(self._on_message, generation)
        async with ClientSession(
            link.session_read,
            link.session_write,
            read_timeout_seconds=self.config.request_timeout,
            message_handler=handler,
            **self.session_callbacks,
        ) as session:
            started = time.monotonic()
            with anyio.fail_after(self.config.connect_timeout):
                init = await initialize(session, self.config)
                discovery = await discover(session, self.config)
            conn = Connection(generation, session, init, build_catalog(self.config, discovery), link, lost, capture)
            end.was_ready = True
            self._publish(conn, discovery, started)
            tg.start_soon(self._health, conn)
            end.reason = await self._wait_end(conn)
            if end.reason in HUNG_REASONS and capture is not None:
                capture.kill()

    def _connect_error(self, exc: BaseException, capture: StderrCapture | None) -> SmithError:
        exc = _unwrap(exc)
        if isinstance(exc, SmithError):
            return exc
        if isinstance(exc, TimeoutError):
            return timeout_error(self.alias, "connect", self.config.connect_timeout)
        code = rpc_code(exc)
        if code is not None and not is_connection_loss(exc):
            return map_error(self.alias, "connect", exc, self.config.connect_timeout)
        detail = "the server closed the connection" if is_connection_loss(exc) else f"{type(exc).__name__}: {exc}"
        tail = capture.tail_text().splitlines()[-5:] if capture is not None else []
        if tail:
            detail += "; stderr: " + " | ".join(tail)
        return transport_error(self.alias, "connect", self.config.redact(detail))

    def _publish(self, conn: Connection, discovery: Discovery, started: float) -> None:
        previous, self._last_tools = self._last_tools, conn.catalog.tool_names()
        self._conn = conn
        self.state = State.READY
        if self._next is not None and not self._next.done():
            self._next.set_result(conn)
        info = conn.init.server_info
        fields = {
            "generation": conn.generation,
            "server": info.name if info else None,
            "version": info.version if info else None,
            "protocol_version": conn.init.protocol_version,
            "pid": self.pid,
            "tools": len(discovery.tools),
            "resources": len(discovery.resources),
            "prompts": len(discovery.prompts),
            "startup_ms": round((time.monotonic() - started) * 1000, 1),
        }
        if previous is not None and previous != conn.catalog.tool_names():
            fields["tools_changed"] = True
        self.events.emit(
            LifecycleEvent(
                LifecycleKind.CONNECTED,
                self.alias,
                f"connected ({self.config.describe()}, protocol {fields['protocol_version']})",
                fields,
            )
        )
        self._announce(conn.catalog)
        if self._stop.is_set():
            self.end(conn, "shutdown")

    def _announce(self, catalog: Catalog) -> None:
        if catalog.task_required and catalog.task_required != self._task_required_logged:
            logger.info(
                "MCP server %r: not offering tools that require task-augmented execution "
                "(MCP tasks are not supported): %s",
                self.alias,
                ", ".join(catalog.task_required),
            )
        self._task_required_logged = catalog.task_required
        for listener in self.catalog_listeners:
            self._spawn(listener(catalog))

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_consume)

    def _on_lost(self, generation: int, lost: asyncio.Future[str], reason: str) -> None:
        conn = self._conn
        if conn is not None and conn.generation == generation:
            self.end(conn, reason)
        elif not lost.done():
            lost.set_result(reason)

    async def _wait_end(self, conn: Connection) -> str:
        idle = self.config.idle_timeout
        while True:
            timeout = None
            if idle is not None:
                timeout = conn.last_used + idle - time.monotonic()
                if timeout <= 0 and conn.inflight == 0:
                    self.end(conn, "idle")
                    return "idle"
                timeout = max(timeout, 0.05) if timeout > 0 else idle
            await asyncio.wait({conn.lost}, timeout=timeout)
            if conn.lost.done():
                return conn.lost.result()

    async def _health(self, conn: Connection) -> None:
        """Ping after ``health_interval`` seconds of silence; end the connection after two failed pings."""
        failures = 0
        while not conn.lost.done():
            quiet = time.monotonic() - conn.last_activity
            await anyio.sleep(max(0.05, self.config.health_interval - quiet))
            if conn.lost.done() or time.monotonic() - conn.last_activity < self.config.health_interval:
                continue
            try:
                await ping(conn, self.config.ping_timeout)
                conn.last_activity = time.monotonic()
                failures = 0
            except Exception as exc:
                if is_connection_loss(exc):
                    return
                if is_session_gone(self.config.kind, exc):
                    self.end(conn, SESSION_EXPIRED)
                    return
                failures += 1
                logger.warning("MCP server %r: ping failed (%d in a row): %s", self.alias, failures, exc)
                if failures >= MAX_PING_FAILURES:
                    self.end(conn, "health")
                    return

    # ---- notifications -------------------------------------------------------------

    async def _on_message(self, generation: int, message: Any) -> None:
        """SDK ``message_handler``: server-wide notifications (to every attached turn) and transport exceptions.

        Per-request notifications (:data:`PER_REQUEST`) reach only their call: the SDK tees them here too.
        """
        if isinstance(message, Exception):
            logger.warning(
                "MCP server %r: transport reported %s: %s",
                self.alias,
                type(message).__name__,
                self.config.redact(str(message))[:200],
            )
            return
        method = getattr(message, "method", None)
        if not isinstance(method, str) or method in PER_REQUEST:
            return
        params = getattr(message, "params", None)
        data = params.model_dump(by_alias=True, mode="json", exclude_none=True) if params is not None else {}
        self.events.emit(Notification(self.alias, method, data))
        if method in LIST_CHANGED:
            self._schedule_refresh(generation)

    def _schedule_refresh(self, generation: int) -> None:
        if generation in self._refresh_pending:
            return
        self._refresh_pending.add(generation)
        self._spawn(self._refresh(generation))

    async def _refresh(self, generation: int) -> None:
        """Re-discover after a ``list_changed`` notification and announce the new catalog."""
        await asyncio.sleep(0)  # coalesce notifications sent back to back
        self._refresh_pending.discard(generation)
        conn = self.connection
        if conn is None or conn.generation != generation:
            return
        try:
            discovery = await discover(conn.session, self.config)
        except Exception as exc:
            logger.warning("MCP server %r: re-discovery after list_changed failed: %s", self.alias, exc)
            return
        conn.catalog = build_catalog(self.config, discovery)
        logger.info("MCP server %r: catalog refreshed (%d tools)", self.alias, len(conn.catalog.schemas))
        self._announce(conn.catalog)
