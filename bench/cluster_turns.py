"""Agent turns on Redis Cluster in one-slot mode and sharded by conversation, beside a single Redis: turns/s, Redis
commands per turn and each node's CPU per turn, one slot on 1, 2 and 3 masters, and 2 and 3 shards on as many
masters (docs/cluster.md, One hash slot and Shards; docs/capacity.md, Redis Cluster).

Starts, side by side, a single private ``redis-server`` (the anchor), another with a replica (``replicaof``: it
feeds a replication stream, as every cluster master does) and Redis Clusters of ``--masters`` masters (default 1, 2
and 3; ``start_redis_cluster``: one replica per master, on loopback), the scripted chat-completions server at zero
latency (``bench/llm_server.py``, its own process) and, for each of them, the same fleet under a prefix of its own:
:data:`TURN_WORKERS` turn workers and :data:`TOOL_WORKERS` tool worker serving ``bench.app:app`` (on a cluster:
``SMITH_REDIS_CLUSTER=1`` and the URL of its first node, so every key carries the prefix as a hash tag and lives in
one slot, on one master). The sharded deployments (``--sharded``, default 2 and 3) have as many shards as masters
(``SMITH_SHARDS``), shard k's slot moved to master k (``RedisClusterRig.move_slot``, as
tests/integration/test_sharded_cluster.py does), a fleet per shard of :data:`SHARD_TURN_WORKERS` turn worker and
:data:`SHARD_TOOL_WORKERS` tool worker (``SMITH_SHARD``: the fewest that serve a shard, 4 and 6 processes against
the others' 3) and a :class:`ShardedSmithClient`; every turn is a conversation of its own, so the turns spread over
the shards by ``shard_of`` (CRC16 mod N), and the bench waits for every shard's queue. Each deployment runs
``--warm`` turns, then its idle background is measured for ``--idle`` seconds (every node's ``INFO``, a turn
worker's ``/metrics`` per shard scraped as while waiting for turns). Then, ``--repeat`` times, the deployments
taking turns so that a noisy moment of the machine does not land on one of them, ``--turns`` turns are submitted at
once (one client, :data:`BATCH` at a time), half text turns (one model call), half one-tool turns (``add(1, 2)`` on
the tool worker, two model calls), and the bench waits until the turns queue is empty (each shard's, a turn worker's
``/metrics``, ``smith_queue_length``, scraped every :data:`SCRAPE_INTERVAL` s), then reads every turn's status. Per
run:

* turns/s: the turns ÷ the time from the first submit to the last end; how many completed, and how many ran
  more than one attempt (a re-run after a lost lease, on an overloaded machine);
* Redis commands per turn: ``INFO commandstats`` calls (the commands Lua scripts run included, the bench's own
  ``INFO`` left out) summed over the masters, less their idle rate over the run's span;
* each node's commands, CPU ms (``INFO cpu``, ``used_cpu_sys + used_cpu_user``), the pub/sub messages sent and
  received over the cluster bus (``CLUSTER INFO``), classic ``PUBLISH`` (which a cluster broadcasts to every node)
  and sharded ``SPUBLISH`` (``publishshard``: to the slot's replicas only; a turn's events on a cluster) apart, and
  KiB written to the bus (:func:`counters`) per turn, each less its idle rate, and its CPU over the run as a share
  of one core (not less anything); the busiest node's ms per turn give the turns/s it would allow at 100 % of its
  core.

Last, each deployment runs ``--monitored`` turns of the same mix with ``redis-cli monitor`` on the node holding its
keys, or each shard's master (bench/distributed.py's ``Monitor``, summed): the commands the processes sent (top
level, ``MULTI``/``EXEC`` apart) and those run inside scripts, per turn, less the idle rate MONITOR saw over
``--idle`` seconds.

Figures are medians over the runs; the table puts each cluster beside the single Redis, and a line per sharded
deployment puts its busiest master's CPU per turn, and the turns/s it would allow at 100 % of its core, beside the
one-slot cluster of as many masters and the single Redis. ``--json FILE`` writes them (``runs``: every run's
figures).

Usage: ``.venv/bin/python bench/cluster_turns.py [--turns 1000] [--repeat 3] [--masters 1,2,3] [--sharded 2,3]
[--json FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import redis
from redis.cluster import key_slot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from bench.distributed import Monitor  # noqa: E402
from bench.in_flight import Worker, llm_server, statuses  # noqa: E402
from bench.llm_server import PROMPTS  # noqa: E402
from bench.report import median_figures, ratio  # noqa: E402
from smith_client import ShardedSmithClient, SmithClient  # noqa: E402
from smith_client.keys import Keys, shard_of, shard_prefix  # noqa: E402
from smith_worker import testing  # noqa: E402
from smith_worker.local.processes import (  # noqa: E402
    ManagedProcess,
    RedisClusterRig,
    free_port,
    start_redis_cluster,
    start_redis_server,
    wait_until,
)
from smith_worker.ops.open_files import raise_open_files_limit  # noqa: E402

APP = "bench.app:app"
#: The fleet of every deployment (bench/in_flight.py's saturation part, one turn worker less for the tool worker).
TURN_WORKERS, TOOL_WORKERS = 2, 1
#: The fleet of each shard of a sharded deployment: the fewest that serve a shard (its turns and its tool jobs), so
#: 4 and 6 processes for 2 and 3 shards against the one-slot deployments' 3.
SHARD_TURN_WORKERS, SHARD_TOOL_WORKERS = 1, 1
#: Seconds between two reads of the first turn worker's ``/metrics`` while turns run (the resolution of the end time).
SCRAPE_INTERVAL = 0.05
#: Turns submitted at once (``asyncio.gather``), as bench/in_flight.py.
BATCH = 500
#: Seconds a run's turns may take to end before the bench gives up (generous: ~5 s at the default size).
RUN_TIMEOUT = 300.0
#: The turn mix, in order: prompts of bench/llm_server.py.
MIX = ("text", "tool")
#: The pub/sub messages a node counts on the cluster bus (``CLUSTER INFO`` ``cluster_stats_messages_<kind>_<way>``):
#: classic ``PUBLISH`` (to every node) and sharded ``SPUBLISH`` (``publishshard``: to the slot's replicas; Redis 7).
BUS, WAYS = ("publish", "publishshard"), ("sent", "received")
#: The highest turns/s of the clusters over the lowest, at or below which they count as equal on this noisy machine.
SAME_RATE = 1.25


@dataclass
class Node:
    """A Redis node of a deployment: its port, its role, ``label`` (``redis``; ``master A`` holds the slot), its pid."""

    port: int
    label: str
    master: bool
    pid: int


@dataclass
class Deployment:
    """A Redis (single or cluster), its fleet and a client: what :func:`deployment` started."""

    name: str
    masters: int  # 0: a single redis-server
    nodes: list[Node]
    workers: list[Worker]  # a turn worker of each shard, shard k's at index k: its /metrics reads the shard's queue
    client: SmithClient | ShardedSmithClient
    clients: list[SmithClient]  # shard k's at index k (one without shards)
    idle: dict[int, dict[str, float]]  # node port → its idle counters' rates per second


def counters(node: Node) -> dict[str, float]:
    """The node's counters now: commands run (``INFO`` left out), CPU seconds, the pub/sub messages sent and received
    over the cluster bus (0 off a cluster; ``CLUSTER INFO``, whose ``cluster_stats_messages_<type>_sent`` and
    ``_received`` appear once a message of the type has gone): ``bus_publish`` the classic ``PUBLISH`` ones (type
    ``publish``), ``bus_publishshard`` the sharded ``SPUBLISH`` ones (type ``publishshard``, Redis 7), bytes written
    to the bus (``/proc/PID/io`` ``wchar`` less ``INFO stats`` ``total_net_output_bytes``, the replies and the
    replication stream, as bench/cluster_pubsub.py counts them; 0 off a cluster), and the time (monotonic)."""
    client = redis.Redis(port=node.port, decode_responses=True)
    try:
        info = client.info("all")
        bus = client.execute_command("CLUSTER", "INFO") if info["cluster_enabled"] else ""
    finally:
        client.close()
    calls = {k: int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_") and isinstance(v, dict)}
    stats = dict(line.split(":", 1) for line in bus.splitlines() if ":" in line)
    io = dict(line.split(": ") for line in Path(f"/proc/{node.pid}/io").read_text().splitlines())
    return {
        "commands": sum(calls.values()) - calls.get("cmdstat_info", 0) - calls.get("cmdstat_cluster|info", 0),
        "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        **{f"bus_{kind}": sum(int(stats.get(f"cluster_stats_messages_{kind}_{w}", 0)) for w in WAYS) for kind in BUS},
        "bus_bytes": int(io["wchar"]) - int(info["total_net_output_bytes"]) if bus else 0,
        "at": time.monotonic(),
    }


def snapshot(nodes: list[Node]) -> dict[int, dict[str, float]]:
    """:func:`counters` of every node."""
    return {node.port: counters(node) for node in nodes}


def cluster_nodes(rig: RedisClusterRig, slots: list[int]) -> list[Node]:
    """The rig's nodes, labelled: ``master A`` serves ``slots[0]``, ``replica A`` follows it, then the masters of
    the next slots (B, C…), then the other masters by port."""
    owners = list(dict.fromkeys(rig.slot_owner(slot) for slot in slots))
    masters = [*owners, *sorted(port for port in rig.masters() if port not in owners)]
    ids = {rig.node_id(port): port for port in masters}
    nodes = [Node(port, f"master {chr(65 + i)}", True, rig.nodes[port].pid) for i, port in enumerate(masters)]
    for view in rig.topology(owners[0]):
        if view.master_id in ids:
            letter = chr(65 + masters.index(ids[view.master_id]))
            nodes.append(Node(view.port, f"replica {letter}", False, rig.nodes[view.port].pid))
    return sorted(nodes, key=lambda node: (node.label[-1], not node.master))


class Layout(NamedTuple):
    """A Redis to measure: a single redis-server (``masters`` 0), with a replica or not, or a cluster of ``masters``
    masters, each with one replica, holding a deployment of ``shards`` shards (1: one slot; more: shard k's slot
    on master k)."""

    masters: int
    replica: bool
    shards: int = 1

    @property
    def name(self) -> str:
        if self.shards > 1:
            return f"cluster, {self.masters} masters, {self.shards} shards"
        if self.masters:
            return f"cluster, {self.masters} master{'s' * (self.masters > 1)}"
        return "single + 1 replica" if self.replica else "single redis-server"

    @property
    def fleet(self) -> tuple[int, int]:
        """(turn workers, tool workers) of each shard."""
        return (SHARD_TURN_WORKERS, SHARD_TOOL_WORKERS) if self.shards > 1 else (TURN_WORKERS, TOOL_WORKERS)


def port_of(url: str) -> int:
    """The port of a ``redis://127.0.0.1:PORT/0`` URL."""
    return int(url.rsplit(":", 1)[1].split("/")[0])


def replica_linked(port: int) -> bool:
    """True when the replica on ``port`` has its link to its master up."""
    client = redis.Redis(port=port, decode_responses=True)
    try:
        return client.info("replication").get("master_link_status") == "up"
    finally:
        client.close()


@contextmanager
def single(replica: bool) -> Iterator[tuple[str, list[Node]]]:
    """A private redis-server, and with ``replica`` another replicating it (``replicaof``, linked): (its URL, its
    nodes labelled ``redis`` and ``replica``)."""
    proc, url = start_redis_server()
    procs, nodes = [proc], [Node(port_of(url), "redis", True, proc.pid)]
    try:
        if replica:
            copy, copy_url = start_redis_server(extra_args=["--replicaof", "127.0.0.1", str(port_of(url))])
            procs.append(copy)
            nodes.append(Node(port_of(copy_url), "replica", False, copy.pid))
            wait_until(lambda: replica_linked(port_of(copy_url)), 30.0, "the replica of the single redis-server")
        yield url, nodes
    finally:
        for started in procs:
            started.stop()


@contextmanager
def redis_of(layout: Layout, prefix: str) -> Iterator[tuple[str, list[Node]]]:
    """The Redis of ``layout``: (the URL its fleet gets, its nodes labelled for the deployment under ``prefix``,
    master A holding shard 0's slot). With shards, shard k's slot is moved to master k (empty: a move of its
    ownership), as tests/integration/test_sharded_cluster.py places them."""
    if layout.masters == 0:
        with single(layout.replica) as started:
            yield started
    else:
        with start_redis_cluster(layout.masters, log_dir=LOGS) as rig:
            slots = [key_slot(Keys(shard_prefix(prefix, k, layout.shards), cluster=True).key_prefix.encode())
                     for k in range(layout.shards)]  # fmt: skip
            if layout.shards > 1:
                for slot, master in zip(slots, rig.masters(), strict=False):
                    if rig.slot_owner(slot) != master:
                        rig.move_slot(slot, master)
            yield rig.urls[0], cluster_nodes(rig, slots)


@asynccontextmanager
async def deployment(layout: Layout, llm_url: str) -> AsyncIterator[Deployment]:
    """A Redis (:func:`redis_of`) and its fleet (:attr:`Layout.fleet` per shard, ``SMITH_SHARD``), registered, with
    a client (a :class:`ShardedSmithClient` with shards); everything stops on exit."""
    cluster, shards = layout.masters > 0, layout.shards
    prefix = f"ct{uuid.uuid4().hex[:6]}"
    procs: list[ManagedProcess] = []
    with redis_of(layout, prefix) as (url, nodes):
        try:
            turn_workers, tool_workers = layout.fleet
            workers = []
            for shard in range(shards):
                env = testing.worker_env(url, prefix, llm_url, SMITH_REDIS_CLUSTER="1" if cluster else "",
                                         SMITH_SHARDS=str(shards), SMITH_SHARD=str(shard))  # fmt: skip
                for i in range(turn_workers):
                    port = free_port()
                    tag = f"{prefix}-{shard}-{i}"
                    [proc] = testing.start_workers(APP, {**env, "SMITH_METRICS_PORT": str(port)}, ["turns"], tag,
                                                   log_dir=LOGS)  # fmt: skip
                    procs.append(proc)
                    if i == 0:
                        workers.append(Worker(proc, port))
                procs += testing.start_workers(APP, env, ["tools"] * tool_workers, f"{prefix}-{shard}", log_dir=LOGS)
            for shard in range(shards):
                await testing.wait_for_workers(url, shard_prefix(prefix, shard, shards), len(procs) // shards,
                                               cluster=cluster)  # fmt: skip
            options: dict[str, Any] = {"prefix": prefix, "cluster": cluster, "max_connections": 200}
            if shards > 1:
                async with ShardedSmithClient.from_url(url, shards=shards, **options) as sharded:
                    yield Deployment(layout.name, layout.masters, nodes, workers, sharded, sharded.clients, {})
            else:
                async with SmithClient.from_url(url, **options) as client:
                    yield Deployment(layout.name, layout.masters, nodes, workers, client, [client], {})
        finally:
            for proc in procs:
                proc.stop()


async def queues(dep: Deployment) -> list[int | None]:
    """The length of every shard's turns queue, as a turn worker of the shard reads it on its ``/metrics``."""
    return await asyncio.gather(*(asyncio.to_thread(worker.queue_length) for worker in dep.workers))


async def drive(dep: Deployment, count: int, tag: str) -> tuple[float, list[list[str]]]:
    """Submit ``count`` turns of the :data:`MIX` at once, each in a conversation of its own (spread over the
    shards by :func:`shard_of`), and wait until every shard's turns queue is empty (arq drops a job when it ends;
    :func:`queues`): (seconds from the first submit to the last end, the turn ids of each shard). Raises
    ``TimeoutError`` after :data:`RUN_TIMEOUT` seconds."""
    started, ids = time.monotonic(), [list[str]() for _ in dep.clients]
    for first in range(0, count, BATCH):
        conversations = [f"{tag}-{i}" for i in range(first, min(first + BATCH, count))]
        handles = await asyncio.gather(
            *(
                dep.client.submit(PROMPTS[MIX[i % len(MIX)]], conversation_id=c)
                for i, c in enumerate(conversations, first)
            )
        )
        for conversation, handle in zip(conversations, handles, strict=True):
            ids[shard_of(conversation, len(dep.clients))].append(handle.turn_id)
    async with asyncio.timeout(RUN_TIMEOUT):
        # a page over HTTP, no event to wait on: poll (None: the scrape could not read the queue)
        while any(length != 0 for length in await queues(dep)):  # noqa: ASYNC110
            await asyncio.sleep(SCRAPE_INTERVAL)
    return time.monotonic() - started, ids


async def scrape_for(dep: Deployment, seconds: float) -> None:
    """Read the shards' turn workers' ``/metrics`` every :data:`SCRAPE_INTERVAL` s for ``seconds``, as :func:`drive`
    does while turns run (each read costs Redis a few commands: the queue gauges)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await queues(dep)
        await asyncio.sleep(SCRAPE_INTERVAL)


async def measure_idle(dep: Deployment, seconds: float) -> None:
    """Every node's commands and CPU seconds per second while the fleet idles and the bench scrapes."""
    before = snapshot(dep.nodes)
    await scrape_for(dep, seconds)
    after = snapshot(dep.nodes)
    dep.idle = {
        port: {k: (after[port][k] - before[port][k]) / (after[port]["at"] - before[port]["at"]) for k in before[port]}
        for port in before
    }


async def run(dep: Deployment, turns: int) -> dict[str, Any]:
    """One measured run of ``turns`` turns on ``dep``: its figures (see the module docstring)."""
    before = snapshot(dep.nodes)
    seconds, ids = await drive(dep, turns, f"run-{uuid.uuid4().hex[:8]}")
    after = snapshot(dep.nodes)
    counts: Counter[str] = Counter()
    reruns = 0
    for client, shard_ids in zip(dep.clients, ids, strict=True):
        shard_counts, shard_reruns = await statuses(client, shard_ids)
        counts.update(shard_counts)
        reruns += shard_reruns

    def used(port: int, counter: str) -> float:
        """What node ``port`` spent on ``counter`` over the run, less its idle rate over the same span."""
        span = after[port]["at"] - before[port]["at"]
        return max(0.0, after[port][counter] - before[port][counter] - dep.idle[port][counter] * span)

    nodes = {
        node.label: {
            "commands_per_turn": used(node.port, "commands") / turns,
            "cpu_ms_per_turn": 1000 * used(node.port, "cpu") / turns,
            "bus_publish_per_turn": used(node.port, "bus_publish") / turns,
            "bus_publishshard_per_turn": used(node.port, "bus_publishshard") / turns,
            "bus_kib_per_turn": used(node.port, "bus_bytes") / turns / 1024,
            "cpu_pct": 100
            * (after[node.port]["cpu"] - before[node.port]["cpu"])
            / (after[node.port]["at"] - before[node.port]["at"]),
        }
        for node in dep.nodes
    }
    busiest = max(figures["cpu_ms_per_turn"] for figures in nodes.values())
    return {
        "turns_per_s": turns / seconds,
        "completed": counts.get("completed", 0),
        "not_completed": sum(n for status, n in counts.items() if status != "completed"),
        "rerun": reruns,
        "commands_per_turn": sum(nodes[node.label]["commands_per_turn"] for node in dep.nodes if node.master),
        "nodes": nodes,
        "busiest_cpu_ms_per_turn": busiest,
        "turns_per_s_at_busiest_core": 1000 / busiest if busiest else 0.0,
    }


@asynccontextmanager
async def monitors(dep: Deployment) -> AsyncIterator[list[Monitor]]:
    """A :class:`Monitor` on each master holding a shard's keys (the node holding them all, without shards)."""
    async with AsyncExitStack() as stack:
        holders = [node for node in dep.nodes if node.master][: len(dep.clients)]
        yield [await stack.enter_async_context(Monitor(str(node.port))) for node in holders]


async def monitored(dep: Deployment, turns: int, idle_seconds: float) -> dict[str, float]:
    """Commands per turn by kind (``top``, ``multi_exec``, ``lua``) that MONITOR sees on the nodes holding the
    deployment's keys (:func:`monitors`, summed) over ``turns`` turns, less the idle rate it sees over
    ``idle_seconds``."""
    async with monitors(dep) as idle:
        await scrape_for(dep, idle_seconds)
    async with monitors(dep) as monitor:
        await drive(dep, turns, f"mon-{uuid.uuid4().hex[:8]}")
        await asyncio.sleep(0.3)  # the last turns' tails (the next claim, the workers' bookkeeping)
    figures = dict.fromkeys(("top", "multi_exec", "lua"), 0.0)
    for before, during in zip(idle, monitor, strict=True):
        idle_kinds, kinds = before.counts()[0], during.counts()[0]
        for kind in figures:
            figures[kind] += (kinds[kind] - idle_kinds[kind] / before.elapsed * during.elapsed) / turns
    return figures


def received(result: dict[str, Any], kind: str = "publish") -> float:
    """Bus messages of ``kind`` (``publish``: classic ``PUBLISH``; ``publishshard``: sharded ``SPUBLISH``) per turn
    that the nodes received: half the messages sent and received (each message counts once where it is sent, once
    where it arrives)."""
    return sum(node[f"bus_{kind}_per_turn"] for node in result["nodes"].values()) / 2


def report(results: list[dict[str, Any]], runs: int) -> str:
    """The figures as text: a line per node, the Markdown table, and what they say about masters."""
    single = next(r for r in results if r["masters"] == 0)
    out = []
    for r in results:
        m = r["monitor"]
        out.append(
            f"{r['name']}: {r['turns_per_s']:.0f} turns/s; of {r['turns']} turns per run "
            f"{r['completed']:.0f} completed, {r['not_completed']:.0f} not, {r['rerun']:.0f} re-run (lost lease); "
            f"{r['commands_per_turn']:.1f} Redis commands per turn on the masters "
            f"(MONITOR: {m['top']:.1f} sent + {m['multi_exec']:.1f} MULTI/EXEC + {m['lua']:.1f} inside scripts)"
        )
        for label, node in r["nodes"].items():
            out.append(
                f"  {label:9} {node['commands_per_turn']:6.1f} commands, {node['cpu_ms_per_turn']:.3f} ms CPU and "
                f"{node['bus_publish_per_turn']:4.1f} bus PUBLISH + {node['bus_publishshard_per_turn']:4.1f} "
                f"PUBLISHSHARD (SPUBLISH) messages (sent + received), "
                f"{node['bus_kib_per_turn']:5.1f} KiB written to the bus per turn, idle less; "
                f"{node['cpu_pct']:4.1f} % of a core over the run"
            )
    out += [
        "",
        f"medians of {runs} run(s); the clusters beside the single redis-server:",
        "",
        "| Redis | turns/s (× single) | commands / turn, masters (× single) | sent + MULTI/EXEC + in scripts "
        "(MONITOR) | CPU ms / turn: master A (× single) | other masters | replicas | bus PUBLISH (classic) messages / "
        "turn received | bus PUBLISHSHARD (SPUBLISH) messages / turn received | bus KiB / turn | busiest node at "
        "100 % → turns/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        nodes, m = r["nodes"], r["monitor"]
        first = nodes["master A" if r["masters"] else "redis"]["cpu_ms_per_turn"]
        others = [n["cpu_ms_per_turn"] for label, n in nodes.items() if label.startswith("master") and label[-1] != "A"]
        replicas = [n["cpu_ms_per_turn"] for label, n in nodes.items() if label.startswith("replica")]
        out.append(
            f"| {r['name']} | {r['turns_per_s']:.0f} ({ratio(r['turns_per_s'], single['turns_per_s'])}) "
            f"| {r['commands_per_turn']:.1f} ({ratio(r['commands_per_turn'], single['commands_per_turn'])}) "
            f"| {m['top']:.1f} + {m['multi_exec']:.1f} + {m['lua']:.1f} "
            f"| {first:.3f} ({ratio(first, single['nodes']['redis']['cpu_ms_per_turn'])}) "
            f"| {' / '.join(f'{x:.3f}' for x in others) or '—'} | {' / '.join(f'{x:.3f}' for x in replicas) or '—'} "
            f"| {received(r):.1f} | {received(r, 'publishshard'):.1f} "
            f"| {sum(n['bus_kib_per_turn'] for n in nodes.values()):.1f} "
            f"| {r['busiest_cpu_ms_per_turn']:.3f} ms → {r['turns_per_s_at_busiest_core']:,.0f} |"
        )
    return "\n".join(out + ["", verdict(results), "", sharded_verdict(results)])


def verdict(results: list[dict[str, Any]]) -> str:
    """What the figures say about adding masters in one-slot mode, worded from the figures themselves."""
    clusters = sorted((r for r in results if r["masters"] and r["shards"] == 1), key=lambda r: r["masters"])
    if not clusters:
        return ""
    rates = [r["turns_per_s"] for r in clusters]
    spread = max(rates) / min(rates)
    share = min(
        r["nodes"]["master A"]["cpu_ms_per_turn"]
        / (sum(n["cpu_ms_per_turn"] for label, n in r["nodes"].items() if label.startswith("master")) or 1)
        for r in clusters
    )
    # in the largest cluster, the nodes that do not hold the keys (replica A applies A's writes)
    others = [node for label, node in clusters[-1]["nodes"].items() if not label.endswith("A")]
    busy = max(r["nodes"]["master A"]["cpu_pct"] for r in clusters)
    cpu = statistics.median(r["nodes"]["master A"]["cpu_ms_per_turn"] for r in clusters)
    anchors = {r["name"]: r["nodes"]["redis"]["cpu_ms_per_turn"] for r in results if not r["masters"]}
    growth = (
        f"within {(spread - 1) * 100:.0f} % of each other: turns/s does not grow with the masters"
        if spread <= SAME_RATE
        else f"{(spread - 1) * 100:.0f} % apart (more than this machine's noise? see the runs above)"
    )
    bystanders = (
        f" The other masters and their replicas ran none of the turns' commands (at most "
        f"{max(n['commands_per_turn'] for n in others):.1f} per turn with {clusters[-1]['masters']} masters); their "
        f"one per-turn work is what a cluster broadcasts over its bus to every node, the classic PUBLISHes (a turn's "
        f"events go by SPUBLISH, which the slot's master sends on to its replica only: "
        f"{received(clusters[-1], 'publishshard'):.1f} PUBLISHSHARD bus messages per turn received in all): "
        f"{statistics.median(n['bus_publish_per_turn'] for n in others):.1f} PUBLISH messages and "
        f"{statistics.median(n['cpu_ms_per_turn'] for n in others):.3f} ms of CPU per turn on each (the median)."
        if others
        else ""
    )
    limit = (
        f"Here the fleet on this machine's cores, not Redis, bounded turns/s: master A used at most {busy:.0f} % of a "
        f"core."
        if busy < 80
        else f"Here master A reached {busy:.0f} % of a core: Redis bounded turns/s."
    )
    return (
        f"One-slot mode, turns/s with {', '.join(str(r['masters']) for r in clusters)} masters: "
        f"{', '.join(f'{x:.0f}' for x in rates)}, {growth}. Every key of a deployment carries its prefix as a hash "
        f"tag, so all of them hash to one slot, served by one master (A): A did at least {share * 100:.0f} % of "
        f"the masters' CPU per turn in every cluster.{bystanders} A cluster serves what its one master serves, "
        f"whatever the count of masters; using more of them needs the sharded layout of docs/cluster.md. {limit} "
        f"Master A's CPU per turn (median over the clusters) is "
        + ", ".join(f"{ratio(cpu, anchor)} that of the {name}" for name, anchor in anchors.items())
        + "."
    )


def sharded_verdict(results: list[dict[str, Any]]) -> str:
    """The sharded deployments beside the one-slot cluster of as many masters and the single redis-server: the
    busiest master's CPU per turn and the turns/s it allows at 100 % of its core."""
    single = next(r for r in results if r["masters"] == 0)
    one_slot: dict[int, dict[str, Any]] = {r["masters"]: r for r in results if r["masters"] and r["shards"] == 1}
    lines = []
    for r in (r for r in results if r["shards"] > 1):
        n, ms, cap = r["masters"], r["busiest_cpu_ms_per_turn"], r["turns_per_s_at_busiest_core"]
        cpu = " / ".join(f"{x['cpu_ms_per_turn']:.3f}" for label, x in r["nodes"].items() if label.startswith("master"))
        beside = [("the single redis-server", single, "")]
        if n in one_slot:
            beside.insert(0, (f"the one-slot cluster of {n} masters", one_slot[n], f"; 1/{n} = {1 / n:.2f}"))
        lines.append(
            f"{r['name']}: {r['turns_per_s']:.0f} turns/s ({ratio(r['turns_per_s'], single['turns_per_s'])} the "
            f"single's); {r['commands_per_turn']:.1f} commands per turn summed over the masters "
            f"({ratio(r['commands_per_turn'], single['commands_per_turn'])}); CPU ms per turn, master A-"
            f"{chr(64 + n)}: {cpu}; the busiest master's {ms:.3f} ms per turn → {cap:,.0f} turns/s at 100 % of its "
            f"core; "
            + "; ".join(
                f"{ratio(ms, other['busiest_cpu_ms_per_turn'])} the ms per turn and "
                f"{ratio(cap, other['turns_per_s_at_busiest_core'])} the turns/s of {name} "
                f"({other['busiest_cpu_ms_per_turn']:.3f} ms → {other['turns_per_s_at_busiest_core']:,.0f}{note})"
                for name, other, note in beside
            )
            + "."
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start every deployment, warm each up and measure its idle rate, run them in turns, print the figures."""
    raise_open_files_limit()
    LOGS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    layouts = [
        Layout(0, False),
        Layout(0, True),
        *(Layout(int(m), True) for m in args.masters.split(",") if m),
        *(Layout(int(n), True, int(n)) for n in args.sharded.split(",") if n),
    ]
    async with AsyncExitStack() as stack:
        llm_url, _ = stack.enter_context(llm_server())
        deps = [await stack.enter_async_context(deployment(layout, llm_url)) for layout in layouts]
        for dep in deps:
            await drive(dep, args.warm, f"warm-{uuid.uuid4().hex[:8]}")
            await measure_idle(dep, args.idle)
        print(
            f"{len(deps)} deployments up in {time.monotonic() - started:.0f} s: "
            + "; ".join(f"{dep.name} ({len(dep.nodes)} node{'s' * (len(dep.nodes) > 1)})" for dep in deps)
            + f". Fleet of each: {TURN_WORKERS} turn workers + {TOOL_WORKERS} tool worker; with shards, per shard "
            f"{SHARD_TURN_WORKERS} turn worker + {SHARD_TOOL_WORKERS} tool worker; the scripted model at zero"
            f" latency; runs of {args.turns} turns ({' / '.join(MIX)} alternating) submitted at once",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {dep.name: [] for dep in deps}
        for number in range(args.repeat):  # the deployments take turns
            for dep in deps:
                figures = await run(dep, args.turns)
                runs[dep.name].append(figures)
                print(
                    f"  run {number + 1}, {dep.name}: {figures['turns_per_s']:.0f} turns/s, "
                    f"{figures['commands_per_turn']:.1f} commands per turn",
                    flush=True,
                )
        results = []
        for dep in deps:
            results.append(
                {
                    "name": dep.name,
                    "masters": dep.masters,
                    "shards": len(dep.clients),
                    "turns": args.turns,
                    **median_figures(runs[dep.name]),
                    "monitor": await monitored(dep, args.monitored, args.idle),
                    "idle_commands_per_s": sum(r["commands"] for r in dep.idle.values()),
                    "runs": runs[dep.name],
                }
            )
    print()
    print(report(results, args.repeat))
    print(f"\ntook {time.monotonic() - started:.0f} s")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=1000, help="turns per run, submitted at once")
    parser.add_argument("--repeat", type=int, default=3, help="runs per deployment; figures are medians")
    parser.add_argument("--masters", default="1,2,3", help="the one-slot clusters' numbers of masters, comma-separated")
    parser.add_argument(
        "--sharded", default="2,3", help="the sharded clusters' numbers of masters, as many shards ('': none)"
    )
    parser.add_argument("--warm", type=int, default=200, help="turns per deployment before measuring")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds of each idle measurement")
    parser.add_argument("--monitored", type=int, default=100, help="turns per deployment counted with MONITOR")
    parser.add_argument("--json", help="write the figures to this file")
    cli = parser.parse_args()
    figures_of_runs = asyncio.run(main(cli))
    if cli.json:
        Path(cli.json).write_text(json.dumps(figures_of_runs, indent=1))
