"""Slot-pinned connections (``connect_redis`` / ``connect_sync_redis`` with ``cluster_key``) on a real Redis Cluster.

Three masters and three replicas (``start_redis_cluster``, one per module: starting it takes a few seconds). Every
key here carries the hash tag ``{smith}``, so all of them live in one slot, on one master at a time. Through the
asyncio and the blocking client: commands, a Lua script over several keys, ``MULTI`` / ``EXEC``, ``BLPOP`` and
pub/sub work and land on that slot's master; the slot moves to another master (``move_slot``) while writes run,
and no error surfaces and no acknowledged write is lost; then its master is SIGKILLed while writes run, and they
carry on on the promoted replica, with the caveat of Redis's asynchronous replication handled by ``WAIT`` (below).
The tests run in file order: the failover comes last (the killed master's shard keeps no replica).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import redis as sync_redis
from redis.crc import key_slot

from smith_client.connection import connect_redis, connect_sync_redis
from smith_worker.local.processes import RedisClusterRig, wait_until

pytestmark = pytest.mark.integration

TAG = "{smith}"
SLOT = key_slot(TAG.encode())
#: Keys the move test puts in the slot before it moves (several MIGRATE batches of the rig).
FILLER_KEYS = 250
#: Writes each writer makes at the least after the slot moved or the failover completed.
WRITES_AFTER = 10
#: Generous ceiling on a whole write loop, seconds (a failover on the rig takes ~2-5 s).
LOOP_CEILING = 90.0
#: Generous ceiling on the event the writers run through (a slot move, a failover), seconds.
EVENT_CEILING = 360.0
#: ``WAIT 1 <ms>`` after each write: the write reached the replica (or the master has none any more).
WAIT_MS = 100
#: Seconds between one loop's writes: unpaced, on a loaded machine the log list grew faster than MIGRATE could move
#: it (a slot move that never ended, seen twice in the whole suite).
PACE = 0.005

INCR_AND_PUSH = """
local n = redis.call('INCR', KEYS[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return n
"""


def another_node(cluster: RedisClusterRig, *not_these: int) -> int:
    """A live node (master or replica) other than ``not_these``: the URL given need not be the slot's master."""
    return next(port for port in cluster.live_ports() if port not in not_these)


def url(port: int) -> str:
    return f"redis://127.0.0.1:{port}/0"


# ---------------------------------------------------------------- what the pinned clients run


async def test_the_asyncio_client_runs_commands_scripts_multi_blpop_and_pubsub_on_the_slots_master(cluster):
    owner = cluster.slot_owner(SLOT)
    redis = connect_redis(url(another_node(cluster, owner)), cluster_key=TAG, max_connections=8)
    other = connect_sync_redis(url(another_node(cluster, owner)), cluster_key=TAG)
    try:
        await redis.set(f"{TAG}:a:plain", "v")
        script = redis.register_script(INCR_AND_PUSH)
        assert await script(keys=[f"{TAG}:a:n", f"{TAG}:a:log"], args=["s1"]) == 1
        async with redis.pipeline(transaction=True) as pipe:
            pipe.incr(f"{TAG}:a:n").rpush(f"{TAG}:a:log", "m1").get(f"{TAG}:a:plain")
            assert await pipe.execute() == [2, 2, b"v"]
        threading.Timer(0.3, other.rpush, (f"{TAG}:a:queue", "job")).start()
        assert await redis.blpop([f"{TAG}:a:queue"], timeout=4) == (f"{TAG}:a:queue".encode(), b"job")
        assert cluster.ask(owner, "GET", f"{TAG}:a:plain") == "v"  # on the master: another node would say MOVED
        assert cluster.ask(owner, "LRANGE", f"{TAG}:a:log", "0", "-1") == ["s1", "m1"]

        pubsub = redis.pubsub()
        await pubsub.subscribe(f"{TAG}:a:channel")
        assert pubsub.connection.port == owner
        other.publish(f"{TAG}:a:channel", "hello")
        assert (await next_message(pubsub))["data"] == b"hello"
        await pubsub.aclose()
    finally:
        await redis.aclose()
        other.close()


def test_the_blocking_client_runs_commands_scripts_multi_blpop_and_pubsub_on_the_slots_master(cluster):
    owner = cluster.slot_owner(SLOT)
    redis = connect_sync_redis(url(another_node(cluster, owner)), cluster_key=TAG, max_connections=8)
    other = connect_sync_redis(url(owner), cluster_key=TAG)
    try:
        redis.set(f"{TAG}:s:plain", "v")
        script = redis.register_script(INCR_AND_PUSH)
        assert script(keys=[f"{TAG}:s:n", f"{TAG}:s:log"], args=["s1"]) == 1
        with redis.pipeline(transaction=True) as pipe:
            pipe.incr(f"{TAG}:s:n").rpush(f"{TAG}:s:log", "m1").get(f"{TAG}:s:plain")
            assert pipe.execute() == [2, 2, b"v"]
        threading.Timer(0.3, other.rpush, (f"{TAG}:s:queue", "job")).start()
        assert redis.blpop([f"{TAG}:s:queue"], timeout=4) == (f"{TAG}:s:queue".encode(), b"job")
        assert cluster.ask(owner, "GET", f"{TAG}:s:plain") == "v"
        assert cluster.ask(owner, "LRANGE", f"{TAG}:s:log", "0", "-1") == ["s1", "m1"]

        pubsub = redis.pubsub()
        pubsub.subscribe(f"{TAG}:s:channel")
        assert pubsub.connection.port == owner
        other.publish(f"{TAG}:s:channel", "hello")
        deadline = time.monotonic() + 5
        message = None
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        assert message is not None and message["data"] == b"hello"
        pubsub.close()
    finally:
        redis.close()
        other.close()


async def next_message(pubsub, within: float = 5.0) -> dict:
    """The next published message on ``pubsub`` (subscription confirmations skipped), within ``within`` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        if message is not None:
            return message
    raise AssertionError(f"no message within {within:g} s")


# ---------------------------------------------------------------- write loops


@dataclass
class Writes:
    """One write loop's acknowledged writes to the keys of ``space``: each value pushed, whether ``WAIT`` saw it on a
    replica, and whether it was sent after the event under test (the slot's move, the failover) had completed."""

    space: str
    name: str
    acknowledged: list[str] = field(default_factory=list)
    replicated: set[str] = field(default_factory=set)
    after: set[str] = field(default_factory=set)
    error: BaseException | None = None


def writes_to_make(done: threading.Event, writes: Writes) -> Callable[[int], bool]:
    """Whether write ``i`` is still to be made: until the event is done and :data:`WRITES_AFTER` writes followed.
    Raises ``TimeoutError`` (the writer reports it: a loop never spins on forever) when the event is not done
    within :data:`EVENT_CEILING` seconds, or the writes after it are not made within :data:`LOOP_CEILING`: the
    event's own time is not the writes'."""
    deadline = time.monotonic() + EVENT_CEILING
    after_done: list[float] = []

    def more(_: int) -> bool:
        if done.is_set() and not after_done:
            after_done.append(time.monotonic() + LOOP_CEILING)
        if time.monotonic() > (after_done[0] if after_done else deadline):
            since = f"{LOOP_CEILING:g} s after the event" if after_done else f"{EVENT_CEILING:g} s, the event not done"
            raise TimeoutError(f"writer {writes.name} still writing after {since}")
        return not done.is_set() or len(writes.after) < WRITES_AFTER

    return more


async def async_writer(redis, writes: Writes, done: threading.Event, wait: bool) -> None:
    """Alternately a script and a ``MULTI`` (each an INCR and an RPUSH of a unique value), then ``WAIT`` if asked."""
    script = redis.register_script(INCR_AND_PUSH)
    counter, log = keys(writes.space)
    more = writes_to_make(done, writes)
    i = 0
    try:
        while more(i):
            value, after = f"{writes.name}{i}", done.is_set()
            if i % 2:
                await script(keys=[counter, log], args=[value])
            else:
                async with redis.pipeline(transaction=True) as pipe:
                    await pipe.incr(counter).rpush(log, value).execute()
            record(writes, value, after, await redis.wait(1, WAIT_MS) if wait else 0)
            i += 1
            await asyncio.sleep(PACE)
    except BaseException as exc:  # the test reports it: no write may fail
        writes.error = exc


def sync_writer(redis: sync_redis.Redis, writes: Writes, done: threading.Event, wait: bool) -> None:
    """:func:`async_writer` on the blocking client (in a thread)."""
    script = redis.register_script(INCR_AND_PUSH)
    counter, log = keys(writes.space)
    more = writes_to_make(done, writes)
    i = 0
    try:
        while more(i):
            value, after = f"{writes.name}{i}", done.is_set()
            if i % 2:
                script(keys=[counter, log], args=[value])
            else:
                with redis.pipeline(transaction=True) as pipe:
                    pipe.incr(counter).rpush(log, value).execute()
            record(writes, value, after, redis.wait(1, WAIT_MS) if wait else 0)
            i += 1
            time.sleep(PACE)
    except BaseException as exc:
        writes.error = exc


def keys(space: str) -> tuple[str, str]:
    """The write loops' counter and log in ``space``."""
    return f"{TAG}:{space}:count", f"{TAG}:{space}:log"


def record(writes: Writes, value: str, after: bool, replicas: int) -> None:
    writes.acknowledged.append(value)
    if replicas >= 1:
        writes.replicated.add(value)
    if after:
        writes.after.add(value)


async def run_writers(
    cluster: RedisClusterRig, node: int, space: str, event: Callable[[], object], wait: bool
) -> list[Writes]:
    """Two asyncio write loops (one client) and one blocking one into ``space``, on slot-pinned clients given node
    ``node``'s URL; ``event`` runs (in a thread) once they all write. Returns their writes once each made
    :data:`WRITES_AFTER` more after ``event`` returned."""
    redis = connect_redis(url(node), cluster_key=TAG, max_connections=8)
    blocking = connect_sync_redis(url(node), cluster_key=TAG, max_connections=4)
    done = threading.Event()
    loops = [Writes(space, "a"), Writes(space, "b"), Writes(space, "c")]
    try:
        tasks = [asyncio.create_task(async_writer(redis, writes, done, wait)) for writes in loops[:2]]
        tasks.append(asyncio.create_task(asyncio.to_thread(sync_writer, blocking, loops[2], done, wait)))
        deadline = time.monotonic() + LOOP_CEILING
        while any(len(writes.acknowledged) < 20 and not writes.error for writes in loops):  # all write first
            assert time.monotonic() < deadline, [(w.name, len(w.acknowledged), w.error) for w in loops]
            await asyncio.sleep(0.05)
        await asyncio.to_thread(event)
        done.set()
        await asyncio.wait_for(asyncio.gather(*tasks), LOOP_CEILING)
    finally:
        done.set()
        await redis.aclose()
        blocking.close()
    for writes in loops:
        assert writes.error is None, f"writer {writes.name} raised {writes.error!r}"
    return loops


def pushed(cluster: RedisClusterRig, space: str) -> list[str]:
    """Every value the writers' log in ``space`` holds, as the slot's master says."""
    return cluster.ask(cluster.slot_owner(SLOT), "LRANGE", keys(space)[1], "0", "-1")


# ---------------------------------------------------------------- the slot moves, then its master dies


async def test_the_slot_moves_to_another_master_under_writes_and_no_write_is_lost(cluster):
    source = cluster.slot_owner(SLOT)
    target = next(port for port in cluster.masters() if port != source)
    filler = connect_sync_redis(url(source), cluster_key=TAG)
    idle = connect_redis(url(source), cluster_key=TAG)  # learns the source now, sends nothing during the move
    try:
        filler.mset({f"{TAG}:fill:{i}": i for i in range(FILLER_KEYS)})
        assert await idle.get(f"{TAG}:fill:0") == b"0"
        loops = await run_writers(cluster, source, "move", lambda: cluster.move_slot(SLOT, target), wait=False)

        assert cluster.slot_owner(SLOT) == target
        assert int(cluster.ask(source, "CLUSTER", "COUNTKEYSINSLOT", str(SLOT))) == 0
        assert int(cluster.ask(target, "CLUSTER", "COUNTKEYSINSLOT", str(SLOT))) >= FILLER_KEYS
        acknowledged = [value for writes in loops for value in writes.acknowledged]
        assert sorted(pushed(cluster, "move")) == sorted(acknowledged)  # none lost, none twice: no redirected
        assert int(cluster.ask(target, "GET", keys("move")[0])) == len(acknowledged)  # command had run
        assert await idle.get(f"{TAG}:fill:1") == b"1"  # follows MOVED from the source
        assert idle.connection_pool.slot_master.address == ("127.0.0.1", target)
    finally:
        filler.close()
        await idle.aclose()


async def test_the_slots_master_dies_under_writes_and_they_carry_on_on_the_promoted_replica(cluster):
    master = cluster.slot_owner(SLOT)
    subscriber = connect_redis(url(master), cluster_key=TAG)  # the URL's node dies: the other nodes are asked
    pubsub = subscriber.pubsub()
    await pubsub.subscribe(f"{TAG}:f:channel")
    idle, idle_blocking = connect_redis(url(master), cluster_key=TAG), connect_sync_redis(url(master), cluster_key=TAG)
    await idle.set(f"{TAG}:f:idle", 0)  # their pooled connection is on the master when it dies
    idle_blocking.set(f"{TAG}:f:idle-blocking", 0)
    promoted: list[int] = []
    try:
        kill = lambda: promoted.append(cluster.kill_master(master))  # noqa: E731
        late = asyncio.create_task(commands_sent_while_down(cluster, master, idle, idle_blocking))
        loops = await run_writers(cluster, master, "failover", kill, wait=True)
        assert await late == [1, 1]

        assert cluster.slot_owner(SLOT) == promoted[0] != master
        log = pushed(cluster, "failover")
        for writes in loops:
            lost = set(writes.acknowledged) - set(log)
            # Redis replicates asynchronously: a write the master acknowledged just before its SIGKILL may not have
            # reached the replica. WAIT says which did; one write per loop at most can be in that window.
            assert not lost & (writes.replicated | writes.after), writes.name
            assert len(lost) <= 1, (writes.name, lost)
            # a write in flight at the kill is sent again: it may have run on the dead master and been replicated
            twice = [value for value in set(writes.acknowledged) if log.count(value) > 1]
            assert len(twice) <= 1, (writes.name, twice)

        sender = connect_sync_redis(url(promoted[0]), cluster_key=TAG)
        try:
            await resubscribed(pubsub, lambda: sender.publish(f"{TAG}:f:channel", "after"))
        finally:
            sender.close()
        assert pubsub.connection.port == promoted[0]
        # a client built now for the dead node's URL starts from the nodes this process learned, and finds the slot
        fresh = connect_redis(url(master), cluster_key=TAG)
        try:
            assert await fresh.ping()
        finally:
            await fresh.aclose()
    finally:
        await pubsub.aclose()
        await subscriber.aclose()
        await idle.aclose()
        idle_blocking.close()


async def commands_sent_while_down(cluster: RedisClusterRig, master: int, idle, idle_blocking) -> list[int]:
    """As soon as ``master`` is dead, a command from each idle client: its pooled connection is broken and the
    replica not yet promoted, so getting a connection fails until the failover (retried, as a command is)."""
    await asyncio.to_thread(wait_until, lambda: not cluster.nodes[master].alive(), LOOP_CEILING, "the kill", 0.01)
    blocking = asyncio.to_thread(idle_blocking.incr, f"{TAG}:f:idle-blocking")
    return await asyncio.gather(idle.incr(f"{TAG}:f:idle"), blocking)


async def resubscribed(pubsub, publish: Callable[[], object], within: float = 30.0) -> None:
    """Read ``pubsub`` as smith_client's fan-out does (a connection error: try again shortly) until a message that
    ``publish`` (called every round) sends arrives: the subscription followed the slot's master."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        publish()
        try:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
        except sync_redis.ConnectionError:
            await asyncio.sleep(0.2)
            continue
        if message is not None and message["data"] == b"after":
            return
    raise AssertionError(f"the subscription got no message within {within:g} s")
