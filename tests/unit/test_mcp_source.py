"""``McpServerSource``: schemas for turn workers (Redis cache), calls on tool workers, events, shutdown.

Runs the bundled example server (smith_worker/demo/mcp_server_example.py) against the suite's
private redis-server; two apps stand for two worker processes (a turn worker and a tool worker).
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path

import orjson
import pytest

import smith_worker.demo as demo_package
from smith_worker import Hooks, SmithApp
from smith_worker.config import Settings
from smith_client.connection import connect_redis
from smith_worker.queue.worker import ROLES
from smith_worker.runtime import Queue, WorkerRuntime
from smith_worker.tools.function import ToolContext
from tests.support.mcp_helpers import eventually_async, exists, lab_config

EXAMPLE = str(Path(demo_package.__file__).with_name("mcp_server_example.py"))


def build_app(prefix: str, redis_url: str, heard: list, extra_lab: bool = False) -> SmithApp:
    app = SmithApp(settings=Settings(redis_url=redis_url, prefix=prefix))
    app.hooks.on_mcp_event = lambda event: heard.append(("app", event.to_data()["kind"]))
    app.mcp_server("example", command=sys.executable, args=[EXAMPLE], deny=["now"])
    sources = ["example"]
    if extra_lab:
        from smith_worker.mcp import McpServerSource

        app.add_source(McpServerSource(lab_config("stubborn", "--ignore-eof")))
        sources.append("stubborn")
    app.agent("a", sources=sources, hooks=Hooks(on_mcp_event=lambda event: heard.append(("agent", event))))
    return app


async def runtime(app: SmithApp, queue: Queue) -> WorkerRuntime:
    """A runtime whose sources were started (as at worker start-up), without the rest of its start."""
    rt = WorkerRuntime(app=app, role=ROLES[queue](), settings=app.settings, redis=connect_redis(app.settings.redis_url))
    for source in app.sources.values():
        await source.start(rt.source_context())
    return rt


def context(tool_name: str, turn_id: str) -> ToolContext:
    return ToolContext(call_id="c1", tool_name=tool_name, turn_id=turn_id, agent="a", budget=20.0,
                       deadline=time.monotonic() + 20.0, worker_id="w")


@pytest.fixture
def prefix():
    return f"mcp{uuid.uuid4().hex[:8]}"


async def test_turn_side_discovers_once_then_reads_the_cache_and_tool_side_calls(redis_url, prefix):
    heard_turns, heard_tools = [], []
    turns = await runtime(build_app(prefix, redis_url, heard_turns), "turns")
    tools = await runtime(build_app(prefix, redis_url, heard_tools, extra_lab=True), "tools")
    turn_source, tool_source = turns.app.sources["example"], tools.app.sources["example"]
    pids: list[int | None] = []
    try:
        # cold cache: the turn worker discovers in its own pool and fills the cache (with a TTL);
        # meanwhile the tool worker starts a server that ignores stdin EOF (for the shutdown check below)
        schemas, _ = await asyncio.gather(turn_source.schemas(), tools.app.sources["stubborn"].handle.catalog())
        names = [s.name for s in schemas]
        assert names == ["mcp_example__echo", "mcp_example__read_resource"]  # "now" denied
        key = turns.keys.mcp_tools("example")
        assert await eventually_async(lambda: turns.redis.exists(key))  # written by a background task
        assert 0 < await turns.redis.ttl(key) <= 300
        # another process with a cold pool reads the cache and starts nothing
        assert [s.name for s in await tool_source.schemas()] == names
        assert tool_source.handle.pid is None

        turn_id = f"turn-{uuid.uuid4().hex[:6]}"
        result = await tool_source.call("mcp_example__echo", {"text": "hi"}, context("mcp_example__echo", turn_id))
        assert (result.content, result.is_error) == ("hi", False)
        resource = await tool_source.call("mcp_example__read_resource", {"uri": "example://info"},
                                          context("mcp_example__read_resource", turn_id))
        assert "example MCP server" in resource.content
        for name in ("mcp_example__now", "mcp_example__nope"):  # denied and unknown: error results, no traffic
            refused = await tool_source.call(name, {}, context(name, turn_id))
            assert refused.is_error and "unknown tool" in orjson.loads(refused.content)["message"]
        messages = await tool_source.get_prompt("greet", {"name": "Neo"})
        assert "Neo" in messages[0].content

        # the call's events reached the turn's stream and the agent's hook; the app hook heard them once
        events = [e for e in await tools.events.read(turn_id) if e.type == "mcp.event"]
        assert events and events[0].data["alias"] == "example" and events[0].data["kind"] == "connected"
        assert ("app", "connected") in heard_tools
        assert any(who == "agent" and event.server_alias == "example" for who, event in heard_tools)

        stubborn = await tools.app.sources["stubborn"].call("mcp_stubborn__echo", {"text": "x"},
                                                          context("mcp_stubborn__echo", turn_id))
        assert stubborn.content == "x"
        pids = [turn_source.handle.pid, tool_source.handle.pid, tools.app.sources["stubborn"].handle.pid]
        assert all(exists(pid) for pid in pids)
    finally:  # worker shutdown: every MCP server goes, the EOF-ignoring one included
        await asyncio.gather(turns.stop(), tools.stop())
    assert all(not exists(pid) for pid in pids)



async def test_needs_approval_names_original_tools_resolved_through_the_catalog_or_its_cache(redis_url, prefix):
    """``needs_approval=["echo"]`` gates ``mcp_example__echo`` only: a process with the server resolves the call's
    name through its catalog, one without it through the cached routes (starting nothing); a name it cannot
    resolve waits for approval (docs/architecture.md, Pausing for a person)."""

    def gated_app() -> SmithApp:
        app = SmithApp(settings=Settings(redis_url=redis_url, prefix=prefix))
        app.mcp_server("example", command=sys.executable, args=[EXAMPLE], needs_approval=["echo"])
        return app

    warm, cold = await runtime(gated_app(), "turns"), await runtime(gated_app(), "turns")
    try:
        warm_source, cold_source = warm.app.sources["example"], cold.app.sources["example"]
        await warm_source.schemas()
        assert await eventually_async(lambda: warm.redis.exists(warm.keys.mcp_tools("example")))
        for source in (warm_source, cold_source):
            policy = source.approval("mcp_example__echo")
            verdicts = {name: await policy(context(name, "t"), {}) for name in
                        ("mcp_example__echo", "mcp_example__now", "mcp_example__read_resource", "mcp_example__gone")}
            assert verdicts == {"mcp_example__echo": True, "mcp_example__now": False,
                                "mcp_example__read_resource": False, "mcp_example__gone": True}  # fmt: skip
        assert cold_source.handle.pid is None  # the cached routes sufficed
    finally:
        await asyncio.gather(warm.stop(), cold.stop())
