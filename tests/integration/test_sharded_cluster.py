"""A deployment sharded by conversation on a real Redis Cluster (docs/cluster.md, Shards): 3 masters and 3
replicas, ``SMITH_SHARDS=3`` with each shard's slot on its own master, a turn worker and a tool worker per shard
(``SMITH_SHARD``), and a :class:`ShardedSmithClient`.

Turns of many conversations run on all three masters at once, each conversation's keys on its shard's master
only; a client that did not send a turn finds its shard to follow it; tenant limits reach every shard; the model
endpoint's rate limit stays one fleet-wide key; one shard's master killed under load fails over while the other
shards' turns go on, every turn ending (completed, or a typed error for one whose last writes the failover lost) and
none run twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import uuid

import pytest
from redis.cluster import key_slot

from smith_client import ShardedSmithClient, SyncShardedSmithClient, TenantLimits
from smith_client.keys import Keys, shard_of, shard_prefix
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.local.processes import RedisClusterRig
from smith_worker.testing import Reply, Script
from smith_worker.testing.workers import start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS
from tests.integration.test_cluster_runtime import assert_once_each, ended, load, unfinished
from tests.integration.test_crash_recovery import assert_clean_stream, wait_for, worker_pid_running
from tests.integration.test_skills import RESEARCH

pytestmark = [pytest.mark.integration]

APP = "tests.support.cluster_app:app"
SHARDS = 3
#: The model endpoint's fleet-wide rate (requests per minute): its 60 s burst allows the module's ~50 model calls at
#: once, and each call's half second keeps the endpoint's rate-limit key for as long as the calls take.
RPM = 120
#: Ceiling on the whole batch of turns, seconds (they take a few on an idle machine).
BATCH_CEILING = 180.0


def shard_slot(prefix: str, shard: int) -> int:
    return key_slot(Keys(shard_prefix(prefix, shard, SHARDS), cluster=True).key_prefix.encode())


@pytest.fixture(scope="module")
def procs():
    """The module's worker processes, stopped at its end (tests may add some)."""
    started: list = []
    yield started
    for proc in started:
        proc.stop()


def start_shard_workers(cluster: RedisClusterRig, prefix: str, llm_url: str, shard: int, queues: list[str]) -> list:
    env = worker_env(cluster.urls[0], prefix, llm_url, SMITH_REDIS_CLUSTER="1", SMITH_SHARDS=str(SHARDS),
                     SMITH_SHARD=str(shard), SMITH_LLM_RPM=str(RPM))
    return start_workers(APP, env, queues, f"{prefix}-s{shard}-{uuid.uuid4().hex[:4]}", log_dir=LOGS)


@pytest.fixture(scope="module")
async def deployment(cluster: RedisClusterRig, scripted_llm, procs):
    """The prefix of a 3-shard deployment whose shards' slots are on the 3 masters, one each, with a turn worker and a
    tool worker per shard."""
    prefix = f"sharded{uuid.uuid4().hex[:6]}"
    for shard, master in enumerate(cluster.masters()):
        if cluster.slot_owner(shard_slot(prefix, shard)) != master:
            cluster.move_slot(shard_slot(prefix, shard), master)  # the slot is empty: a move of its ownership
    for shard in range(SHARDS):
        procs += start_shard_workers(cluster, prefix, scripted_llm.base_url, shard, ["turns", "tools"])
    for shard in range(SHARDS):
        await wait_for_workers(cluster.urls[0], shard_prefix(prefix, shard, SHARDS), 2, cluster=True)
    return prefix


@pytest.fixture
async def client(cluster, deployment):
    async with ShardedSmithClient.from_url(cluster.urls[0], shards=SHARDS, prefix=deployment, cluster=True) as client:
        yield client


def commands_processed(cluster: RedisClusterRig, port: int) -> int:
    return int(cluster.ask(port, "INFO", "stats")["total_commands_processed"])


async def test_conversations_spread_over_every_master(client, cluster, deployment, scenario):
    conversations = [f"conv-{uuid.uuid4().hex[:8]}" for _ in range(30)]
    assert {shard_of(conv, SHARDS) for conv in conversations} == set(range(SHARDS))  # 30 ids reach every shard
    masters = cluster.masters()
    before = {port: commands_processed(cluster, port) for port in masters}
    scripts = []
    for i, _ in enumerate(conversations):
        if i % 2:
            scripts.append(scenario(Script(Reply.tool_calls([("add", {"a": i, "b": 1})]), Reply.text(f"sum {i + 1}"))))
        else:
            scripts.append(scenario(Script(Reply.text(f"answer {i}", chunk_size=3))))
    async with asyncio.timeout(BATCH_CEILING):
        replies = await asyncio.gather(*(
            client.send(f"{marker} go", conversation_id=conv, timeout=BATCH_CEILING)
            for conv, (_, marker) in zip(conversations, scripts, strict=True)))
    assert [r.content for r in replies] == [f"sum {i + 1}" if i % 2 else f"answer {i}" for i in range(30)]

    # every master ran turns; each conversation's keys are on its shard's master and nowhere else
    for port in masters:
        assert commands_processed(cluster, port) - before[port] > 10 * 30 // SHARDS, port
    for i, conv in enumerate(conversations):
        shard = shard_of(conv, SHARDS)
        history = await client.for_conversation(conv).history(conv)
        tool_turn = [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
        assert [type(m) for m in history] == (tool_turn if i % 2 else [UserMessage, AssistantMessage])
        key = client.for_conversation(conv).keys.history(conv)
        owner = cluster.slot_owner(shard_slot(deployment, shard))
        assert masters[shard] == owner
        for port in masters:
            held = cluster.ask(port, "KEYS", f"*:conv:{conv}:*")
            assert (key in held) if port == owner else held == [], (conv, port, held)


def bus_publishes(cluster: RedisClusterRig) -> int:
    """PUBLISH messages the cluster's nodes sent each other over the bus so far."""
    total = 0
    for port in cluster.live_ports():
        info = dict(line.split(":", 1) for line in cluster.ask(port, "CLUSTER", "INFO").splitlines() if ":" in line)
        total += int(info.get("cluster_stats_messages_publish_sent", 0))
    return total


async def test_a_turns_events_go_by_sharded_pub_sub_and_never_cross_the_bus(client, cluster, deployment, scenario):
    conv = f"conv-{uuid.uuid4().hex[:8]}"
    master = cluster.slot_owner(shard_slot(deployment, shard_of(conv, SHARDS)))
    spublished = int(cluster.ask(master, "INFO", "commandstats").get("cmdstat_spublish", {}).get("calls", 0))
    bus = bus_publishes(cluster)
    _, marker = scenario(Script(Reply.text("one two three four five six", chunk_size=3)))
    events = [e async for e in client.stream(f"{marker} hi", conversation_id=conv, timeout=60)]
    assert_clean_stream(events)
    assert "".join(e.data["text"] for e in events if e.type == "token") == "one two three four five six"
    stats = cluster.ask(master, "INFO", "commandstats")
    assert int(stats["cmdstat_spublish"]["calls"]) - spublished >= len(events)
    assert bus_publishes(cluster) == bus  # classic PUBLISH would have sent each event to the 5 other nodes


async def test_a_client_that_did_not_send_a_turn_follows_it_on_its_shard(client, cluster, deployment, scenario):
    conv = next(c for c in (f"conv-{uuid.uuid4().hex[:8]}" for _ in range(100)) if shard_of(c, SHARDS) == 2)
    _, marker = scenario(Script(Reply.text("found on shard two", chunk_size=4)))
    handle = await client.submit(f"{marker} hi", conversation_id=conv)
    await handle.result(timeout=60)
    async with ShardedSmithClient.from_url(cluster.urls[1], shards=SHARDS, prefix=deployment, cluster=True) as other:
        events = [e async for e in other.follow(handle.turn_id, timeout=60)]
        assert_clean_stream(events)
        assert (await (await other.turn(handle.turn_id)).status()) == "completed"
        assert (await other.for_turn(handle.turn_id)) is other.clients[2]
        # a turn no shard has answers as an unknown turn does
        assert (await (await other.turn("no-such-turn")).status()) == "missing"


def conversation_in(shard: int) -> str:
    return next(c for c in (f"conv-{uuid.uuid4().hex[:8]}" for _ in range(100)) if shard_of(c, SHARDS) == shard)


async def test_a_sub_agent_with_a_skill_and_a_cancel_each_stay_in_their_shard(client, scenario, scripted_llm):
    research_key, research = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 1})]), Reply.text("found 2")))
    _, lead = scenario(Script(Reply.tool_calls([("researcher", {"task": f"{research} look"})]), Reply.text("done")))
    handle = await client.submit(f"{lead} plan", conversation_id=conversation_in(1), agent="lead")
    assert handle.client is client.clients[1]
    assert (await handle.result(timeout=60)).content == "done"
    events = [e async for e in client.follow(handle.turn_id, timeout=60)]
    results = {(tuple(e.agent_path), e.data["name"]): e.data["content"] for e in events if e.type == "tool.result"}
    assert results[(("lead",), "researcher")] == "found 2" and results[(("lead", "researcher"), "add")] == "2"
    assert RESEARCH in scripted_llm.requests_for(research_key)[0].body["messages"][0]["content"]  # the skill's prompt

    _, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 20})]), Reply.text("never")))
    slow = await client.submit(f"{marker} wait", conversation_id=conversation_in(2))
    marks = f"{slow.client.keys.key_prefix}:test:slow:{slow.turn_id}"  # the tool worker of shard 2 writes them
    async with asyncio.timeout(30):
        while b"started" not in await slow.client.redis.lrange(marks, 0, -1):
            await asyncio.sleep(0.05)
    assert await (await client.turn(slow.turn_id)).cancel() == "cancelling"
    assert [e async for e in client.follow(slow.turn_id, timeout=60)][-1].type == "turn.cancelled"
    async with asyncio.timeout(30):  # the tool job was aborted on shard 2's tool worker
        while b"cancelled" not in await slow.client.redis.lrange(marks, 0, -1):
            await asyncio.sleep(0.05)


async def test_the_blocking_sharded_client_streams_sends_and_follows(cluster, deployment, scenario):
    _, streamed = scenario(Script(Reply.text("streamed to a thread", chunk_size=3)))
    _, sent = scenario(Script(Reply.tool_calls([("add", {"a": 40, "b": 2})]), Reply.text("42")))
    conversations = [conversation_in(0), conversation_in(2)]

    def use() -> tuple[list, str, list]:
        with SyncShardedSmithClient.from_url(cluster.urls[2], shards=SHARDS, prefix=deployment, cluster=True) as sync:
            events = list(sync.stream(f"{streamed} hi", conversation_id=conversations[0], timeout=60))
            reply = sync.send(f"{sent} add", conversation_id=conversations[1], timeout=60)
            turn_id = events[0].turn_id
        with SyncShardedSmithClient.from_url(cluster.urls[1], shards=SHARDS, prefix=deployment, cluster=True) as other:
            return events, reply.content, list(other.follow(turn_id, timeout=60))

    events, reply, followed = await asyncio.to_thread(use)
    assert_clean_stream(events)
    assert "".join(e.data["text"] for e in events if e.type == "token") == "streamed to a thread"
    assert reply == "42"
    assert [(e.seq, e.type) for e in followed] == [(e.seq, e.type) for e in events]


async def test_tenant_limits_reach_every_shard_and_the_rate_limit_is_fleet_wide(client, cluster, deployment, scenario):
    tenant = f"acme{uuid.uuid4().hex[:4]}"
    await client.set_tenant_limits(tenant, TenantLimits(weight=3, max_running=4))
    assert [await shard.tenant_limits(tenant) for shard in client.clients] == [
        TenantLimits(weight=3, max_running=4)] * SHARDS
    assert (await client.tenant_limits(tenant)).max_running == 4
    assert len(await client.tenant_quota(tenant)) == SHARDS
    assert await client.clear_tenant_limits(tenant)
    assert not await client.clear_tenant_limits(tenant)

    # the workers of every shard count their model calls in one rate-limit key, the prefix's own
    conversations = {shard_of(c, SHARDS): c for c in (f"conv-{uuid.uuid4().hex[:8]}" for _ in range(100))}
    for shard in range(SHARDS):
        _, marker = scenario(Script(Reply.text("counted")))
        await client.send(f"{marker} hi", conversation_id=conversations[shard], timeout=60)
    rate_keys = [key for port in cluster.masters()
                 for key in cluster.ask(port, "KEYS", f"*{deployment}*llm-rate*")]
    assert rate_keys and all(key.startswith(f"{{{deployment}}}:llm-rate:") for key in rate_keys), rate_keys
    assert len(set(rate_keys)) == 1


async def test_kill_9_of_a_shards_turn_worker_resumes_the_turn_on_that_shards_other(client, cluster, deployment,
                                                                                      scenario, scripted_llm, procs):
    procs += start_shard_workers(cluster, deployment, scripted_llm.base_url, 0, ["turns"])
    await wait_for_workers(cluster.urls[0], shard_prefix(deployment, 0, SHARDS), 3, cluster=True)
    gate = threading.Event()
    _, marker = scenario(Script(Reply.text("resumed answer", chunk_size=3, gate=gate)))
    conv = conversation_in(0)
    handle = await client.submit(f"{marker} talk", conversation_id=conv, agent="plain")
    pid = await worker_pid_running(handle.client, handle.turn_id)
    await wait_for(handle.client, handle.turn_id, "turn.started")
    os.kill(pid, signal.SIGKILL)
    gate.set()
    assert (await handle.result(timeout=120)).content == "resumed answer"
    events = [e async for e in client.follow(handle.turn_id, timeout=60)]
    assert_clean_stream(events)
    assert [e.data["attempt"] for e in events if e.type == "turn.resumed"] == [2]
    assert [type(m) for m in await client.history(conv)] == [UserMessage, AssistantMessage]


async def test_a_reshard_of_a_shard_under_200_turns_loses_and_repeats_nothing(client, cluster, deployment, scenario,
                                                                              scripted_llm):
    slot = shard_slot(deployment, 1)
    source = cluster.slot_owner(slot)
    target = next(m for m in cluster.masters() if m != source)
    # redis-cli --cluster reshard moves the source's slots in ascending order: those before the shard's first (none
    # is another shard's: each is on its own master), then, under load, the shard's
    owned = sorted(next(n for n in cluster.topology(source) if n.port == source).slots())
    if owned[-1] == slot:
        # moved last, the source would keep no slot, and Redis makes a master left without one a replica of the
        # node that took its last (cluster-allow-replica-migration): give it a later one first, an empty slot
        await asyncio.to_thread(cluster.move_slot, next(s for s in range(16383, slot, -1) if s not in {
            shard_slot(deployment, k) for k in range(SHARDS)}), source)
    if owned.index(slot):
        await asyncio.to_thread(cluster.reshard, source, target, owned.index(slot))
    assert cluster.slot_owner(slot) == source
    handles, labels, scenarios = await load(client, scenario, 200)
    assert sum(h.client is client.clients[1] for h in handles) > 30
    await asyncio.sleep(0.5)
    await asyncio.to_thread(cluster.reshard, source, target, 1)
    assert await unfinished(handles) > 0  # the slot moved under load
    outcomes = await asyncio.gather(*(ended(h) for h in handles))
    assert sorted(outcomes) == sorted(f"answer {i}" for i in range(200))
    assert cluster.slot_owner(slot) == target
    await assert_once_each(handles, labels, outcomes)
    assert {h.turn_id: scripted_llm.attempts(scenarios[h.turn_id]) for h in handles} == {
        h.turn_id: 2 if h.turn_id in labels else 1 for h in handles}  # no model call made twice
    await asyncio.to_thread(cluster.move_slot, slot, source)  # back on its own master for the next test


async def test_a_stream_goes_on_gap_free_when_its_shards_slot_moves(client, cluster, deployment, scenario, caplog):
    conv = next(c for c in (f"conv-{uuid.uuid4().hex[:8]}" for _ in range(100)) if shard_of(c, SHARDS) == 2)
    slot = shard_slot(deployment, 2)
    home = cluster.slot_owner(slot)
    elsewhere = next(m for m in cluster.masters() if m != home)
    _, marker = scenario(Script(Reply.text("a slow answer that streams on while its slot moves", chunk_size=2,
                                           delay=0.1)))
    events = []
    with caplog.at_level("WARNING", logger="agent_smith"):
        async for event in client.stream(f"{marker} hi", conversation_id=conv, timeout=120):
            events.append(event)
            if len(events) == 3:
                await asyncio.to_thread(cluster.move_slot, slot, elsewhere)
        await asyncio.to_thread(cluster.move_slot, slot, home)  # back where the next test expects it
    assert_clean_stream(events)
    assert "".join(e.data["text"] for e in events if e.type == "token") == (
        "a slow answer that streams on while its slot moves")
    # Redis ended the channel's sharded subscription when the slot left its master: the fan-out subscribed again
    assert "Redis ended the subscription" in caplog.text


async def test_one_shards_master_killed_under_load_fails_over_and_the_others_go_on(client, cluster, deployment,
                                                                                   scenario):
    handles, labels, _ = await load(client, scenario, 45)
    by_shard = {k: [h for h in handles if h.client is client.clients[k]] for k in range(SHARDS)}
    assert all(len(shard) >= 5 for shard in by_shard.values()), {k: len(v) for k, v in by_shard.items()}
    await asyncio.sleep(0.5)
    assert await unfinished(handles) > 0  # the master dies under load
    await asyncio.to_thread(cluster.kill_master, cluster.slot_owner(shard_slot(deployment, 1)))
    outcomes = dict(zip((h.turn_id for h in handles), await asyncio.gather(*(ended(h) for h in handles)), strict=True))
    assert all(o.startswith("answer") or o.endswith("Error") for o in outcomes.values()), outcomes
    for shard in (0, 2):  # the shards on the masters that stayed lost nothing
        assert all(outcomes[h.turn_id].startswith("answer") for h in by_shard[shard]), outcomes
    assert sum(outcomes[h.turn_id].startswith("answer") for h in by_shard[1]) >= len(by_shard[1]) // 2, outcomes
    await assert_once_each(handles, labels, [outcomes[h.turn_id] for h in handles])
