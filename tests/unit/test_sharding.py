"""Shards by conversation (docs/cluster.md, Shards): the shard of a conversation, the shards' prefixes, and how
ShardedSmithClient routes calls; the real cluster run is tests/integration/test_sharded_cluster.py."""

from __future__ import annotations

import uuid
from collections import Counter

import fakeredis
import pytest
from redis.cluster import key_slot

from smith_client import (
    ConfigurationError,
    ConflictError,
    InvalidRequestError,
    ShardedSmithClient,
    SmithClient,
    SyncShardedSmithClient,
    SyncSmithClient,
    TenantLimits,
    sharding,
)
from smith_client.keys import now_ms, shard_of, shard_prefix
from smith_client.sharding import check_shard_count
from smith_client.usage import AgentUsage


def test_a_conversations_shard_is_redis_clusters_crc16_of_its_id():
    for conversation in ("conv-1", "user:42", "é-unicode", "x" * 200):
        assert shard_of(conversation, 16384) == key_slot(conversation.encode())
    assert shard_of("conv-1", 1) == 0
    spread = Counter(shard_of(uuid.uuid4().hex, 4) for _ in range(4000))
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) > 800


def test_the_shards_prefixes():
    assert shard_prefix("smith", 0, 1) == "smith"  # one shard: the unsharded layout's names
    assert [shard_prefix("smith", k, 3) for k in range(3)] == ["smith:s0", "smith:s1", "smith:s2"]
    with pytest.raises(ValueError, match="shard 3 is not one of 0-2"):
        shard_prefix("smith", 3, 3)


def test_a_single_deployments_client_refuses_a_sharded_deployment(monkeypatch):
    with pytest.raises(ConfigurationError, match="ShardedSmithClient") as info:
        SmithClient.from_url("redis://127.0.0.1:1/0", shards=3)
    assert info.value.setting == "SMITH_SHARDS"
    monkeypatch.setenv("SMITH_SHARDS", "2")
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS=2"):
        SmithClient.from_url("redis://127.0.0.1:1/0")


async def test_from_url_builds_a_client_per_shard_from_the_environment(monkeypatch):
    monkeypatch.setenv("SMITH_SHARDS", "4")
    monkeypatch.setenv("SMITH_PREFIX", "acme")
    client = ShardedSmithClient.from_url("redis://127.0.0.1:1/0")
    try:
        assert client.shards == 4
        assert [c.keys.prefix for c in client.clients] == ["acme:s0", "acme:s1", "acme:s2", "acme:s3"]
    finally:
        await client.aclose()
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS must be a whole number of shards from 1 to 256"):
        ShardedSmithClient.from_url("redis://127.0.0.1:1/0", shards=0)
    with pytest.raises(ConfigurationError):
        ShardedSmithClient([])


@pytest.fixture
async def sharded():
    server = fakeredis.FakeServer()
    clients = [SmithClient(fakeredis.FakeAsyncRedis(server=server), prefix=shard_prefix("p", k, 3)) for k in range(3)]
    client = ShardedSmithClient(clients)
    yield client
    await client.aclose()


async def test_calls_by_conversation_go_to_its_shard(sharded):
    conversation = next(c for c in (uuid.uuid4().hex for _ in range(100)) if shard_of(c, 3) == 1)
    assert sharded.for_conversation(conversation) is sharded.clients[1]
    shard = sharded.clients[1]
    await shard.redis.set(shard.keys.conversation_agent(conversation), "billing")
    assert await sharded.conversation_agent(conversation) == "billing"
    assert await sharded.clients[0].conversation_agent(conversation) is None


async def test_a_turn_is_found_in_the_shard_that_has_it(sharded):
    keys = sharded.clients[2].keys
    await sharded.clients[2].redis.hset(keys.turn_state("t-1"), mapping={"status": "completed"})
    assert await sharded.for_turn("t-1") is sharded.clients[2]
    assert sharded._turn_shards["t-1"] == 2  # remembered: the next call asks no shard
    await sharded.clients[2].redis.delete(keys.turn_state("t-1"))
    assert await (await sharded.turn("t-1")).status() == "missing"
    assert await (await sharded.turn("unknown")).status() == "missing"  # shard 0 answers for an unknown turn
    assert "unknown" not in sharded._turn_shards


async def test_a_turn_sent_through_it_is_remembered_with_the_id_it_was_given(sharded, monkeypatch):
    monkeypatch.setattr(sharding, "REMEMBERED_TURNS", 2)
    for i in range(3):
        options = {"conversation_id": f"c{i}"}
        assert sharded._sending(options) is sharded.for_conversation(f"c{i}")
        assert sharded._turn_shards[options["turn_id"]] == shard_of(f"c{i}", 3)
    assert len(sharded._turn_shards) == 2  # the oldest forgotten


async def test_tenant_limits_go_to_every_shard(sharded):
    await sharded.set_tenant_limits("acme", TenantLimits(max_running=2))
    await sharded.update_tenant_limits("acme", weight=5)
    for client in sharded.clients:
        assert await client.tenant_limits("acme") == TenantLimits(max_running=2, weight=5)
    assert await sharded.tenant_limits("acme") == TenantLimits(max_running=2, weight=5)
    assert await sharded.clear_tenant_limits("acme")
    assert await sharded.tenant_limits("acme") == TenantLimits()


def test_usage_adds_up_over_the_shards():
    shards = [
        {"a": AgentUsage(requests=1, prompt=10, completion=2, total=12)},
        {},
        {"b": AgentUsage(requests=2, prompt=1, completion=1, total=2), "a": AgentUsage(requests=1, prompt=5, total=5)},
    ]
    assert sharding._summed(shards) == {
        "a": AgentUsage(requests=2, prompt=15, completion=2, total=17),
        "b": AgentUsage(requests=2, prompt=1, completion=1, total=2),
    }


@pytest.fixture
def sync_sharded():
    server = fakeredis.FakeServer()
    clients = [SyncSmithClient(fakeredis.FakeRedis(server=server), prefix=shard_prefix("p", k, 3)) for k in range(3)]
    client = SyncShardedSmithClient(clients)
    yield client
    client.close()


def test_the_blocking_client_routes_as_the_asyncio_one(sync_sharded):
    conversation = next(c for c in (uuid.uuid4().hex for _ in range(100)) if shard_of(c, 3) == 2)
    shard = sync_sharded.clients[2]
    shard.redis.set(shard.keys.conversation_agent(conversation), "billing")
    assert sync_sharded.conversation_agent(conversation) == "billing"
    shard.redis.hset(shard.keys.turn_state("t-2"), mapping={"status": "running"})
    assert sync_sharded.for_turn("t-2") is shard
    assert sync_sharded.turn("t-2").status() == "running"
    assert sync_sharded.turn("unknown").status() == "missing"
    sync_sharded.set_tenant_limits("acme", TenantLimits(weight=2))
    assert [c.tenant_limits("acme").weight for c in sync_sharded.clients] == [2, 2, 2]
    assert sync_sharded.clear_tenant_limits("acme")
    assert [c.tenant_limits("acme").weight for c in sync_sharded.clients] == [1, 1, 1]  # every shard's cleared


def test_tenants_usage_adds_up_over_the_shards():
    one = AgentUsage(requests=1, prompt=1, total=1)
    assert sharding._summed_by_tenant([{"t": {"a": one}}, {"t": {"a": one}, "u": {"b": one}}]) == {
        "t": {"a": AgentUsage(requests=2, prompt=2, total=2)},
        "u": {"b": one},
    }


def test_the_workers_count_of_shards_must_be_the_clients():
    check_shard_count(None, 3, "p")  # no worker set one yet
    check_shard_count(b"3", 3, "p")
    check_shard_count(None, 1, "p", unsharded_workers=2)
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 2, but the workers of prefix 'p' run 3 shard"):
        check_shard_count(b"3", 2, "p")
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 1, but the workers of prefix 'p' run 2 shard"):
        check_shard_count(b"2", 1, "p")  # an unsharded worker on a sharded deployment
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 2, but the workers of prefix 'p' run 1 shard"):
        check_shard_count(None, 2, "p", unsharded_workers=1)  # a sharded client of an unsharded deployment


@pytest.fixture
async def with_fleet():
    server = fakeredis.FakeServer()
    fleet = SmithClient(fakeredis.FakeAsyncRedis(server=server), prefix="p")
    clients = [SmithClient(fakeredis.FakeAsyncRedis(server=server), prefix=shard_prefix("p", k, 2)) for k in range(2)]
    async with ShardedSmithClient(clients, fleet) as sharded:
        yield sharded


async def test_a_caller_chosen_turn_id_names_one_turn_across_the_shards(with_fleet):
    conversations = {shard_of(c, 2): c for c in (uuid.uuid4().hex for _ in range(50))}
    first = await with_fleet._prepare("hi", {"conversation_id": conversations[0], "turn_id": "order-1"})
    assert first is with_fleet.clients[0]
    again = await with_fleet._prepare("hi", {"conversation_id": conversations[0], "turn_id": "order-1"})
    assert again is first  # the same request sent again: its shard's client answers as for any repeat
    with pytest.raises(ConflictError, match="turn order-1 exists with a different request"):
        await with_fleet._prepare("hi", {"conversation_id": conversations[1], "turn_id": "order-1"})
    with pytest.raises(InvalidRequestError):
        await with_fleet._prepare("hi", {"conversation_id": conversations[1], "turn_id": "{bad} id"})
    assert await with_fleet.fleet.redis.ttl(with_fleet.fleet.keys.turn_shard("order-1")) > 0


async def test_the_count_is_looked_at_until_a_worker_set_it(with_fleet):
    await with_fleet._prepare("hi", {"conversation_id": "c"})  # no worker yet: nothing to compare
    await with_fleet.fleet.redis.set(with_fleet.fleet.keys.shard_count, 3)
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 2"):
        await with_fleet._prepare("hi", {"conversation_id": "c"})


async def test_a_sharded_client_of_an_unsharded_deployment_sends_nothing(with_fleet):
    await with_fleet.fleet.redis.zadd(with_fleet.fleet.keys.workers, {"host:1:turns:ab": now_ms() + 15_000})
    with pytest.raises(ConfigurationError, match="run 1 shard"):
        await with_fleet._prepare("hi", {"conversation_id": "c"})


async def test_a_client_with_another_count_of_shards_sends_nothing():
    server = fakeredis.FakeServer()
    fleet = SmithClient(fakeredis.FakeAsyncRedis(server=server), prefix="p")
    await fleet.redis.set(fleet.keys.shard_count, 3)
    clients = [SmithClient(fakeredis.FakeAsyncRedis(server=server), prefix=shard_prefix("p", k, 2)) for k in range(2)]
    async with ShardedSmithClient(clients, fleet) as sharded:
        with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 2"):
            await sharded.submit("hi", conversation_id="c1")
        with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 2"):
            [event async for event in sharded.stream("hi", conversation_id="c1")]
    sync_fleet = SyncSmithClient(fakeredis.FakeRedis(server=server), prefix="p")
    sync_clients = [
        SyncSmithClient(fakeredis.FakeRedis(server=server), prefix=shard_prefix("p", k, 2)) for k in range(2)
    ]
    with SyncShardedSmithClient(sync_clients, sync_fleet) as sync_sharded, pytest.raises(ConfigurationError):
        sync_sharded.send("hi", conversation_id="c1")


async def test_a_refused_turn_id_is_looked_for_where_its_turn_is(with_fleet):
    conversations = {shard_of(c, 2): c for c in (uuid.uuid4().hex for _ in range(50))}
    await with_fleet._prepare("hi", {"conversation_id": conversations[1], "turn_id": "order-2"})
    winner = with_fleet.clients[1]
    await winner.redis.hset(winner.keys.turn_state("order-2"), mapping={"status": "completed"})
    with pytest.raises(ConflictError):
        await with_fleet._prepare("hi", {"conversation_id": conversations[0], "turn_id": "order-2"})
    assert await with_fleet.for_turn("order-2") is winner  # not the refused send's shard

    server = fakeredis.FakeServer()
    fleet = SyncSmithClient(fakeredis.FakeRedis(server=server), prefix="p")
    clients = [SyncSmithClient(fakeredis.FakeRedis(server=server), prefix=shard_prefix("p", k, 2)) for k in range(2)]
    with SyncShardedSmithClient(clients, fleet) as sync_sharded:
        sync_sharded._prepare("hi", {"conversation_id": conversations[1], "turn_id": "order-3"})
        clients[1].redis.hset(clients[1].keys.turn_state("order-3"), mapping={"status": "completed"})
        with pytest.raises(ConflictError):
            sync_sharded._prepare("hi", {"conversation_id": conversations[0], "turn_id": "order-3"})
        assert sync_sharded.for_turn("order-3") is clients[1]


async def test_a_request_the_client_refuses_claims_no_turn_id(with_fleet):
    conversations = {shard_of(c, 2): c for c in (uuid.uuid4().hex for _ in range(50))}
    with pytest.raises(InvalidRequestError):
        await with_fleet._prepare("hi", {"conversation_id": conversations[0], "turn_id": "t-9", "agent": "no such!"})
    with pytest.raises(InvalidRequestError):
        await with_fleet._prepare("", {"conversation_id": conversations[0], "turn_id": "t-9"})  # blank text
    assert await with_fleet.fleet.redis.get(with_fleet.fleet.keys.turn_shard("t-9")) is None
    assert await with_fleet._prepare("hi", {"conversation_id": conversations[1], "turn_id": "t-9"}) is (
        with_fleet.clients[1])
