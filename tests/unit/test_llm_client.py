"""LlmClient against the scripted server over real loopback sockets.

See docs/architecture.md, Model requests and HTTP retry policy.

Retry waits are checked through the injected ``sleep`` (which records the
requested delays and returns at once) with ``rng`` fixed at 0.5, so the
jitter is 0.125 s and no test waits on the wall clock for a backoff.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import gc
import logging
import socket
import threading
import time
import uuid
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
from pydantic import ValidationError

from smith_client.errors import ConfigurationError, LlmApiError, ParseError, SmithTimeoutError, TransportError
from smith_client.messages import AssistantMessage, SystemMessage, ToolCall, ToolMessage, UserMessage
from smith_worker.llm import (
    LlmClient,
    LlmClientConfig,
    LlmRequest,
    SamplingParams,
    StreamFinished,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
    ToolSchema,
    parse_retry_after,
)
from smith_worker.llm.wire import to_openai
from smith_worker.testing import Reply, Script, ScriptedLlmServer, scenario_marker, sse_frame

JITTER = 0.125  # rng() = 0.5 times the 0.25 s jitter bound
WEATHER = ToolSchema(
    name="get_weather",
    description="Weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture(scope="module")
def server():
    with ScriptedLlmServer() as running:
        yield running


class Harness:
    """A client wired to the server with recorded sleeps."""

    def __init__(self, server: ScriptedLlmServer) -> None:
        self.server = server
        self.sleeps: list[float] = []

    async def _sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)

    def client(self, base_url: str | None = None, **config: Any) -> LlmClient:
        settings: dict[str, Any] = {"base_url": base_url or self.server.base_url, "model": "test-model", "request_timeout": 5.0}
        settings.update(config)
        return LlmClient(LlmClientConfig(**settings), sleep=self._sleep, rng=lambda: 0.5)

    def scenario(self, handler: Any) -> str:
        key = uuid.uuid4().hex[:12]
        self.server.add_scenario(key, handler)
        return key


@pytest.fixture
def harness(server):
    return Harness(server)


def request_for(key: str, text: str = "hello", **fields: Any) -> LlmRequest:
    return LlmRequest(messages=[SystemMessage(content="be brief"), UserMessage(content=f"{scenario_marker(key)} {text}")], **fields)


async def collect(client: LlmClient, req: LlmRequest) -> tuple[Any, list[Any]]:
    events: list[Any] = []
    response = await client.complete_stream(req, events.append)
    return response, events


async def call(client: LlmClient, req: LlmRequest, stream: bool) -> Any:
    """``complete_stream`` (events dropped) or ``complete``."""
    if stream:
        return await client.complete_stream(req, lambda e: None)
    return await client.complete(req)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- happy paths ----------------------------------------------------------------------


async def test_complete_non_streaming_text(harness):
    key = harness.scenario(Reply.text("Hello there", usage=(7, 3)))
    async with harness.client() as client:
        response = await client.complete(request_for(key))
    assert response.message.content == "Hello there"
    assert response.message.usage is not None and response.message.usage.total == 10
    assert response.finish_reason == "stop"
    (recorded,) = harness.server.requests_for(key)
    assert recorded.body["stream"] is False and "stream_options" not in recorded.body
    assert recorded.headers["content-type"] == "application/json"


async def test_complete_non_streaming_tool_calls_and_reasoning(harness):
    key = harness.scenario(Script(Reply.tool_calls([("get_weather", {"city": "Zürich"})], ids=["call_1"])))
    async with harness.client() as client:
        response = await client.complete(request_for(key, tools=[WEATHER]))
    assert response.message.tool_calls == [ToolCall(id="call_1", name="get_weather", arguments={"city": "Zürich"})]
    assert response.finish_reason == "tool_calls"

    key = harness.scenario(Reply.text("42", reasoning="thinking hard"))
    async with harness.client() as client:
        response = await client.complete(request_for(key))
    assert (response.message.content, response.reasoning_content) == ("42", "thinking hard")


async def test_complete_stream_text(harness):
    key = harness.scenario(Reply.text("Streaming works fine", chunk_size=4, usage=(11, 6)))
    async with harness.client() as client:
        response, events = await collect(client, request_for(key))
    assert "".join(e.text for e in events if isinstance(e, StreamTokenDelta)) == "Streaming works fine"
    assert events[-1] == StreamFinished("stop", response.message.usage)
    assert response.message.usage is not None and response.message.usage.prompt == 11
    assert response.message.content == "Streaming works fine"
    (recorded,) = harness.server.requests_for(key)
    assert recorded.body["stream"] is True
    assert recorded.body["stream_options"] == {"include_usage": True}
    assert recorded.headers["accept"] == "text/event-stream"


async def test_streamed_requests_reuse_one_kept_alive_connection(harness):
    """The body's end after ``[DONE]`` is read, so the connection goes back to the pool (no TCP connect per call)."""
    key = harness.scenario(Reply.text("again and again", chunk_size=4))
    async with harness.client() as client:
        for _ in range(3):
            response, _ = await collect(client, request_for(key))
            assert response.message.content == "again and again"
        assert (await client.complete(request_for(key))).message.content == "again and again"
    peers = {recorded.peer for recorded in harness.server.requests_for(key)}
    assert len(harness.server.requests_for(key)) == 4 and len(peers) == 1 and None not in peers


async def test_stream_without_include_usage(harness):
    key = harness.scenario(Reply.text("x"))
    async with harness.client(include_usage=False) as client:
        response, events = await collect(client, request_for(key))
    assert "stream_options" not in harness.server.requests_for(key)[0].body
    assert response.message.usage is None and events[-1] == StreamFinished("stop", None)


@pytest.mark.parametrize("style", ["openai", "llama_cpp"])
async def test_complete_stream_tool_calls(harness, style):
    calls = [("get_weather", {"city": "São Paulo", "note": 'say "hi"'}), ("get_weather", {"city": "Oslo"})]
    key = harness.scenario(Reply.tool_calls(calls, style=style, split=3, ids=["c_a", "c_b"]))
    async with harness.client() as client:
        response, events = await collect(client, request_for(key, tools=[WEATHER]))
    assert [e for e in events if isinstance(e, StreamToolCallStarted)] == [
        StreamToolCallStarted("c_a", "get_weather", 0),
        StreamToolCallStarted("c_b", "get_weather", 1),
    ]
    completed = [e for e in events if isinstance(e, StreamToolCallCompleted)]
    assert [(e.index, e.arguments) for e in completed] == [(0, calls[0][1]), (1, calls[1][1])]
    assert isinstance(events[-1], StreamFinished) and events[-1].finish_reason == "tool_calls"
    assert [(c.id, c.name, c.arguments) for c in response.message.tool_calls] == [
        ("c_a", "get_weather", calls[0][1]),
        ("c_b", "get_weather", calls[1][1]),
    ]


async def test_stream_request_answered_with_plain_json_is_replayed_as_events(harness):
    body = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "hi",
                    "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    key = harness.scenario(Reply.json(body))
    async with harness.client() as client:
        response, events = await collect(client, request_for(key))
    assert events == [
        StreamTokenDelta("hi"),
        StreamToolCallStarted("c9", "f", 0),
        StreamToolCallCompleted(0, {}, "c9", "f"),
        StreamFinished("tool_calls", None),
    ]
    assert response.message.tool_calls[0].id == "c9"


async def test_async_on_event_is_awaited(harness):
    key = harness.scenario(Reply.text("abc", chunk_size=1))
    seen: list[str] = []

    async def on_event(event):
        await asyncio.sleep(0)
        if isinstance(event, StreamTokenDelta):
            seen.append(event.text)

    async with harness.client() as client:
        await client.complete_stream(request_for(key), on_event)
    assert seen == ["a", "b", "c"]


async def test_events_are_delivered_while_the_response_is_arriving(harness):
    """The server holds the rest of the stream until the client has seen the first token."""
    gate = threading.Event()
    chunks = [
        sse_frame({"choices": [{"index": 0, "delta": {"content": "first "}}]}),
        sse_frame({"choices": [{"index": 0, "delta": {"content": "second"}, "finish_reason": "stop"}]}),
        b"data: [DONE]\n\n",
    ]
    key = harness.scenario(Reply.raw(chunks, gate=gate))
    still_streaming: list[bool] = []

    def on_event(event):
        if isinstance(event, StreamTokenDelta) and not gate.is_set():
            still_streaming.append(not harness.server.requests_for(key)[0].completed)
            gate.set()

    async with harness.client(request_timeout=3.0) as client:
        response = await client.complete_stream(request_for(key), on_event)
    assert still_streaming == [True]
    assert response.message.content == "first second"


async def test_first_event_arrives_long_before_a_delayed_chunk(harness):
    loop = asyncio.get_running_loop()
    key = harness.scenario(Reply.text("ab", chunk_size=1, delay=0.25))
    times: list[float] = []
    async with harness.client() as client:
        await client.complete_stream(
            request_for(key), lambda e: times.append(loop.time()) if isinstance(e, StreamTokenDelta) else None
        )
    end = loop.time()
    assert len(times) == 2 and end - times[0] >= 0.4


# -- request body -------------------------------------------------------


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what is submitted to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.submitted = 0

    def submit(self, *args: Any, **kwargs: Any) -> Any:
        self.submitted += 1
        return super().submit(*args, **kwargs)


async def test_requests_use_no_thread_without_a_proxy_in_the_environment(harness, monkeypatch):
    """aiohttp's ``trust_env`` looks up the proxy and ~/.netrc in a thread per request; without a proxy
    named in the environment the session does without it, so a model call hops to no thread."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "example.com")  # names no proxy
    executor = CountingExecutor()
    loop = asyncio.get_running_loop()
    loop.set_default_executor(executor)
    try:
        key = harness.scenario(Reply.text("no threads"))
        async with harness.client() as client:
            for stream in (False, True):
                assert (await call(client, request_for(key), stream)).message.content == "no threads"
    finally:  # the loop is the session's: later tests' asyncio.to_thread must not share one thread
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(thread_name_prefix="asyncio"))
        executor.shutdown(wait=False)
    assert executor.submitted == 0


async def forward_proxy(upstream_port: int, seen: list[str]) -> tuple[asyncio.Server, int]:
    """An HTTP forward proxy for one upstream: records each request line, sends it on in origin form."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
        writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, rest = head.split(b" ", 2)
        seen.append(f"{method.decode()} {target.decode()}")
        origin_form = b"/" + target.split(b"/", 3)[3]  # http://host/path -> /path
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
        up_writer.write(b" ".join((method, origin_form, rest)))
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_proxy_named_in_the_environment_is_used(harness, monkeypatch):
    """As with httpx's own transport, ``HTTP_PROXY`` carries the model calls (read when the client is made)."""
    seen: list[str] = []
    server, port = await forward_proxy(harness.server.port, seen)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    key = harness.scenario(Reply.text("via the proxy"))
    async with server, harness.client(base_url="http://model.invalid/v1") as client:  # resolves only at the proxy
        response = await client.complete(request_for(key))
    assert response.message.content == "via the proxy"
    assert seen == ["POST http://model.invalid/v1/chat/completions"]


async def test_request_body_merge_rules(harness):
    key = harness.scenario(Reply.text("ok"))
    defaults = SamplingParams(temperature=0.2, top_p=0.9, stop=["</s>"], extra={"seed": 1, "top_k": 5})
    override = SamplingParams(temperature=0.7, max_tokens=64, response_format={"type": "json_object"}, extra={"top_k": 40})
    history = [
        UserMessage(content=f"{scenario_marker(key)} weather?"),
        AssistantMessage(tool_calls=[ToolCall(id="c1", name="get_weather", arguments={"city": "Rome"})]),
        ToolMessage(tool_call_id="c1", name="get_weather", content="sunny", is_error=False),
    ]
    req = LlmRequest(messages=history, tools=[WEATHER], sampling=override, tool_choice="required")
    async with harness.client(default_sampling=defaults) as client:
        await client.complete(req)
    body = harness.server.requests_for(key)[0].body
    assert "is_error" not in str(body["messages"])
    assert body == {
        "model": "test-model",
        "messages": [to_openai(message) for message in history],
        "tools": [WEATHER.to_openai()],
        "tool_choice": "required",
        "temperature": 0.7,
        "top_p": 0.9,
        "max_tokens": 64,
        "response_format": {"type": "json_object"},
        "stop": ["</s>"],
        "stream": False,
        "seed": 1,
        "top_k": 40,
    }
    assert harness.server.requests_for(key)[0].step == 1


def test_tools_and_tool_choice_omitted_without_tools(harness):
    client = harness.client()
    body = client.build_body(request_for("k", tool_choice="auto"), stream=True)
    assert "tools" not in body and "tool_choice" not in body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert not {"temperature", "top_p", "max_tokens", "stop", "response_format"} & body.keys()
    forced = {"type": "function", "function": {"name": "get_weather"}}
    body = client.build_body(request_for("k", tools=[WEATHER], tool_choice=forced), stream=False)
    assert body["tool_choice"] == forced
    assert "tool_choice" not in client.build_body(request_for("k", tools=[WEATHER]), stream=False)


def test_extra_may_override_non_reserved_first_class_fields(harness):
    body = harness.client().build_body(
        request_for("k", sampling=SamplingParams(temperature=0.1, extra={"temperature": 0.3, "stream_options": None})),
        stream=True,
    )
    assert body["temperature"] == 0.3 and body["stream_options"] is None


def test_invalid_tool_choice_object_is_rejected():
    with pytest.raises(ValueError):
        request_for("k", tool_choice={"type": "function"})


@pytest.mark.parametrize("reserved", ["model", "messages", "tools", "tool_choice", "stream"])
@pytest.mark.parametrize("where", ["request", "default"])
async def test_reserved_keys_in_extra_are_a_configuration_error(harness, reserved, where):
    key = harness.scenario(Reply.text("never"))
    sampling = SamplingParams(extra={reserved: "x"})
    config = {"default_sampling": sampling} if where == "default" else {}
    req = request_for(key, sampling=sampling if where == "request" else None)
    async with harness.client(**config) as client:
        with pytest.raises(ConfigurationError) as info:
            await client.complete(req)
        with pytest.raises(ConfigurationError):
            await client.complete_stream(req, lambda e: None)
    assert reserved in info.value.message and info.value.setting == "sampling.extra"
    assert harness.server.attempts(key) == 0


async def test_authorization_header_only_with_a_key(harness):
    key = harness.scenario(Reply.text("ok"))
    async with harness.client(api_key="sk-test-123") as client:
        await client.complete(request_for(key))
    async with harness.client() as client:
        await client.complete_stream(request_for(key), lambda e: None)
    with_key, without_key = harness.server.requests_for(key)
    assert with_key.headers["authorization"] == "Bearer sk-test-123"
    assert "authorization" not in without_key.headers


async def test_wire_logs_are_redacted(harness, caplog):
    key = harness.scenario(Reply.text("ok"))
    caplog.set_level(logging.DEBUG, logger="agent_smith.llm")
    async with harness.client(api_key="sk-very-secret") as client:
        await client.complete(request_for(key, "my password is hunter2"))
        await client.complete_stream(request_for(key), lambda e: None)
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "POST " in text and "sse frame" in text
    assert "sk-very-secret" not in text
    assert "<redacted>" in text


# -- retry table --------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_connection_refused_is_retried_with_backoff_then_transport_error(harness, stream):
    port = closed_port()
    async with harness.client(base_url=f"http://127.0.0.1:{port}/v1") as client:
        with pytest.raises(TransportError) as info:
            if stream:
                await client.complete_stream(request_for("k"), lambda e: None)
            else:
                await client.complete(request_for("k"))
    assert harness.sleeps == [0.5 + JITTER, 1.0 + JITTER, 2.0 + JITTER]
    assert info.value.operation == "chat_completions"
    assert info.value.endpoint_or_server == f"http://127.0.0.1:{port}/v1/chat/completions"
    # the aiohttp error itself, not the ConnectTimeout httpx-aiohttp raises in its place
    assert isinstance(info.value.__cause__, aiohttp.ClientConnectorError)
    assert isinstance(info.value.__cause__.os_error, ConnectionRefusedError)


@pytest.mark.parametrize("stream", [False, True])
async def test_stalled_server_times_out_and_is_retried(harness, stream):
    key = harness.scenario(Reply.stall())
    async with harness.client(request_timeout=0.3, max_retries=1, response_timeout=30.0) as client:
        with pytest.raises(SmithTimeoutError) as info:
            await call(client, request_for(key), stream)
    # the retry (sleeps are not waited here) ends with the silence budget: 2 x request_timeout
    assert (info.value.operation, info.value.budget) == ("chat_completions", 0.6)
    assert "no data within 0.6 s" in info.value.message
    assert harness.server.attempts(key) == 2
    assert harness.sleeps == [0.5 + JITTER]
    assert await harness.server.wait_until_async(lambda: all(r.closed_early for r in harness.server.requests_for(key)))


@pytest.mark.parametrize("stream", [False, True])
async def test_the_last_timeout_of_a_call_says_its_real_cost(harness, stream):
    """Retries within the silence budget: the timeout that ends them names the attempts, not one budget."""
    key = harness.scenario(Reply.sequence(Reply.error(503), Reply.stall()))
    async with harness.client(request_timeout=0.3, max_retries=1) as client:
        with pytest.raises(SmithTimeoutError) as info:
            await call(client, request_for(key), stream)
    assert (info.value.operation, info.value.budget) == ("chat_completions", 0.3)
    assert "(after 2 attempts in " in info.value.message
    assert harness.server.attempts(key) == 2


@pytest.mark.parametrize("reply", [Reply.stall, Reply.silent], ids=["no-head", "head-then-nothing"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_silent_model_ends_within_the_silence_budget_whatever_the_retries(harness, stream, reply):
    """max_retries=10 and response_timeout=100 s would allow 11 silent attempts; 2 x request_timeout ends them."""
    key = harness.scenario(reply())
    started = time.monotonic()
    async with harness.client(request_timeout=0.3, max_retries=10, response_timeout=100.0) as client:
        with pytest.raises(SmithTimeoutError) as info:
            await call(client, request_for(key), stream)
    assert (info.value.operation, info.value.budget) == ("chat_completions", 0.6)
    assert time.monotonic() - started < 5 * 0.6
    assert harness.server.attempts(key) <= 3  # the retries fit in the budget, not 11 of them


def test_the_default_model_timeouts_bound_a_silent_call_by_twice_the_read_timeout():
    defaults = LlmClientConfig(base_url="http://127.0.0.1:1/v1", model="m")
    assert (defaults.request_timeout, defaults.response_timeout, defaults.max_retries) == (60.0, 300.0, 3)
    assert defaults.silence_budget == 2 * defaults.request_timeout == 120.0
    # retries and a longer response_timeout cannot stretch it: the budget is derived, not set
    lavish = LlmClientConfig(base_url="http://127.0.0.1:1/v1", model="m", request_timeout=5.0, max_retries=50,
                             response_timeout=10_000.0)
    assert lavish.silence_budget == 10.0
    with pytest.raises(ValidationError):
        LlmClientConfig(base_url="http://127.0.0.1:1/v1", model="m", silence_budget=500.0)


async def test_keep_alive_comments_do_not_reset_the_idle_timeout(harness):
    """A stream sending only comments is idle: request_timeout fires though bytes keep arriving."""
    key = harness.scenario(Reply.trickle(0.05))
    started = time.monotonic()
    async with harness.client(request_timeout=0.5, response_timeout=30.0) as client:
        with pytest.raises(SmithTimeoutError) as info:
            await client.complete_stream(request_for(key), lambda e: None)
    assert (info.value.operation, info.value.budget) == ("chat_completions", 0.5)
    assert time.monotonic() - started < 5.0
    assert harness.server.attempts(key) == 1  # bytes arrived: not retried


async def test_data_frames_reset_the_idle_timeout(harness):
    """Tokens 0.3 s apart with request_timeout 0.5 s: a 1.5 s stream completes."""
    key = harness.scenario(Reply.text("a b c d e", chunk_size=2, delay=0.3))
    async with harness.client(request_timeout=0.5, response_timeout=30.0) as client:
        response, _events = await collect(client, request_for(key))
    assert response.message.content == "a b c d e"


@pytest.mark.parametrize("stream", [False, True])
async def test_response_timeout_bounds_the_whole_response_and_is_not_retried(harness, stream):
    """A server trickling keep-alives (or stalling) past response_timeout: SmithTimeoutError llm.response, once."""
    key = harness.scenario(Reply.trickle(0.05) if stream else Reply.stall())
    started = time.monotonic()
    async with harness.client(request_timeout=60.0, response_timeout=0.6) as client:
        with pytest.raises(SmithTimeoutError) as info:
            await call(client, request_for(key), stream)
    assert (info.value.operation, info.value.budget) == ("llm.response", 0.6)
    assert time.monotonic() - started < 5.0
    assert harness.server.attempts(key) == 1
    assert await harness.server.wait_until_async(lambda: all(r.closed_early for r in harness.server.requests_for(key)))


@pytest.mark.parametrize("stream", [False, True])
async def test_5xx_then_success(harness, stream):
    key = harness.scenario(Reply.sequence(Reply.error(500), Reply.error(503), Reply.text("recovered")))
    async with harness.client() as client:
        if stream:
            response, _ = await collect(client, request_for(key))
        else:
            response = await client.complete(request_for(key))
    assert response.message.content == "recovered"
    assert harness.server.attempts(key) == 3
    assert harness.sleeps == [0.5 + JITTER, 1.0 + JITTER]


async def test_5xx_exhausted_raises_the_last_api_error(harness):
    key = harness.scenario(Reply.error(502, {"error": {"message": "bad gateway upstream"}}))
    async with harness.client(max_retries=2) as client:
        with pytest.raises(LlmApiError) as info:
            await client.complete(request_for(key))
    assert info.value.http_status == 502 and "bad gateway upstream" in info.value.message
    assert "bad gateway upstream" in info.value.body_excerpt
    assert harness.server.attempts(key) == 3 and len(harness.sleeps) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_429_with_retry_after_seconds(harness, stream):
    key = harness.scenario(Reply.sequence(Reply.error(429, headers={"Retry-After": "2"}), Reply.text("ok")))
    async with harness.client() as client:
        if stream:
            response, _ = await collect(client, request_for(key))
        else:
            response = await client.complete(request_for(key))
    assert response.message.content == "ok"
    assert harness.sleeps == [2.0]


async def test_429_with_retry_after_http_date(harness):
    when = email.utils.formatdate(time.time() + 3, usegmt=True)
    key = harness.scenario(Reply.sequence(Reply.error(429, headers={"Retry-After": when}), Reply.text("ok")))
    async with harness.client() as client:
        response = await client.complete(request_for(key))
    assert response.message.content == "ok"
    (delay,) = harness.sleeps
    assert 1.0 <= delay <= 3.0


async def test_retry_after_longer_than_the_maximum_fails_at_once(harness):
    key = harness.scenario(Reply.sequence(Reply.error(429, headers={"Retry-After": "120"}), Reply.text("ok")))
    async with harness.client(max_retry_after=60.0) as client:
        with pytest.raises(LlmApiError) as info:
            await client.complete(request_for(key))
    assert info.value.http_status == 429
    assert harness.sleeps == [] and harness.server.attempts(key) == 1


async def test_429_without_retry_after_uses_backoff(harness):
    key = harness.scenario(Reply.sequence(Reply.error(429), Reply.error(429), Reply.text("ok")))
    async with harness.client(backoff_base=1.0) as client:
        await client.complete(request_for(key))
    assert harness.sleeps == [1.0 + JITTER, 2.0 + JITTER]


def test_backoff_is_capped_at_8_seconds(harness):
    client = harness.client(backoff_base=3.0)
    assert [client.backoff_delay(n) for n in (1, 2, 3, 4)] == [3.0 + JITTER, 6.0 + JITTER, 8.0, 8.0]


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_other_4xx_are_not_retried(harness, status):
    key = harness.scenario(Reply.error(status, {"error": {"message": "nope"}}))
    async with harness.client() as client:
        with pytest.raises(LlmApiError) as info:
            await client.complete_stream(request_for(key), lambda e: None)
    assert info.value.http_status == status and harness.sleeps == []


async def test_unknown_scenario_is_a_404(harness):
    async with harness.client() as client:
        with pytest.raises(LlmApiError) as info:
            await client.complete(request_for("no-such-scenario"))
    assert info.value.http_status == 404 and "unknown scenario" in info.value.message


async def test_stream_dropped_after_bytes_is_not_retried(harness):
    token = sse_frame({"choices": [{"index": 0, "delta": {"content": "partial"}, "finish_reason": None}]})
    key = harness.scenario(Reply.sequence(Reply.raw([token], close_after=True), Reply.text("second try")))
    events: list[Any] = []
    async with harness.client() as client:
        with pytest.raises(TransportError):
            await client.complete_stream(request_for(key), events.append)
    assert events == [StreamTokenDelta("partial")]
    assert harness.server.attempts(key) == 1 and harness.sleeps == []


async def test_stream_dropped_before_any_byte_is_retried(harness):
    key = harness.scenario(Reply.sequence(Reply.raw([], close_after=True), Reply.text("second try")))
    async with harness.client() as client:
        response, _ = await collect(client, request_for(key))
    assert response.message.content == "second try"
    assert harness.server.attempts(key) == 2 and harness.sleeps == [0.5 + JITTER]


async def hang_up_server() -> tuple[asyncio.Server, int]:
    """A TCP server that reads the request and closes the connection without an answer."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("stream", [False, True])
async def test_server_hanging_up_is_a_transport_error_not_a_timeout(harness, stream):
    """httpx-aiohttp maps aiohttp's ServerDisconnectedError to httpx.ConnectTimeout; it stays a transport error."""
    server, port = await hang_up_server()
    async with server, harness.client(base_url=f"http://127.0.0.1:{port}/v1") as client:
        with pytest.raises(TransportError) as info:
            if stream:
                await client.complete_stream(request_for("k"), lambda e: None)
            else:
                await client.complete(request_for("k"))
    assert isinstance(info.value.__cause__, aiohttp.ServerDisconnectedError)
    assert harness.sleeps == [0.5 + JITTER, 1.0 + JITTER, 2.0 + JITTER]


async def test_stream_cut_before_finish_reason_is_a_parse_error(harness):
    token = sse_frame({"choices": [{"index": 0, "delta": {"content": "half"}}]})
    key = harness.scenario(Reply.raw([token]))
    async with harness.client() as client:
        with pytest.raises(ParseError):
            await client.complete_stream(request_for(key), lambda e: None)
    assert harness.server.attempts(key) == 1


async def test_invalid_json_in_stream_is_a_parse_error_without_retry(harness):
    key = harness.scenario(Reply.raw([b'data: {"choices": [{"delta": {"content": "hi"}}\n\n']))
    async with harness.client() as client:
        with pytest.raises(ParseError) as info:
            await client.complete_stream(request_for(key), lambda e: None)
    assert info.value.offset == 0 and harness.server.attempts(key) == 1


async def test_error_frame_in_a_200_stream(harness):
    chunks = [
        sse_frame({"choices": [{"index": 0, "delta": {"content": "a"}}]}),
        sse_frame({"error": {"message": "context length exceeded"}}),
    ]
    key = harness.scenario(Reply.raw(chunks))
    async with harness.client() as client:
        with pytest.raises(LlmApiError) as info:
            await client.complete_stream(request_for(key), lambda e: None)
    assert info.value.http_status == 200 and "context length exceeded" in info.value.body_excerpt
    assert harness.server.attempts(key) == 1


async def test_non_streaming_bad_json_and_error_body(harness):
    key = harness.scenario(Reply.raw([b"{not json"], headers={"Content-Type": "application/json"}))
    async with harness.client() as client:
        with pytest.raises(ParseError):
            await client.complete(request_for(key))
    key = harness.scenario(Reply.json({"error": {"message": "quota"}}))
    async with harness.client() as client:
        with pytest.raises(LlmApiError) as info:
            await client.complete(request_for(key))
    assert info.value.http_status == 200
    key = harness.scenario(Reply.json({"choices": []}))
    async with harness.client() as client:
        with pytest.raises(ParseError):
            await client.complete(request_for(key))


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("5", 5.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("soon", None),
        ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),
        ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),
    ],
)
def test_parse_retry_after(value, expected):
    now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
    assert parse_retry_after(value, now=lambda: now) == expected


# -- cancellation and lifecycle ------------------------------------------------------


async def test_cancelling_a_stream_closes_the_connection(harness):
    first = sse_frame({"choices": [{"index": 0, "delta": {"content": "one"}}]})
    later = sse_frame({"choices": [{"index": 0, "delta": {"content": "two"}, "finish_reason": "stop"}]})
    key = harness.scenario(Reply.raw([first, later, b"data: [DONE]\n\n"], delay=30.0))
    got_first = asyncio.Event()
    async with harness.client() as client:
        task = asyncio.create_task(client.complete_stream(request_for(key), lambda e: got_first.set()))
        await asyncio.wait_for(got_first.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    (recorded,) = harness.server.requests_for(key)
    assert await harness.server.wait_until_async(lambda: recorded.closed_early)
    assert not recorded.completed


async def test_cancelling_a_waiting_complete_closes_the_connection(harness):
    key = harness.scenario(Reply.stall())
    async with harness.client() as client:
        task = asyncio.create_task(client.complete(request_for(key)))
        assert await harness.server.wait_until_async(lambda: harness.server.attempts(key) == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert await harness.server.wait_until_async(lambda: harness.server.requests_for(key)[0].closed_early)


async def test_shared_http_client_is_not_closed(harness):
    key = harness.scenario(Reply.text("ok"))
    async with httpx.AsyncClient() as http:
        client = LlmClient(LlmClientConfig(base_url=harness.server.base_url + "/", model="m"), http)
        await client.aclose()
        assert not http.is_closed
        assert (await client.complete(request_for(key))).message.content == "ok"


# -- the scripted server itself ------------------------------------------------------


def test_scripted_server_models_route_steps_and_404(server):
    with httpx.Client(base_url=server.base_url) as http:
        assert http.get("/models").json()["data"][0]["id"] == "scripted"
        assert http.get("/nothing").status_code == 404
        key = uuid.uuid4().hex[:8]
        server.add_scenario(key, Script(Reply.text("step zero"), Reply.text("step one")))
        marker = scenario_marker(key)
        first = [{"role": "user", "content": f"{marker} hi"}]
        second = [*first, {"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "x"}]
        assert http.post("/chat/completions", json={"messages": first}).json()["choices"][0]["message"]["content"] == "step zero"
        assert http.post("/chat/completions", json={"messages": second}).json()["choices"][0]["message"]["content"] == "step one"
    assert [(r.step, r.attempt) for r in server.requests_for(key)] == [(0, 1), (1, 2)]
    assert server.attempts(key) == 2


def test_scripted_server_reports_handler_errors_as_500(server):
    key = uuid.uuid4().hex[:8]

    def broken(request):
        raise RuntimeError("handler bug")

    server.add_scenario(key, broken)
    with httpx.Client(base_url=server.base_url) as http:
        reply = http.post("/chat/completions", json={"messages": [{"role": "user", "content": scenario_marker(key)}]})
    assert reply.status_code == 500 and "handler bug" in reply.text
    assert any("handler bug" in str(exc) for exc in server.handler_errors)


# -- memory ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_an_encoded_request_is_the_body_sent_and_answers_as_the_request_would(harness, stream):
    key = harness.scenario(Reply.text("encoded"))
    async with harness.client() as client:
        encoded = client.encode(request_for(key, tools=[WEATHER]), stream=stream)
        assert encoded.body == orjson.dumps(client.build_body(request_for(key, tools=[WEATHER]), stream=stream))
        assert (await call(client, encoded, stream)).message.content == "encoded"
        assert harness.server.requests_for(key)[-1].raw_body == encoded.body
        with pytest.raises(ValueError, match="encoded with stream="):
            await call(client, client.encode(request_for(key), stream=not stream), stream)


@pytest.mark.parametrize("stream", [True, False])
async def test_a_finished_request_leaves_no_reference_cycle_holding_its_body(harness, stream):
    """httpx keeps a closed response in a cycle with its stream; the client breaks it, so the request and
    its body (the whole prompt) are freed by refcounting, not at the cyclic collector's next run."""
    key = harness.scenario(Reply.text("freed"))
    async with harness.client() as client:
        await call(client, request_for(key), stream)  # the connection and the pool exist before the count
        gc.collect()
        gc.disable()
        try:
            await call(client, request_for(key, "x" * 100_000), stream)
            gc.set_debug(gc.DEBUG_SAVEALL)
            gc.collect()
            cyclic = [o for o in gc.garbage if isinstance(o, httpx.Request | httpx.Response | httpx.ByteStream)]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert cyclic == []
