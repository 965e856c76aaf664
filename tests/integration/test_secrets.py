"""An API key never leaves the worker's own configuration (docs/architecture.md, Hooks and logs).

One turn with a tool call runs on an extra pair of worker processes (their own
prefix) configured with ``SMITH_LLM_API_KEY`` and DEBUG logging, so the LLM
client logs request headers and bodies. Everything the turn wrote to Redis is
captured with ``MONITOR`` (job payloads, tool results, history, events, the
replay log), plus its events as the client received them and the workers' log
files. The key must appear in none of them, while the scripted server did
receive it as ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid

import pytest
from redis.asyncio import Redis

from smith_client import SmithClient
from smith_worker.local.processes import start_redis_server
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS
from tests.integration.test_turns import collect

pytestmark = pytest.mark.integration


async def _monitor(redis_url: str, commands: list[str], ready: asyncio.Event) -> None:
    """Append every command the Redis server executes (from any client) to ``commands``."""
    redis = Redis.from_url(redis_url)
    try:
        async with redis.monitor() as monitor:
            ready.set()
            while True:
                commands.append((await monitor.next_command())["command"])
    finally:
        await redis.aclose()


async def _all_values(redis: Redis) -> str:
    """Every key and value in the database, whatever its type, as one text."""
    readers = {
        b"string": lambda k: redis.get(k),
        b"hash": lambda k: redis.hgetall(k),
        b"list": lambda k: redis.lrange(k, 0, -1),
        b"set": lambda k: redis.smembers(k),
        b"zset": lambda k: redis.zrange(k, 0, -1, withscores=True),
        b"stream": lambda k: redis.xrange(k),
    }
    parts = []
    async for key in redis.scan_iter(count=1000):
        kind = await redis.type(key)
        parts.append(f"{key!r} {await readers[kind](key)!r}" if kind in readers else repr(key))
    return "\n".join(parts)


async def _captured_turn(redis_url: str, prefix: str, env: dict[str, str], text: str, conversation: str):
    """Run one turn on a worker pair of its own, capturing every Redis command (MONITOR) meanwhile.

    Returns ``(events, history, stored values, commands, procs)``; the workers are stopped
    first so their log files are complete.
    """
    commands: list[str] = []
    ready = asyncio.Event()
    monitor = asyncio.create_task(_monitor(redis_url, commands, ready))
    await ready.wait()
    procs = start_workers("tests.support.app:app", env, ["turns", "tools"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, len(procs))
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            events = await collect(client, text, conversation)
            history = await client.history(conversation)
            stored = await _all_values(client.redis)
    finally:
        for proc in procs:
            proc.stop()
        monitor.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await monitor
    return events, history, stored, commands, procs


async def test_api_key_appears_in_no_event_log_or_job_payload(redis_url, scripted_llm, scenario):
    api_key = f"sk-secret-{uuid.uuid4().hex}"
    prefix = f"secret{uuid.uuid4().hex[:8]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_LLM_API_KEY=api_key, SMITH_LOG_LEVEL="DEBUG")
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 2})]), Reply.text("four")))

    events, history, _, commands, procs = await _captured_turn(redis_url, prefix, env, f"{marker} 2+2?", f"conv-{key}")

    assert events[-1].type == "turn.completed" and events[-1].final_message().content == "four"
    requests = scripted_llm.requests_for(key)
    assert len(requests) == 2 and all(r.headers["authorization"] == f"Bearer {api_key}" for r in requests)

    logs = "\n".join(proc.log_path.read_text(errors="replace") for proc in procs)
    written = "\n".join(commands)
    # the captures are real: the wire was logged (redacted) and the payloads went through Redis
    assert "'Authorization': '<redacted>'" in logs and "sse frame" in logs
    assert "run_turn" in written and "run_tool" in written and '"four"' in written.replace('\\"', '"')
    for captured in (logs, written, *(e.model_dump_json() for e in events), *(m.model_dump_json() for m in history)):
        assert api_key not in captured


@pytest.fixture
def protected_redis(tmp_path):
    """A private redis-server that requires a password; yields ``(url, password)``."""
    redis_password = f"redis-{uuid.uuid4().hex}"
    proc, url = start_redis_server(log_path=tmp_path / "redis.log", password=redis_password)
    yield url, redis_password
    proc.stop()


async def test_echoed_credentials_appear_in_no_event_redis_value_or_log_line(protected_redis, scripted_llm, scenario):
    """An LLM 401 body echoing the API key, credentials in the base URL, a
    password-protected Redis, the root logger at DEBUG (httpx, aiohttp, mcp and arq included)."""
    redis_url, redis_password = protected_redis
    api_key = f"sk-live-{uuid.uuid4().hex}"
    password = f"pw-{uuid.uuid4().hex}"
    prefix = f"leak{uuid.uuid4().hex[:8]}"
    base_url = scripted_llm.base_url.replace("http://", f"http://smithuser:{password}@")
    env = worker_env(redis_url, prefix, base_url, SMITH_LLM_API_KEY=api_key, SMITH_LOG_LEVEL="DEBUG")

    def handler(request):
        if request.step == 0:
            return Reply.tool_calls([("add", {"a": 1, "b": 1})])
        echoed = f"Invalid credentials: {request.headers.get('authorization')} (user smithuser:{password})"
        return Reply.error(401, {"error": {"message": echoed, "type": "invalid_request_error"}})

    key, marker = scenario(handler)
    events, history, stored, commands, procs = await _captured_turn(redis_url, prefix, env, f"{marker} 1+1?",
                                                                    f"conv-{key}")

    failed = events[-1]
    assert failed.type == "turn.failed" and failed.data["error"]["kind"] == "LlmApiError"
    assert "Invalid credentials: Bearer <redacted>" in failed.data["error"]["message"]
    requests = scripted_llm.requests_for(key)
    assert requests[-1].headers["authorization"] == f"Bearer {api_key}"  # the server did get the key
    logs = "\n".join(proc.log_path.read_text(errors="replace") for proc in procs)
    # the captures are real: httpx's request lines, asyncio's DEBUG lines and arq's job lines were written
    assert "HTTP Request: POST http://127.0.0.1" in logs and "asyncio DEBUG" in logs and ":run_tool(…)" in logs and ":run_turn(…)" in logs
    assert "401" in logs and "run_turn" in "\n".join(commands)
    basic = base64.b64encode(f"smithuser:{password}".encode()).decode()
    captures = (logs, "\n".join(commands), stored, *(e.model_dump_json() for e in events),
                *(m.model_dump_json() for m in history))
    for secret in (api_key, password, basic, redis_password):
        assert not [c for c in captures if secret in c]
    arq_lines = [line for line in logs.splitlines() if " arq." in line]
    assert arq_lines and not [line for line in arq_lines if "1+1?" in line]  # arq logs no job arguments
