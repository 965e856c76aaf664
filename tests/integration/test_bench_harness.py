"""`make bench`'s harness in its tiny mode: every figure of the distributed benchmarks comes out (no anchors venv).

Figures are checked for presence and sanity only (no timings asserted): the
harness must not rot while the code it measures changes.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bench.report import acceptance, table
from tests.conftest import ROOT


def test_quick_run_produces_every_figure(tmp_path):
    out = tmp_path / "figures.json"
    subprocess.run([sys.executable, "bench/distributed.py", "--quick", "--no-anchors", "--out", str(out)],
                   cwd=ROOT, check=True, timeout=240)
    f = json.loads(out.read_text())
    for worker in ("turn_worker", "tool_worker", "arq_default", "arq_fast"):
        assert set(f["idle"][worker]) == {"cmds_per_s", "cpu_pct", "rss_mib"}
    assert f["idle"]["arq_fast"]["cmds_per_s"] > 0  # the attribution by client port found the poller
    for part in ("tool_hop", "tool_hop_arq_default", "tool_hop_arq_fast"):
        assert f[part]["n"] > 0 and 0 < f[part]["p50"] <= f[part]["p99"]
    assert set(f["turn"]) == {"text", "tool", "stream_tool", "floor_stream_text", "floor_stream_tool"}
    for kind in ("text", "tool"):
        assert set(f["commands_per_turn"][kind]) == {"top", "multi_exec", "lua", "commandstats_total"}
        assert f["commands_per_turn"][kind]["lua"] > 0
        for workers in ("1", "2"):
            burst = f["throughput"][f"{workers}_{kind}"]
            assert burst["turns_per_s"] > 0 and "cpu_ms_turn_worker" in burst and "cpu_ms_client" in burst
    assert "cpu_ms_turn_worker_2" in f["throughput"]["2_tool"]
    for streams in ("1", "50"):
        latency = f["token_latency"][streams]
        assert latency["project"]["n"] == latency["pubsub"]["n"] > 0
        assert latency["pubsub_lost"] == 0
    coalesced = f["token_latency"]["50_coalesced"]  # fewer, longer token events through a coalescing worker
    assert 0 < coalesced["events_per_stream"] < f["token_latency"]["50"]["events_per_stream"]
    assert f["memory"]["rss_peak_mib"] > 0
    assert all(project != "—" for _, project, _, _ in table(f))  # every project figure, even without anchors
    judged = [line for line in acceptance(f, None) if not line.startswith("n/a")]
    assert [line[6:8] for line in judged] == ["1.", "1.", "4.", "6."]  # the lines needing no anchor are judged


def test_several_runs_are_merged_into_medians_figure_by_figure():
    from bench.report import median_figures

    runs = [
        {"quick": True, "tool_hop": {"p50": 5.0, "n": 200}, "only_here": {"x": 1.0}},
        {"quick": True, "tool_hop": {"p50": 1.0, "n": 200}},
        {"quick": True, "tool_hop": {"p50": 3.0, "n": 200}},
    ]
    assert median_figures(runs) == {"quick": True, "tool_hop": {"p50": 3.0, "n": 200}, "only_here": {"x": 1.0}}


def test_the_paused_turns_bench_runs_small():
    """bench/paused_turns.py at 20 turns: every figure is printed, and paused turns hold no job slot."""
    out = subprocess.run([sys.executable, "bench/paused_turns.py", "--turns", "20", "--approvals", "3"],
                         cwd=ROOT, check=True, timeout=240, capture_output=True, text=True).stdout
    assert "paused turns: 20 in" in out and "Redis used_memory per paused turn:" in out
    assert "job slots held: 0" in out
    assert "approve -> tool started: p50" in out and "(n=3)" in out


def test_the_tracing_bench_runs_small(tmp_path):
    """bench/tracing.py at 20 turns: both fleets measured, the spans of the traced one exported, a verdict line."""
    figures = tmp_path / "tracing.json"
    out = subprocess.run([sys.executable, "bench/tracing.py", "--turns", "20", "--json", str(figures)],
                         cwd=ROOT, check=True, timeout=240, capture_output=True, text=True).stdout
    assert "one-tool turn, tracing off" in out and "one-tool turn, tracing on (exporting)" in out
    assert "PASS" in out or "MISS" in out
    result = json.loads(figures.read_text())
    assert result["spans"] >= 4 * 30 and result["off_p50_ms"] > 0 and result["off_path_us"] < 100


def test_the_cluster_pubsub_bench_runs_small(tmp_path):
    """bench/cluster_pubsub.py at 10 turns of 5 events on a real 3-master cluster: every mode and phase delivers
    every event, with the connections its design needs, and only classic PUBLISH sends each event to every node."""
    figures = tmp_path / "cluster_pubsub.json"
    out = subprocess.run([sys.executable, "bench/cluster_pubsub.py", "--turns", "10", "--events", "5",
                          "--interval", "0.01", "--flood-events", "5", "--repeat", "1", "--json", str(figures)],
                         cwd=ROOT, check=True, timeout=240, capture_output=True, text=True).stdout
    assert "| (b) spublish | paced |" in out and "cluster bus per 1,000 events" in out
    runs = {(f["mode"], f["flood"]): f for f in json.loads(figures.read_text())}
    assert set(runs) == {(mode, flood) for mode in ("publish", "spublish", "xread") for flood in (False, True)}
    for f in runs.values():
        assert f["delivered"] == f["published"] == 50 and f["publish_errors"] == 0
        # 50 events may cost the masters less than one tick of their CPU counters: measured, possibly 0
        assert 0 < f["p50_ms"] <= f["p99_ms"] and f["cpu_ms_per_k_masters"] >= 0
    # one subscriber connection on one node, one per master, one per shard followed (10 turns: shards 0-9)
    assert [runs[mode, False]["subscriber_connections"] for mode in ("publish", "spublish", "xread")] == [1, 3, 10]
    # PUBLISH goes over the bus to the 5 other nodes, SPUBLISH to the slot's replica only
    assert runs["publish", False]["bus_messages_per_k"] > runs["spublish", False]["bus_messages_per_k"]


def test_the_cluster_turns_bench_runs_small(tmp_path):
    """bench/cluster_turns.py at 40 turns: the single Redis (with and without a replica), clusters of 1, 2 and 3
    masters in one slot and 2 shards on 2 masters each run every turn, with commands, CPU and bus messages per turn
    of every node; all of a one-slot cluster's turns land on the master holding its slot, and a turn's events cross
    the bus as sharded pub/sub (SPUBLISH) to that master's replica only."""
    figures = tmp_path / "cluster_turns.json"
    out = subprocess.run([sys.executable, "bench/cluster_turns.py", "--turns", "40", "--warm", "10", "--repeat", "1",
                          "--idle", "0.5", "--monitored", "10", "--sharded", "2", "--json", str(figures)],
                         cwd=ROOT, check=True, timeout=240, capture_output=True, text=True).stdout
    assert "| cluster, 3 masters |" in out and "One-slot mode, turns/s with 1, 2, 3 masters" in out
    results = {r["name"]: r for r in json.loads(figures.read_text())}
    assert list(results) == ["single redis-server", "single + 1 replica", "cluster, 1 master", "cluster, 2 masters",
                             "cluster, 3 masters", "cluster, 2 masters, 2 shards"]
    for r in results.values():
        assert r["completed"] == r["turns"] == 40 and r["turns_per_s"] > 0
        assert r["commands_per_turn"] > 50 and all(r["monitor"][kind] > 0 for kind in ("top", "multi_exec", "lua"))
        figures = {"commands_per_turn", "cpu_ms_per_turn", "cpu_pct", "bus_publish_per_turn",
                   "bus_publishshard_per_turn", "bus_kib_per_turn"}
        assert all(set(node) == figures for node in r["nodes"].values())
        assert r["busiest_cpu_ms_per_turn"] > 0 and len(r["runs"]) == 1
    for masters in (1, 2, 3):
        nodes = results[f"cluster, {masters} master{'s' * (masters > 1)}"]["nodes"]
        assert sorted(nodes) == sorted(f"{role} {chr(65 + i)}" for i in range(masters) for role in ("master", "replica"))
        # one slot: master A runs the turns' commands, the other masters only their idle background
        assert all(nodes[f"master {chr(65 + i)}"]["commands_per_turn"] < 5 for i in range(1, masters))
        assert nodes["master A"]["commands_per_turn"] > 50
        # the events: sharded messages from master A to replica A, none to the other nodes
        assert all(nodes[f"{role} A"]["bus_publishshard_per_turn"] > 5 for role in ("master", "replica"))
        assert all(node["bus_publishshard_per_turn"] == 0 for label, node in nodes.items() if not label.endswith("A"))
    # sharded: each master runs its shard's turns and sends their events to its own replica
    nodes = results["cluster, 2 masters, 2 shards"]["nodes"]
    assert all(nodes[f"master {m}"]["commands_per_turn"] > 20 for m in "AB")
    assert all(node["bus_publishshard_per_turn"] > 1 for node in nodes.values())
