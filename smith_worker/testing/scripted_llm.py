"""The scripted chat-completions server: an OpenAI-compatible model whose every reply a test writes.

:class:`ScriptedLlmServer` is a real HTTP/1.1 server on ``127.0.0.1`` (a free
port), written on :func:`asyncio.start_server` so a test controls the exact
bytes on the wire: chunk boundaries, delays between chunks, dropped
connections, stalls. It runs its own event loop in a background thread, so it
serves sync tests, async tests (whatever their loop) and other processes:
point worker processes at :attr:`ScriptedLlmServer.base_url`
(``SMITH_LLM_BASE_URL``, see :func:`smith_worker.testing.worker_env`).

Routes: ``POST /v1/chat/completions`` (streamed as server-sent events when
the body has ``"stream": true``, else one JSON completion) and
``GET /v1/models`` (one model, ``"scripted"``). Anything else is a 404 JSON
error.

Scenarios
---------
Many conversations share one server; each request picks its script by a
marker. A chat request belongs to scenario ``KEY`` when its first user
message contains ``[[scenario:KEY]]`` (:func:`scenario_marker`; ``KEY``
matches ``[\\w.-]+``). :meth:`ScriptedLlmServer.add_scenario` registers a
*handler* for a key: a callable ``handler(request: RecordedRequest) -> Reply``.
No marker, or a key without a handler, is answered HTTP 404 with an
OpenAI-style error body; a handler that raises is answered HTTP 500 and its
exception kept in :attr:`ScriptedLlmServer.handler_errors`.

:attr:`RecordedRequest.step` is the number of assistant messages after the
last user message: 0 for the first model call of a turn, 1 after one tool
round, and so on (a user message carrying ``{"tool_results": ...}`` of
json_schema tool calling does not start a turn). :class:`Script` is the usual
handler: one :class:`Reply` per step of a turn, the last one repeating.
:func:`without_native_tools` wraps a handler into a server that refuses
native tool fields with HTTP 400.

Replies
-------
:class:`Reply` class methods build every answer: :meth:`Reply.text` (an
assistant message, optionally with reasoning), :meth:`Reply.tool_calls`
(``(name, arguments)`` pairs), :meth:`Reply.error` (a status code and JSON
error body, e.g. 429 with ``Retry-After``), :meth:`Reply.json` and
:meth:`Reply.raw` (any body, byte for byte), :meth:`Reply.stall`,
:meth:`Reply.silent` and :meth:`Reply.trickle` (a model that never finishes)
and :meth:`Reply.sequence` (one reply per attempt, for retries). ``text`` and
``tool_calls`` stream when the request asks to (a role chunk, content deltas
of ``chunk_size`` characters, a finish chunk, a usage frame when
``stream_options.include_usage`` is set, ``data: [DONE]``) and answer one
``chat.completion`` JSON object otherwise. Delays are in seconds: ``delay``
is slept before every streamed chunk but the first; a ``gate``
(:class:`threading.Event`) holds the second and later chunks until it is set.

Example::

    with ScriptedLlmServer() as server:
        server.add_scenario("weather", Script(
            Reply.tool_calls([("get_weather", {"city": "Paris"})]),   # step 0
            Reply.text("It is sunny."),                                # step 1
        ))
        # a client posting to server.base_url with "[[scenario:weather]] ..."
        # as its first user message gets the tool call, then the text.
        assert server.attempts("weather") == 0

Rate limit
----------
``ScriptedLlmServer(limit=RequestLimit(requests, window))`` enforces a provider's limit, as a sliding window
(seconds): a chat request arriving when ``requests`` were accepted within the last ``window`` is answered
``429`` with ``Retry-After`` (whole seconds until the oldest of them leaves the window, or
``RequestLimit.retry_after`` when set) and never reaches its scenario; :attr:`RecordedRequest.limited` marks it.

Inspection: every request is recorded in :attr:`ScriptedLlmServer.requests`
(headers, decoded JSON body, routed scenario, step, per-scenario ``attempt``
number, whether the client closed early); :meth:`ScriptedLlmServer.attempts`
counts a scenario's requests and :meth:`ScriptedLlmServer.wait_until` polls a
condition on them.

Wire shapes follow https://platform.openai.com/docs/api-reference/chat/streaming:
each SSE frame is written as its own HTTP chunk (``Transfer-Encoding: chunked``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import itertools
import json
import math
import re
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

SCENARIO_MARKER = re.compile(r"\[\[scenario:([\w.-]+)\]\]")
DONE_FRAME = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"
DEFAULT_USAGE = (10, 5)
_MAX_HEAD = 64 * 1024
#: Connections waiting to be accepted (listen(2)'s backlog; the kernel caps it at ``net.core.somaxconn``):
#: thousands of clients connecting at once are queued, not refused or left to retry their SYN (asyncio's
#: default is 100).
BACKLOG = 4096


def scenario_marker(key: str) -> str:
    """The marker to put in the first user message to reach scenario ``key``."""
    return f"[[scenario:{key}]]"


@dataclass
class RecordedRequest:
    """One request as the server received it.

    ``headers`` have lowercase names; ``body`` is the decoded JSON (``None``
    if it was not JSON); ``scenario`` the routed key (``None`` without a
    marker); ``step`` see the module doc; ``attempt`` the 1-based number of
    this request among the requests of its scenario; ``peer`` the client's
    ``(host, port)``: requests with the same peer came on one kept-alive connection. ``completed`` is set
    once the whole reply was written; ``closed_early`` when the client closed
    the connection before the reply finished (cancellation, timeout); ``limited`` when the server's
    :class:`RequestLimit` answered it 429. ``received_at`` is :func:`time.monotonic` (seconds).
    """

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw_body: bytes
    scenario: str | None = None
    step: int = 0
    attempt: int = 0
    peer: tuple[str, int] | None = None
    received_at: float = field(default_factory=time.monotonic)
    completed: bool = False
    closed_early: bool = False
    limited: bool = False

    @property
    def stream(self) -> bool:
        """True when the body asks for a streamed response."""
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    @property
    def include_usage(self) -> bool:
        """True when a streamed request asks for the final usage frame."""
        options = self.body.get("stream_options") if isinstance(self.body, dict) else None
        return isinstance(options, dict) and bool(options.get("include_usage"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The request's ``messages`` (``[]`` when absent)."""
        messages = self.body.get("messages") if isinstance(self.body, dict) else None
        return messages if isinstance(messages, list) else []

    @property
    def model(self) -> str:
        """The request's ``model`` (``"scripted"`` when absent)."""
        model = self.body.get("model") if isinstance(self.body, dict) else None
        return model if isinstance(model, str) else "scripted"


@dataclass(frozen=True)
class WirePlan:
    """What goes on the socket for one reply (produced by :meth:`Reply.render`).

    ``chunks`` are written one by one; ``chunked`` selects
    ``Transfer-Encoding: chunked`` (one HTTP chunk per entry) over
    ``Content-Length``. ``delay`` (seconds) is slept before every chunk but
    the first; ``gate``, when given, must be set before the second and later
    chunks go out. ``close_after`` drops the connection after the chunks
    without ending the body; ``stall`` sends nothing and holds the
    connection until the client gives up; ``trickle`` (seconds), when set,
    sends the SSE head and then a keep-alive comment every ``trickle``
    seconds, forever (a model that never finishes).
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    chunks: tuple[bytes, ...] = ()
    chunked: bool = True
    delay: float = 0.0
    gate: threading.Event | None = None
    close_after: bool = False
    stall: bool = False
    trickle: float = 0.0


class Reply:
    """One scripted HTTP reply, rendered against the request it answers.

    Build with the class methods: :meth:`text`, :meth:`tool_calls`,
    :meth:`raw`, :meth:`json`, :meth:`error`, :meth:`stall`, :meth:`silent`,
    :meth:`trickle`, :meth:`sequence`. ``text`` and ``tool_calls`` stream SSE when the
    request has ``stream: true`` and answer one JSON completion otherwise.
    """

    def __init__(self, render: Callable[[RecordedRequest], WirePlan]) -> None:
        self._render = render

    def render(self, request: RecordedRequest) -> WirePlan:
        """The wire plan answering ``request``."""
        return self._render(request)

    @classmethod
    def text(
        cls,
        text: str,
        chunk_size: int = 3,
        usage: tuple[int, int] | dict[str, int] | None = DEFAULT_USAGE,
        *,
        reasoning: str = "",
        finish_reason: str = "stop",
        delay: float = 0.0,
        gate: threading.Event | None = None,
    ) -> Reply:
        """An assistant text answer.

        Streamed: a role chunk, ``reasoning`` then ``text`` in deltas of
        ``chunk_size`` characters, a finish chunk, a usage-only frame
        (``choices: []``) when the request asks for it, ``[DONE]``.
        ``usage`` is ``(prompt_tokens, completion_tokens)``, an OpenAI usage
        dict, or ``None`` for none. ``finish_reason`` is sent as is (``"length"``
        for a truncated answer). Streamed only: ``delay`` seconds are slept
        before every chunk but the first, and ``gate``, when given, holds the
        second and later chunks until it is set. Not streamed: one
        ``chat.completion`` object whose message has ``content`` (and
        ``reasoning_content`` when ``reasoning`` is given).
        """
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        deltas += [{"reasoning_content": piece} for piece in _pieces(reasoning, chunk_size)]
        deltas += [{"content": piece} for piece in _pieces(text, chunk_size)]
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if reasoning:
            message["reasoning_content"] = reasoning
        return cls._completion(deltas, message, finish_reason, usage, delay, gate)

    @classmethod
    def tool_calls(
        cls,
        calls: Sequence[tuple[str, dict[str, Any]]],
        style: Literal["openai", "llama_cpp"] = "openai",
        split: int = 5,
        *,
        content: str = "",
        ids: Sequence[str] | None = None,
        usage: tuple[int, int] | dict[str, int] | None = DEFAULT_USAGE,
        delay: float = 0.0,
        gate: threading.Event | None = None,
    ) -> Reply:
        """An assistant answer calling tools; ``finish_reason`` is ``"tool_calls"``.

        ``calls`` are ``(name, arguments)`` pairs. Streamed, each call's
        arguments JSON is cut into fragments of ``split`` characters, one per
        chunk. ``style="openai"`` sends id and name only in a call's first
        chunk (with ``arguments: ""``); ``style="llama_cpp"`` repeats the same
        id and name in every chunk, as llama-cpp-python does. ``ids``
        defaults to fresh ``call_<hex>`` ids (one per call: raises ``ValueError``
        when the lengths differ). ``content`` is text sent before the calls;
        ``usage``, ``delay`` (seconds) and ``gate`` as in :meth:`text`.
        """
        call_ids = list(ids) if ids is not None else [f"call_{uuid.uuid4().hex[:12]}" for _ in calls]
        encoded = [
            (call_id, name, json.dumps(args, ensure_ascii=False))
            for call_id, (name, args) in zip(call_ids, calls, strict=True)
        ]
        deltas: list[dict[str, Any]] = [{"role": "assistant", "content": None}]
        deltas += [{"content": piece} for piece in _pieces(content, split)]
        for index, (call_id, name, arguments) in enumerate(encoded):
            deltas += _tool_call_deltas(index, call_id, name, arguments, style, split)
        message = {
            "role": "assistant",
            "content": content or None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                for call_id, name, arguments in encoded
            ],
        }
        return cls._completion(deltas, message, "tool_calls", usage, delay, gate)

    @classmethod
    def raw(
        cls,
        chunks: Sequence[bytes],
        status: int = 200,
        headers: dict[str, str] | None = None,
        delay: float = 0.0,
        close_after: bool = False,
        *,
        gate: threading.Event | None = None,
    ) -> Reply:
        """Exactly these body bytes, one HTTP chunk each (empty entries are skipped).

        ``Content-Type`` defaults to ``text/event-stream``. ``close_after``
        drops the connection after the last chunk without ending the body
        (the client sees an incomplete response).
        """
        plan = WirePlan(
            status=status,
            headers={"content-type": "text/event-stream", **_lower(headers)},
            chunks=tuple(chunks),
            delay=delay,
            gate=gate,
            close_after=close_after,
        )
        return cls(lambda _request: plan)

    @classmethod
    def json(cls, body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Reply:
        """A JSON body with ``Content-Length``."""
        plan = _json_plan(status, body, headers)
        return cls(lambda _request: plan)

    @classmethod
    def error(cls, status: int, body: dict[str, Any] | None = None, headers: dict[str, str] | None = None) -> Reply:
        """An error status with a JSON body (default ``{"error": {"message": ..., "code": status}}``).

        E.g. ``Reply.error(429, headers={"Retry-After": "2"})`` or ``Reply.error(500)``.
        """
        if body is None:
            body = {"error": {"message": f"scripted HTTP {status}", "type": "scripted_error", "code": status}}
        return cls.json(body, status, headers)

    @classmethod
    def stall(cls) -> Reply:
        """Read the request, then never answer (until the client closes or the server stops)."""
        plan = WirePlan(stall=True)
        return cls(lambda _request: plan)

    @classmethod
    def silent(cls) -> Reply:
        """A 200 SSE head, then nothing, ever (a model hung after taking the request)."""
        never = threading.Event()
        plan = WirePlan(headers={"Content-Type": "text/event-stream"}, chunks=(b"", b"data: {}\n\n"), gate=never)
        return cls(lambda _request: plan)

    @classmethod
    def trickle(cls, interval: float = 0.5) -> Reply:
        """A 200 SSE response that never ends: ``: keep-alive`` comments every ``interval`` seconds, no data."""
        plan = WirePlan(headers={"Content-Type": "text/event-stream"}, trickle=interval)
        return cls(lambda _request: plan)

    @classmethod
    def sequence(cls, *replies: Reply) -> Reply:
        """Answer with ``replies`` in turn, one per request rendered; the last one repeats.

        The counter belongs to this object: ``Script(Reply.sequence(Reply.error(500), Reply.text("ok")))``
        fails the first attempt of step 0 and succeeds on the retry.
        """
        if not replies:
            raise ValueError("Reply.sequence needs at least one reply")
        counter = itertools.count()

        def render(request: RecordedRequest) -> WirePlan:
            return replies[min(next(counter), len(replies) - 1)].render(request)

        return cls(render)

    @classmethod
    def _completion(
        cls,
        deltas: list[dict[str, Any]],
        message: dict[str, Any],
        finish_reason: str,
        usage: tuple[int, int] | dict[str, int] | None,
        delay: float,
        gate: threading.Event | None,
    ) -> Reply:
        usage_body = _usage(usage)

        def render(request: RecordedRequest) -> WirePlan:
            if not request.stream:
                return _json_plan(200, _completion_body(request, message, finish_reason, usage_body), None)
            chunks = _stream_chunks(request, deltas, finish_reason, usage_body)
            return WirePlan(headers={"content-type": "text/event-stream"}, chunks=chunks, delay=delay, gate=gate)

        return cls(render)


#: A scenario's handler: the reply for one recorded request (:class:`Script` is one).
Handler = Callable[[RecordedRequest], Reply]


class Script:
    """A handler answering ``replies[min(step, len(replies) - 1)]``: one reply per step of a turn."""

    def __init__(self, *replies: Reply) -> None:
        if not replies:
            raise ValueError("Script needs at least one reply")
        self.replies = replies

    def __call__(self, request: RecordedRequest) -> Reply:
        """The reply for ``request.step``."""
        return self.replies[min(request.step, len(self.replies) - 1)]


NATIVE_TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


def native_tool_fields(request: RecordedRequest) -> list[str]:
    """The native tool-calling parts of ``request``: body fields, ``tool_calls`` and ``role: "tool"`` messages."""
    found = [name for name in NATIVE_TOOL_FIELDS if isinstance(request.body, dict) and name in request.body]
    for position, message in enumerate(request.messages):
        if isinstance(message, dict) and message.get("tool_calls") is not None:
            found.append(f"messages[{position}].tool_calls")
        if isinstance(message, dict) and message.get("role") == "tool":
            found.append(f'messages[{position}].role="tool"')
    return found


def without_native_tools(handler: Handler) -> Handler:
    """``handler`` behind a server without native tool support.

    A request carrying ``tools``/``tool_choice``, an assistant message with
    ``tool_calls`` or a ``role: "tool"`` message is refused with HTTP 400 (as
    a vLLM without a tool parser or an older gateway does); others reach ``handler``.
    """

    def refuse_native(request: RecordedRequest) -> Reply:
        found = native_tool_fields(request)
        if found:
            return Reply.error(
                400, {"error": {"message": f"unsupported: {', '.join(found)}", "type": "invalid_request_error"}}
            )
        return handler(request)

    return refuse_native


@dataclass(frozen=True)
class RequestLimit:
    """A provider's request limit, enforced by the server over a sliding window: at most ``requests`` chat
    requests accepted within any ``window`` seconds; past it a request gets ``429`` with ``Retry-After``:
    ``retry_after`` seconds when set, else the whole seconds until the oldest accepted request leaves the window."""

    requests: int
    window: float = 60.0
    retry_after: float | None = None


class _SlidingWindow:
    """The times (``time.monotonic()``) of the chat requests a :class:`RequestLimit` accepted within its window."""

    def __init__(self, limit: RequestLimit) -> None:
        self.limit = limit
        self._accepted: collections.deque[float] = collections.deque()

    def refusal(self, now: float) -> str | None:
        """None when a request arriving at ``now`` is accepted (and counted), else its ``Retry-After`` value."""
        limit = self.limit
        while self._accepted and self._accepted[0] <= now - limit.window:
            self._accepted.popleft()
        if len(self._accepted) < limit.requests:
            self._accepted.append(now)
            return None
        if limit.retry_after is not None:
            return f"{limit.retry_after:g}"
        return str(max(1, math.ceil(self._accepted[0] + limit.window - now)))


class ScriptedLlmServer:
    """The server (see the module doc). Thread-safe to configure and inspect from any thread.

    ``start()`` returns ``self`` once listening; ``stop()`` closes every
    connection and joins the thread. Also a context manager. ``limit``: a :class:`RequestLimit` to enforce
    (None: none; :attr:`limit` changes it).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, limit: RequestLimit | None = None) -> None:
        self.host = host
        self._window = _SlidingWindow(limit) if limit is not None else None
        self._requested_port = port
        self.port = 0
        self._lock = threading.Lock()
        self._scenarios: dict[str, Handler] = {}
        self._requests: list[RecordedRequest] = []
        self._attempts: dict[str, int] = {}
        #: Exceptions raised by scenario handlers (each also answered with HTTP 500).
        self.handler_errors: list[BaseException] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._startup_error: BaseException | None = None
        self._connections: set[asyncio.Task[None]] = set()

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> ScriptedLlmServer:
        """Start listening in a background thread; returns ``self``.

        Raises ``RuntimeError`` when already started or when the port cannot be bound.
        """
        if self._thread is not None:
            raise RuntimeError("server already started")
        ready = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="scripted-llm", daemon=True)
        self._thread.start()
        ready.wait(10)
        if self._startup_error is not None:
            raise RuntimeError("scripted LLM server failed to start") from self._startup_error
        return self

    def stop(self) -> None:
        """Stop the server, closing every open connection."""
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
        self._thread = None

    def __enter__(self) -> ScriptedLlmServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1`` — the chat-completions base URL (with ``/v1``)."""
        return f"http://{self.host}:{self.port}/v1"

    # -- configuration and inspection ------------------------------------------

    def add_scenario(self, key: str, handler: Handler | Reply) -> None:
        """Route requests marked ``[[scenario:key]]`` to ``handler(request) -> Reply``.

        A bare :class:`Reply` answers every request of the scenario. A key already registered is replaced.
        Raises ``ValueError`` for a key outside ``[\\w.-]+``.
        """
        if not re.fullmatch(r"[\w.-]+", key):
            raise ValueError(f"invalid scenario key {key!r}")
        if isinstance(handler, Reply):
            handler = Script(handler)
        with self._lock:
            self._scenarios[key] = handler

    @property
    def requests(self) -> list[RecordedRequest]:
        """A snapshot of every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def requests_for(self, key: str) -> list[RecordedRequest]:
        """The requests routed to scenario ``key``."""
        return [request for request in self.requests if request.scenario == key]

    def attempts(self, key: str) -> int:
        """How many chat requests scenario ``key`` received."""
        with self._lock:
            return self._attempts.get(key, 0)

    def reset(self) -> None:
        """Forget recorded requests, attempt counts and handler errors (scenarios stay)."""
        with self._lock:
            self._requests.clear()
            self._attempts.clear()
            self.handler_errors.clear()

    @property
    def limit(self) -> RequestLimit | None:
        """The enforced :class:`RequestLimit` (None: none). Setting it starts a new window (nothing counted yet)."""
        with self._lock:
            return self._window.limit if self._window is not None else None

    @limit.setter
    def limit(self, limit: RequestLimit | None) -> None:
        with self._lock:
            self._window = _SlidingWindow(limit) if limit is not None else None

    def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Poll ``predicate`` (blocking this thread) until true or ``timeout`` seconds; returns the last result."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    async def wait_until_async(self, predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
        """Like :meth:`wait_until` without blocking the caller's event loop."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    # -- server thread -------------------------------------------------------

    def _run(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            server = loop.run_until_complete(
                asyncio.start_server(self._serve_connection, self.host, self._requested_port, backlog=BACKLOG)
            )
        except BaseException as exc:  # reported by start()
            self._startup_error = exc
            ready.set()
            loop.close()
            return
        self.port = server.sockets[0].getsockname()[1]
        ready.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            for task in list(self._connections):
                task.cancel()
            loop.run_until_complete(asyncio.gather(*self._connections, return_exceptions=True))
            loop.run_until_complete(server.wait_closed())
            loop.close()

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        connection = _Connection(reader, writer)
        try:
            while await self._serve_one(connection):
                pass
        except (ConnectionError, ValueError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:  # the server stops: the connection closes (asyncio's stream callback
            pass  # would log a cancelled handler as an error while a client still holds the connection)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _serve_one(self, connection: _Connection) -> bool:
        """Read and answer one request; False when the connection must close."""
        request = await connection.read_request()
        if request is None:
            return False
        plan = self._route(request)
        keep_alive = await self._send(connection, request, plan)
        return keep_alive and request.headers.get("connection", "").lower() != "close"

    def _route(self, request: RecordedRequest) -> WirePlan:
        path = request.path.split("?", 1)[0].rstrip("/")
        if request.method == "GET" and path in ("/v1/models", "/models"):
            return _json_plan(
                200, {"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "tests"}]}, None
            )
        if request.method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            return self._route_chat(request)
        return _error_plan(404, f"no route for {request.method} {request.path}", "not_found_error")

    def _route_chat(self, request: RecordedRequest) -> WirePlan:
        request.scenario = _find_scenario(request.messages)
        request.step = _step(request.messages)
        with self._lock:
            if request.scenario is not None:
                request.attempt = self._attempts.get(request.scenario, 0) + 1
                self._attempts[request.scenario] = request.attempt
            self._requests.append(request)
            handler = self._scenarios.get(request.scenario or "")
            retry_after = self._window.refusal(request.received_at) if self._window is not None else None
        if retry_after is not None:
            request.limited = True
            body = {"error": {"message": "rate limit reached", "type": "rate_limit_error", "code": 429}}
            return _json_plan(429, body, {"Retry-After": retry_after})
        if not isinstance(request.body, dict):
            return _error_plan(400, "request body is not a JSON object", "invalid_request_error")
        if handler is None:
            return _error_plan(404, f"unknown scenario {request.scenario!r}", "not_found_error")
        try:
            return handler(request).render(request)
        except Exception as exc:  # surfaced to the client as a 500 and kept for the test
            with self._lock:
                self.handler_errors.append(exc)
            return _error_plan(500, f"scenario handler failed: {exc!r}", "scripted_server_error")

    async def _send(self, connection: _Connection, request: RecordedRequest, plan: WirePlan) -> bool:
        """Write ``plan`` while watching for the client closing; True when the connection stays usable."""
        sender = asyncio.create_task(connection.write_plan(plan))
        watcher = asyncio.create_task(connection.wait_peer_closed())
        try:
            await asyncio.wait({sender, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, watcher):
                if not task.done():
                    task.cancel()
            await asyncio.gather(sender, watcher, return_exceptions=True)
        if sender.cancelled() or sender.exception() is not None:
            request.closed_early = True
            return False
        request.completed = True
        return not plan.close_after


class _Connection:
    """Buffered HTTP/1.1 request reading and reply writing on one socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.buffer = bytearray()
        self.peer: tuple[str, int] | None = writer.get_extra_info("peername")

    async def _fill(self) -> bool:
        try:
            data = await self.reader.read(65536)
        except OSError:
            return False
        self.buffer += data
        return bool(data)

    async def _read_until(self, marker: bytes) -> bytes | None:
        while (end := self.buffer.find(marker)) < 0:
            if len(self.buffer) > _MAX_HEAD:
                raise ValueError("request head too large")
            if not await self._fill():
                return None
        data = bytes(self.buffer[:end])
        del self.buffer[: end + len(marker)]
        return data

    async def _read_exact(self, size: int) -> bytes:
        while len(self.buffer) < size:
            if not await self._fill():
                raise ConnectionError("connection closed inside a request body")
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def _read_chunked(self) -> bytes:
        body = bytearray()
        while True:
            size_line = await self._read_until(b"\r\n")
            if size_line is None:
                raise ConnectionError("connection closed inside a chunked body")
            size = int(size_line.split(b";", 1)[0], 16)
            if size == 0:
                while await self._read_until(b"\r\n"):  # trailers, up to the empty line
                    pass
                return bytes(body)
            body += await self._read_exact(size)
            await self._read_exact(2)

    async def read_request(self) -> RecordedRequest | None:
        """The next request, or ``None`` when the client closed the connection."""
        head = await self._read_until(b"\r\n\r\n")
        if head is None:
            return None
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _version = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raw_body = await self._read_chunked()
        else:
            raw_body = await self._read_exact(int(headers.get("content-length") or 0))
        return RecordedRequest(method, target, headers, _decode_json(raw_body), raw_body, peer=self.peer)

    async def wait_peer_closed(self) -> None:
        """Return when the client closes its side (bytes it sends meanwhile are kept for the next request)."""
        while await self._fill():
            pass

    async def write_plan(self, plan: WirePlan) -> None:
        """Write the status line, headers and body chunks of ``plan``."""
        if plan.stall:
            await asyncio.Event().wait()
        self.writer.write(_head(plan))
        await self.writer.drain()
        while plan.trickle:
            self.writer.write(b"%x\r\n%s\r\n" % (len(KEEP_ALIVE), KEEP_ALIVE))
            await self.writer.drain()
            await asyncio.sleep(plan.trickle)
        for position, chunk in enumerate(plan.chunks):
            if position > 0:
                await _pause(plan)
            if chunk:
                self.writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if plan.chunked else chunk)
                await self.writer.drain()
        if plan.close_after:
            self.writer.transport.abort()
            return
        if plan.chunked:
            self.writer.write(b"0\r\n\r\n")
            await self.writer.drain()


async def _pause(plan: WirePlan) -> None:
    if plan.delay > 0:
        await asyncio.sleep(plan.delay)
    # The gate is a threading.Event set from the test's thread, which an asyncio.Event cannot be.
    while plan.gate is not None and not plan.gate.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.005)


def _head(plan: WirePlan) -> bytes:
    try:
        reason = http.HTTPStatus(plan.status).phrase
    except ValueError:
        reason = "Status"
    headers = dict(plan.headers)
    if plan.chunked:
        headers["transfer-encoding"] = "chunked"
    else:
        headers["content-length"] = str(sum(len(chunk) for chunk in plan.chunks))
    lines = [f"HTTP/1.1 {plan.status} {reason}", *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _json_plan(status: int, body: Any, headers: dict[str, str] | None) -> WirePlan:
    payload = json.dumps(body).encode()
    return WirePlan(
        status=status,
        headers={"content-type": "application/json", **_lower(headers)},
        chunks=(payload,),
        chunked=False,
    )


def _error_plan(status: int, message: str, kind: str) -> WirePlan:
    return _json_plan(status, {"error": {"message": message, "type": kind, "code": status}}, None)


def _lower(headers: dict[str, str] | None) -> dict[str, str]:
    return {name.lower(): value for name, value in (headers or {}).items()}


def _decode_json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _content_text(content: Any) -> str:
    """A message's text: a string, or the ``text`` of each part of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _find_scenario(messages: list[Any]) -> str | None:
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            match = SCENARIO_MARKER.search(_content_text(message.get("content")))
            return match.group(1) if match else None
    return None


def _is_user_turn(message: dict[str, Any]) -> bool:
    """A user message that starts a turn: not one carrying tool results in json_schema tool calling."""
    return message.get("role") == "user" and not _content_text(message.get("content")).startswith('{"tool_results"')


def _step(messages: list[Any]) -> int:
    dicts = [message for message in messages if isinstance(message, dict)]
    roles = [message.get("role") for message in dicts]
    last_user = max((i for i, message in enumerate(dicts) if _is_user_turn(message)), default=-1)
    return sum(1 for role in roles[last_user + 1 :] if role == "assistant")


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tool_call_deltas(
    index: int, call_id: str, name: str, arguments: str, style: str, split: int
) -> list[dict[str, Any]]:
    header = {"index": index, "id": call_id, "type": "function"}
    fragments = _pieces(arguments, split) or [""]
    if style == "llama_cpp":
        return [{"tool_calls": [{**header, "function": {"name": name, "arguments": part}}]} for part in fragments]
    if style != "openai":
        raise ValueError(f"unknown tool-call style {style!r}")
    first = {"tool_calls": [{**header, "function": {"name": name, "arguments": ""}}]}
    rest = [{"tool_calls": [{"index": index, "function": {"arguments": part}}]} for part in fragments]
    return [first, *rest]


def _usage(usage: tuple[int, int] | dict[str, int] | None) -> dict[str, int] | None:
    if usage is None or isinstance(usage, dict):
        return usage
    prompt, completion = usage
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _envelope(request: RecordedRequest, kind: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": kind,
        "created": int(time.time()),
        "model": request.model,
    }


def _completion_body(
    request: RecordedRequest, message: dict[str, Any], finish_reason: str, usage: dict[str, int] | None
) -> dict[str, Any]:
    body = _envelope(request, "chat.completion")
    body["choices"] = [{"index": 0, "message": message, "finish_reason": finish_reason}]
    if usage is not None:
        body["usage"] = usage
    return body


def sse_frame(payload: Any) -> bytes:
    """``data: <json>\\n\\n`` for a JSON payload."""
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def _stream_chunks(
    request: RecordedRequest, deltas: list[dict[str, Any]], finish_reason: str, usage: dict[str, int] | None
) -> tuple[bytes, ...]:
    envelope = _envelope(request, "chat.completion.chunk")
    frames = [{**envelope, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]} for delta in deltas]
    frames.append({**envelope, "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason}]})
    if usage is not None and request.include_usage:
        frames.append({**envelope, "choices": [], "usage": usage})
    return (*(sse_frame(frame) for frame in frames), DONE_FRAME)
