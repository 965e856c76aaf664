"""What misbehaves is contained — runaway sync tools, process-isolated tools, a hand-off
while a tool runs. These tests run their own worker processes (own prefix), since they restart
and kill them.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import psutil
import pytest

from smith_client import SmithClient
from smith_client.messages import ToolMessage
from smith_client.registry import live_workers
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]


def gone(pid: int) -> bool:
    """True when no process ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def eventually(check, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(0.1)
    return False


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm):
    """One turn worker and one tool worker of their own prefix (the tool worker restarts in a test)."""
    prefix = f"contain{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    procs = {
        q: start_workers("tests.support.app:app", env, [q], f"{prefix}-a", log_dir=LOGS)[0] for q in ("turns", "tools")
    }
    await wait_for_workers(redis_url, prefix, 2)
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        yield procs, env, client
    for proc in procs.values():
        proc.stop()


def tool_contents(history) -> list[str]:
    return [m.content for m in history if isinstance(m, ToolMessage)]


async def test_overrunning_sync_tools_never_starve_the_worker_and_a_process_tool_is_killed(fleet, scenario):
    procs, _, client = fleet
    tools_proc = procs["tools"]
    blockers = [("block_sync", {"seconds": 25})] * 8
    key, marker = scenario(Script(
        Reply.tool_calls(blockers),  # 8 threads overrun their 1 s timeout (limit 10: no restart yet)
        Reply.tool_calls([("add", {"a": 2, "b": 3})]),  # a normal sync tool on the same worker
        Reply.tool_calls([("block_sync", {"seconds": 25})] * 2),  # overruns 9 and 10: drain and restart
        Reply.tool_calls([("add", {"a": 4, "b": 5})]),  # served by the restarted worker
        Reply.tool_calls([("sleep_in_process", {"seconds": 30})]),  # killed at its 5 s timeout
        Reply.text("contained"),
    ))
    conv = f"conv-{key}"
    before = {w["id"] for w in await live_workers(client.redis, client.keys) if w["queue"] == "tools"}
    started = time.monotonic()
    handle = await client.submit(f"{marker} go", conversation_id=conv, agent="contain")
    assert (await handle.result(timeout=90)).content == "contained"
    contents = tool_contents(await client.history(conv))
    assert len(contents) == 13
    assert all("timed out after 1 s" in c for c in contents[:8])
    assert contents[8] == "5"  # ran and returned while 8 threads were still blocked
    assert all("timed out after 1 s" in c for c in contents[9:11])
    assert contents[11] == "9"
    assert "timed out after 5 s" in contents[12]
    assert time.monotonic() - started < 60  # the 25 s threads never delayed anything

    # the tool worker drained and re-executed itself (same pid, a new registration), logged
    log = tools_proc.log_path.read_text(errors="replace")
    assert "overran their timeouts; draining to restart" in log and "re-executing" in log
    assert tools_proc.alive()
    after = [w for w in await live_workers(client.redis, client.keys) if w["queue"] == "tools"]
    assert len(after) == 1 and after[0]["id"] not in before and after[0]["pid"] == tools_proc.pid
    assert after[0]["draining"] is False and after[0]["overrunning_threads"] == 0

    # the process-isolated tool's process is gone, not left sleeping
    pids = await client.redis.lrange(f"{client.keys.prefix}:test:proc:{handle.turn_id}", 0, -1)
    assert len(pids) == 1, "the process-isolated tool never started"
    pid = int(pids[0])
    assert pid != tools_proc.pid
    assert await eventually(lambda: asyncio.to_thread(gone, pid), 10)


async def test_a_process_isolated_tool_returns_its_result(fleet, scenario):
    _, _, client = fleet
    key, marker = scenario(Script(Reply.tool_calls([("pid_in_process", {})]), Reply.text("ok")))
    handle = await client.submit(f"{marker} pid", conversation_id=f"conv-{key}", agent="contain")
    assert (await handle.result(timeout=60)).content == "ok"
    [content] = tool_contents(await client.history(f"conv-{key}"))
    worker_pids = {w["pid"] for w in await live_workers(client.redis, client.keys)}
    assert content.isdigit() and int(content) not in worker_pids  # it ran in a pool process


async def test_a_tool_result_landing_between_attempts_is_published_exactly_once(fleet, scenario, redis_url):
    procs, env, client = fleet
    key, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 3})]), Reply.text("after")))
    handle = await client.submit(f"{marker} slow", conversation_id=f"conv-{key}", agent="contain")
    started = client.keys.tool_started(handle.turn_id, 1, 0)
    assert await eventually(lambda: client.redis.exists(started), 20)  # the tool runs now
    turns = procs["turns"]
    turns.signal(signal.SIGTERM)  # the only turn worker hands the turn off while the tool runs
    await asyncio.to_thread(turns.proc.wait, 30)
    await asyncio.sleep(3.5)  # the tool finishes while no attempt runs the turn
    procs["turns"] = start_workers("tests.support.app:app", env, ["turns"], f"{client.keys.prefix}-b", log_dir=LOGS)[0]
    assert (await handle.result(timeout=60)).content == "after"
    events = [e async for e in handle.events()]
    assert [e.type for e in events].count("tool.result") == 1
    assert "turn.resumed" in [e.type for e in events]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    await wait_for_workers(redis_url, client.keys.prefix, 2)


async def test_sigterm_ends_a_tool_worker_with_an_overrunning_thread(redis_url, scripted_llm, scenario):
    """QA: a sync tool sleeping an hour past its timeout must not keep a SIGTERMed tool worker alive."""
    from smith_worker.tool_worker.role import TOOL_JOB_COMPLETION_WAIT

    prefix = f"overrun{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    turns, tools = start_workers("tests.support.app:app", env, ["turns", "tools"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, 2)
        key, marker = scenario(Script(Reply.tool_calls([("block_sync", {"seconds": 3600})]), Reply.text("left")))
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            handle = await client.submit(f"{marker} go", conversation_id=f"conv-{key}", agent="contain")
            assert (await handle.result(timeout=60)).content == "left"
        assert "overran its timeout" in tools.log_path.read_text(errors="replace")
        tools.signal(signal.SIGTERM)
        deadline = time.monotonic() + TOOL_JOB_COMPLETION_WAIT + 20  # the completion wait + a margin
        while tools.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not tools.alive(), "the tool worker outlived SIGTERM (its overrunning thread was joined)"
        assert tools.proc.returncode == 0
        assert "abandoned" in tools.log_path.read_text(errors="replace")
    finally:
        turns.stop()
        tools.stop()


async def test_sigterm_during_a_drain_to_restart_ends_the_worker_instead_of_re_executing(
        redis_url, scripted_llm, scenario):
    """A tool worker draining to restart (overrun limit) that gets SIGTERM exits: no re-exec, no hang."""
    from smith_worker.tool_worker.role import TOOL_JOB_COMPLETION_WAIT

    prefix = f"drainterm{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_TOOL_MAX_OVERRUNS="1")
    turns, tools = start_workers("tests.support.app:app", env, ["turns", "tools"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, 2)
        # the overrun starts the drain; the slow async tool keeps the drain waiting while SIGTERM comes
        key, marker = scenario(Script(
            Reply.tool_calls([("block_sync", {"seconds": 3600}), ("slow_tool", {"seconds": 6})]), Reply.text("x")))
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            await client.submit(f"{marker} go", conversation_id=f"conv-{key}", agent="contain")
            deadline = time.monotonic() + 30
            while "draining to restart" not in tools.log_path.read_text(errors="replace"):
                assert time.monotonic() < deadline, "the tool worker never started draining"
                await asyncio.sleep(0.1)
        tools.signal(signal.SIGTERM)
        deadline = time.monotonic() + TOOL_JOB_COMPLETION_WAIT + 20
        while tools.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        log = tools.log_path.read_text(errors="replace")
        assert not tools.alive(), "the tool worker outlived SIGTERM during its drain"
        assert "re-executing" not in log
    finally:
        turns.stop()
        tools.stop()
