"""A worker's check of the deployment's count of shards at start (smith_worker/runtime.py
``WorkerRuntime._claim_shard_count``; docs/cluster.md, One count per deployment)."""

from __future__ import annotations

from types import SimpleNamespace

import fakeredis
import pytest

from smith_client import ConfigurationError
from smith_client.keys import now_ms
from smith_worker.config import Settings
from smith_worker.runtime import WorkerRuntime


def runtime(redis: fakeredis.FakeAsyncRedis, **settings: object) -> SimpleNamespace:
    config = Settings(prefix="p", **settings)  # type: ignore[arg-type]
    return SimpleNamespace(settings=config, fleet_keys=config.fleet_keys(), fleet_redis=redis)


async def test_a_sharded_worker_refused_by_an_unsharded_deployment_leaves_no_count():
    redis = fakeredis.FakeAsyncRedis()
    unsharded = runtime(redis)
    await redis.zadd(unsharded.fleet_keys.workers, {"host:1:turns:ab": now_ms() + 15_000})
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 2, but the workers of prefix 'p' run 1 shard"):
        await WorkerRuntime._claim_shard_count(runtime(redis, shards=2, shard=0))  # type: ignore[arg-type]
    assert await redis.get(unsharded.fleet_keys.shard_count) is None
    await WorkerRuntime._claim_shard_count(unsharded)  # type: ignore[arg-type]  # its own workers still start


async def test_a_sharded_worker_sets_the_count_and_another_count_is_refused():
    redis = fakeredis.FakeAsyncRedis()
    await WorkerRuntime._claim_shard_count(runtime(redis, shards=2, shard=1))  # type: ignore[arg-type]
    keys = runtime(redis).fleet_keys
    assert await redis.get(keys.shard_count) == b"2" and await redis.ttl(keys.shard_count) > 0
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 3"):
        await WorkerRuntime._claim_shard_count(runtime(redis, shards=3, shard=0))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 1"):
        await WorkerRuntime._claim_shard_count(runtime(redis))  # type: ignore[arg-type]
