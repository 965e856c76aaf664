"""MCP elicitation and sampling against the reference server ``@modelcontextprotocol/server-everything`` (npm),
over stdio and Streamable HTTP, through real workers (docs/architecture.md, MCP and Pausing for a person).

Its tools ``trigger-elicitation-request`` (registered when the client declares elicitation) and
``trigger-sampling-request`` (registered only when the client declares sampling) ask us during the call.
The server is installed with npm into the pytest cache once; the tests skip when npm cannot install it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import orjson
import pytest

from smith_client import InvalidRequestError, NoPendingCallError, SmithClient, SyncSmithClient
from smith_client.keys import Keys
from smith_worker.local.processes import free_port
from smith_worker.testing import Reply, Script, worker_env, worker_pair
from tests.conftest import LOGS
from tests.support.mcp_helpers import open_input, tool_contents

pytestmark = [pytest.mark.integration]

PACKAGE = "@modelcontextprotocol/server-everything"
VERSION = "2026.8.31"  # the release these tests were written against (its tool names)
ELICIT = "trigger-elicitation-request"
SAMPLE = "trigger-sampling-request"


@pytest.fixture(scope="module")
def everything() -> Path:
    """server-everything's ``dist/index.js``, installed with npm beside the tests' worker logs (once)."""
    cache = LOGS.parent / f"server-everything-{VERSION}"
    cache.mkdir(parents=True, exist_ok=True)
    script = cache / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
    if script.exists():
        return script
    npm, node = shutil.which("npm"), shutil.which("node")
    if npm is None or node is None:
        pytest.skip(f"npm and node are needed to install {PACKAGE}")
    try:
        done = subprocess.run([npm, "install", "--prefix", str(cache), "--no-audit", "--no-fund", f"{PACKAGE}@{VERSION}"],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        pytest.skip(f"npm could not install {PACKAGE} within 300 s")
    if done.returncode != 0 or not script.exists():
        pytest.skip(f"npm could not install {PACKAGE}: {done.stderr.strip()[-400:]}")
    return script


@pytest.fixture(scope="module")
def everything_url(everything):
    """server-everything's Streamable HTTP endpoint (its ``streamableHttp`` transport on a free port)."""
    port = free_port()
    log = open(LOGS.parent / f"server-everything-{port}.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([shutil.which("node") or "node", str(everything), "streamableHttp"],
                            env={**os.environ, "PORT": str(port)}, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"server-everything's HTTP transport did not start (exit {proc.poll()})")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@pytest.fixture(scope="module")
async def ev(redis_url, scripted_llm, everything, everything_url):
    """A client on workers serving tests/support/everything_app.py (a prefix of their own)."""
    prefix = f"ev{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url,
                     EVERYTHING_SCRIPT=str(everything), EVERYTHING_URL=everything_url)
    async with worker_pair("tests.support.everything_app:app", redis_url, prefix, env, log_dir=LOGS), \
            SmithClient.from_url(redis_url, prefix=prefix) as client:
        yield client



ALIASES = {"everything": "ev", "everything_http": "ev_http", "everything_sampling": "ev_sampling"}


@pytest.mark.parametrize("agent", ["everything", "everything_http"])
async def test_an_elicitation_is_answered_through_respond_accept_then_decline(
    ev, scenario, scripted_llm, redis_url, agent
):
    tool = f"mcp_{ALIASES[agent]}__{ELICIT}"
    key, marker = scenario(Script(
        Reply.tool_calls([(tool, {})], ids=["call_ask"]),
        Reply.tool_calls([(tool, {})], ids=["call_ask_again"]),
        Reply.text("thanks"),
    ))
    handle = await ev.submit(f"{marker} ask me", conversation_id=f"conv-{key}", agent=agent)
    item = await open_input(ev, handle.turn_id)
    assert (item.kind, item.tool, item.call_id, item.agent_path) == ("input", tool, "call_ask", [agent])
    assert item.message == "Please provide inputs for the following fields:"
    assert item.parameters["required"] == ["name"] and "check" in item.parameters["properties"]
    assert await handle.status() == "running"  # the turn is not paused: its tool job holds the MCP request
    with pytest.raises(InvalidRequestError):  # content is checked against the requested schema
        await ev.respond(handle.turn_id, item.request_id, "accept", {"check": True})
    answer = await ev.respond(handle.turn_id, item.request_id, "accept", {"name": "Ada Lovelace", "check": True})
    assert answer.action == "accept"
    with pytest.raises(NoPendingCallError):  # answered: no longer open
        await ev.respond(handle.turn_id, item.request_id, "decline")

    second = await open_input(ev, handle.turn_id)
    assert second.call_id == "call_ask_again" and second.request_id != item.request_id
    def decline_with_the_sync_client() -> str:
        with SyncSmithClient.from_url(redis_url, prefix=ev.keys.prefix) as sync:
            assert [i.request_id for i in sync.pending(handle.turn_id)] == [second.request_id]
            return sync.respond(handle.turn_id, second.request_id, "decline").action

    assert await asyncio.to_thread(decline_with_the_sync_client) == "decline"
    final = await handle.result(timeout=30)
    assert final.content == "thanks"

    requests = scripted_llm.requests_for(key)
    accepted, declined = tool_contents(requests[1])[0], tool_contents(requests[2])[-1]
    assert "User provided the requested information" in accepted and "Name: Ada Lovelace" in accepted
    assert "declined" in declined
    events = [e async for e in ev.follow(handle.turn_id)]
    asked = [e.data["item"]["request_id"] for e in events if e.type == "input.requested"]
    answered = [(e.data["request_id"], e.data["action"]) for e in events if e.type == "input.answered"]
    assert asked == [item.request_id, second.request_id]
    assert answered == [(item.request_id, "accept"), (second.request_id, "decline")]
    assert await ev.pending(handle.turn_id) == []


async def test_an_unanswered_elicitation_is_declined_after_elicitation_timeout(ev, scenario, scripted_llm):
    tool = f"mcp_ev_hasty__{ELICIT}"
    key, marker = scenario(Script(Reply.tool_calls([(tool, {})]), Reply.text("ok")))
    handle = await ev.submit(f"{marker} ask me", conversation_id=f"conv-{key}", agent="everything_hasty")
    item = await open_input(ev, handle.turn_id)
    assert (await handle.result(timeout=30)).content == "ok"
    assert "declined" in tool_contents(scripted_llm.requests_for(key)[1])[0]
    with pytest.raises(NoPendingCallError):
        await ev.respond(handle.turn_id, item.request_id, "accept", {"name": "late"})


@pytest.mark.parametrize("agent", ["everything_sampling", "everything_http"])
async def test_sampling_is_answered_by_the_calling_agents_model_and_counted_in_the_tree(
    ev, scenario, scripted_llm, agent
):
    sample_key, sample_marker = scenario(Reply.text("Hello from the sampled model", usage=(30, 12)))
    tool = f"mcp_{ALIASES[agent]}__{SAMPLE}"
    key, marker = scenario(Script(
        Reply.tool_calls([(tool, {"prompt": f"{sample_marker} say hello", "maxTokens": 40})], usage=(10, 5)),
        Reply.text("done", usage=(10, 5)),
    ))
    handle = await ev.submit(f"{marker} sample", conversation_id=f"conv-{key}", agent=agent)
    assert (await handle.result(timeout=30)).content == "done"

    [sampled] = scripted_llm.requests_for(sample_key)
    body = sampled.body
    assert body["model"] == "sampler"  # the calling agent's own model settings
    assert body["messages"][0] == {"role": "system", "content": "You are a helpful test server."}
    assert body["messages"][1]["role"] == "user" and sample_marker in body["messages"][1]["content"]
    assert body["max_tokens"] == 40 and body["temperature"] == 0.7
    result = tool_contents(scripted_llm.requests_for(key)[1])[0]
    assert "Hello from the sampled model" in result and '"model": "sampler"' in result
    # the sampled tokens count toward the turn tree's budget, with the turn's own model calls
    assert int(await ev.redis.get(Keys(ev.keys.prefix).tree_tokens(handle.turn_id))) == 15 + 42 + 15


async def test_sampling_is_refused_without_sampling(ev, scenario, scripted_llm):
    sample_key, sample_marker = scenario(Reply.text("never"))
    tool = f"mcp_ev__{SAMPLE}"
    key, marker = scenario(Script(
        Reply.tool_calls([(tool, {"prompt": f"{sample_marker} say hello"})]), Reply.text("done"),
    ))
    handle = await ev.submit(f"{marker} sample", conversation_id=f"conv-{key}", agent="everything")
    assert (await handle.result(timeout=30)).content == "done"
    first = scripted_llm.requests_for(key)[0].body
    offered = {t["function"]["name"] for t in first["tools"]}
    # no sampling capability declared: the server does not even offer its sampling tool; elicitation is declared
    assert f"mcp_ev__{ELICIT}" in offered and tool not in offered
    assert orjson.loads(tool_contents(scripted_llm.requests_for(key)[1])[0])["error"] is True
    assert scripted_llm.requests_for(sample_key) == []
