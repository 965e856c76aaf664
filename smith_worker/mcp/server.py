"""One pooled MCP server: the request path, over the connection its :class:`Supervisor` keeps.

A :class:`ServerHandle` is what the rest of the worker uses: tools, resources,
prompts and pings. It asks its :class:`~smith_worker.mcp.supervisor.Supervisor`
(``handle.supervisor``: process, connection generations, health, restarts,
circuit breaker, lifecycle events) for a ready connection and reports one it
found dead or hung; everything else here is about the requests.

* **Requests** run in the caller's task, straight on the shared session,
  under a per-server semaphore, with no task of their own. Each one races
  the connection's loss future (which cancels it, see :meth:`ServerHandle._race`),
  so it fails fast with a typed error when the server dies. On a loss it is sent once more on the next generation when
  it cannot have run twice (never sent, or read-only, or a configured
  idempotent tool); a ``tools/call`` that may have reached the server is
  never replayed (docs/architecture.md, MCP). A cancelled or timed-out call makes the SDK
  send ``notifications/cancelled``. ``max_timeouts`` request timeouts in a
  row end the connection as hung (``timeouts``). An HTTP server that no
  longer knows our session (HTTP 400/404 on our session id, seen by
  :mod:`~smith_worker.mcp.http`, or a JSON-RPC error saying so) ends the
  connection the same way (``disconnected``, reason ``session expired``):
  the next generation re-initializes; a failed ``tools/call`` is not resent.
  Only successful answers count as activity, so failing requests never
  hold off the health ping.
* **Progress** notifications reach only the turn of the call they belong
  to (the SDK routes them by progress token, which is the request id).
* **Results** become Smith values (MCP 2025-06-18, tools:
  https://modelcontextprotocol.io/specification/2025-06-18/server/tools):

  * ``tools/call`` → :class:`ToolResult` (:func:`tool_result`): text blocks
    joined by newlines; embedded text resources inlined; binary content
    (images, audio, blobs) replaced by a short placeholder (messages carry
    text only); ``structuredContent`` kept as ``structured`` (and used as the
    content when there is no text); ``isError`` → an error result with the
    compact JSON error payload of tool messages.
  * ``resources/read`` → :class:`ToolResult` (:func:`resource_result`): text
    contents joined, with a ``uri`` header line per item when there are
    several; blobs as placeholders.
  * ``prompts/get`` → :class:`UserMessage` / :class:`AssistantMessage`
    (:func:`prompt_messages`); any non-text content raises :class:`McpError`.

  Results are read through their JSON dump (MCP wire field names), so the
  conversion does not depend on SDK classes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from smith_client.errors import McpError
from smith_client.messages import AssistantMessage, UserMessage
from smith_worker.mcp.catalog import Catalog
from smith_worker.mcp.config import ServerConfig
from smith_worker.mcp.errors import (
    SESSION_EXPIRED,
    ConnectionLost,
    is_connection_loss,
    is_session_gone,
    map_error,
    timeout_error,
    transport_error,
)
from smith_worker.mcp.events import EventRouter, EventSink, Notification
from smith_worker.mcp.link import CALL_TAG
from smith_worker.mcp.supervisor import CatalogListener, Connection, State, Supervisor, ping
from smith_worker.tools.function import ToolResult, error_result

logger = logging.getLogger("agent_smith.mcp")

#: Seconds a request may outlive its own deadline before the pool's backstop fires (the SDK's timeout fires first).
BACKSTOP_GRACE = 1.0


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


class CallClock:
    """The clock of one tool call's request budget (``request_timeout``), stopped while the call waits for a
    person: an elicitation's answer or a sampling approval (docs/architecture.md, MCP).

    The call's waits share ``allowance`` seconds (the server's ``elicitation_timeout``): :meth:`waiting` yields
    what is left, so a call spends at most ``request_timeout`` working and ``elicitation_timeout`` waiting, and
    its tool job's timeout (:meth:`~smith_worker.mcp.source.McpServerSource.timeout_for`) covers both.
    """

    def __init__(self, allowance: float) -> None:
        self._left = allowance
        self._open = 0
        self._since = 0.0
        self._timers: set[_Timer] = set()

    def left(self) -> float:
        """Seconds of waiting for a person the call has left (never negative)."""
        spent = time.monotonic() - self._since if self._open else 0.0
        return max(0.0, self._left - spent)

    @contextlib.contextmanager
    def waiting(self) -> Iterator[float]:
        """Stop the call's request timers for the block (waits may overlap); yields the seconds it may last."""
        if not self._open:
            self._since = time.monotonic()
            for timer in self._timers:
                timer.stop()
        self._open += 1
        try:
            yield self.left()
        finally:
            self._open -= 1
            if not self._open:
                self._left = max(0.0, self._left - (time.monotonic() - self._since))
                for timer in self._timers:
                    timer.start()

    @contextlib.contextmanager
    def timing(self, timer: _Timer) -> Iterator[None]:
        """Stop and start ``timer`` with the call's waits for the block's duration."""
        self._timers.add(timer)
        if self._open:
            timer.stop()
        try:
            yield
        finally:
            self._timers.discard(timer)


class _Timer:
    """A one-shot timer on the running loop that stops and starts again, keeping the time it had left."""

    def __init__(self, seconds: float, callback: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._left = seconds
        self._callback = callback
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self.start()

    def start(self) -> None:
        if self._handle is None:
            self._due = self._loop.time() + self._left
            self._handle = self._loop.call_at(self._due, self._callback)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
            self._left = max(0.0, self._due - self._loop.time())


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

    ``supervisor`` keeps its connection; ``events``, ``catalog_listeners``,
    ``state``, ``generation``, ``pid`` and ``connection`` are the supervisor's
    (see :class:`~smith_worker.mcp.supervisor.Supervisor`).
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.alias = config.alias
        self.supervisor = Supervisor(config)
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._tag_prefix = uuid.uuid4().hex[:12] + "-"  # call tags: unique per handle, cheap per call
        self._tag_seq = itertools.count(1)

    # ---- the supervisor's view -------------------------------------------------------

    @property
    def events(self) -> EventRouter:
        """Where lifecycle events and notifications go (append to ``events.listeners`` to get them all)."""
        return self.supervisor.events

    @property
    def catalog_listeners(self) -> list[CatalogListener]:
        """Awaited with every new catalog (after connect and after a ``list_changed`` re-discovery)."""
        return self.supervisor.catalog_listeners

    @property
    def state(self) -> State:
        """Where the server is in its life."""
        return self.supervisor.state

    @property
    def generation(self) -> int:
        """Connection attempts so far."""
        return self.supervisor.generation

    @property
    def pid(self) -> int | None:
        """The pid of the current stdio server process, when known."""
        return self.supervisor.pid

    @property
    def connection(self) -> Connection | None:
        """The live connection, if any."""
        return self.supervisor.connection

    async def close(self) -> None:
        """Stop the server (see :meth:`Supervisor.close`); never raises.

        In-flight requests fail with :class:`TransportError`; the handle can start again afterwards.
        """
        await self.supervisor.close()

    # ---- public operations ---------------------------------------------------

    async def catalog(self, deadline: float | None = None, sink: EventSink | None = None) -> Catalog:
        """The server's catalog, connecting first if needed (by ``deadline``, a monotonic instant).

        Raises :class:`TransportError`, :class:`McpProtocolError` or :class:`SmithTimeoutError`
        when the server cannot be reached or discovered.
        """
        with self.events.attached(sink):
            conn = await self.supervisor.ready(deadline)
        return conn.catalog

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        deadline: float | None = None,
        sink: EventSink | None = None,
        clock: CallClock | None = None,
    ) -> ToolResult:
        """Call MCP tool ``tool`` (its original name) and adapt the result (docs/architecture.md, MCP).

        ``deadline`` (monotonic instant) bounds connect + request; the request
        itself gets at most ``request_timeout`` seconds, not counting the time
        ``clock`` (the call's :class:`CallClock`) stood still. An ``isError`` result is
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
        return tool_result(await self.request(request, deadline, sink, clock))

    async def read_resource(
        self,
        uri: str,
        *,
        deadline: float | None = None,
        sink: EventSink | None = None,
        clock: CallClock | None = None,
    ) -> ToolResult:
        """Read resource ``uri`` as a :class:`ToolResult`. Read-only: retried once after a loss.

        See docs/architecture.md, MCP; ``clock`` as for :meth:`call_tool`.

        Raises like :meth:`call_tool`.
        """

        async def run(conn: Connection, timeout: float) -> Any:
            import mcp_types as types

            request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=uri))
            return await conn.session.send_request(
                request, types.ReadResourceResult, request_read_timeout_seconds=timeout
            )

        request = Request(f"resources/read {uri!r}", run, True)
        return resource_result(await self.request(request, deadline, sink, clock))

    async def get_prompt(
        self,
        name: str,
        arguments: dict[str, str] | None = None,
        *,
        deadline: float | None = None,
        sink: EventSink | None = None,
    ) -> list[Any]:
        """Render prompt ``name`` as Smith messages (docs/architecture.md, MCP). Read-only: retried once after a loss.

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
        return prompt_messages(self.alias, name, result)

    async def ping(self, *, deadline: float | None = None) -> None:
        """One ``ping`` round trip (starts the server if needed)."""
        await self.request(Request("ping", ping, True), deadline, None)

    async def request(
        self,
        request: Request,
        deadline: float | None = None,
        sink: EventSink | None = None,
        clock: CallClock | None = None,
    ) -> Any:
        """Run ``request`` with the pool's rules (see module doc); returns the SDK result. With ``clock`` (a tool
        call's), the request's budget does not run while the call waits for a person (:class:`CallClock`)."""
        attempts = 2 if self.config.reconnect_on_transport_error else 1
        with self.events.attached(sink):
            for attempt in range(1, attempts + 1):
                conn = await self.supervisor.ready(deadline)
                request_deadline = time.monotonic() + self.config.request_timeout
                if deadline is not None:
                    request_deadline = min(request_deadline, deadline)
                try:
                    return await self._attempt(conn, request, request_deadline, clock)
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

    # ---- one request attempt -----------------------------------------------------

    async def _attempt(self, conn: Connection, request: Request, deadline: float, clock: CallClock | None) -> Any:
        budget = round(max(0.0, deadline - time.monotonic()), 3)
        slots = await self._acquire(request, budget)
        conn.inflight += 1
        try:
            if conn.lost.done():
                raise ConnectionLost(conn.lost.result(), maybe_sent=False)
            conn.last_used = time.monotonic()
            return await self._race(conn, request, deadline, budget, clock)
        finally:
            conn.inflight -= 1
            conn.last_used = time.monotonic()
            slots.release()

    async def _acquire(self, request: Request, budget: float) -> asyncio.Semaphore:
        """Take one of the server's ``concurrency`` slots within ``budget`` seconds; returns the semaphore to
        release. Raises :class:`SmithTimeoutError` when none frees up in time."""
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:  # a semaphore serves one event loop
            self._slots, self._slots_loop = asyncio.Semaphore(self.config.concurrency), loop
        slots = self._slots
        if not slots.locked():  # the common path skips the timer
            await slots.acquire()
            return slots
        try:
            async with asyncio.timeout(budget):
                await slots.acquire()
        except TimeoutError:
            raise timeout_error(self.alias, request.operation + " (waiting for a free slot)", budget) from None
        return slots

    async def _race(
        self, conn: Connection, request: Request, deadline: float, budget: float, clock: CallClock | None
    ) -> Any:
        """Run the request in this task against the connection's loss and a backstop timer; map the outcome.

        No task per call: the loss (a done callback on ``conn.lost``) or the
        backstop (``BACKSTOP_GRACE`` s past the SDK's own timeout) cancels this
        task, and that cancellation is turned into :class:`ConnectionLost` or a
        timeout (the SDK then sends ``notifications/cancelled``; the link's
        write side never blocks, so it cannot hold the caller). A cancellation
        from outside (turn cancelled, tool timeout) propagates unchanged.

        With a ``clock`` the roles swap, since the SDK's timer cannot stop while a person is asked: the backstop
        fires at the request's own deadline and stops with the clock; the SDK's timeout is a ceiling past it by
        the waiting time the call has left (and ``BACKSTOP_GRACE``).
        """
        remaining = max(0.001, deadline - time.monotonic())
        guard = _Interrupt(asyncio.current_task())
        conn.lost.add_done_callback(guard.on_lost)
        if clock is None:
            sdk_timeout, backstop = remaining, remaining + BACKSTOP_GRACE
        else:
            sdk_timeout, backstop = remaining + clock.left() + BACKSTOP_GRACE, remaining
        timer = _Timer(backstop, lambda: guard.fire("backstop"))
        try:
            with clock.timing(timer) if clock is not None else contextlib.nullcontext():
                result = await request.run(conn, sdk_timeout)
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
            timer.stop()
            conn.lost.remove_done_callback(guard.on_lost)

    @staticmethod
    def _maybe_sent(conn: Connection, request: Request) -> bool:
        return request.tag is None or request.tag in conn.link.sent

    def _failed(self, conn: Connection, request: Request, exc: Exception, budget: float) -> NoReturn:
        """Map a failed request: :class:`ConnectionLost` (to retry or report) or a typed Smith error."""
        if is_session_gone(self.config.kind, exc):  # the server forgot our session: reconnect; resend what is safe
            self.supervisor.end(conn, SESSION_EXPIRED)
            raise ConnectionLost(conn.lost.result(), self._maybe_sent(conn, request))
        if is_connection_loss(exc):
            self.supervisor.end(conn, "transport error")
            raise ConnectionLost(conn.lost.result(), self._maybe_sent(conn, request))
        error = map_error(self.alias, request.operation, exc, budget)
        if error.kind == "SmithTimeoutError":
            self._count_timeout(conn)
        else:  # an answer, but not proof of a healthy session: the health ping still runs
            conn.timeouts = 0
        raise error from None

    def _count_timeout(self, conn: Connection) -> None:
        conn.timeouts += 1
        if conn.timeouts >= self.config.max_timeouts:
            logger.warning("MCP server %r: %d request timeouts in a row; restarting it", self.alias, conn.timeouts)
            self.supervisor.end(conn, "timeouts")


# ---- results as Smith values (module doc, results) ----------------------------------------


def _dump(model: Any) -> dict[str, Any]:
    if isinstance(model, dict):
        return model
    dumped: dict[str, Any] = model.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


def _blob_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (ValueError, TypeError):
        return len(data)


def placeholder(kind: str, mime: str | None, size: int | None, uri: str | None = None) -> str:
    """``[image omitted: image/png, 1234 bytes]``-style text for content the model cannot take."""
    parts = [p for p in (mime, f"{size} bytes" if size is not None else None, uri) if p]
    return f"[{kind} omitted{': ' + ', '.join(parts) if parts else ''}]"


def resource_text(contents: dict[str, Any]) -> str:
    """One resource content item (text or blob) as text."""
    if "text" in contents:
        return str(contents["text"])
    blob = contents.get("blob", "")
    return placeholder("binary resource", contents.get("mimeType"), _blob_size(blob), contents.get("uri"))


def block_text(block: dict[str, Any]) -> str:
    """One content block of a tool result as text (module doc, results)."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind == "resource":
        return resource_text(block.get("resource") or {})
    if kind == "resource_link":
        return f"[resource link: {block.get('uri')}{' — ' + block['name'] if block.get('name') else ''}]"
    if kind in ("image", "audio"):
        return placeholder(kind, block.get("mimeType"), _blob_size(block.get("data", "")))
    return placeholder(f"{kind or 'unknown'} content", None, None)


def tool_result(result: Any) -> ToolResult:
    """A ``CallToolResult`` as a :class:`ToolResult` (module doc, results)."""
    data = _dump(result)
    texts = [block_text(block) for block in data.get("content") or []]
    structured = data.get("structuredContent")
    text = "\n".join(texts)
    if not texts and structured is not None:
        text = orjson.dumps(structured).decode()
    if data.get("isError"):
        return error_result(text or "the MCP tool reported an error")
    return ToolResult(content=text, structured=structured)


def resource_result(result: Any) -> ToolResult:
    """A ``ReadResourceResult`` as a :class:`ToolResult` (module doc, results)."""
    contents = _dump(result).get("contents") or []
    if len(contents) == 1:
        return ToolResult(content=resource_text(contents[0]))
    return ToolResult(content="\n\n".join(f"uri: {c.get('uri')}\n{resource_text(c)}" for c in contents))


def prompt_messages(alias: str, name: str, result: Any) -> list[UserMessage | AssistantMessage]:
    """A ``GetPromptResult`` as Smith messages. Raises :class:`McpError` on non-text content."""
    messages: list[UserMessage | AssistantMessage] = []
    for item in _dump(result).get("messages") or []:
        content = item.get("content") or {}
        if content.get("type") != "text":
            raise McpError(
                f"MCP server {alias!r}: prompt {name!r} has {content.get('type')!r} content; "
                "only text prompts are supported",
                server=alias,
            )
        cls = AssistantMessage if item.get("role") == "assistant" else UserMessage
        messages.append(cls(content=str(content.get("text", ""))))
    return messages
