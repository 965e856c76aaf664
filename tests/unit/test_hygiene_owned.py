"""The hygiene report names the owner of the keys that have no TTL by design (the arq queues)."""

from __future__ import annotations

import fakeredis

from smith_client.hygiene import QUEUE_OWNER, TENANT_LIMITS_OWNER, keys_without_ttl, owned_keys_without_ttl
from smith_client.keys import Keys


async def test_a_queue_no_worker_serves_is_listed_with_its_owner_not_silently():
    redis, keys = fakeredis.FakeAsyncRedis(), Keys("hyg")
    assert await owned_keys_without_ttl(redis, keys) == {}
    await redis.zadd(keys.tools_queue, {"hyg:tool:t1:1:0": 1})  # a job that no tool worker takes
    await redis.zadd(f"{keys.prefix}:stray", {"x": 1})
    assert await owned_keys_without_ttl(redis, keys) == {keys.tools_queue: QUEUE_OWNER}
    assert await keys_without_ttl(redis, keys) == [f"{keys.prefix}:stray"]  # the queue is owned, the stray is not
    assert "arq" in QUEUE_OWNER and "never a TTL" in QUEUE_OWNER


async def test_a_tenants_limits_are_owned_by_the_operator_and_listed_with_that_owner():
    redis, keys = fakeredis.FakeAsyncRedis(), Keys("hyg")
    await redis.hset(keys.tenant_limits("acme"), "token_quota", "100")  # configuration: no TTL
    await redis.set(keys.tenant_quota("acme", 0), 5)  # a quota counter always has one: a stray without
    assert await owned_keys_without_ttl(redis, keys) == {keys.tenant_limits("acme"): TENANT_LIMITS_OWNER}
    assert await keys_without_ttl(redis, keys) == [keys.tenant_quota("acme", 0)]
