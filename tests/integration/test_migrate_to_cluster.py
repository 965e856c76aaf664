"""``smith migrate-to-cluster`` (docs/cluster.md, Moving a deployment from a single Redis to a cluster), run as a
user runs it, from a real single redis-server to a real 3-master Redis Cluster (``start_redis_cluster``).

A deployment runs a text turn with a skill active, a tool turn and a tenant's limits on the single Redis with a
real worker pair, which then stops; the command copies it, and a worker pair started on the cluster with
``SMITH_REDIS_CLUSTER=1`` carries on: the conversation goes on with its history and skill, the old turns' results
and events are read from the cluster, TTLs are kept. The refusals: workers registered (on either side), a turn
queued, a key on the cluster already (``--replace`` overwrites it); ``--dry-run`` copies nothing.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from dataclasses import dataclass

import pytest

from smith_client import SmithClient
from smith_client.migration import key_kind
from smith_worker.local.processes import RedisClusterRig
from smith_worker.testing import Reply, Script, worker_env, worker_pair
from tests.conftest import LOGS
from tests.integration.test_skills import RESEARCH, per_turn

pytestmark = [pytest.mark.integration]

#: The app both fleets serve: its tools and skill work on either Redis (tests/support/cluster_app.py).
APP = "tests.support.cluster_app:app"


def migrate(source_url: str, prefix: str, cluster: RedisClusterRig, *options: str) -> subprocess.CompletedProcess:
    """``smith migrate-to-cluster`` from ``source_url`` to the cluster's first node, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()", "migrate-to-cluster",
         "--redis-url", source_url, "--prefix", prefix, "--to-url", cluster.urls[0], *options],
        capture_output=True, text=True, timeout=60)  # fmt: skip


def on_cluster(cluster: RedisClusterRig, prefix: str) -> SmithClient:
    return SmithClient.from_url(cluster.urls[0], prefix=prefix, cluster=True)


async def names(client: SmithClient) -> set[str]:
    """Every key of the client's prefix (on a cluster: all in the tag's slot, on its master)."""
    return {raw.decode() async for raw in client.redis.scan_iter(match=client.keys.all_pattern, count=1000)}


@dataclass
class Deployment:
    """What the deployment did on the single Redis before it stopped."""

    prefix: str
    conversation: str
    text_scenario: str
    tool_turn: str
    #: ``smith migrate-to-cluster`` run while its workers were registered.
    refused: subprocess.CompletedProcess


@pytest.fixture(scope="module")
async def deployment(redis_url, scripted_llm, cluster):
    prefix = f"mig{uuid.uuid4().hex[:6]}"
    text_key, tool_key = uuid.uuid4().hex[:12], uuid.uuid4().hex[:12]
    scripted_llm.add_scenario(text_key, per_turn(hi=Script(Reply.text("first answer")),
                                                 move=Script(Reply.text("after the move"))))  # fmt: skip
    scripted_llm.add_scenario(tool_key, Script(Reply.tool_calls([("add", {"a": 20, "b": 22})]), Reply.text("42")))
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_REDIS_CLUSTER="")
    conversation = f"conv-{text_key}"
    async with worker_pair(APP, redis_url, prefix, env, log_dir=LOGS), SmithClient.from_url(
            redis_url, prefix=prefix, cluster=False) as client:  # fmt: skip
        await client.activate_skill(conversation, "research")
        assert (await client.send(f"[[scenario:{text_key}]] hi", conversation_id=conversation,
                                  timeout=60)).content == "first answer"  # fmt: skip
        tool_turn = await client.submit(f"[[scenario:{tool_key}]] add", conversation_id=f"conv-{tool_key}")
        assert (await tool_turn.result(timeout=60)).content == "42"
        await client.update_tenant_limits("acme", weight=2.0)  # operator configuration: a key without a TTL
        refused = migrate(redis_url, prefix, cluster)
    return Deployment(prefix, conversation, text_key, tool_turn.turn_id, refused)


async def test_refused_while_workers_are_registered(deployment):
    assert deployment.refused.returncode == 1
    err = deployment.refused.stderr
    assert f"smith: the fleet of prefix {deployment.prefix!r} is not stopped and drained; still there:" in err
    assert "on the turns queue" in err and "on the tools queue" in err  # one line per live worker
    assert "stop every worker" in err
    assert deployment.refused.stdout == ""  # refused before planning anything


async def test_refused_with_a_queued_turn_or_a_key_on_the_cluster_a_dry_run_copies_nothing(redis_url, cluster):
    prefix = f"mig{uuid.uuid4().hex[:6]}"  # no worker serves it: a turn sent waits in the queue
    async with SmithClient.from_url(redis_url, prefix=prefix, cluster=False) as client, \
            on_cluster(cluster, prefix) as target:  # fmt: skip
        waiting = await client.submit("nobody answers", conversation_id="c-queued")
        queued = migrate(redis_url, prefix, cluster)
        assert queued.returncode == 1, queued
        assert f"{prefix}:turns: 1 job(s): 1 queued (waiting for admission included), 0 running, 0 deferred" in \
            queued.stderr  # fmt: skip
        assert await waiting.cancel() == "cancelled_queued"  # the turn ends: nothing waits any more
        source_names = await names(client)
        assert client.keys.turn_state(waiting.turn_id) in source_names

        # a key to copy is on the cluster already: refused, nothing copied, and the key is left as it was
        taken = target.keys.turn_state(waiting.turn_id)
        await target.redis.set(taken, b"someone else's")
        conflict = migrate(redis_url, prefix, cluster)
        assert conflict.returncode == 1, conflict
        assert f"smith: nothing copied: 1 key(s) exist on the target already: {taken}" in conflict.stderr
        assert "--replace overwrites them" in conflict.stderr
        assert await names(target) == {taken} and await target.redis.get(taken) == b"someone else's"

        dry = migrate(redis_url, prefix, cluster, "--dry-run", "--replace")
        assert dry.returncode == 0, dry
        assert "turn records" in dry.stdout and "dry run: nothing copied" in dry.stdout
        assert await names(target) == {taken} and await target.redis.get(taken) == b"someone else's"

        replaced = migrate(redis_url, prefix, cluster, "--replace")
        assert replaced.returncode == 0, replaced
        assert (await target.turn(waiting.turn_id).state())["status"] == "cancelled"
        assert taken in await names(target)
        assert await names(client) == source_names  # the source is never changed


async def test_the_deployment_goes_on_on_the_cluster(deployment, redis_url, cluster, scripted_llm):
    prefix = deployment.prefix
    async with SmithClient.from_url(redis_url, prefix=prefix, cluster=False) as source:
        before = {name: await source.redis.pttl(name) for name in await names(source)}
        usage_before = await source.usage()
        copied = migrate(redis_url, prefix, cluster)
        assert copied.returncode == 0, copied
        kept = {name: ttl for name, ttl in before.items() if key_kind(source.keys, name)[1]}
        assert kept.keys() <= await names(source)  # the source keeps its keys
    out = copied.stdout
    assert f"under the hash tag {{{prefix}}}" in out and "copied " in out and "conversation histories" in out
    assert "are left as they were: delete them once the fleet runs on the cluster" in out

    async with on_cluster(cluster, prefix) as client:
        # exactly the deployment's data, renamed; the fleet's own keys are left out; TTLs kept (none stays none)
        assert any(not key_kind(source.keys, name)[1] for name in before)  # there were registrations, queues…
        assert await names(client) == {source.keys.moved(name, client.keys) for name in kept}
        for name, ttl in kept.items():
            now = await client.redis.pttl(source.keys.moved(name, client.keys))
            assert (now == ttl == -1) or (0 <= ttl - now < 30_000), (name, ttl, now)
        assert await client.redis.ttl(client.keys.tenant_limits("acme")) == -1
        state = await client.turn(deployment.tool_turn).state()
        assert state["job_id"] == client.keys.turn_job_id(deployment.tool_turn)  # the record names the new job id
        assert await client.usage() == usage_before

        # a fleet on the cluster: the old turn's result and events are there, the conversation goes on
        env = worker_env(cluster.urls[0], prefix, scripted_llm.base_url, SMITH_REDIS_CLUSTER="1")
        async with worker_pair(APP, cluster.urls[0], prefix, env, log_dir=LOGS):
            old = client.turn(deployment.tool_turn)
            assert (await old.result(timeout=10)).content == "42"
            events = [e async for e in client.follow(deployment.tool_turn, timeout=10)]
            assert events[-1].type == "turn.completed" and [e.seq for e in events] == list(range(1, len(events) + 1))
            assert [e.data["content"] for e in events if e.type == "tool.result"] == ["42"]

            reply = await client.send("and after the move", conversation_id=deployment.conversation, timeout=60)
            assert reply.content == "after the move"
            running = migrate(redis_url, prefix, cluster, "--replace")  # the cluster's fleet runs: refused
            assert running.returncode == 1 and "  on the cluster: worker " in running.stderr, running
        request = scripted_llm.requests_for(deployment.text_scenario)[1].body["messages"]
        assert request[0]["content"] == f"You are a test agent.\n\n{RESEARCH}"  # the skill is still active
        assert [m["content"] for m in request[1:]] == [
            f"[[scenario:{deployment.text_scenario}]] hi", "first answer", "and after the move"]
        assert [m.content for m in await client.history(deployment.conversation)][-1] == "after the move"
