"""One pooled MCP server: its owner task, health, restarts and request routing (research/mcp-notes.md §7).

A :class:`ServerHandle` owns at most one live :class:`Connection` at a time.

* **Owner task.** Started lazily by the first request. It enters the
  transport, the pumps (:mod:`~smith_worker.mcp.link`) and the SDK
  ``ClientSession`` and exits them itself (the SDK's task groups must be
  exited by the task that entered them; mcp-notes §3.1), runs the handshake
  and discovery under ``connect_timeout``, publishes the connection, then
  waits for its end: shutdown, idle, loss (read pump EOF, transport error),
  failed health pings or repeated request timeouts. A hung server is
  SIGKILLed before the SDK's teardown, so a restart does not wait out its
  grace periods.
* **Restarts.** After an unexpected end the owner starts the next
  generation after ``backoff_base·2^(n-1)`` seconds (±20 %, capped at
  ``backoff_max``). ``max_restarts`` failures within ``restart_window``
  open a circuit for ``circuit_cooldown``: requests then fail at once with
  :class:`TransportError`.
* **Requests** run in the caller's task, straight on the shared session,
  under a per-server semaphore, with no task of their own. Each one races
  the connection's loss future (which cancels it, see :meth:`ServerHandle._race`),
  so it fails fast with a typed error when the server dies. On a loss it is sent once more on the next generation when
  it cannot have run twice (never sent, or read-only, or a configured
  idempotent tool); a ``tools/call`` that may have reached the server is
  never replayed (seed §11.2). A cancelled or timed-out call makes the SDK
  send ``notifications/cancelled``. An HTTP server that no longer knows
  our session (HTTP 400/404 on our session id, seen by
  :mod:`~smith_worker.mcp.http`, or a JSON-RPC error saying so) ends the
  connection the same way (``disconnected``, reason ``session expired``):
  the next generation re-initializes; a failed ``tools/call`` is not resent.
  Only successful answers count as activity, so failing requests never
  hold off the health ping.
* **Progress** notifications reach only the turn of the call they belong
  to (the SDK routes them by progress token, which is the request id);
  server-wide notifications (logging, ``*/list_changed``) reach every
  turn attached to the server.
* **Events**: lifecycle events and server notifications go through the
  handle's :class:`~smith_worker.mcp.events.EventRouter` to hooks, logs and
  the turns with a request in flight.

A handle is bound to the event loop that first uses it; it may be used
again after :meth:`ServerHandle.close`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any, NoReturn

import anyio

from smith_client.errors import SmithError, TransportError
from smith_worker.mcp import adapt
from smith_worker.mcp.catalog import Catalog, Discovery, build_catalog
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.discovery import discover, initialize
from smith_worker.mcp.errors import (
    SESSION_EXPIRED,
    ConnectionLost,
    is_connection_loss,
    is_session_terminated,
    map_error,
    rpc_code,
    timeout_error,
    transport_error,
)
from smith_worker.mcp.events import EventRouter, EventSink, LifecycleEvent, LifecycleKind, Notification
from smith_worker.mcp.link import CALL_TAG, Link
from smith_worker.mcp.transport import StderrCapture, open_transport
from smith_worker.tools.function import ToolResult

logger = logging.getLogger("agent_smith.mcp")

#: Seconds a request may outlive its own deadline before the pool's backstop fires (the SDK's timeout fires first).
BACKSTOP_GRACE = 1.0
#: Seconds :meth:`ServerHandle.close` waits for the owner (the SDK's stdio teardown takes at most ~6.5 s).
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
    last request and of the last answer (pings included).
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


@dataclass
class Request:
    """One high-level operation: ``run(conn, timeout_s)`` performs it on a connection.

    ``idempotent`` allows a resend after a loss even if it reached the
    server; ``tag`` is the ``_meta`` call tag of a ``tools/call``.
    """

    operation: str
    run: Callable[[Connection, float], Awaitable[Any]]
    idempotent: bool = False
    tag: str | None = None


@dataclass
class _GenerationEnd:
    reason: str = "error"
    was_ready: bool = False
    error: BaseException | None = None


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


class _Interrupt:
    """Cancels one task for the pool's own reasons (connection lost, backstop), at most once, while armed.

    :meth:`disarm` stops it and says whether the task's cancellation is ours
    alone (then it has been taken back with ``uncancel``).
    """

    __slots__ = ("armed", "reason", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        assert task is not None
        self.task = task
        self.armed = True
        self.reason: str | None = None

    def fire(self, reason: str) -> None:
        if self.armed and self.reason is None:
            self.reason = reason
            self.task.cancel()

    def on_lost(self, _lost: asyncio.Future[str]) -> None:
        self.fire("lost")

    def disarm(self) -> bool:
        self.armed = False
        return self.reason is not None and self.task.uncancel() == 0


class ServerHandle:
    """A pooled MCP server (see module doc). ``config`` is its :class:`ServerConfig`.

    ``catalog_listeners`` are awaited with every new catalog (after connect
    and after a ``list_changed`` re-discovery); ``events.listeners`` get every
    :data:`~smith_worker.mcp.events.McpEvent`.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.alias = config.alias
        self.events = EventRouter(config.alias, config.redact)
        self.catalog_listeners: list[CatalogListener] = []
        self.state = State.IDLE
        self.generation = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conn: Connection | None = None
        self._capture: StderrCapture | None = None
        self._owner: asyncio.Task[None] | None = None
        self._next: asyncio.Future[Connection] | None = None
        self._stop = asyncio.Event()
        self._sem = asyncio.Semaphore(config.concurrency)
        self._failures: collections.deque[float] = collections.deque()
        self._circuit_until = 0.0
        self._closing = False
        self._background: set[asyncio.Task[Any]] = set()
        self._refresh_pending: set[int] = set()
        self._last_tools: list[str] | None = None
        self._task_required_logged: list[str] = []
        self._tag_prefix = uuid.uuid4().hex[:12] + "-"  # call tags: unique per handle, cheap per call
        self._tag_seq = itertools.count(1)

    # ---- public operations ---------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pid of the current stdio server process, when known."""
        return self._capture.pid if self._capture is not None else None

    @property
    def connection(self) -> Connection | None:
        """The live connection, if any."""
        conn = self._conn
        return conn if conn is not None and not conn.lost.done() else None

    async def catalog(self, deadline: float | None = None, sink: EventSink | None = None) -> Catalog:
        """The server's catalog, connecting first if needed (by ``deadline``, a monotonic instant).

        Raises :class:`TransportError`, :class:`McpProtocolError` or :class:`SmithTimeoutError`
        when the server cannot be reached or discovered.
        """
        self._bind()
        with self.events.attached(sink):
            conn = await self.ready(self._connect_deadline(deadline))
        return conn.catalog

    async def call_tool(
        self, tool: str, arguments: dict[str, Any], *, deadline: float | None = None, sink: EventSink | None = None
    ) -> ToolResult:
        """Call MCP tool ``tool`` (its original name) and adapt the result (seed §11.7).

        ``deadline`` (monotonic instant) bounds connect + request; the request
        itself gets at most ``request_timeout`` seconds. An ``isError`` result is
        an error :class:`ToolResult`. Raises :class:`TransportError` (loss; not
        retried when the call may have reached the server),
        :class:`SmithTimeoutError`, :class:`McpProtocolError`, ``CancelledError``.
        """
        tag = f"{self._tag_prefix}{next(self._tag_seq)}"

        async def run(conn: Connection, timeout: float) -> Any:
            async def progress(value: float, total: float | None, message: str | None) -> None:
                params = {"progress": value, "total": total, "message": message}
                self.events.emit(Notification(self.alias, "notifications/progress", params), sink, exclusive=True)

            return await conn.session.call_tool(
                tool,
                arguments,
                read_timeout_seconds=timeout,
                progress_callback=progress if sink is not None else None,
                meta={CALL_TAG: tag},
            )

        request = Request(f"tools/call {tool!r}", run, idempotent=tool in self.config.idempotent_tools, tag=tag)
        return adapt.tool_result(await self.request(request, deadline, sink))

    async def read_resource(
        self, uri: str, *, deadline: float | None = None, sink: EventSink | None = None
    ) -> ToolResult:
        """Read resource ``uri`` as a :class:`ToolResult` (seed §11.8). Read-only: retried once after a loss.

        Raises like :meth:`call_tool`.
        """

        async def run(conn: Connection, timeout: float) -> Any:
            import mcp_types as types

            request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=uri))
            return await conn.session.send_request(
                request, types.ReadResourceResult, request_read_timeout_seconds=timeout
            )

        return adapt.resource_result(await self.request(Request(f"resources/read {uri!r}", run, True), deadline, sink))

    async def get_prompt(
        self,
        name: str,
        arguments: dict[str, str] | None = None,
        *,
        deadline: float | None = None,
        sink: EventSink | None = None,
    ) -> list[Any]:
        """Render prompt ``name`` as Smith messages (seed §11.8). Read-only: retried once after a loss.

        Raises :class:`McpError` for non-text content, otherwise like :meth:`call_tool`.
        """

        async def run(conn: Connection, timeout: float) -> Any:
            import mcp_types as types

            params = types.GetPromptRequestParams(
                name=name, arguments={k: str(v) for k, v in (arguments or {}).items()}
            )
            return await conn.session.send_request(
                types.GetPromptRequest(params=params), types.GetPromptResult, request_read_timeout_seconds=timeout
            )

        result = await self.request(Request(f"prompts/get {name!r}", run, True), deadline, sink)
        return adapt.prompt_messages(self.alias, name, result)

    async def ping(self, *, deadline: float | None = None) -> None:
        """One ``ping`` round trip (starts the server if needed)."""
        await self.request(Request("ping", self._ping, True), deadline, None)

    async def request(self, request: Request, deadline: float | None = None, sink: EventSink | None = None) -> Any:
        """Run ``request`` with the pool's rules (see module doc); returns the SDK result."""
        self._bind()
        attempts = 2 if self.config.reconnect_on_transport_error else 1
        with self.events.attached(sink):
            for attempt in range(1, attempts + 1):
                conn = await self.ready(self._connect_deadline(deadline))
                request_deadline = time.monotonic() + self.config.request_timeout
                if deadline is not None:
                    request_deadline = min(request_deadline, deadline)
                try:
                    return await self._attempt(conn, request, request_deadline)
                except ConnectionLost as lost:
                    replay_unsafe = lost.maybe_sent and not request.idempotent
                    if attempt == attempts or replay_unsafe:
                        detail = f"connection lost ({lost.reason})"
                        if replay_unsafe:
                            detail += "; the call may have reached the server and is not retried"
                        raise transport_error(self.alias, request.operation, detail) from None
                    logger.info(
                        "MCP server %r: retrying %s once after a transport error", self.alias, request.operation
                    )
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Stop the server (graceful, bounded by :data:`CLOSE_TIMEOUT` seconds, then SIGKILL); never raises.

        In-flight requests fail with :class:`TransportError`; the handle can start again afterwards.
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

    # ---- connection management ------------------------------------------------

    def _bind(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            return
        if self._loop is not None:
            logger.info("MCP server %r: used from a new event loop; starting afresh", self.alias)
        self._loop = loop
        self._conn = self._capture = self._owner = self._next = None
        self._stop = asyncio.Event()
        self._sem = asyncio.Semaphore(self.config.concurrency)
        self.state = State.IDLE

    def _connect_deadline(self, deadline: float | None) -> float:
        limit = time.monotonic() + self.config.connect_timeout
        return limit if deadline is None else min(limit, deadline)

    async def ready(self, deadline: float) -> Connection:
        """The live connection, starting or waiting for one until ``deadline`` (monotonic instant).

        A connect attempt that fails with a transport error is followed by one
        more (the owner's next generation) when ``reconnect_on_transport_error``.
        Raises :class:`TransportError` (shutting down, circuit open, connect
        failed), :class:`McpProtocolError` (handshake/discovery failed),
        :class:`SmithTimeoutError` (not ready by ``deadline``).
        """
        self._bind()
        retry = self.config.reconnect_on_transport_error
        while True:
            if self._closing:
                raise transport_error(self.alias, "connect", "the pool is shutting down")
            conn = self.connection
            if conn is not None:
                return conn
            now = time.monotonic()
            if now < self._circuit_until:
                raise transport_error(
                    self.alias,
                    "connect",
                    f"server unavailable after repeated failures; retry in {self._circuit_until - now:.1f} s",
                )
            pending = self._start()
            if deadline <= now:
                raise timeout_error(self.alias, "connect", self.config.connect_timeout)
            try:
                async with asyncio.timeout(deadline - now):
                    conn = await asyncio.shield(pending)
            except TimeoutError:
                raise timeout_error(self.alias, "connect", round(deadline - now, 3)) from None
            except TransportError:
                if not retry:
                    raise
                retry = False  # a transport failure while connecting: wait for the owner's next attempt, once
                logger.info("MCP server %r: connect failed; waiting for one more attempt", self.alias)
                continue
            if not conn.lost.done():
                return conn

    def _start(self) -> asyncio.Future[Connection]:
        loop = asyncio.get_running_loop()
        if self._next is None or self._next.done():
            self._next = loop.create_future()
        if self._owner is None or self._owner.done():
            self._stop = asyncio.Event()
            self._owner = loop.create_task(self._run_owner(), name=f"mcp-owner-{self.alias}")
        return self._next

    async def _stop_owner(self) -> None:
        owner = self._owner
        if owner is None or owner.done():
            return
        self._stop.set()
        conn = self._conn
        if conn is not None:
            self._end(conn, "shutdown")
        elif self.state is State.STARTING:
            owner.cancel()  # abort a handshake in progress; the SDK still stops the child (shielded)
        done, _ = await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT)
        if not done:
            logger.warning("MCP server %r did not stop within %g s; killing it", self.alias, CLOSE_TIMEOUT)
            if self._capture is not None:
                self._capture.kill()
            owner.cancel()
            await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT)

    # ---- the owner task -----------------------------------------------------

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
        finally:
            self._conn = None
            if self._next is not None:
                _settle(self._next, transport_error(self.alias, "connect", "the server was stopped"))
            if self.state is not State.OPEN:
                self.state = State.IDLE

    def _trip_breaker(self, end: _GenerationEnd) -> bool:
        """Record a failure; open the circuit (and say so) after too many in the window."""
        now = time.monotonic()
        self._failures.append(now)
        while self._failures and self._failures[0] < now - self.config.restart_window:
            self._failures.popleft()
        if len(self._failures) < self.config.max_restarts:
            return False
        self._circuit_until = now + self.config.circuit_cooldown
        self.state = State.OPEN
        error = self._failure_text(end)
        self.events.emit(
            LifecycleEvent(
                LifecycleKind.RECONNECT_FAILED,
                self.alias,
                f"giving up after {len(self._failures)} failures; circuit open for {self.config.circuit_cooldown:g} s",
                {
                    "attempts": len(self._failures),
                    "last_error": error,
                    "circuit_open_for": self.config.circuit_cooldown,
                },
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
            end.error = exc
            if not end.was_ready:
                error = self._connect_error(exc, capture)
                logger.warning("%s", error.message)
                if self._next is not None:
                    _settle(self._next, error)
        finally:
            conn = self._conn
            if conn is not None and conn.generation == generation:  # ended by an error: never leave it published
                self._end(conn, end.reason)
            if capture is not None:
                await capture.close()
        return end

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
            self._end(conn, "shutdown")

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
            self._end(conn, reason)
        elif not lost.done():
            lost.set_result(reason)

    def _end(self, conn: Connection, reason: str) -> None:
        """End ``conn`` now: unpublish, emit ``disconnected`` (to the turns using it), wake its requests."""
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

    async def _wait_end(self, conn: Connection) -> str:
        idle = self.config.idle_timeout
        while True:
            timeout = None
            if idle is not None:
                timeout = conn.last_used + idle - time.monotonic()
                if timeout <= 0 and conn.inflight == 0:
                    self._end(conn, "idle")
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
                await self._ping(conn, self.config.ping_timeout)
                conn.last_activity = time.monotonic()
                failures = 0
            except Exception as exc:
                if is_connection_loss(exc):
                    return
                if self._session_gone(exc):
                    self._end(conn, SESSION_EXPIRED)
                    return
                failures += 1
                logger.warning("MCP server %r: ping failed (%d in a row): %s", self.alias, failures, exc)
                if failures >= MAX_PING_FAILURES:
                    self._end(conn, "health")
                    return

    @staticmethod
    async def _ping(conn: Connection, timeout: float) -> Any:
        import mcp_types as types

        return await conn.session.send_request(
            types.PingRequest(), types.EmptyResult, request_read_timeout_seconds=timeout
        )

    # ---- one request attempt -----------------------------------------------------

    async def _attempt(self, conn: Connection, request: Request, deadline: float) -> Any:
        budget = round(max(0.0, deadline - time.monotonic()), 3)
        if self._sem.locked():  # wait for a slot within the deadline (the common path skips the timer)
            try:
                async with asyncio.timeout(budget):
                    await self._sem.acquire()
            except TimeoutError:
                raise timeout_error(self.alias, request.operation + " (waiting for a free slot)", budget) from None
        else:
            await self._sem.acquire()
        conn.inflight += 1
        try:
            if conn.lost.done():
                raise ConnectionLost(conn.lost.result(), maybe_sent=False)
            conn.last_used = time.monotonic()
            return await self._race(conn, request, deadline, budget)
        finally:
            conn.inflight -= 1
            conn.last_used = time.monotonic()
            self._sem.release()

    async def _race(self, conn: Connection, request: Request, deadline: float, budget: float) -> Any:
        """Run the request in this task against the connection's loss and a backstop timer; map the outcome.

        No task per call: the loss (a done callback on ``conn.lost``) or the
        backstop (``BACKSTOP_GRACE`` s past the SDK's own timeout) cancels this
        task, and that cancellation is turned into :class:`ConnectionLost` or a
        timeout (the SDK then sends ``notifications/cancelled``; the link's
        write side never blocks, so it cannot hold the caller). A cancellation
        from outside (turn cancelled, tool timeout) propagates unchanged.
        """
        remaining = max(0.001, deadline - time.monotonic())
        guard = _Interrupt(asyncio.current_task())
        conn.lost.add_done_callback(guard.on_lost)
        timer = asyncio.get_running_loop().call_later(remaining + BACKSTOP_GRACE, guard.fire, "backstop")
        try:
            result = await request.run(conn, remaining)
        except asyncio.CancelledError:
            if not guard.disarm():
                raise
            if conn.lost.done():
                raise ConnectionLost(conn.lost.result(), self._maybe_sent(conn, request)) from None
            self._count_timeout(conn)
            raise timeout_error(self.alias, request.operation, budget) from None
        except Exception as exc:  # noqa: BLE001 - every SDK failure is mapped to a typed error
            guard.disarm()
            self._failed(conn, request, exc, budget)
        else:
            guard.disarm()
            conn.last_activity = time.monotonic()
            conn.timeouts = 0
            return result
        finally:
            timer.cancel()
            conn.lost.remove_done_callback(guard.on_lost)

    @staticmethod
    def _maybe_sent(conn: Connection, request: Request) -> bool:
        return request.tag is None or request.tag in conn.link.sent

    def _failed(self, conn: Connection, request: Request, exc: Exception, budget: float) -> NoReturn:
        """Map a failed request: :class:`ConnectionLost` (to retry or report) or a typed Smith error."""
        if self._session_gone(exc):  # the server forgot our session: reconnect; resend only what is safe
            self._end(conn, SESSION_EXPIRED)
            raise ConnectionLost(conn.lost.result(), self._maybe_sent(conn, request))
        if is_connection_loss(exc):
            self._end(conn, "transport error")
            raise ConnectionLost(conn.lost.result(), self._maybe_sent(conn, request))
        error = map_error(self.alias, request.operation, exc, budget)
        if error.kind == "SmithTimeoutError":
            self._count_timeout(conn)
        else:  # an answer, but not proof of a healthy session: the health ping still runs (issue 12)
            conn.timeouts = 0
        raise error from None

    def _session_gone(self, exc: Exception) -> bool:
        """An HTTP server's JSON-RPC error saying it does not know our session (stdio has no sessions)."""
        return self.config.kind == "http" and is_session_terminated(exc)

    def _count_timeout(self, conn: Connection) -> None:
        conn.timeouts += 1
        if conn.timeouts >= self.config.max_timeouts:
            logger.warning("MCP server %r: %d request timeouts in a row; restarting it", self.alias, conn.timeouts)
            self._end(conn, "timeouts")

    # ---- notifications -----------------------------------------------------------

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
