"""The runtime on a real Redis Cluster (docs/cluster.md, One hash slot): 3 masters and 3 replicas
(``start_redis_cluster``), a turn worker pair plus a spare turn worker and a client with ``SMITH_REDIS_CLUSTER=1``.

Every key of the deployment carries its prefix as a hash tag, so it lives in one slot: text, tool, streamed,
cancelled, memory, skill and sub-agent turns run there, a turn worker killed with SIGKILL hands its turn over,
the slot's master killed under load fails over with every turn ending (completed, or a typed error) and none run
twice, and a reshard (``redis-cli --cluster reshard``) moving the slot to another master under 200 turns loses,
repeats and skips nothing.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from redis.cluster import key_slot
from redis.exceptions import NoPermissionError

from smith_client import SmithClient, SmithError, SyncSmithClient, TransportError
from smith_client.acl import tenant_acl_rules
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.local.processes import RedisClusterRig
from smith_worker.testing import Reply, Script
from tests.integration.test_crash_recovery import Fleet, assert_clean_stream, wait_for, worker_pid_running
from tests.integration.test_skills import RESEARCH

pytestmark = [pytest.mark.integration]

APP = "tests.support.cluster_app:app"
#: Ceiling on a turn's end, seconds: generous, a failover (~2-5 s) or a lease (10 s) may come first.
TURN_CEILING = 120.0


@pytest.fixture(scope="module")
async def fleet(cluster: RedisClusterRig, scripted_llm):
    fleet = Fleet(cluster.urls[0], scripted_llm.base_url, cluster=True, app=APP)
    # everyone connects through a master that does not hold the deployment's slot, which the failover test kills
    other = next(m for m in cluster.masters() if m != cluster.slot_owner(key_slot(fleet.prefix.encode())))
    fleet.redis_url = fleet.env["SMITH_REDIS_URL"] = f"redis://127.0.0.1:{other}/0"
    yield fleet
    fleet.stop()


@pytest.fixture
async def client(fleet):
    await fleet.ensure(turns=2, tools=1)
    async with fleet.client() as client:
        yield client


def slot_of(client: SmithClient) -> int:
    return key_slot(client.keys.key_prefix.encode())


async def ended(handle) -> str:
    """How a turn ended, riding out the client's own Redis errors during a failover: its final content, or the
    name of the typed error it failed with."""
    for _ in range(20):
        try:
            return (await handle.result(timeout=TURN_CEILING)).content
        except TransportError:  # the client's connection broke (failover): the turn goes on, ask again
            await asyncio.sleep(1.0)
        except SmithError as error:
            return type(error).__name__
    raise AssertionError(f"turn {handle.turn_id} never ended")


async def all_events(handle) -> list:
    return [e async for e in handle.events(timeout=TURN_CEILING)]


async def test_turns_of_every_kind_run_on_one_slot(client, scenario, scripted_llm, cluster):
    conv = f"conv-{uuid.uuid4().hex[:8]}"
    label = uuid.uuid4().hex[:8]
    text_key, text = scenario(Script(Reply.text("hello from the cluster", chunk_size=4)))
    _, tool = scenario(Script(Reply.tool_calls([("add", {"a": 20, "b": 22}), ("counted", {"label": label})]),
                              Reply.text("42")))
    streamed = [e async for e in client.stream(f"{text} hi", conversation_id=conv, timeout=60)]
    assert streamed[-1].type == "turn.completed"
    assert "".join(e.data["text"] for e in streamed if e.type == "token") == "hello from the cluster"
    assert_clean_stream(streamed)
    await client.send("again", conversation_id=conv, timeout=60)  # memory: the second turn sees the first
    assert [m["content"] for m in scripted_llm.requests_for(text_key)[1].body["messages"][1:]] == [
        f"{text} hi", "hello from the cluster", "again"]
    assert (await client.send(f"{tool} add", conversation_id=f"{conv}-tools", timeout=60)).content == "42"
    history = await client.history(f"{conv}-tools")
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, ToolMessage, AssistantMessage]
    assert history[2].content == "42"
    runs = await client.redis.lrange(f"{client.keys.key_prefix}:test:counted:{label}", 0, -1)
    assert runs == [b"run"]  # ran once, on the tool worker

    # every key of the deployment is in its tag's slot, on that slot's master; no other master holds a key
    owner = cluster.slot_owner(slot_of(client))
    assert int(cluster.ask(owner, "CLUSTER", "COUNTKEYSINSLOT", str(slot_of(client)))) > 0
    for master in cluster.masters():
        if master != owner:
            assert int(cluster.ask(master, "DBSIZE")) == 0, master


async def test_the_blocking_client_streams_a_turn_by_sharded_pub_sub(client, fleet, scenario, cluster):
    _, marker = scenario(Script(Reply.text("streamed to a thread", chunk_size=3)))

    def stream() -> list:
        with SyncSmithClient.from_url(fleet.redis_url, prefix=fleet.prefix, cluster=True) as sync_client:
            return list(sync_client.stream(f"{marker} hi", conversation_id=f"conv-{uuid.uuid4().hex[:8]}", timeout=60))

    before = cluster.ask(cluster.slot_owner(slot_of(client)), "INFO", "commandstats").get("cmdstat_ssubscribe", {})
    events = await asyncio.to_thread(stream)
    assert_clean_stream(events)
    assert "".join(e.data["text"] for e in events if e.type == "token") == "streamed to a thread"
    after = cluster.ask(cluster.slot_owner(slot_of(client)), "INFO", "commandstats")["cmdstat_ssubscribe"]
    assert int(after["calls"]) > int(before.get("calls", 0))  # its one connection subscribed with SSUBSCRIBE


async def test_a_skill_and_a_sub_agent(client, scenario, scripted_llm):
    conv = f"conv-{uuid.uuid4().hex[:8]}"
    research_key, research = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 1})]), Reply.text("found 2")))
    _, lead = scenario(Script(Reply.tool_calls([("researcher", {"task": f"{research} look"})]), Reply.text("done")))
    handle = await client.submit(f"{lead} plan", conversation_id=conv, agent="lead")
    assert (await handle.result(timeout=60)).content == "done"
    events = await all_events(handle)
    results = {(tuple(e.agent_path), e.data["name"]): e.data["content"] for e in events if e.type == "tool.result"}
    assert results[(("lead",), "researcher")] == "found 2"
    assert results[(("lead", "researcher"), "add")] == "2"
    assert RESEARCH in scripted_llm.requests_for(research_key)[0].body["messages"][0]["content"]  # the skill's prompt
    assert [e.seq for e in events] == list(range(1, len(events) + 1))


async def test_cancel_aborts_a_running_tool(client, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 20})]), Reply.text("never")))
    handle = await client.submit(f"{marker} wait", conversation_id=f"conv-{uuid.uuid4().hex[:8]}")
    marks = f"{client.keys.key_prefix}:test:slow:{handle.turn_id}"
    async with asyncio.timeout(30):
        while b"started" not in await client.redis.lrange(marks, 0, -1):
            await asyncio.sleep(0.05)
    await handle.cancel()
    events = await all_events(handle)
    assert events[-1].type == "turn.cancelled"
    async with asyncio.timeout(30):  # the tool job was aborted on the tool worker
        while b"cancelled" not in await client.redis.lrange(marks, 0, -1):
            await asyncio.sleep(0.05)


async def test_a_tenant_acl_user_sends_turns_and_reads_nothing_else(fleet, client, scenario, cluster):
    password = uuid.uuid4().hex
    for port in cluster.live_ports():  # ACL SETUSER is per node
        cluster.ask(port, "ACL", "SETUSER", "tenant", *tenant_acl_rules(fleet.prefix, password, cluster=True))
    url = fleet.redis_url.replace("redis://", f"redis://tenant:{password}@")
    _, marker = scenario(Script(Reply.text("hello tenant")))
    async with SmithClient.from_url(url, prefix=fleet.prefix, cluster=True) as tenant:
        assert (await tenant.send(f"{marker} hi", conversation_id=f"acl-{uuid.uuid4().hex[:6]}")).content \
            == "hello tenant"
        with pytest.raises(NoPermissionError):
            await tenant.redis.get("{other}:conv:c:history")


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, timeout=120, check=False)


async def test_a_mismatched_cluster_setting_fails_fast_and_says_so(fleet, redis_url):
    """The cluster's URL without SMITH_REDIS_CLUSTER, and SMITH_REDIS_CLUSTER with a single Redis's URL: the CLI and
    a worker end at once (never the retries of a Redis down), naming the setting."""
    without = {**fleet.env, "SMITH_REDIS_CLUSTER": ""}
    status = run(["-c", "from smith_client.cli import smith_main; smith_main()", "status"], without)
    assert status.returncode != 0 and "set SMITH_REDIS_CLUSTER=1" in status.stderr, status.stderr
    worker = run(["-m", "smith_worker", APP, "--queue", "turns"], without)
    assert worker.returncode == 1 and "set SMITH_REDIS_CLUSTER=1" in worker.stderr, worker.stderr[-2000:]
    single = {**fleet.env, "SMITH_REDIS_URL": redis_url}
    status = run(["-c", "from smith_client.cli import smith_main; smith_main()", "status"], single)
    assert status.returncode != 0 and "is not a Redis Cluster node" in status.stderr, status.stderr
    worker = run(["-m", "smith_worker", APP, "--queue", "turns"], single)
    assert worker.returncode == 1 and "is not a Redis Cluster node" in worker.stderr, worker.stderr[-2000:]


async def test_kill_9_of_the_turn_worker_resumes_the_turn(client, scenario):
    gate = threading.Event()
    _, marker = scenario(Script(Reply.text("resumed answer", chunk_size=3, gate=gate)))
    conv = f"conv-{uuid.uuid4().hex[:8]}"
    handle = await client.submit(f"{marker} talk", conversation_id=conv, agent="plain")
    pid = await worker_pid_running(client, handle.turn_id)
    await wait_for(client, handle.turn_id, "turn.started")
    os.kill(pid, signal.SIGKILL)
    gate.set()
    assert (await handle.result(timeout=TURN_CEILING)).content == "resumed answer"
    events = await all_events(handle)
    assert_clean_stream(events)
    assert [e.data["attempt"] for e in events if e.type == "turn.resumed"] == [2]
    assert [type(m) for m in await client.history(conv)] == [UserMessage, AssistantMessage]


async def load(client: SmithClient, scenario, turns: int) -> tuple[list, dict[str, str], dict[str, str]]:
    """Submit ``turns`` turns, one in four with a (not idempotent) counted tool call; each streams slowly enough
    to be in flight for a few seconds. Returns the handles, each tool turn's label and each turn's scenario key."""
    handles, labels, scenarios = [], {}, {}
    delay = 0.4  # seconds between chunks: each turn streams for 1.2 s at least
    for i in range(turns):
        label = uuid.uuid4().hex[:8]
        if i % 4 == 0:
            key, marker = scenario(Script(Reply.tool_calls([("counted", {"label": label, "seconds": 0.5})]),
                                        Reply.text(f"answer {i}", chunk_size=2, delay=delay)))
        else:
            key, marker = scenario(Script(Reply.text(f"answer {i}", chunk_size=2, delay=delay)))
        handle = await client.submit(f"{marker} go", conversation_id=f"load-{label}")
        handles.append(handle)
        scenarios[handle.turn_id] = key
        if i % 4 == 0:
            labels[handle.turn_id] = label
    return handles, labels, scenarios


async def unfinished(handles: list) -> int:
    """How many of these turns have not ended yet."""
    states = [await handle.state() for handle in handles]
    return sum(state.get("status") not in ("completed", "failed", "cancelled") for state in states)


async def assert_once_each(handles: list, labels: dict[str, str], outcomes: list[str]) -> None:
    """Every completed turn has one gap-free stream with one ``turn.completed``, and ran its tool once (the tool's
    marker is under the prefix of the client of the turn's handle: its shard's, for a sharded deployment)."""
    for handle, outcome in zip(handles, outcomes, strict=True):
        if outcome.startswith("answer"):
            events = await all_events(handle)
            assert [e.seq for e in events] == list(range(1, len(events) + 1)), handle.turn_id
            assert [e.type for e in events].count("turn.completed") == 1
            if handle.turn_id in labels:
                key = f"{handle.client.keys.key_prefix}:test:counted:{labels[handle.turn_id]}"
                assert await handle.client.redis.lrange(key, 0, -1) == [b"run"]


async def test_the_slots_master_killed_under_load_fails_over(client, scenario, cluster):
    handles, labels, _ = await load(client, scenario, 40)
    await asyncio.sleep(0.5)
    assert await unfinished(handles) > 0  # the master dies under load
    await asyncio.to_thread(cluster.kill_master, cluster.slot_owner(slot_of(client)))
    outcomes = await asyncio.gather(*(ended(h) for h in handles))
    # a turn whose last writes the failover lost (asynchronous replication) may end in a typed error
    assert all(o.startswith("answer") or o.endswith("Error") for o in outcomes), outcomes
    assert sum(o.startswith("answer") for o in outcomes) >= len(outcomes) // 2, outcomes
    await assert_once_each(handles, labels, outcomes)


async def test_a_reshard_under_200_turns_loses_and_repeats_nothing(client, scenario, cluster, scripted_llm):
    slot = slot_of(client)
    source = cluster.slot_owner(slot)
    target = next(m for m in cluster.masters() if m != source)
    # redis-cli --cluster reshard moves the source's slots in ascending order: the ones before ours first (no key
    # of the deployment), then, under load, ours
    owned = sorted(next(n for n in cluster.topology(source) if n.port == source).slots())
    if owned.index(slot):
        await asyncio.to_thread(cluster.reshard, source, target, owned.index(slot))
    assert cluster.slot_owner(slot) == source
    handles, labels, scenarios = await load(client, scenario, 200)
    await asyncio.sleep(0.5)
    await asyncio.to_thread(cluster.reshard, source, target, 1)
    assert await unfinished(handles) > 0  # the slot moved under load
    outcomes = await asyncio.gather(*(ended(h) for h in handles))
    assert [o for o in outcomes if not o.startswith("answer")] == []
    assert sorted(outcomes) == sorted(f"answer {i}" for i in range(200))
    assert cluster.slot_owner(slot) == target
    await assert_once_each(handles, labels, outcomes)
    # no model call was made twice: one per text turn, two per tool turn
    assert {h.turn_id: scripted_llm.attempts(scenarios[h.turn_id]) for h in handles} == {
        h.turn_id: 2 if h.turn_id in labels else 1 for h in handles}
