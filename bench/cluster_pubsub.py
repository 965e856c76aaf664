"""Live delivery of turn events on Redis Cluster: classic PUBLISH, sharded SPUBLISH, or the replay log read with
XREAD BLOCK (docs/cluster.md, "Pub/sub: SPUBLISH / SSUBSCRIBE or the replay log").

Starts a real cluster (``start_redis_cluster``: 3 masters, 3 replicas on 127.0.0.1), spreads ``--turns`` turns over
the 64 shard tags ``{smith:s00}`` … ``{smith:s63}`` (turn *i* in shard *i* mod 64; key and channel names are
``Keys``'s with the shard's tag as the prefix, the layout docs/cluster.md proposes), and has each turn publish
``--events`` events of ``--size`` bytes (a JSON event carrying its publish time), one every ``--interval`` seconds,
from a publisher process of its own (one connection pool per master; each event goes to its turn's slot's master).
Every event is appended to the turn's replay log (``XADD``: the source of truth in every option), and:

* ``publish``: (a) also ``PUBLISH``\\ed on the turn's channel (classic pub/sub: the master forwards every message to
  every other node over the cluster bus); one subscriber connection, on the first master, subscribes to all the
  channels;
* ``spublish``: (b) also ``SPUBLISH``\\ed on the turn's channel (sharded pub/sub, Redis 7: the message goes only to
  the slot's master and its replicas); one subscriber connection per master ``SSUBSCRIBE``\\s to the channels of
  the slots it serves (read from ``CLUSTER SLOTS``; one command per shard tag, since ``SSUBSCRIBE``'s channels
  must share a slot);
* ``xread``: (c) nothing more; followers read the logs with ``XREAD BLOCK``, one blocking connection per shard
  followed (``XREAD`` over several streams must stay within one slot), each on the shard's master.

Each mode runs in two phases: paced (every turn publishing every ``--interval`` seconds) and flooded (every turn
publishing back to back, ``--flood-events`` events each), ``--repeat`` times (the modes taking turns); it prints
the median of each figure over the repeats: events delivered of published, events/s
delivered (first publish to last receipt), delivery latency p50/p99 (receipt − the publish time in the event),
Redis CPU per 1,000 events (``INFO cpu`` ``used_cpu_sys`` + ``used_cpu_user`` deltas, summed over the masters and
over the replicas, less each node's idle rate measured first), the cluster capacity extrapolated from it (events/s
at which the busiest node would use a whole core), the cluster bus's messages (``CLUSTER INFO``
``cluster_stats_messages_sent``) and bytes (``/proc/PID/io`` ``wchar`` less ``INFO stats``
``total_net_output_bytes``, which counts the replies and the replication stream: what a node writes besides
those is its bus traffic and log lines), both per 1,000 events and less the idle rate, the subscriber's
connections, and the CPU seconds of the bench's own publisher and subscriber processes (on a small machine they,
not Redis, bound the flooded events/s).

Usage: ``.venv/bin/python bench/cluster_pubsub.py [--turns 200] [--events 50] [--interval 0.05] [--size 200]
[--flood-events 50] [--repeat 3] [--modes publish,spublish,xread] [--json PATH]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import Connection
from redis.crc import key_slot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from bench.stats import pct  # noqa: E402
from smith_client.keys import Keys  # noqa: E402
from smith_worker.local.processes import RedisClusterRig, start_redis_cluster  # noqa: E402

#: Virtual shards (docs/cluster.md, Shards and hash tags: ``SMITH_SHARDS``' default).
SHARDS = 64
#: What each mode adds to the log's ``XADD``, and how it is followed.
MODES = {
    "publish": "(a) XADD + PUBLISH, 1 subscriber connection on one node",
    "spublish": "(b) XADD + SPUBLISH, SSUBSCRIBE on 1 connection per master",
    "xread": "(c) XADD only, XREAD BLOCK on 1 connection per shard followed",
}
#: Publisher connections per master (a worker's pool; the same in every mode).
PUBLISHER_POOL = 16
#: Entries one XREAD returns at most, and how long it blocks (ms) before a follower checks whether to stop.
XREAD_COUNT = 100
XREAD_BLOCK_MS = 1000
#: Seconds the cluster is watched idle, for the background rates subtracted from each run.
IDLE_SECONDS = 3.0
#: Seconds a run waits for its last events after the publisher has finished.
DRAIN_TIMEOUT = 30.0


@dataclass(frozen=True)
class Turn:
    """One turn's names, on its shard's tag, and the port of the master serving their slot."""

    shard: int
    log: str
    channel: str
    master: int


def shard_keys(shard: int) -> Keys:
    """The names of shard ``shard``: ``Keys`` with the shard's hash tag ``{smith:sNN}`` as the prefix."""
    return Keys("{" + f"smith:s{shard:02d}" + "}")


def slot_owners(port: int) -> list[tuple[int, int, int]]:
    """(first slot, last slot, master port) of each slot range, from ``CLUSTER SLOTS`` asked of node ``port``."""
    client = redis.Redis(port=port)
    try:
        return [
            (int(first), int(last), int(master[1]))
            for first, last, master, *_ in client.execute_command("CLUSTER", "SLOTS")
        ]
    finally:
        client.close()


def layout(turns: int, port: int) -> list[Turn]:
    """``turns`` turns, turn i in shard i mod :data:`SHARDS`, each with the master of its slot."""
    owners = slot_owners(port)
    out = []
    for i in range(turns):
        keys, turn_id = shard_keys(i % SHARDS), uuid.uuid4().hex
        slot = key_slot(keys.turn_log(turn_id).encode())
        master = next(m for first, last, m in owners if first <= slot <= last)
        out.append(Turn(i % SHARDS, keys.turn_log(turn_id), keys.turn_events_channel(turn_id), master))
    return out


# -- the publisher process ----------------------------------------------------------------------------------------


def event(seq: int, size: int) -> bytes:
    """A ``size``-byte JSON event carrying its publish time (``ts``, epoch seconds)."""
    head = json.dumps({"ts": time.time(), "seq": seq, "type": "message.delta", "data": ""})
    return head.replace('"data": ""', '"data": "' + "x" * max(0, size - len(head)) + '"').encode()


async def publish(spec: dict[str, Any]) -> dict[str, Any]:
    """Publish every turn's events as ``spec`` says; return the count, the errors and this process's CPU seconds."""
    mode, interval, events, size = spec["mode"], spec["interval"], spec["events"], spec["size"]
    clients = {
        port: Redis(connection_pool=BlockingConnectionPool(port=port, max_connections=PUBLISHER_POOL))
        for port in {turn["master"] for turn in spec["turns"]}
    }
    counts = {"published": 0, "errors": 0}

    async def one_turn(turn: dict[str, Any], delay: float) -> None:
        await asyncio.sleep(delay)
        client, due = clients[turn["master"]], time.monotonic()
        for seq in range(events):
            payload = event(seq, size)
            try:
                if mode == "xread":
                    await client.xadd(turn["log"], {"e": payload})
                else:
                    async with client.pipeline(transaction=False) as pipe:
                        pipe.xadd(turn["log"], {"e": payload})
                        pipe.execute_command(mode.upper(), turn["channel"], payload)
                        await pipe.execute()
                counts["published"] += 1
            except redis.RedisError:
                counts["errors"] += 1
            if interval:
                due += interval
                await asyncio.sleep(max(0.0, due - time.monotonic()))

    cpu = time.process_time()
    spread = interval / len(spec["turns"])  # the turns' first events spread over one interval
    await asyncio.gather(*(one_turn(turn, i * spread) for i, turn in enumerate(spec["turns"])))
    for client in clients.values():
        await client.aclose()
    return {**counts, "cpu_s": time.process_time() - cpu}


# -- the subscriber side ------------------------------------------------------------------------------------------


class Receipts:
    """Delivery latencies (s) of the events received so far; ``done`` is set when ``expected`` have arrived."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.latencies: list[float] = []
        self.first_ts = float("inf")
        self.last_receipt = 0.0
        self.done = asyncio.Event()

    def add(self, payload: bytes, now: float) -> None:
        ts = json.loads(payload)["ts"]
        self.latencies.append(now - ts)
        self.first_ts = min(self.first_ts, ts)
        self.last_receipt = now
        if len(self.latencies) >= self.expected:
            self.done.set()


async def subscribe(port: int, command: str, groups: list[list[str]]) -> Connection:
    """A connection to node ``port`` that sent ``command`` once per group of channels, every confirmation read."""
    conn = Connection(host="127.0.0.1", port=port)
    await conn.connect()
    for channels in groups:
        await conn.send_command(command, *channels)
    for _ in range(sum(len(channels) for channels in groups)):
        reply = await conn.read_response()
        if reply[0].decode() != command.lower():
            raise RuntimeError(f"{command} on port {port}: {reply!r}")
    return conn


async def read_messages(conn: Connection, receipts: Receipts) -> None:
    """Record every message (``message`` / ``smessage``) the subscribed connection ``conn`` receives."""
    while True:
        reply = await conn.read_response()
        receipts.add(reply[2], time.time())


async def follow_logs(port: int, logs: list[str], events: int, receipts: Receipts, stop: asyncio.Event) -> None:
    """Read ``logs`` (streams of one slot) on node ``port`` with XREAD BLOCK until each has ``events`` entries."""
    client = Redis(port=port, single_connection_client=True)
    after = dict.fromkeys(logs, "0-0")
    left = dict.fromkeys(logs, events)
    try:
        while after and not stop.is_set():
            reply = await client.xread(after, count=XREAD_COUNT, block=XREAD_BLOCK_MS)
            now = time.time()
            for log, entries in reply:
                name = log.decode()
                for entry_id, fields in entries:
                    receipts.add(fields[b"e"], now)
                    after[name] = entry_id
                    left[name] -= 1
                if left[name] == 0:
                    del after[name]
    finally:
        await client.aclose()


# -- the measurements ---------------------------------------------------------------------------------------------


def node_counters(rig: RedisClusterRig, port: int) -> dict[str, float]:
    """Node ``port``'s CPU seconds, bytes written (all / replies + replication) and cluster bus messages sent."""
    client = redis.Redis(port=port, decode_responses=True)
    try:
        cpu, stats = client.info("cpu"), client.info("stats")
        bus = dict(line.split(":", 1) for line in client.execute_command("CLUSTER", "INFO").splitlines() if ":" in line)
    finally:
        client.close()
    io = dict(line.split(": ") for line in Path(f"/proc/{rig.nodes[port].pid}/io").read_text().splitlines())
    return {
        "cpu_s": float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
        "bus_bytes": int(io["wchar"]) - int(stats["total_net_output_bytes"]),
        "bus_messages": int(bus["cluster_stats_messages_sent"]),
    }


def snapshot(rig: RedisClusterRig) -> dict[int, dict[str, float]]:
    """:func:`node_counters` of every node, with the time (``at``, monotonic seconds)."""
    return {port: {**node_counters(rig, port), "at": time.monotonic()} for port in rig.ports}


def rates(before: dict[int, dict[str, float]], after: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
    """Each node's counters' increase per second between two snapshots."""
    return {
        port: {k: (after[port][k] - before[port][k]) / (after[port]["at"] - before[port]["at"]) for k in after[port]}
        for port in before
    }


async def run(
    rig: RedisClusterRig, mode: str, args: argparse.Namespace, flood: bool, idle: dict[int, dict[str, float]]
) -> dict[str, Any]:
    """One run of ``mode``, paced or flooded: its figures (see the module docstring)."""
    masters = rig.masters()
    turns = layout(args.turns, masters[0])
    events = args.flood_events if flood else args.events
    receipts, stop = Receipts(len(turns) * events), asyncio.Event()
    by_shard: dict[int, list[Turn]] = {}
    for t in turns:
        by_shard.setdefault(t.shard, []).append(t)
    connections: list[Connection] = []
    if mode == "publish":
        connections.append(await subscribe(masters[0], "SUBSCRIBE", [[t.channel for t in turns]]))
    elif mode == "spublish":  # one SSUBSCRIBE per shard tag: its channels share a slot
        for port in masters:
            groups = [[t.channel for t in mine] for mine in by_shard.values() if mine[0].master == port]
            connections.append(await subscribe(port, "SSUBSCRIBE", groups))
    readers = [asyncio.create_task(read_messages(conn, receipts)) for conn in connections]
    if mode == "xread":
        readers += [
            asyncio.create_task(follow_logs(mine[0].master, [t.log for t in mine], events, receipts, stop))
            for mine in by_shard.values()
        ]
    subscriber_connections = len(connections) or len(by_shard)
    spec = {
        "mode": mode,
        "interval": 0.0 if flood else args.interval,
        "events": events,
        "size": args.size,
        "turns": [{"log": t.log, "channel": t.channel, "master": t.master} for t in turns],
    }
    before, cpu = snapshot(rig), time.process_time()
    publisher = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--publisher", stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    out, _ = await publisher.communicate(json.dumps(spec).encode())
    if publisher.returncode:
        raise RuntimeError(f"the publisher exited with {publisher.returncode}")
    published = json.loads(out)
    try:
        await asyncio.wait_for(receipts.done.wait(), DRAIN_TIMEOUT)
    except TimeoutError:
        pass  # counted: delivered < published
    after, subscriber_cpu = snapshot(rig), time.process_time() - cpu
    failed = [task.exception() for task in readers if task.done() and task.exception() is not None]
    if failed:  # e.g. a MOVED reply: the slot map changed under the run
        raise RuntimeError(f"a follower failed: {failed[0]!r}")
    stop.set()
    for task in readers:
        task.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    for conn in connections:
        await conn.disconnect()
    for port in masters:  # the next run starts on empty masters (replicas follow)
        client = redis.Redis(port=port)
        client.flushall()
        client.close()
    return figures(
        mode, flood, receipts, published, before, after, idle, masters, subscriber_connections, subscriber_cpu
    )


def figures(
    mode: str,
    flood: bool,
    receipts: Receipts,
    published: dict[str, Any],
    before: dict[int, dict[str, float]],
    after: dict[int, dict[str, float]],
    idle: dict[int, dict[str, float]],
    masters: list[int],
    connections: int,
    subscriber_cpu: float,
) -> dict[str, Any]:
    """The run's figures from its receipts, the publisher's report and the nodes' counters around it."""
    n = len(receipts.latencies)
    span = receipts.last_receipt - receipts.first_ts if n else 0.0

    def used(port: int, counter: str) -> float:
        """What node ``port`` spent on ``counter`` during the run, less its idle rate over the same time."""
        seconds = after[port]["at"] - before[port]["at"]
        return max(0.0, after[port][counter] - before[port][counter] - idle[port][counter] * seconds)

    per_k = 1000 / n if n else 0.0
    busiest = max(used(port, "cpu_s") for port in after)  # CPU seconds of the node that worked most
    ms = sorted(x * 1000 for x in receipts.latencies) or [0.0]
    return {
        "mode": mode,
        "flood": flood,
        "published": published["published"],
        "publish_errors": published["errors"],
        "delivered": n,
        "events_per_s": n / span if span else 0.0,
        "p50_ms": statistics.median(ms),
        "p99_ms": pct(ms, 0.99),
        "cpu_ms_per_k_masters": 1000 * per_k * sum(used(p, "cpu_s") for p in after if p in masters),
        "cpu_ms_per_k_replicas": 1000 * per_k * sum(used(p, "cpu_s") for p in after if p not in masters),
        "cpu_ms_per_k_busiest": 1000 * per_k * busiest,
        "capacity_events_per_s": n / busiest if busiest else 0.0,
        "bus_messages_per_k": per_k * sum(used(p, "bus_messages") for p in after),
        "bus_kib_per_k": per_k * sum(used(p, "bus_bytes") for p in after) / 1024,
        "subscriber_connections": connections,
        "publisher_cpu_s": published["cpu_s"],
        "subscriber_cpu_s": subscriber_cpu,
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The runs of one mode merged: the median of each number (counts included), other values from the first run."""
    return {
        key: statistics.median(run[key] for run in runs)
        if isinstance(value, int | float) and not isinstance(value, bool)
        else value
        for key, value in runs[0].items()
    }


def line(f: dict[str, Any]) -> str:
    """One run's figures, printed."""
    latency = "latency from creation (the publisher's queue included)" if f["flood"] else "latency"
    return (
        f"  delivered {f['delivered']} of {f['published']} ({f['publish_errors']} publish errors), "
        f"{f['events_per_s']:.0f} events/s; {latency} p50 {f['p50_ms']:.2f} ms, p99 {f['p99_ms']:.2f} ms\n"
        f"  Redis CPU per 1,000 events: masters {f['cpu_ms_per_k_masters']:.1f} ms, "
        f"replicas {f['cpu_ms_per_k_replicas']:.1f} ms; busiest node {f['cpu_ms_per_k_busiest']:.1f} ms "
        f"-> ~{f['capacity_events_per_s']:.0f} events/s with it at 100 % of a core\n"
        f"  cluster bus per 1,000 events: {f['bus_messages_per_k']:.0f} messages, {f['bus_kib_per_k']:.0f} KiB\n"
        f"  subscriber connections: {f['subscriber_connections']}; bench CPU: publisher {f['publisher_cpu_s']:.1f} s, "
        f"subscriber {f['subscriber_cpu_s']:.1f} s"
    )


def table(results: list[dict[str, Any]]) -> str:
    """The figures of every mode and phase as a Markdown table (BENCHMARKS.md)."""
    out = [
        "| mode | phase | events/s | p50 ms | p99 ms | Redis CPU ms / 1k events, masters (replicas) "
        "| busiest node ms / 1k → events/s at 100 % | bus messages / 1k | bus KiB / 1k | subscriber connections |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    out += [
        f"| {MODES[f['mode']][:3]} {f['mode']} | {'flooded' if f['flood'] else 'paced'} | {f['events_per_s']:.0f} "
        f"| {f['p50_ms']:.2f} | {f['p99_ms']:.2f} | {f['cpu_ms_per_k_masters']:.1f} ({f['cpu_ms_per_k_replicas']:.1f}) "
        f"| {f['cpu_ms_per_k_busiest']:.1f} → {f['capacity_events_per_s']:,.0f} | {f['bus_messages_per_k']:.0f} "
        f"| {f['bus_kib_per_k']:,.0f} | {f['subscriber_connections']} |"
        for f in results
    ]
    return "\n".join(out)


async def main(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the cluster, run every mode in both phases, print the figures; return them."""
    LOGS.mkdir(parents=True, exist_ok=True)
    modes = args.modes.split(",")
    results = []
    started = time.monotonic()
    with start_redis_cluster(3, log_dir=LOGS) as rig:
        masters = rig.masters()
        shards_per_master = [len({t.shard for t in layout(SHARDS, masters[0]) if t.master == p}) for p in masters]
        print(
            f"cluster: {len(masters)} masters + {len(rig.ports) - len(masters)} replicas on 127.0.0.1 "
            f"(Redis {rig.ask(masters[0], 'INFO', 'server')['redis_version']}); {SHARDS} shard tags, "
            f"{'/'.join(map(str, shards_per_master))} per master"
        )
        print(
            f"turns: {args.turns}, {args.size}-byte events; paced: {args.events} each, one every "
            f"{args.interval * 1000:.0f} ms ({args.turns / args.interval:.0f} events/s offered); "
            f"flooded: {args.flood_events} each, back to back"
        )
        before = snapshot(rig)
        await asyncio.sleep(IDLE_SECONDS)
        idle = rates(before, snapshot(rig))
        print(
            f"idle cluster: {sum(r['cpu_s'] for r in idle.values()) * 100:.1f} % of a core over the "
            f"{len(rig.ports)} nodes, "
            f"{sum(r['bus_messages'] for r in idle.values()):.0f} bus messages/s, "
            f"{sum(r['bus_bytes'] for r in idle.values()) / 1024:.0f} KiB/s (subtracted below)"
        )
        for flood in (False, True):
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
            for _ in range(args.repeat):  # the modes take turns, so a noisy moment does not land on one mode
                for mode in modes:
                    runs[mode].append(await run(rig, mode, args, flood, idle))
            for mode in modes:
                f = medians(runs[mode])
                results.append(f)
                print(f"{MODES[mode]}, {'flooded' if flood else 'paced'}:\n{line(f)}", flush=True)
    print(f"\nmedians of {args.repeat} run(s) each; took {time.monotonic() - started:.0f} s\n")
    print(table(results))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--events", type=int, default=50, help="events per turn, paced")
    parser.add_argument("--interval", type=float, default=0.05, help="seconds between a turn's events, paced")
    parser.add_argument("--flood-events", type=int, default=50, help="events per turn, flooded")
    parser.add_argument("--size", type=int, default=200, help="bytes per event")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--repeat", type=int, default=3, help="runs of each mode and phase; figures are medians")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--publisher", action="store_true", help="(internal) publish the spec read from stdin")
    cli = parser.parse_args()
    if cli.publisher:
        print(json.dumps(asyncio.run(publish(json.loads(sys.stdin.read())))))
    else:
        figures_of_runs = asyncio.run(main(cli))
        if cli.json:
            Path(cli.json).write_text(json.dumps(figures_of_runs, indent=1))
