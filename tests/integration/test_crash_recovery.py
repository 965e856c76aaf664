"""Turns survive a killed turn worker (kill -9) and a SIGTERM under load.

These tests run their own fleet (two turn workers, one tool worker, own
prefix), since they kill workers. Recovery waits for the turn's lease (10 s)
to expire, so each takes ~15 s.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid

import pytest

from smith_client import SmithClient, TurnPausedError
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_client.registry import live_workers
from smith_worker.local.processes import ManagedProcess
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]


class Fleet:
    """Worker processes of one prefix; `ensure` tops the turn workers back up after a kill."""

    def __init__(self, redis_url: str, llm_url: str, *, cluster: bool = False, app: str = "tests.support.app:app",
                 **extra: str) -> None:
        self.redis_url = redis_url
        self.app = app
        self.prefix = f"crash{uuid.uuid4().hex[:6]}"
        self.cluster = cluster  # redis_url names a Redis Cluster node (SMITH_REDIS_CLUSTER)
        self.env = worker_env(redis_url, self.prefix, llm_url, SMITH_REDIS_CLUSTER="1" if cluster else "", **extra)
        self.procs: dict[str, list[ManagedProcess]] = {"turns": [], "tools": []}

    async def ensure(self, turns: int = 2, tools: int = 1) -> None:
        for queue, wanted in (("turns", turns), ("tools", tools)):
            self.procs[queue] = [p for p in self.procs[queue] if p.alive()]
            missing = wanted - len(self.procs[queue])
            if missing > 0:
                self.procs[queue] += start_workers(self.app, self.env, [queue] * missing, self.prefix,
                                                   log_dir=LOGS)
        await wait_for_workers(self.redis_url, self.prefix, turns + tools, cluster=self.cluster)

    def client(self) -> SmithClient:
        """A client of this fleet's prefix and Redis."""
        return SmithClient.from_url(self.redis_url, prefix=self.prefix, cluster=self.cluster)

    def stop(self) -> None:
        for proc in self.procs["turns"] + self.procs["tools"]:
            proc.stop()


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm):
    fleet = Fleet(redis_url, scripted_llm.base_url)
    yield fleet
    fleet.stop()


@pytest.fixture
async def fleet_client(fleet):
    await fleet.ensure(turns=2, tools=1)
    async with SmithClient.from_url(fleet.redis_url, prefix=fleet.prefix) as client:
        yield client


async def worker_pid_running(client: SmithClient, turn_id: str) -> int:
    """The pid of the turn worker running ``turn_id`` (from its state: worker id ``host:pid:turns:…``)."""
    for _ in range(200):
        state = await client.turn(turn_id).state()
        if state.get("status") == "running" and state.get("worker"):
            return int(state["worker"].split(":")[1])
        await asyncio.sleep(0.05)
    raise AssertionError(f"turn {turn_id} never ran")


async def wait_for(client: SmithClient, turn_id: str, event_type: str) -> None:
    async for event in client.turn(turn_id).events():
        if event.type == event_type:
            return


def assert_clean_stream(events: list) -> None:
    assert [e.seq for e in events] == list(range(1, len(events) + 1))  # no duplicated or missing seq
    assert events[-1].type == "turn.completed"
    assert "turn.cancelled" not in [e.type for e in events]


async def test_kill_9_during_the_model_stream(fleet_client, scenario):
    gate = threading.Event()
    key, marker = scenario(Script(Reply.text("resumed answer", chunk_size=3, gate=gate)))
    conv = f"conv-{key}"
    handle = await fleet_client.submit(f"{marker} talk", conversation_id=conv, agent="plain")
    pid = await worker_pid_running(fleet_client, handle.turn_id)
    await wait_for(fleet_client, handle.turn_id, "turn.started")
    os.kill(pid, signal.SIGKILL)
    gate.set()
    reply = await handle.result(timeout=60)  # acceptance: within 30 s (lease 10 s + sweep 2 s + rerun)
    assert reply.content == "resumed answer"
    events = [e async for e in handle.events()]
    assert_clean_stream(events)
    assert [e.data["attempt"] for e in events if e.type == "turn.resumed"] == [2]
    history = await fleet_client.history(conv)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage]  # no duplicate message
    # the dead attempt's arq job left the turns queue with its keys (arq alone keeps it queued until its
    # in-progress key expires, turn job timeout + 40 s, then runs it once more for nothing)
    keys, redis, dead_job = fleet_client.keys, fleet_client.redis, fleet_client.keys.turn_job_id(handle.turn_id)
    async with asyncio.timeout(10):  # the sweeper removes it right after re-enqueueing the turn
        while await redis.zscore(keys.turns_queue, dead_job) is not None:
            await asyncio.sleep(0.05)
    assert not await redis.exists(keys.arq_job(dead_job), keys.arq_in_progress(dead_job))


async def test_kill_9_during_a_tool_wait_reuses_the_tool_result(fleet_client, scenario, prefix):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(Reply.tool_calls([("counted", {"label": label, "seconds": 2})]), Reply.text("done")))
    conv = f"conv-{key}"
    handle = await fleet_client.submit(f"{marker} count", conversation_id=conv, agent="durable")
    pid = await worker_pid_running(fleet_client, handle.turn_id)
    await wait_for(fleet_client, handle.turn_id, "tool_call.completed")
    os.kill(pid, signal.SIGKILL)
    assert (await handle.result(timeout=60)).content == "done"
    runs = await fleet_client.redis.lrange(f"{fleet_client.keys.prefix}:test:counted:{label}", 0, -1)
    assert runs == [b"run"]  # the completed tool was not executed twice
    events = [e async for e in handle.events()]
    assert_clean_stream(events)
    assert "turn.resumed" in [e.type for e in events]
    history = await fleet_client.history(conv)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    assert history[2].content == f"counted {label}"


async def test_sigterm_under_load_hands_turns_off(fleet_client, fleet, scenario):
    _, marker = scenario(Script(Reply.text("steady " * 20, chunk_size=7, delay=0.1)))
    handles = await asyncio.gather(*(
        fleet_client.submit(f"{marker} n{i}", conversation_id=f"load-{uuid.uuid4().hex[:6]}", agent="plain")
        for i in range(20)
    ))
    pids = {await worker_pid_running(fleet_client, h.turn_id) for h in handles}
    victim = next(iter(pids))
    os.kill(victim, signal.SIGTERM)
    results = await asyncio.gather(*(h.result(timeout=90) for h in handles))
    assert all(r.content == "steady " * 20 for r in results)  # none lost
    resumed = 0
    for handle in handles:
        events = [e async for e in handle.events()]
        assert_clean_stream(events)  # a handed-off turn publishes no turn.cancelled
        resumed += "turn.resumed" in [e.type for e in events]
    assert resumed >= 1
    workers = await live_workers(fleet_client.redis, fleet_client.keys)
    assert all(str(victim) != w["id"].split(":")[1] for w in workers)  # the victim unregistered
    # it unregisters before closing its sources: let it exit, or the next ensure() counts it as alive
    victim_proc = next(p for p in fleet.procs["turns"] if p.pid == victim)
    await asyncio.to_thread(victim_proc.proc.wait, 30)


async def tool_worker_running(client: SmithClient, turn_id: str, step: int = 1, index: int = 0) -> int:
    """The pid of the tool worker that started a call (from its started marker)."""
    for _ in range(200):
        worker = await client.redis.get(client.keys.tool_started(turn_id, step, index))
        if worker:
            return int(worker.decode().split(":")[1])
        await asyncio.sleep(0.05)
    raise AssertionError("the tool call never started")


@pytest.mark.parametrize("tool, runs, expect_error", [("counted", 1, True), ("counted_idempotent", 2, False)])
async def test_kill_9_of_the_tool_worker(fleet_client, fleet, scenario, tool, runs, expect_error):
    await fleet.ensure(turns=2, tools=2)  # a second tool worker to re-run an idempotent call
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(Reply.tool_calls([(tool, {"label": label, "seconds": 4})]), Reply.text("after")))
    handle = await fleet_client.submit(f"{marker} go", conversation_id=f"conv-{key}", agent="durable")
    pid = await tool_worker_running(fleet_client, handle.turn_id)
    runs_key = f"{fleet_client.keys.prefix}:test:counted:{label}"
    for _ in range(200):  # kill it mid-call: after the tool has started its work
        if await fleet_client.redis.llen(runs_key):
            break
        await asyncio.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    assert (await handle.result(timeout=60)).content == "after"
    executions = await fleet_client.redis.lrange(runs_key, 0, -1)
    assert len(executions) == runs  # a call that may have had effects is never silently re-run
    tool_message = (await fleet_client.history(f"conv-{key}"))[2]
    assert tool_message.is_error is expect_error
    if expect_error:
        assert "interrupted" in tool_message.content
    else:
        assert tool_message.content == f"counted {label}"


async def test_kill_9_after_a_done_final_message_does_not_call_the_model_again(fleet_client, scenario, scripted_llm):
    """The `_done` final message (docs/architecture.md, Tool calls) is in the history before the turn completes, and a
    re-run after a crash there completes from it. The agent's on_message hook holds the turn after it."""
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2}), ("finish", {"answer": "all done"})]),
                                  Reply.text("never asked")))
    conv = f"conv-{key}"
    handle = await fleet_client.submit(f"{marker} finish", conversation_id=conv, agent="done_pause")
    pid = await worker_pid_running(fleet_client, handle.turn_id)
    async for event in handle.events():
        if event.type == "message" and event.data["message"].get("content") == "all done":
            break
    os.kill(pid, signal.SIGKILL)
    assert (await handle.result(timeout=60)).content == "all done"
    assert len(scripted_llm.requests_for(key)) == 1  # the re-run did not ask the model again
    events = [e async for e in handle.events()]
    assert_clean_stream(events)
    assert [e.data["attempt"] for e in events if e.type == "turn.resumed"] == [2]
    history = await fleet_client.history(conv)
    assert [m.role for m in history] == ["user", "assistant", "tool", "tool", "assistant"]
    assert history[-1] == AssistantMessage(content="all done")


async def test_a_paused_turn_survives_kill_9_of_every_worker(fleet_client, fleet, scenario):
    """Nothing of a paused turn lives in a worker (docs/architecture.md, Pausing for a person): every worker
    killed and started again, the approval resumes it; no tool ran twice."""
    label = uuid.uuid4().hex[:8]
    calls = [("guarded_delete", {"label": label, "target": "repo"}), ("counted", {"label": f"{label}-plain"})]
    key, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_gated", "call_plain"]), Reply.text("done")))
    with pytest.raises(TurnPausedError) as paused:
        await fleet_client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="guarded", timeout=30)
    for proc in fleet.procs["turns"] + fleet.procs["tools"]:
        proc.signal(signal.SIGKILL)
    async with asyncio.timeout(10):
        while any(proc.alive() for proc in fleet.procs["turns"] + fleet.procs["tools"]):
            await asyncio.sleep(0.05)
    await fleet.ensure(turns=2, tools=1)
    await fleet_client.approve(paused.value.turn_id, "call_gated")
    events = [e async for e in fleet_client.follow(paused.value.turn_id, timeout=60)]
    assert events[-1].final_message().content == "done"
    prefix = fleet_client.keys.prefix
    assert await fleet_client.redis.lrange(f"{prefix}:test:counted:{label}", 0, -1) == [b"repo"]
    assert await fleet_client.redis.lrange(f"{prefix}:test:counted:{label}-plain", 0, -1) == [b"run"]


async def paused_gated_turn(client: SmithClient, scenario, label: str, answer: Reply) -> tuple[str, int]:
    """A turn of the `guarded` agent paused on its gated call (``answer`` follows it): its id and the pid of
    the worker that ran it."""
    calls = [("guarded_delete", {"label": label, "target": "repo"})]
    key, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_gated"]), answer))
    with pytest.raises(TurnPausedError) as paused:
        await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="guarded", timeout=30)
    worker = (await client.turn(paused.value.turn_id).state())["worker"]
    return paused.value.turn_id, int(worker.split(":")[1])


async def test_a_paused_turn_resumes_on_the_other_turn_worker(fleet_client, fleet, scenario):
    """The worker that paused the turn is gone (kill -9): the approval resumes it on the other one."""
    label = uuid.uuid4().hex[:8]
    turn_id, paused_on = await paused_gated_turn(fleet_client, scenario, label, Reply.text("done"))
    [gone] = [proc for proc in fleet.procs["turns"] if proc.pid == paused_on]
    gone.signal(signal.SIGKILL)
    await fleet_client.approve(turn_id, "call_gated", {"label": label, "target": "edited"})
    assert (await fleet_client.turn(turn_id).result(timeout=60)).content == "done"
    resumed_on = int((await fleet_client.turn(turn_id).state())["worker"].split(":")[1])
    assert resumed_on != paused_on and resumed_on in [p.pid for p in fleet.procs["turns"]]
    prefix = fleet_client.keys.prefix
    assert await fleet_client.redis.lrange(f"{prefix}:test:counted:{label}", 0, -1) == [b"edited"]


async def test_kill_9_of_the_turn_worker_right_after_the_approval(fleet_client, fleet, scenario):
    """The worker that took the resumed turn dies while its answer streams: another attempt completes it;
    the approved tool ran once."""
    label = uuid.uuid4().hex[:8]
    slow = Reply.text("done", chunk_size=1, delay=0.5)  # the resumed step's answer streams for 2 s
    turn_id, _ = await paused_gated_turn(fleet_client, scenario, label, slow)
    await fleet_client.approve(turn_id, "call_gated")
    running_on = await worker_pid_running(fleet_client, turn_id)
    [taken] = [proc for proc in fleet.procs["turns"] if proc.pid == running_on]
    taken.signal(signal.SIGKILL)
    await fleet.ensure(turns=2, tools=1)
    assert (await fleet_client.turn(turn_id).result(timeout=90)).content == "done"
    prefix = fleet_client.keys.prefix
    assert await fleet_client.redis.lrange(f"{prefix}:test:counted:{label}", 0, -1) == [b"repo"]


async def test_kill_9_in_the_resumed_step_announces_the_decision_once(fleet_client, fleet, scenario):
    """The turn worker that took the resumed turn dies while the approved call runs (its ``tool_call.decided``
    is out, its append is not): the next attempt plans the step again, reuses the call's result and announces
    the decision no second time (docs/architecture.md, Pausing for a person)."""
    label = uuid.uuid4().hex[:8]
    calls = [("guarded_slow", {"label": label, "seconds": 3})]
    key, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_gated"]), Reply.text("done")))
    with pytest.raises(TurnPausedError) as paused:
        await fleet_client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="guarded_slow", timeout=30)
    turn_id = paused.value.turn_id
    await fleet_client.approve(turn_id, "call_gated")
    running_on = await worker_pid_running(fleet_client, turn_id)
    await wait_for(fleet_client, turn_id, "tool_call.decided")
    counted = f"{fleet_client.keys.prefix}:test:counted:{label}"
    async with asyncio.timeout(30):  # the approved call started on the tool worker
        while not await fleet_client.redis.lrange(counted, 0, -1):
            await asyncio.sleep(0.05)
    [taken] = [proc for proc in fleet.procs["turns"] if proc.pid == running_on]
    taken.signal(signal.SIGKILL)
    await fleet.ensure(turns=2, tools=1)
    handle = fleet_client.turn(turn_id)
    assert (await handle.result(timeout=90)).content == "done"
    assert await fleet_client.redis.lrange(counted, 0, -1) == [b"run"]  # the approved call ran once
    events = [e async for e in handle.events()]
    assert_clean_stream(events)
    assert [e.data["reason"] for e in events if e.type == "turn.resumed"] == ["decision", "restart"]
    decided = [(e.data["id"], e.data["action"]) for e in events if e.type == "tool_call.decided"]
    assert decided == [("call_gated", "approve")]
    assert [e.data["tool_call_id"] for e in events if e.type == "tool.result"] == ["call_gated"]
