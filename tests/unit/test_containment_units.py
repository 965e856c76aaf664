"""Containment units: secret registry and log filter, base-URL userinfo sent as Authorization,
``max_response_bytes`` on a real loopback server, the abort set's TTL and the hygiene report."""

from __future__ import annotations

import base64
import logging
import uuid

import fakeredis
import pytest
from redis.asyncio import Redis

from smith_client.errors import LlmApiError, ParseError
from smith_client.hygiene import keys_without_ttl
from smith_client.keys import ABORT_ENTRY_TTL, Keys
from smith_client.messages import UserMessage
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.llm import LlmClient, LlmClientConfig, LlmRequest
from smith_worker.ops.redaction import (
    REDACTED,
    RedactingFilter,
    redact_error,
    redact_text,
    register_secrets,
    registered_secrets,
    url_credentials,
)
from smith_worker.runtime import WorkerRuntime
from smith_worker.testing import Reply, ScriptedLlmServer, scenario_marker, sse_frame
from smith_worker.tools.waiter import abort_job
from smith_worker.turn.role import TurnRole


@pytest.fixture(scope="module")
def server():
    with ScriptedLlmServer() as running:
        yield running


def request_for(server: ScriptedLlmServer, reply: Reply) -> LlmRequest:
    key = uuid.uuid4().hex[:12]
    server.add_scenario(key, reply)
    return LlmRequest(messages=[UserMessage(content=f"{scenario_marker(key)} hi")])


def test_registered_secrets_and_credential_patterns_are_redacted():
    secret = f"s3cret-{uuid.uuid4().hex}"
    register_secrets(secret, "abc", None)  # too short and None are ignored
    assert secret in registered_secrets() and "abc" not in registered_secrets()
    text = f"key {secret}; Authorization: Bearer tok-123456789; Basic dXNlcjpwYXNz; http://u:p@h/v1"
    assert redact_text(text) == (f"key {REDACTED}; Authorization: Bearer {REDACTED}; Basic {REDACTED}; "
                                 f"http://{REDACTED}@h/v1")


def test_url_credentials_split_and_decode():
    assert url_credentials("http://us%40er:p%3Aw@h:8/v1") == ("http://h:8/v1", "us@er", "p:w")
    assert url_credentials("http://h/v1") == ("http://h/v1", None, None)
    assert url_credentials("redis://:pw@h:6379/0") == ("redis://h:6379/0", "", "pw")


def test_redact_error_covers_message_and_text_fields():
    secret = f"sk-{uuid.uuid4().hex}"
    register_secrets(secret)
    error = redact_error(LlmApiError(f"HTTP 401: bad key {secret}", 401, f'{{"echo": "{secret}"}}'))
    assert secret not in error.message and secret not in error.body_excerpt and error.http_status == 401
    assert secret not in str(error.to_payload())


def test_log_filter_redacts_messages_tracebacks_and_arq_job_arguments():
    secret = f"pw-{uuid.uuid4().hex}"
    register_secrets(secret)
    filt = RedactingFilter()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "password is %s", (secret,), None)
    assert filt.filter(record) and record.getMessage() == f"password is {REDACTED}"
    arq = logging.LogRecord("arq.worker", logging.INFO, __file__, 1, "%6.2fs → %s(%s)%s",
                            (0.01, "job:run_turn", "{'message': 'user text'}", ""), None)
    filt.filter(arq)
    assert arq.getMessage() == "  0.01s → job:run_turn(…)"
    try:
        raise RuntimeError(f"boom {secret}")
    except RuntimeError:
        import sys

        failing = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())
    filt.filter(failing)
    assert secret not in logging.Formatter().format(failing)


def test_runtime_registers_the_redis_password_and_llm_credentials():
    redis_pw, llm_pw, key = (f"{n}-{uuid.uuid4().hex}" for n in ("redis", "llm", "key"))
    settings = Settings(redis_url=f"redis://:{redis_pw}@127.0.0.1:1/0", llm_base_url=f"http://u:{llm_pw}@h/v1",
                        llm_api_key=key)
    app = SmithApp(settings)
    app.agent("other", llm={"api_key": f"agent-{key}"})
    app.mcp_server("remote", url="http://127.0.0.1:1/mcp", bearer_token=f"mcp-{key}", headers={"X-Api-Key": f"hdr-{key}"})
    rt = WorkerRuntime(app=app, role=TurnRole(), settings=settings, redis=fakeredis.FakeAsyncRedis())
    rt.protect_secrets()
    assert {redis_pw, llm_pw, key, f"agent-{key}", f"mcp-{key}", f"hdr-{key}"} <= registered_secrets()


async def test_base_url_userinfo_becomes_a_basic_authorization_header(server):
    password = f"pw-{uuid.uuid4().hex}"
    base = server.base_url.replace("http://", f"http://smith:{password}@")
    config = LlmClientConfig(base_url=base, model="m")
    assert config.base_url == server.base_url and password not in config.chat_completions_url
    request = request_for(server, Reply.text("ok"))
    async with LlmClient(config) as client:
        assert (await client.complete(request)).message.content == "ok"
    recorded = server.requests[-1]
    assert recorded.headers["authorization"] == "Basic " + base64.b64encode(f"smith:{password}".encode()).decode()
    assert password in registered_secrets()


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("shape", ["one line", "small frames"])
async def test_a_response_past_max_response_bytes_is_cut_off(server, stream, shape):
    limit = 256 * 1024
    if shape == "one line":
        body = [b"data: " + b"x" * (4 * limit)]  # one SSE line, never terminated
    else:
        body = [sse_frame({"choices": [{"index": 0, "delta": {"content": "y" * 1024}}]})] * 2048
    reply = Reply.raw(body, headers=None if stream else {"content-type": "application/json"})
    async with LlmClient(LlmClientConfig(base_url=server.base_url, model="m", max_response_bytes=limit,
                                         max_retries=0)) as client:
        with pytest.raises(ParseError) as cut:
            if stream:
                await client.complete_stream(request_for(server, reply), lambda event: None)
            else:
                await client.complete(request_for(server, reply))
    assert cut.value.offset == limit


def test_default_max_response_bytes_is_4_mib():
    assert LlmClientConfig(base_url="http://h/v1", model="m").max_response_bytes == 4 * 1024 * 1024


async def test_abort_set_expires_and_the_hygiene_report_covers_it(redis_url):
    redis = Redis.from_url(redis_url)  # a real server: abort_job is a Lua script
    keys = Keys(f"hyg-{uuid.uuid4().hex[:8]}")
    try:
        await abort_job(redis, keys, keys.tool_job_id("t", 1, 0))
        assert 0 < await redis.ttl(keys.abort_set) <= ABORT_ENTRY_TTL
        assert await keys_without_ttl(redis, keys) == []
        await redis.persist(keys.abort_set)
        assert await keys_without_ttl(redis, keys) == [keys.abort_set]
    finally:
        await redis.delete(keys.abort_set)
        await redis.aclose()


def test_scrub_surrogates_and_bounded_structured():
    from smith_worker.tools.function import bounded_structured, scrub_surrogates

    assert scrub_surrogates("a\ud800b\udfffc") == "a\ufffdb\ufffdc"
    assert bounded_structured({"x": 1}, 100) == {"x": 1}
    assert bounded_structured({"x": "y" * 200}, 100) is None
    assert bounded_structured({"_done": True, "final_message": "bye", "x": "y" * 200}, 100) == {
        "_done": True, "final_message": "bye"}
    assert bounded_structured(None, 1) is None


async def test_executors_count_overrunning_threads_and_call_on_limit_once():
    import asyncio
    import threading

    from smith_worker.tools.isolation import ToolExecutors

    release = threading.Event()
    calls: list[int] = []
    executors = ToolExecutors(job_slots=2, overrun_limit=2, on_limit=lambda: calls.append(executors.overrunning))
    assert executors.threads._max_workers == 4  # one thread per job slot, plus the overrun allowance
    for _ in range(3):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):
                await executors.run_in_thread(release.wait, {})
    assert executors.overrunning == 3 and calls == [2] and executors.limit_reached
    assert await executors.run_in_thread(lambda x: x * 2, {"x": 21}) == 42  # a slot is still free
    release.set()
    for _ in range(100):
        if executors.overrunning == 0:
            break
        await asyncio.sleep(0.01)
    assert executors.overrunning == 0
    executors.close()


async def test_a_sync_tool_stopped_by_a_cancel_is_logged_as_a_cancel_and_by_its_timeout_as_a_timeout(caplog):
    import asyncio
    import threading

    from smith_worker.tools.function import ToolContext, make_tool
    from smith_worker.tools.isolation import ToolExecutors

    release, started = threading.Event(), threading.Event()

    def blocking() -> str:
        started.set()
        release.wait()
        return "late"

    tool, executors = make_tool(blocking), ToolExecutors(job_slots=2)
    ctx = ToolContext(call_id="c1", tool_name="blocking")
    caplog.set_level(logging.WARNING, logger="agent_smith")
    try:
        timed_out = await tool.invoke({}, ctx, timeout=0.05, executors=executors)
        assert timed_out.is_error and "timed out after 0.05 s" in timed_out.content
        overran = [r.getMessage() for r in caplog.records if "blocking" in r.getMessage()]
        assert len(overran) == 1 and "overran its timeout" in overran[0], overran
        caplog.clear()
        started.clear()
        aborted = asyncio.create_task(tool.invoke({}, ctx, timeout=3600, executors=executors))
        await asyncio.to_thread(started.wait)  # the thread runs: the cancel (an abort) finds it running
        aborted.cancel()
        with pytest.raises(asyncio.CancelledError):
            await aborted
        cancelled = [r.getMessage() for r in caplog.records if "blocking" in r.getMessage()]
        assert len(cancelled) == 1 and "was cancelled" in cancelled[0] and "timeout" not in cancelled[0], cancelled
    finally:
        release.set()
        executors.close()
