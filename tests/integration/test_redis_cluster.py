"""redis-py's Redis Cluster client (``connect_redis_cluster`` / ``connect_sync_redis_cluster``) on a real cluster.

Three masters and three replicas (``start_redis_cluster``, real ``redis-server`` processes): keys land on every
master and read back, from the asyncio and the blocking cluster clients; a Lua script runs over keys sharing one
hash tag (the layout docs/cluster.md proposes) and is refused over keys of two slots; slots move with ``redis-cli
--cluster reshard`` under a write load with no acknowledged write lost; a master is SIGKILLed and the client
reaches its keys again once the replica has taken over. The runtime itself refuses cluster mode (unit tests); the
slot-pinned clients it is to run on: test_redis_slot_pool.py.
"""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest
from redis.cluster import key_slot
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from smith_client.connection import connect_redis_cluster, connect_sync_redis_cluster
from smith_worker.local.processes import RedisClusterRig

pytestmark = pytest.mark.integration

#: Generous ceiling on the client's recovery after a master's SIGKILL, seconds (the rig's failover takes ~2-5 s).
RECOVERY_CEILING = 60.0
#: Slots the reshard test moves (of the source master's ~5461).
MOVED_SLOTS = 1000
#: Writes the reshard test makes at the least, during and after the move.
MIN_WRITES = 2000


@pytest.fixture
async def client(cluster: RedisClusterRig):
    redis = connect_redis_cluster(cluster.urls[0])
    yield redis
    await redis.aclose()


def owned_slots(cluster: RedisClusterRig, port: int) -> set[int]:
    """The hash slots the master on ``port`` serves, as it says."""
    return next(node for node in cluster.topology(port) if node.port == port).slots()


async def test_keys_land_on_every_master_and_read_back(cluster, client):
    keys = [f"spread:{i}" for i in range(60)]
    for key in keys:
        await client.set(key, key.upper())
    assert [await client.get(key) for key in keys] == [key.upper().encode() for key in keys]
    masters = cluster.masters()
    assert len(masters) == 3
    for port in masters:  # each master holds some of them
        assert any(key_slot(key.encode()) in owned_slots(cluster, port) for key in keys), port
        assert cluster.ask(port, "DBSIZE") > 0

    sync = connect_sync_redis_cluster(cluster.urls[-1])  # any node will do, a replica too
    try:
        assert [sync.get(key) for key in keys] == [key.upper().encode() for key in keys]
        sync.set("spread:sync", "blocking")
        assert await client.get("spread:sync") == b"blocking"
    finally:
        sync.close()


SCRIPT = """
local n = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return {n, redis.call('LLEN', KEYS[2])}
"""


async def test_a_script_runs_over_keys_sharing_a_hash_tag(client):
    keys = ["{s17}:turn:t1:seq", "{s17}:turn:t1:events"]
    assert key_slot(keys[0].encode()) == key_slot(keys[1].encode()) == key_slot(b"s17")
    script = client.register_script(SCRIPT)
    assert await script(keys=keys, args=["a"]) == [1, 1]
    assert await script(keys=keys, args=["b"]) == [2, 2]
    assert await client.lrange(keys[1], 0, -1) == [b"a", b"b"]
    untagged = ["turn:t1:seq", "turn:t1:events"]
    assert key_slot(untagged[0].encode()) != key_slot(untagged[1].encode())
    with pytest.raises(RedisClusterException, match="same key slot"):  # refused before Redis would (CROSSSLOT)
        await script(keys=untagged, args=["c"])


async def test_slots_move_under_writes_and_no_acknowledged_write_is_lost(cluster, client):
    source, target = cluster.masters()[:2]
    before = owned_slots(cluster, target)
    acknowledged: dict[str, str] = {}
    moving = True

    async def write() -> None:
        for i in itertools.count():
            if not moving and i >= MIN_WRITES:
                return
            key, value = f"load:{i}", f"v{i}"
            await client.set(key, value)
            acknowledged[key] = value

    writer = asyncio.create_task(write())
    await asyncio.sleep(0.2)  # the load is running before the move starts
    try:
        await asyncio.to_thread(cluster.reshard, source, target, MOVED_SLOTS)
    finally:
        moving = False
    await asyncio.wait_for(writer, 120)

    moved = owned_slots(cluster, target) - before
    assert len(moved) == MOVED_SLOTS and not moved & owned_slots(cluster, source)
    assert any(key_slot(key.encode()) in moved for key in acknowledged)  # the load did write into moving slots
    values = await asyncio.gather(*(client.get(key) for key in acknowledged))
    lost = [key for key, value in zip(acknowledged, values, strict=True) if value != acknowledged[key].encode()]
    assert lost == [] and len(acknowledged) >= MIN_WRITES


async def test_the_client_reaches_a_killed_masters_keys_after_the_failover(cluster, client):
    key = "{s17}:failover"
    await client.set(key, 0)
    master = next(port for port in cluster.masters() if key_slot(key.encode()) in owned_slots(cluster, port))
    started = time.monotonic()
    failover = asyncio.create_task(asyncio.to_thread(cluster.kill_master, master))  # SIGKILL, then the replica
    failures = acknowledged = 0
    recovered = False
    while not recovered:  # until a command sent after the replica's promotion succeeds
        promoted_before = failover.done()
        try:  # a command meeting the dead master retries (bounded); past that it fails, and the next one tries again
            acknowledged = await client.incr(key)
            recovered = promoted_before
        except RedisError:
            failures += 1
            await asyncio.sleep(0.2)
        assert time.monotonic() - started < RECOVERY_CEILING, f"no recovery after {failures} failed commands"
    promoted = await failover
    assert promoted != master and key_slot(key.encode()) in owned_slots(cluster, promoted)
    assert int(await client.get(key)) == acknowledged  # the new master acknowledged the last one
    with pytest.raises(ResponseError, match="MOVED"):  # the promoted replica answers for the slot; others redirect
        cluster.ask(next(p for p in cluster.masters() if p != promoted), "GET", key)
