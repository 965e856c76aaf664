"""``smith-worker`` serving every shard (smith_worker/shard_processes.py; docs/cluster.md, Shards): with
``SMITH_SHARDS=2`` and no ``SMITH_SHARD`` one command runs a worker process per shard, which serve turns of both
shards; the liveness check covers each; a child killed stops the set with its code; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from smith_client import ConfigurationError, ConflictError, ShardedSmithClient
from smith_client.keys import shard_of, shard_prefix
from smith_worker.testing import Reply, Script
from smith_worker.testing.workers import start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]

APP = "tests.support.app:app"
#: Ceiling on the set's stop, seconds: each child stops as a worker does (well under deploy/'s 30 s grace).
STOP_CEILING = 60.0


def children_of(pid: int) -> list[int]:
    return [int(child) for child in open(f"/proc/{pid}/task/{pid}/children").read().split()]


async def wait_exit(proc, ceiling: float) -> int:
    deadline = time.monotonic() + ceiling
    while proc.alive() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not proc.alive(), f"the shards' worker did not stop within {ceiling} s"
    return proc.returncode


@pytest.fixture
async def every_shard(redis_url, scripted_llm):
    prefix = f"every{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_SHARDS="2")
    env.pop("SMITH_SHARD", None)
    procs = start_workers(APP, env, ["turns", "tools"], prefix, log_dir=LOGS)
    try:
        for shard in range(2):
            await wait_for_workers(redis_url, shard_prefix(prefix, shard, 2), 2)
        yield prefix, env, procs
    finally:
        for proc in procs:
            proc.stop()


async def test_one_command_serves_every_shard_and_stops_them_together(redis_url, every_shard, scenario):
    prefix, env, (turns, tools) = every_shard
    assert len(children_of(turns.pid)) == 2 and len(children_of(tools.pid)) == 2
    conversations = {shard_of(c, 2): c for c in (f"conv-{uuid.uuid4().hex[:8]}" for _ in range(50))}
    async with ShardedSmithClient.from_url(redis_url, shards=2, prefix=prefix) as client:
        for shard in (0, 1):
            _, marker = scenario(Script(Reply.tool_calls([("add", {"a": shard, "b": 1})]), Reply.text(f"on {shard}")))
            reply = await client.send(f"{marker} go", conversation_id=conversations[shard], timeout=60)
            assert reply.content == f"on {shard}"

    status = subprocess.run([sys.executable, "-m", "smith_client.cli", "status"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    for shard in (0, 1):  # smith status shows each shard's queues and workers
        assert f"shard {shard} (prefix {prefix}:s{shard})" in status.stdout
        assert status.stdout.count(f":turns:") >= 2 and f"{prefix}:s{shard}:turns" in status.stdout
    # the workers keep the deployment's count of shards: a worker or a client with another refuses to start
    async with ShardedSmithClient.from_url(redis_url, shards=2, prefix=prefix) as client:
        assert await client.fleet.redis.get(client.fleet.keys.shard_count) == b"2"
    wrong = subprocess.run([sys.executable, "-m", "smith_worker", APP, "--queue", "turns"],
                           env={**env, "SMITH_SHARDS": "3", "SMITH_SHARD": "0"}, capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode == 1 and "SMITH_SHARDS is 3, but the workers of prefix" in wrong.stderr, wrong.stderr
    async with ShardedSmithClient.from_url(redis_url, shards=3, prefix=prefix) as client:
        with pytest.raises(ConfigurationError, match="SMITH_SHARDS is 3"):
            await client.send("hi", conversation_id="any")
    unsharded = {key: value for key, value in env.items() if key != "SMITH_SHARDS"}
    wrong = subprocess.run([sys.executable, "-m", "smith_worker", APP, "--queue", "turns"], env=unsharded,
                           capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 1 and "SMITH_SHARDS is 1, but the workers of prefix" in wrong.stderr, wrong.stderr

    # a caller-chosen turn id names one turn across the shards
    fresh = {shard_of(c, 2): c for c in (f"conv-{uuid.uuid4().hex[:8]}" for _ in range(50))}
    async with ShardedSmithClient.from_url(redis_url, shards=2, prefix=prefix) as client:
        _, marker = scenario(Script(Reply.text("once")))
        assert (await client.send(f"{marker} hi", conversation_id=fresh[0], turn_id="order-7")).content == "once"
        with pytest.raises(ConflictError, match="turn order-7 exists with a different request"):
            await client.send(f"{marker} hi", conversation_id=fresh[1], turn_id="order-7")

    check = [sys.executable, "-m", "smith_worker", "--check", "--queue", "turns"]
    probe = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert probe.stdout.count("alive") == 2  # each shard's turn worker

    # a child killed: the set stops, with its code (128 + SIGKILL), so the platform restarts it as one worker
    first, second = children_of(turns.pid)
    os.kill(first, signal.SIGKILL)
    assert await wait_exit(turns, STOP_CEILING) == 128 + signal.SIGKILL
    assert not os.path.exists(f"/proc/{second}") or open(f"/proc/{second}/stat").read().split()[2] == "Z"
    probe = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
    assert probe.returncode == 1  # no live turn worker for either shard

    # SIGTERM reaches every child, which stops as a worker does; the set exits 0
    children = children_of(tools.pid)
    tools.signal(signal.SIGTERM)
    assert await wait_exit(tools, STOP_CEILING) == 0
    assert all(not os.path.exists(f"/proc/{child}") for child in children)
