"""MCP through real workers: a turn using an MCP tool end to end, and worker shutdown.

The ``mcp`` agent of tests/support/app.py uses the lab stdio server (tests/support/mcp_servers/lab_server.py)
as source ``lab``; each worker process pools its own connection.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import psutil
import pytest

from smith_client import SmithClient
from smith_client.jobs import RUN_TOOL, ToolJob, ToolOutcome
from smith_client.keys import Keys
from smith_client.messages import ToolCall
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env, worker_pair
from tests.conftest import LOGS
from tests.support.mcp_helpers import eventually, running

pytestmark = [pytest.mark.integration]


async def test_a_turn_calls_mcp_tools_end_to_end(redis_url, scenario, scripted_llm):
    # workers of its own prefix: their MCP servers are cold and no schemas are cached, whichever tests ran first
    prefix = f"mcpe{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    async with worker_pair("tests.support.app:app", redis_url, prefix, env, log_dir=LOGS), \
            SmithClient.from_url(redis_url, prefix=prefix) as client:
        await _a_turn_calls_mcp_tools_end_to_end(client, scenario, scripted_llm, prefix)


async def _a_turn_calls_mcp_tools_end_to_end(client, scenario, scripted_llm, prefix):
    key, marker = scenario(Script(
        Reply.tool_calls([("mcp_lab__echo", {"text": "hello from MCP"}), ("mcp_lab__notify", {"message": "psst"}),
                          ("mcp_lab__crash", {}), ("mcp_lab__progress", {"steps": 4})]),
        Reply.text("The server said hello."),
    ))
    events = [e async for e in client.stream(f"{marker} use the lab", conversation_id=f"conv-{key}", agent="mcp")]

    assert events[-1].type == "turn.completed" and events[-1].final_message().content == "The server said hello."
    offered = {t["function"]["name"] for t in scripted_llm.requests_for(key)[0].body["tools"]}
    assert {"mcp_lab__echo", "mcp_lab__notify", "mcp_lab__read_resource", "add"} <= offered
    assert "mcp_lab__crash" not in offered  # denied in the app's config
    results = {e.data["name"]: e.data for e in events if e.type == "tool.result"}
    assert results["mcp_lab__echo"]["content"] == "hello from MCP" and not results["mcp_lab__echo"]["is_error"]
    assert ":tools:" in results["mcp_lab__echo"]["worker"]  # ran on the tool worker's pooled server
    assert results["mcp_lab__notify"]["content"] == "notified"
    assert results["mcp_lab__crash"]["is_error"]  # a denied tool is refused, never sent
    mcp_events = [e for e in events if e.type == "mcp.event"]
    assert any(e.data["kind"] == "notification" and e.data["fields"]["method"] == "notifications/message"
               and e.data["fields"]["params"]["data"] == "psst" for e in mcp_events)
    assert all(e.data["alias"] == "lab" for e in mcp_events)
    # the call's 4 progress notifications are on its turn's stream once each
    progress = [e.data["fields"]["params"]["progress"] for e in mcp_events
                if e.data["kind"] == "notification" and e.data["fields"]["method"] == "notifications/progress"]
    assert progress == [1, 2, 3, 4]
    # two connections, both reported on this turn's stream: the turn worker's discovery (schemas for
    # the model) and the tool worker's pooled server that ran the calls
    assert [e.data["kind"] for e in mcp_events].count("connected") == 2
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(events) + 1))
    # the turn worker cached the schemas for every other turn worker, with a TTL
    assert 0 < await client.redis.ttl(Keys(prefix).mcp_tools("lab")) <= 300
    # the agent's on_mcp_event hook ran on the tool worker
    assert b"notification" in await client.redis.lrange(f"{prefix}:test:mcp-hook", 0, -1)


async def test_tool_worker_shutdown_leaves_no_mcp_process(redis_url, scripted_llm, client):
    prefix = f"mcpw{uuid.uuid4().hex[:6]}"
    keys = Keys(prefix)
    (worker,) = start_workers("tests.support.app:app", worker_env(redis_url, prefix, scripted_llm.base_url),
                              ["tools"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, 1)
        job = ToolJob(turn_id="t-shutdown", conversation_id="c", agent="mcp", step=1, index=0,
                      call=ToolCall(id="call-1", name="mcp_lab__pid"), timeout=30.0,
                      reply_channel=keys.worker_replies_channel("test"), result_key=keys.tool_result("t-shutdown", 1, 0))
        await client.redis.enqueue_job(RUN_TOOL, job.model_dump(mode="json"), _job_id=keys.tool_job_id("t-shutdown", 1, 0),
                                       _queue_name=keys.tools_queue)
        raw = None
        deadline = time.monotonic() + 30
        while raw is None and time.monotonic() < deadline:
            raw = await client.redis.get(job.result_key)
            await asyncio.sleep(0.05)
        outcome = ToolOutcome.model_validate(orjson.loads(raw))
        server_pid = int(outcome.content)
        assert server_pid in [p.pid for p in psutil.Process(worker.proc.pid).children(recursive=True)]
    finally:
        code = worker.stop()  # SIGTERM: arq's on_shutdown closes the pool
    assert code == 0
    assert await eventually(lambda: not running(server_pid))
    log = (LOGS / f"{prefix}-tools-0.log").read_text()
    assert "MCP server 'lab': disconnected: shutdown" in log  # closed by the worker, not by the parent-death signal
