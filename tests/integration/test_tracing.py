"""Tracing end to end (docs/architecture.md, Tracing): real workers with ``SMITH_OTEL=1`` export OTLP/HTTP to an
in-test receiver (smith_worker/testing/otlp.py), this process's client exports there too.

One fleet of its own (two turn workers: the kill -9 test needs a second; one tool worker), serving
``tests.support.tracing_app:app``: an agent with a Python tool, a sub-agent and the example MCP server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
import uuid

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from smith_client import SmithClient
from smith_client.errors import LlmApiError
from smith_worker.local.processes import ManagedProcess
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from smith_worker.testing.otlp import OtlpReceiver, ReceivedSpan
from tests.conftest import LOGS
from tests.integration.test_crash_recovery import worker_pid_running

pytestmark = [pytest.mark.integration]

APP = "tests.support.tracing_app:app"
API_KEY = f"sk-trace-{uuid.uuid4().hex}"
SERVER = 2  # SpanKind SERVER in OTLP's enum


@pytest.fixture(scope="module")
def receiver():
    with OtlpReceiver() as rx:
        yield rx


@pytest.fixture(scope="module")
def client_tracing(receiver):
    """This process's tracer provider (the application's own OpenTelemetry), exporting to the receiver."""
    provider = TracerProvider(resource=Resource.create({"service.name": "test-app"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")))
    trace.set_tracer_provider(provider)  # once per process (the SDK refuses a second)
    yield trace.get_tracer("test-app")
    provider.shutdown()


class TracedFleet:
    def __init__(self, redis_url: str, llm_url: str, endpoint: str) -> None:
        self.redis_url = redis_url
        self.prefix = f"otel{uuid.uuid4().hex[:6]}"
        self.env = worker_env(
            redis_url, self.prefix, llm_url,
            SMITH_OTEL="1", OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100",
            SMITH_LLM_API_KEY=API_KEY,
        )  # fmt: skip
        for name in ("OTEL_SERVICE_NAME", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "OTEL_TRACES_SAMPLER"):
            self.env.pop(name, None)
        self.procs: dict[str, list[ManagedProcess]] = {"turns": [], "tools": []}
        self.starts = 0  # each start's logs under their own name: a restarted worker never truncates a live one's

    async def ensure(self, turns: int = 2, tools: int = 1) -> None:
        for queue, wanted in (("turns", turns), ("tools", tools)):
            self.procs[queue] = [p for p in self.procs[queue] if p.alive()]
            missing = wanted - len(self.procs[queue])
            if missing > 0:
                self.starts += 1
                tag = f"{self.prefix}-{self.starts}"
                self.procs[queue] += start_workers(APP, self.env, [queue] * missing, tag, log_dir=LOGS)
        await wait_for_workers(self.redis_url, self.prefix, turns + tools)

    def stop(self) -> None:
        for proc in self.procs["turns"] + self.procs["tools"]:
            proc.stop()


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm, receiver):
    fleet = TracedFleet(redis_url, scripted_llm.base_url, receiver.endpoint)
    yield fleet
    fleet.stop()


@pytest.fixture
async def traced_client(fleet, client_tracing):
    await fleet.ensure()
    async with SmithClient.from_url(fleet.redis_url, prefix=fleet.prefix) as client:
        yield client


def one(spans: list[ReceivedSpan], name: str, **attributes: object) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and all(s.attributes.get(k) == v for k, v in attributes.items())]
    assert len(found) == 1, (name, attributes, [(s.name, s.attributes) for s in spans])
    return found[0]


async def attempt_span(receiver: OtlpReceiver, trace_id: str, agent: str, attempt: int) -> ReceivedSpan:
    """The ``invoke_agent`` span of attempt ``attempt``, once exported (30 s at most)."""
    async with asyncio.timeout(30):
        while True:
            found = [s for s in receiver.trace(trace_id)
                     if s.name == f"invoke_agent {agent}" and s.attributes.get("smith.turn.attempt") == attempt]
            if found:
                return one(found, f"invoke_agent {agent}")
            await asyncio.sleep(0.05)


async def started_trace_id(client: SmithClient, turn_id: str) -> str:
    async for event in client.turn(turn_id).events(timeout=60):
        if event.type == "turn.started":
            return event.data["trace_id"]
    raise AssertionError("no turn.started")


async def test_one_trace_from_the_client_through_both_workers_a_sub_agent_and_the_mcp_server(
    traced_client, client_tracing, receiver, scenario
):
    _, helper = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]), Reply.text("helped: 5")))
    key, marker = scenario(Script(
        Reply.tool_calls([
            ("add", {"a": 1, "b": 2}),
            ("helper", {"task": f"{helper} add 2 and 3"}),
            ("mcp_example__echo", {"text": "traced echo"}),
        ]),
        Reply.text("all done"),
    ))  # fmt: skip
    secret_prompt = f"{marker} private words {uuid.uuid4().hex}"
    with client_tracing.start_as_current_span("web request") as outer:
        handle = await traced_client.submit(secret_prompt, conversation_id=f"conv-{key}", agent="traced")
        trace_id = format(outer.get_span_context().trace_id, "032x")
    assert (await handle.result(timeout=60)).content == "all done"
    assert await started_trace_id(traced_client, handle.turn_id) == trace_id  # the caller's trace, in turn.started

    spans = receiver.wait_for(trace_id, {
        "web request", "submit_turn traced", "invoke_agent traced", "invoke_agent helper", "chat scripted",
        "execute_tool add", "execute_tool mcp_example__echo", "MCP send tools/call echo", "tools/call echo",
    })  # fmt: skip
    by_id = {s.span_id: s for s in spans}
    web, submit = one(spans, "web request"), one(spans, "submit_turn traced")
    root = one(spans, "invoke_agent traced")
    helper_span = one(spans, "invoke_agent helper")
    root_add = one(spans, "execute_tool add", **{"gen_ai.agent.name": "traced"})
    helper_add = one(spans, "execute_tool add", **{"gen_ai.agent.name": "helper"})
    mcp_tool = one(spans, "execute_tool mcp_example__echo")
    mcp_send = one(spans, "MCP send tools/call echo")
    mcp_server = one(spans, "tools/call echo")
    # correctly parented, across four processes
    assert submit.parent_id == web.span_id and root.parent_id == submit.span_id
    assert helper_span.parent_id == root.span_id and root_add.parent_id == root.span_id
    assert helper_add.parent_id == helper_span.span_id and mcp_tool.parent_id == root.span_id
    assert mcp_send.parent_id == mcp_tool.span_id and mcp_server.parent_id == mcp_send.span_id
    assert mcp_server.kind == SERVER
    assert {s.service for s in (web, submit)} == {"test-app"}
    assert root.resource["smith.worker.queue"] == "turns" and helper_span.resource["smith.worker.queue"] == "turns"
    assert {s.resource["smith.worker.queue"] for s in (root_add, helper_add, mcp_tool, mcp_send)} == {"tools"}
    assert mcp_server.service == "agent-smith-mcp-example"
    assert root.resource["smith.worker.id"] != root_add.resource["smith.worker.id"]
    # the model requests: GenAI attributes, children of the agent that made them
    chats = [s for s in spans if s.name == "chat scripted"]
    assert len(chats) == 4 and {by_id[c.parent_id].name for c in chats} == {"invoke_agent traced", "invoke_agent helper"}
    chat = chats[0]
    assert chat.attributes["gen_ai.operation.name"] == "chat" and chat.attributes["gen_ai.request.model"] == "scripted"
    assert chat.attributes["server.address"] == "127.0.0.1" and chat.attributes["gen_ai.usage.input_tokens"] > 0
    assert {c.attributes["gen_ai.response.finish_reasons"][0] for c in chats} == {"tool_calls", "stop"}
    # the tool worker's span: queue wait and run time apart
    assert root_add.attributes["smith.tool.queue_wait_s"] >= 0 and root_add.attributes["smith.tool.run_s"] >= 0
    # the MCP connection's own requests (handshake, pings) are in no turn's trace
    assert not {"MCP send initialize", "MCP send ping", "MCP send tools/list"} & {s.name for s in spans}
    # ... and the example server records no trace of its own (only spans continuing a caller's: its handshake
    # notifications carry no trace context)
    services: dict[str, set[str]] = {}
    for received in receiver.spans:
        services.setdefault(received.trace_id, set()).add(received.service)
    assert {"agent-smith-mcp-example"} not in services.values(), [
        (s.name, s.trace_id) for s in receiver.spans if services[s.trace_id] == {"agent-smith-mcp-example"}
    ]
    # no message content without OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true
    assert not any("private words" in s.text() or "gen_ai.input.messages" in s.attributes for s in spans)


async def test_a_resumed_attempt_after_kill_9_continues_the_same_trace(traced_client, receiver, scenario):
    gate = threading.Event()
    key, marker = scenario(Script(Reply.text("resumed answer", chunk_size=3, gate=gate)))
    handle = await traced_client.submit(f"{marker} talk", conversation_id=f"conv-{key}", agent="plain")
    pid = await worker_pid_running(traced_client, handle.turn_id)
    trace_id = await started_trace_id(traced_client, handle.turn_id)
    assert len(trace_id) == 32
    os.kill(pid, signal.SIGKILL)
    gate.set()
    assert (await handle.result(timeout=60)).content == "resumed answer"
    spans = receiver.wait_for(trace_id, {"submit_turn plain", "invoke_agent plain", "chat scripted"})
    resumed = one(spans, "invoke_agent plain", **{"smith.turn.attempt": 2})
    assert resumed.parent_id == one(spans, "submit_turn plain").span_id
    assert ("smith.turn.resumed", {"smith.turn.attempt": 2, "smith.turn.resumed_by": "restart"}) in resumed.events
    assert any(by.parent_id == resumed.span_id for by in spans if by.name == "chat scripted")


async def test_a_turn_handed_off_at_sigterm_continues_the_same_trace(traced_client, fleet, receiver, scenario):
    gate = threading.Event()
    key, marker = scenario(Script(Reply.text("handed on", chunk_size=3, gate=gate)))
    handle = await traced_client.submit(f"{marker} talk", conversation_id=f"conv-{key}", agent="plain")
    pid = await worker_pid_running(traced_client, handle.turn_id)
    trace_id = await started_trace_id(traced_client, handle.turn_id)
    os.kill(pid, signal.SIGTERM)
    victim = next(p for p in fleet.procs["turns"] if p.pid == pid)
    await asyncio.to_thread(victim.proc.wait, 30)  # its spans are exported as it stops
    gate.set()
    assert (await handle.result(timeout=60)).content == "handed on"
    first = await attempt_span(receiver, trace_id, "plain", 1)
    resumed = await attempt_span(receiver, trace_id, "plain", 2)
    assert "smith.turn.handed_off" in [name for name, _ in first.events]
    submit = one(receiver.wait_for(trace_id, {"submit_turn plain"}), "submit_turn plain")
    assert resumed.parent_id == first.parent_id == submit.span_id
    assert "smith.turn.resumed" in [name for name, _ in resumed.events]


async def test_a_tools_error_result_marks_its_span_failed(traced_client, receiver, scenario):
    key, marker = scenario(Script(Reply.tool_calls([("refuse", {"reason": "no way"})]), Reply.text("it refused")))
    handle = await traced_client.submit(f"{marker} go", conversation_id=f"conv-{key}", agent="refuser", tenant="acme")
    trace_id = await started_trace_id(traced_client, handle.turn_id)
    assert (await handle.result(timeout=60)).content == "it refused"
    spans = receiver.wait_for(trace_id, {"execute_tool refuse", "invoke_agent refuser"})
    assert one(spans, "invoke_agent refuser").attributes["smith.tenant"] == "acme"  # the turn's tenant
    tool = one(spans, "execute_tool refuse")
    assert tool.attributes["error.type"] == "ToolError" and tool.status_code == 2  # STATUS_CODE_ERROR
    assert tool.status_message == "refused: no way"
    assert ("exception", {"exception.type": "ToolError", "exception.message": "refused: no way"}) in tool.events


async def test_an_api_key_echoed_by_a_model_error_is_in_no_span_and_the_failure_is_typed(
    traced_client, receiver, scenario
):
    def echo_key(request):
        echoed = f"Invalid credentials: {request.headers.get('authorization')}"
        return Reply.error(401, {"error": {"message": echoed, "type": "invalid_request_error"}})

    key, marker = scenario(echo_key)
    handle = await traced_client.submit(f"{marker} hi", conversation_id=f"conv-{key}", agent="plain")
    trace_id = await started_trace_id(traced_client, handle.turn_id)
    with pytest.raises(LlmApiError):
        await handle.result(timeout=60)
    spans = receiver.wait_for(trace_id, {"invoke_agent plain", "chat scripted"})
    for span in (one(spans, "invoke_agent plain"), one(spans, "chat scripted")):
        assert span.attributes["error.type"] == "LlmApiError" and span.status_code == 2  # STATUS_CODE_ERROR
        assert "<redacted>" in span.status_message
    assert not any(API_KEY in s.text() for s in receiver.spans)
    # the worker's log line for the failure carries the turn's trace id
    logs = "".join(p.read_text(errors="replace") for p in LOGS.glob(f"{traced_client.keys.prefix}-*-turns-*.log"))
    assert any(f"turn {handle.turn_id} failed" in line and f"trace_id={trace_id}" in line for line in logs.splitlines())


@pytest.fixture
def hanging_collector():
    """An OTLP endpoint that accepts connections and never answers (a hung collector); yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    held: list[socket.socket] = []
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except TimeoutError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    done.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


async def test_a_workers_stop_is_not_held_by_a_collector_that_never_answers(
    redis_url, scripted_llm, scenario, hanging_collector
):
    prefix = f"otelhang{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_OTEL="1",
                     OTEL_EXPORTER_OTLP_ENDPOINT=hanging_collector, OTEL_BSP_SCHEDULE_DELAY="100")  # fmt: skip
    (worker,) = start_workers(APP, env, ["turns"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, 1)
        key, marker = scenario(Reply.text("traced into the void"))
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            handle = await client.submit(f"{marker} hi", conversation_id=f"conv-{key}", agent="plain")
            assert (await handle.result(timeout=60)).content == "traced into the void"
        started = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(worker.proc.wait, 60)
        elapsed = time.monotonic() - started
    finally:
        worker.stop()
    assert code == 0 and elapsed < 8, (code, elapsed)  # the flush is bounded to 3 s; unbounded, 10 s and more
    log = "".join(p.read_text(errors="replace") for p in LOGS.glob(f"{prefix}-turns-*.log"))
    assert "spans not exported within 3 s at shutdown were dropped" in log
