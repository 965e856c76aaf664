"""A real turn against the real embedded model (SmolLM2-135M on xllamacpp) in json_schema tool calling, as `make demo` runs it."""

from __future__ import annotations

import socket
import uuid

import pytest

from smith_client import SmithClient
from smith_worker.local.llm_server import LocalModelServer
from smith_worker.testing import worker_env, worker_pair
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration, pytest.mark.local_llm]


@pytest.fixture(scope="module")
def local_model():
    """The server, started (and its workers run) with a dead proxy in the environment, as on a machine behind
    a proxy: its readiness probe and the workers' model calls go to loopback directly (NO_PROXY)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed_port()}")
        for name in ("NO_PROXY", "no_proxy"):
            env.delenv(name, raising=False)
        with LocalModelServer(log_path=LOGS / "local-model.log", startup_timeout=60.0) as server:
            assert "127.0.0.1" in server.client_env()["NO_PROXY"].split(",")
            yield server


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
async def demo_workers(redis_url, local_model):
    prefix = f"local{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, local_model.base_url, **local_model.client_env())
    assert env["SMITH_LLM_TOOL_CALLING"] == "json_schema"
    async with worker_pair("smith_worker.demo:app", redis_url, prefix, env, log_dir=LOGS):
        yield prefix


async def test_calculator_turn_against_the_local_model(redis_url, demo_workers):
    async with SmithClient.from_url(redis_url, prefix=demo_workers) as client:
        events = [e async for e in client.stream("What is 17*23?", conversation_id="local-calc", timeout=240)]
    assert events[-1].type == "turn.completed", events[-1].data
    calls = [e.data for e in events if e.type == "tool_call.completed"]
    assert calls and calls[0]["name"] == "calculator"
    results = [e.data for e in events if e.type == "tool.result"]
    assert results[0]["is_error"] is False and ":tools:" in results[0]["worker"]
    assert results[0]["content"] == "391"  # the model asked for 17*23 (named tool_choice, greedy decoding)
    tokens = "".join(e.data["text"] for e in events if e.type == "token")
    assert "391" in tokens and tokens == events[-1].final_message().content
    assert "{" not in tokens and "answer" not in tokens  # the JSON reply's text only, no JSON around it
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
