"""``smith migrate-to-cluster``'s rules (smith_client/migration.py; docs/cluster.md, Moving a deployment from a single
Redis to a cluster): which keys a copy takes, what it reports as still there, and the copy itself (DUMP + RESTORE
with the TTL, names and a turn state's ``job_id`` renamed), on fakeredis. The real single Redis and cluster are
tests/integration/test_migrate_to_cluster.py's."""

from __future__ import annotations

import fakeredis
import orjson
import pytest

from smith_client.keys import Keys, now_ms
from smith_client.migration import OTHER_KIND, copy_keys, drain_blockers, key_kind, plan_copy
from tests.unit.test_cluster_keys import every_name

#: The members of Keys naming keys that a copy leaves out: the fleet writes them again, or they concern only live
#: processes (worker registrations and turn sets, MCP caches, abort requests, the queues and what is named after them).
LEFT_OUT = {
    "worker", "workers", "worker_turns", "mcp_tools", "abort_set", "turns_queue", "tools_queue", "wake_list",
    "job_requirements", "capability_sets", "capability_set", "capability_prefixes", "tenant_ring", "tenant_waiting",
    "tenant_running", "tenant_prefixes",
}  # fmt: skip
#: Members that name no key of the prefix: channels, job ids, arq's names, patterns, prefixes of names.
NOT_KEYS = {
    "worker_replies_channel", "turn_events_channel", "tool_aborts_channel", "control_channel", "turn_job_id",
    "tool_job_id", "turn_rerun_job_id", "turn_resume_job_id", "turn_park_job_id", "turn_kick_job_id",
    "tool_rerun_job_id", "arq_job", "arq_in_progress", "arq_result", "arq_retry", "arq_claim_prefixes",
    "all_pattern", "arq_pattern", "key_patterns", "acl_patterns", "fleet_key_patterns", "data_key_patterns",
    "cluster_slot_key", "key_prefix", "tenant_limits_prefix", "tenant_limits_affixes", "tenant_quota_prefix",
}  # fmt: skip


def test_every_key_name_has_a_kind_and_only_the_fleets_own_keys_are_left_out():
    keys = Keys("acme")
    names = every_name(keys)
    assert NOT_KEYS | LEFT_OUT <= set(names)  # the lists name members that exist
    for member, built in names.items():
        if member in NOT_KEYS:
            continue
        for name in built:
            kind, copied = key_kind(keys, name)
            assert kind != OTHER_KIND, (member, name)  # a new kind of key must be placed in one table or the other
            assert copied == (member not in LEFT_OUT), (member, name, kind)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("acme:conv:c1:history", "conversation histories"),
        ("acme:conv:c1:summary", "other conversation keys"),
        ("acme:conv:a:b:skills", "other conversation keys"),  # ids may hold ':'
        ("acme:turn:t1:state", "turn records"),
        ("acme:turn:t1:agent#1.0:history", "turn records"),
        ("acme:toolres:t1#1.0:2:0:published", "tool results"),
        ("acme:tree:t1:tokens", "agent tree counters"),
        ("acme:usage:29000000", "usage buckets"),
        ("acme:tenant:t-1:quota:86400", "tenant quota counters"),
        ("acme:tenant:t-1:limits", "tenant limits"),
        ("acme:llm-rate:e1", "model rate limits"),
        ("acme:shard-count", "count of shards"),
        ("acme:test:marker", OTHER_KIND),  # an application's own key under the prefix: copied
        ("acme:turns:wake:d1", "queues and their routing"),
        ("acme:tools:waiting:t-1", "queues and their routing"),
        ("acme:worker:h:1:turns:ab", "worker registrations"),
        ("acme:worker-turns:h:1:turns:ab", "worker turn sets"),
    ],
)
def test_kinds_of_sample_names(name, kind):
    assert key_kind(Keys("acme"), name)[0] == kind


def test_a_name_moves_from_the_prefix_to_its_hash_tag():
    plain, tagged = Keys("acme"), Keys("acme", cluster=True)
    assert plain.moved("acme:conv:c1:history", tagged) == "{acme}:conv:c1:history"
    assert plain.moved(plain.turn_job_id("t1"), tagged) == tagged.turn_job_id("t1")
    with pytest.raises(ValueError, match="no name of prefix"):
        plain.moved("acmex:conv:c1:history", tagged)


def servers() -> tuple[fakeredis.FakeAsyncRedis, fakeredis.FakeAsyncRedis]:
    """A source and a target: two fake Redis servers."""
    return (fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer()),
            fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer()))  # fmt: skip


async def test_a_drained_deployment_has_no_blocker_and_each_leftover_is_named():
    redis, _ = servers()
    keys = Keys("acme")
    assert await drain_blockers(redis, keys) == []
    await redis.zadd(keys.workers, {"h:7:turns:ab": now_ms() + 60_000, "h:8:turns:cd": now_ms() - 1})  # one expired
    await redis.set(keys.worker("h:7:turns:ab"), orjson.dumps({"id": "h:7:turns:ab", "queue": "turns", "pid": 7}))
    await redis.zadd(keys.tools_queue, {keys.tool_job_id("t1", 1, 0): now_ms() - 5})
    await redis.zadd(keys.turns_queue, {keys.turn_park_job_id("t2", 1): now_ms() + 60_000})  # deferred
    await redis.zadd(keys.running, {"t3": now_ms() - 1})  # an expired lease: a turn that waits for the sweeper
    await redis.zadd(keys.paused, {f"p{i}": float("inf") for i in range(12)})
    lines = await drain_blockers(redis, keys)
    assert lines[0].startswith("worker h:7:turns:ab on the turns queue")
    assert "h:8" not in "\n".join(lines)
    assert "acme:turns: 1 job(s): 0 queued (waiting for admission included), 0 running, 1 deferred" in lines
    assert "acme:tools: 1 job(s): 1 queued (waiting for admission included), 0 running, 0 deferred" in lines
    assert "1 running turn(s): t3" in lines
    assert [line for line in lines if line.startswith("12 paused turn(s): ")][0].endswith(" and 2 more")


async def test_the_copy_renames_keeps_ttls_and_leaves_the_fleets_keys_and_the_source_alone():
    source, target = servers()
    keys, tagged = Keys("acme"), Keys("acme", cluster=True)
    await source.rpush(keys.history("c1"), b'{"role":"user"}', b'{"role":"assistant"}')
    await source.expire(keys.history("c1"), 3600)
    state = keys.turn_state("t1")
    await source.hset(state, mapping={"status": "completed", "job_id": keys.turn_rerun_job_id("t1", 2)})
    await source.expire(state, 600)
    await source.hset(keys.turn_state("t2"), mapping={"status": "completed", "job_id": ""})
    await source.hset(keys.tenant_limits("t-1"), "weight", "2")  # no TTL: stays without
    await source.set(keys.worker("h:1:turns:ab"), b"{}", ex=15)
    await source.zadd(keys.capability_sets(keys.turns_queue), {"d1": 1})
    await source.set("acmex:conv:c1:history", b"another prefix")
    await source.set(keys.arq_result(keys.turn_job_id("t1")), b"arq's", ex=60)

    plan = await plan_copy(source, keys, target, tagged)
    assert {kind: len(names) for kind, names in plan.copied.items()} == {
        "conversation histories": 1, "turn records": 2, "tenant limits": 1}  # fmt: skip
    assert plan.left_out == {"worker registrations": 1, "queues and their routing": 1}
    assert plan.conflicts == []
    before = {name: await source.dump(name) for name in await source.keys("*")}

    report = await copy_keys(source, keys, target, tagged, plan)
    assert {kind: total.keys for kind, total in report.copied.items()} == {
        "conversation histories": 1, "turn records": 2, "tenant limits": 1}  # fmt: skip
    assert sorted(await target.keys("*")) == sorted(
        n.encode() for n in (tagged.history("c1"), tagged.turn_state("t1"), tagged.turn_state("t2"),
                             tagged.tenant_limits("t-1")))  # fmt: skip
    assert await target.lrange(tagged.history("c1"), 0, -1) == [b'{"role":"user"}', b'{"role":"assistant"}']
    assert 3500_000 < await target.pttl(tagged.history("c1")) <= 3600_000
    assert 500_000 < await target.pttl(tagged.turn_state("t1")) <= 600_000
    assert await target.ttl(tagged.tenant_limits("t-1")) == -1
    assert await target.hget(tagged.turn_state("t1"), "job_id") == tagged.turn_rerun_job_id("t1", 2).encode()
    assert await target.hget(tagged.turn_state("t2"), "job_id") == b""
    assert {name: await source.dump(name) for name in await source.keys("*")} == before  # the source is unchanged

    await target.hset(tagged.tenant_limits("t-1"), "weight", "5")
    again = await plan_copy(source, keys, target, tagged)  # a second run finds every key there
    assert sorted(again.conflicts) == sorted(n.decode() for n in await target.keys("*"))
    await copy_keys(source, keys, target, tagged, again, replace=True)
    assert await target.hget(tagged.tenant_limits("t-1"), "weight") == b"2"
