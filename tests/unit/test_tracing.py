"""Tracing's two doors (smith_client/tracing.py, smith_worker/ops/tracing.py; docs/architecture.md, Tracing):
off costs nothing and imports nothing; on, the chat span carries message content only when asked, redacted."""

from __future__ import annotations

import subprocess
import sys
import uuid

import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from smith_client.jobs import TurnJob
from smith_client.messages import UserMessage
from smith_client.turns import fingerprint
from smith_worker.llm import LlmClient
from smith_worker.llm.types import LlmClientConfig, LlmRequest
from smith_worker.ops import tracing
from smith_worker.ops.redaction import register_secrets
from smith_worker.testing import Reply, ScriptedLlmServer, scenario_marker


def test_off_nothing_imports_opentelemetry_and_jobs_carry_no_trace():
    code = """
import sys
from smith_client.jobs import TurnJob
from smith_client.messages import UserMessage
from smith_client.tracing import submit_span
from smith_worker.ops import tracing
job = TurnJob(turn_id="t", conversation_id="c", message=UserMessage(content="hi"))
with submit_span(job) as sent:
    assert sent is job and sent.trace is None
assert tracing.setup(False) is False and tracing.span("x") is tracing.NO_SPAN and tracing.inject() is None
assert tracing.trace_id() == "" and tracing.child_env() == {}
assert not [m for m in sys.modules if m.startswith("opentelemetry")], sorted(sys.modules)
"""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": "."}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_the_trace_context_is_not_part_of_a_turns_fingerprint():
    job = TurnJob(turn_id="t", conversation_id="c", message=UserMessage(content="hi"))
    traced = job.model_copy(update={"trace": {"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"}})
    assert fingerprint(job) == fingerprint(traced)


@pytest.fixture
def spans(monkeypatch):
    """Tracing on in this process, exporting to memory (the module's globals, restored after)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for name in ("_tracer", "ENABLED", "_capture", "_otel"):
        monkeypatch.setattr(tracing, name, getattr(tracing, name) if name != "_otel" else {})
    tracing.use_provider(provider)
    yield exporter
    provider.shutdown()


@pytest.fixture(scope="module")
def server():
    with ScriptedLlmServer() as running:
        yield running


@pytest.mark.parametrize("capture", [False, True])
async def test_chat_spans_carry_content_only_when_captured_and_redacted(spans, server, monkeypatch, capture):
    tracing._capture = capture  # restored by the fixture
    secret = f"sk-unit-{uuid.uuid4().hex}"
    register_secrets(secret)
    key = uuid.uuid4().hex[:12]
    server.add_scenario(key, Reply.text("the answer"))
    request = LlmRequest(messages=[UserMessage(content=f"{scenario_marker(key)} my key is {secret}")])
    async with LlmClient(LlmClientConfig(base_url=server.base_url, model="m", request_timeout=5.0)) as client:
        with tracing.span("parent") as parent:
            await client.complete_stream(request, lambda e: None)
    (chat,) = [s for s in spans.get_finished_spans() if s.name == "chat m"]
    assert format(chat.context.trace_id, "032x") == parent.trace_id
    assert chat.attributes["gen_ai.request.model"] == "m" and chat.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    text = repr(dict(chat.attributes))
    assert secret not in text
    if capture:
        assert "my key is <redacted>" in chat.attributes["gen_ai.input.messages"]
        assert "the answer" in chat.attributes["gen_ai.output.messages"]
    else:
        assert "my key" not in text and "the answer" not in text


def test_log_lines_written_under_a_span_carry_its_trace_id(spans):
    import logging

    record = logging.LogRecord("x", logging.INFO, __file__, 1, "turn %s failed", ("t1",), None)
    with tracing.span("s") as span:
        tracing.TraceIdFilter().filter(record)
    assert record.getMessage() == f"turn t1 failed trace_id={span.trace_id}"


def test_captured_content_redacts_secrets_inside_json_encoded_arguments_and_tool_results():
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "login", "arguments": '{"user":"bob","password":"hunter2-SECRETPW"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok":true,"access_token":"tok-abc123XYZ"}'},
        {"role": "user", "content": "[not json"},
    ]  # fmt: skip
    text = tracing.content(messages)
    assert "hunter2-SECRETPW" not in text and "tok-abc123XYZ" not in text
    decoded = orjson.loads(text)
    assert orjson.loads(decoded[0]["tool_calls"][0]["function"]["arguments"]) == {"user": "bob", "password": "<redacted>"}
    assert orjson.loads(decoded[1]["content"]) == {"ok": True, "access_token": "<redacted>"}
    assert decoded[2]["content"] == "[not json"


def test_an_unsampled_spans_trace_id_is_written_nowhere(spans, monkeypatch):
    import logging

    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    def logged() -> str:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "line", (), None)
        tracing.TraceIdFilter().filter(record)
        return record.getMessage()

    ctx = tracing.background_context()  # the pooled MCP connection's placeholder
    assert ctx is not None and ctx.run(logged) == "line" and ctx.run(tracing.trace_id) == ""
    tracing.use_provider(TracerProvider(sampler=ALWAYS_OFF))  # OTEL_TRACES_SAMPLER=always_off
    job = TurnJob(turn_id="t", conversation_id="c", message=UserMessage(content="hi"))
    with tracing.attempt_span(job, 1) as attempt:
        assert attempt.trace_id == "" and tracing.trace_id() == "" and logged() == "line"
