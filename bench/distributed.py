"""The distributed figures, project and anchors side by side in one run (parts a–d and f).

Starts a private redis-server, the scripted server (``bench/llm_server.py``, its
own process), one turn worker and one tool worker (``smith-worker bench.app:app``)
and, for the anchors, two plain arq workers (``bench/plain_redis.py``, at arq's
default 0.5 s polling and at 0.01 s) and the Agents SDK in ``.bench-venv``
(``bench/sdk_anchor.py``). Only the public client API drives the project.

Figures (one JSON object, ``--out``; durations in ms):

* (f) idle, first: per process Redis commands/s (MONITOR lines attributed by the
  client's TCP port), CPU % of a core (/proc utime+stime), RSS;
* (a) tool hop of sequential no-op tool turns: ``tool_call.completed`` →
  ``tool.result`` (worker stamps: the tool job's enqueue → its result back in the
  turn worker), vs plain arq ``enqueue_job`` → ``job.result()`` at both polls;
* (b) turn latency, interleaved: ``send`` text, ``send`` one-tool, ``stream`` one-tool;
  overhead = turn p50 − the same model requests made directly with httpx, streamed as
  the worker streams (``bench/floor.py``, interleaved in this process; the SDK's side
  subtracts its own floor, measured the same way in its process);
* (c) Redis commands per text and per one-tool turn (MONITOR: top-level,
  MULTI/EXEC and inside scripts apart, the idle rate measured just before
  subtracted; INFO commandstats total too), turns/s with 16 in flight for one and two
  turn workers and CPU ms per turn of each process;
* (d) token latency (event ``ts`` → receipt) at 1 and 50 streams vs raw PUBLISH, and the 50 streams
  through a turn worker coalescing tokens within ``COALESCE`` seconds (events, CPU and latency);
* (f) turn-worker RSS growth with 100 streamed turns in flight.

Usage: ``.venv/bin/python bench/distributed.py [--quick] [--no-anchors] [--out FILE]``
(``--quick``: a few turns per figure, for the smoke test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
import redis.asyncio as aioredis  # noqa: E402
from arq import create_pool  # noqa: E402
from arq.connections import RedisSettings  # noqa: E402

from bench import LOGS  # noqa: E402
from bench.floor import Floor  # noqa: E402
from bench.llm_server import PROMPTS, TOKENS  # noqa: E402
from bench.stats import pct  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_worker.local.processes import ManagedProcess, start_redis_server  # noqa: E402
from smith_worker.testing import start_workers, wait_for_workers, worker_env  # noqa: E402

APP = "bench.app:app"
CLK_TCK = os.sysconf("SC_CLK_TCK")
_COMMAND = re.compile(r'^\S+ \[([^\]]*)\] "([A-Za-z]+)"')
ARQ_POLLS = {"arq_default": 0.5, "arq_fast": 0.01}
#: The token-coalescing window of (d)'s extra run, seconds (SMITH_TOKEN_COALESCE; off by default).
COALESCE = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="a few turns per figure (the smoke test)")
    parser.add_argument("--no-anchors", action="store_true", help="skip the Agents SDK (no .bench-venv)")
    parser.add_argument("--out", type=Path, help="write the figures as JSON here")
    return parser.parse_args(argv)


class Sizes:
    """How many iterations each figure takes (full run or ``--quick``)."""

    def __init__(self, quick: bool) -> None:
        self.idle_s = 1.0 if quick else 10.0
        self.hops = 5 if quick else 200
        self.arq_default_hops = 2 if quick else 10
        self.turns = 3 if quick else 150  # per variant, interleaved
        self.counted = 2 if quick else 20  # turns under MONITOR per kind
        self.burst = 16 if quick else 200
        self.in_flight = 10 if quick else 100
        self.many_streams = 5 if quick else 50


def ms(values: list[float]) -> dict[str, float]:
    """p50 and p99 of durations in seconds, in ms."""
    return {"p50": statistics.median(values) * 1000, "p99": pct(values, 0.99) * 1000, "n": len(values)}


def cpu_s(pid: int) -> float:
    """utime + stime of process ``pid`` (seconds, /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Monitor:
    """``redis-cli monitor`` into a file while the body runs; :meth:`lines` classifies what it saw."""

    def __init__(self, port: str) -> None:
        self.port = port
        self.path = LOGS / f"bench-monitor-{uuid.uuid4().hex[:6]}.log"

    async def __aenter__(self) -> Monitor:
        LOGS.mkdir(parents=True, exist_ok=True)
        self._out = self.path.open("w")
        # Popen returns once the child is spawned; no event-loop stall worth a thread
        self._proc = subprocess.Popen(  # noqa: ASYNC220
            [shutil.which("redis-cli") or "redis-cli", "-p", self.port, "monitor"], stdout=self._out)
        self.started = time.monotonic()  # lines of the settling pause below count too
        await asyncio.sleep(0.3)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self.started
        self._proc.terminate()
        self._proc.wait()
        self._out.close()

    def counts(self) -> tuple[Counter[str], Counter[str]]:
        """(commands by kind: ``top``/``multi_exec``/``lua``, top-level commands by client address)."""
        kinds: Counter[str] = Counter()
        by_client: Counter[str] = Counter()
        for line in self.path.read_text(errors="replace").splitlines():
            match = _COMMAND.match(line)
            if match is None:
                continue
            client, name = match.group(1), match.group(2).upper()
            if "lua" in client:
                kinds["lua"] += 1
            elif name in ("MULTI", "EXEC"):
                kinds["multi_exec"] += 1
                by_client[client.split()[-1]] += 1
            else:
                kinds["top"] += 1
                by_client[client.split()[-1]] += 1
        self.path.unlink()
        return kinds, by_client


def client_ports(pid: int, redis_port: int) -> set[int]:
    """Local TCP ports of ``pid``'s connections to Redis."""
    return {c.laddr.port for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == redis_port}


async def commandstats_total(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.sizes = args, Sizes(args.quick)
        self.out: dict[str, Any] = {"quick": args.quick}
        self.procs: dict[str, ManagedProcess] = {}

    # ---- setup ---------------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        redis_proc, self.url = start_redis_server()
        self.redis_port = int(self.url.rsplit(":", 1)[1].split("/", 1)[0])
        llm = subprocess.Popen([sys.executable, "-m", "bench.llm_server"], cwd=ROOT,  # noqa: ASYNC220
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert llm.stdout is not None
            self.base_url = llm.stdout.readline().strip()
            self.prefix = f"bench{uuid.uuid4().hex[:6]}"
            self.env = worker_env(self.url, self.prefix, self.base_url)
            turn, tool = start_workers(APP, self.env, ["turns", "tools"], self.prefix, log_dir=LOGS)
            self.procs.update(turn_worker=turn, tool_worker=tool)
            for name, poll in ARQ_POLLS.items():
                argv = [sys.executable, "-m", "bench.plain_redis", "arq-worker", self.url, f"{self.prefix}:{name}",
                        str(poll)]
                self.procs[name] = ManagedProcess(argv, env=self.env, log_path=LOGS / f"{self.prefix}-{name}.log",
                                                  grace=5.0).start()
            self.redis_pid = redis_proc.pid
            self.llm_pid = llm.pid
            await wait_for_workers(self.url, self.prefix, 2)
            self.redis = aioredis.Redis.from_url(self.url)
            async with SmithClient.from_url(self.url, prefix=self.prefix) as self.client:
                await self.warm_up()
                await self.idle()
                await self.tool_hop()
                await self.turn_latency()
                await self.commands_per_turn()
                await self.throughput()
                await self.token_latency()
                await self.memory()
            await self.redis.aclose()
        finally:
            for proc in self.procs.values():
                proc.stop()
            llm.stdin.close()  # type: ignore[union-attr]
            llm.wait(10)
            redis_proc.stop()
        if not self.args.no_anchors:
            self.anchors()
        return self.out

    def conversation(self) -> str:
        return f"c{uuid.uuid4().hex[:12]}"

    async def send(self, name: str) -> None:
        await self.client.send(PROMPTS[name], conversation_id=self.conversation(), timeout=60)

    async def stream(self, name: str) -> list[Any]:
        return [event async for event in self.client.stream(PROMPTS[name], conversation_id=self.conversation(),
                                                            timeout=60)]

    async def warm_up(self) -> None:
        for name in ("text", "tool", "noop"):
            await self.send(name)
            await self.stream(name)

    # ---- (f) idle -----------------------------------------------------------------------------------

    async def idle(self) -> None:
        await asyncio.sleep(1.0)
        watched = {name: proc.pid for name, proc in self.procs.items()}
        ports = {name: client_ports(pid, self.redis_port) for name, pid in watched.items()}
        cpu_before = {name: cpu_s(pid) for name, pid in watched.items()}
        async with Monitor(str(self.redis_port)) as monitor:
            await asyncio.sleep(self.sizes.idle_s)
        cpu_after = {name: cpu_s(pid) for name, pid in watched.items()}
        kinds, by_client = monitor.counts()
        idle: dict[str, Any] = {}
        for name in watched:
            commands = sum(n for address, n in by_client.items() if int(address.rsplit(":", 1)[1]) in ports[name])
            idle[name] = {"cmds_per_s": commands / monitor.elapsed,
                          "cpu_pct": (cpu_after[name] - cpu_before[name]) / monitor.elapsed * 100,
                          "rss_mib": rss_mib(watched[name])}
        self.out["idle"] = idle
        self.out["idle_rate"] = {kind: n / monitor.elapsed for kind, n in kinds.items()}

    # ---- (a) tool hop -------------------------------------------------------------------------------

    async def tool_hop(self) -> None:
        hops: list[float] = []
        for _ in range(self.sizes.hops):
            started = None
            for event in await self.stream("noop"):
                if event.type == "tool_call.completed":
                    started = event.ts
                elif event.type == "tool.result" and started is not None:
                    hops.append(event.ts - started)
            await asyncio.sleep(random.uniform(0, 0.01))  # not in step with any poll
        self.out["tool_hop"] = ms(hops)
        pool = await create_pool(RedisSettings.from_dsn(self.url))
        try:
            for name, poll in ARQ_POLLS.items():
                n = self.sizes.arq_default_hops if name == "arq_default" else self.sizes.hops
                samples = []
                for _ in range(n):
                    started_at = time.perf_counter()
                    job = await pool.enqueue_job("noop", _queue_name=f"{self.prefix}:{name}")
                    assert job is not None
                    await job.result(timeout=30, poll_delay=poll)
                    samples.append(time.perf_counter() - started_at)
                    await asyncio.sleep(random.uniform(0, 0.01))
                self.out[f"tool_hop_{name}"] = ms(samples)
        finally:
            await pool.aclose()

    # ---- (b) turn latency ---------------------------------------------------------------------------

    async def turn_latency(self) -> None:
        variants: dict[str, Callable[[], Awaitable[Any]]] = {
            "text": lambda: self.send("text"),
            "tool": lambda: self.send("tool"),
            "stream_tool": lambda: self.stream("tool"),
            "floor_stream_text": lambda: floor.turn("text", stream=True),
            "floor_stream_tool": lambda: floor.turn("tool", stream=True),
        }
        floor = Floor(self.base_url, PROMPTS)
        wall: dict[str, list[float]] = {name: [] for name in variants}
        order = list(variants)
        for _ in range(self.sizes.turns):
            random.shuffle(order)
            for name in order:
                started = time.perf_counter()
                await variants[name]()
                wall[name].append(time.perf_counter() - started)
        await floor.aclose()
        self.out["turn"] = {name: ms(values) for name, values in wall.items()}

    # ---- (c) commands per turn, throughput, CPU -----------------------------------------------------

    async def commands_per_turn(self) -> None:
        port = str(self.redis_port)
        async with Monitor(port) as idle:
            await asyncio.sleep(min(2.0, self.sizes.idle_s))
        idle_kinds, _ = idle.counts()
        idle_total_before = await commandstats_total(self.redis)
        await asyncio.sleep(1.0)
        idle_total_rate = (await commandstats_total(self.redis) - idle_total_before - 1) / 1.0
        per_turn: dict[str, Any] = {}
        for name in ("text", "tool"):
            total_before = await commandstats_total(self.redis)
            async with Monitor(port) as monitor:
                for _ in range(self.sizes.counted):
                    await self.send(name)
                await asyncio.sleep(0.3)  # the last turn's tail
            total = await commandstats_total(self.redis) - total_before
            kinds, _ = monitor.counts()
            n = self.sizes.counted
            per_turn[name] = {kind: (kinds[kind] - idle_kinds[kind] / idle.elapsed * monitor.elapsed) / n
                              for kind in ("top", "multi_exec", "lua")}
            per_turn[name]["commandstats_total"] = (total - idle_total_rate * monitor.elapsed) / n
        self.out["commands_per_turn"] = per_turn

    async def burst(self, name: str) -> dict[str, float]:
        """``burst`` turns of ``name``, 16 in flight: turns/s and CPU ms per turn of each process."""
        remaining = list(range(self.sizes.burst))

        async def lane() -> None:
            while remaining:
                remaining.pop()
                await self.send(name)

        pids = {n: p.pid for n, p in self.procs.items() if n.startswith(("turn_worker", "tool_worker"))}
        pids.update(redis=self.redis_pid, llm_server=self.llm_pid)
        before = {n: cpu_s(pid) for n, pid in pids.items()}
        client_before, started = own_cpu_s(), time.perf_counter()
        await asyncio.gather(*(lane() for _ in range(16)))
        elapsed, n = time.perf_counter() - started, self.sizes.burst
        out = {"turns_per_s": n / elapsed, "cpu_ms_client": (own_cpu_s() - client_before) * 1000 / n}
        out.update({f"cpu_ms_{name}": (cpu_s(pid) - before[name]) * 1000 / n for name, pid in pids.items()})
        return out

    async def throughput(self) -> None:
        result: dict[str, Any] = {}
        for name in ("text", "tool"):
            result[f"1_{name}"] = await self.burst(name)
        second = start_workers(APP, self.env, ["turns"], f"{self.prefix}-2", log_dir=LOGS)[0]
        self.procs["turn_worker_2"] = second
        await wait_for_workers(self.url, self.prefix, 3)
        for _ in range(4):
            await self.send("tool")  # warm the second worker
        for name in ("text", "tool"):
            result[f"2_{name}"] = await self.burst(name)
        second.stop()
        del self.procs["turn_worker_2"]
        self.out["throughput"] = result

    # ---- (d) token latency --------------------------------------------------------------------------

    async def project_tokens(self, streams: int, sequential: int, client: SmithClient | None = None
                             ) -> tuple[list[float], int]:
        latencies: list[float] = []
        size = 0

        async def one() -> None:
            nonlocal size
            async for event in (client or self.client).stream(PROMPTS["tokens"], conversation_id=self.conversation(),
                                                              timeout=60):
                if event.type == "token":
                    latencies.append(time.time() - event.ts)
                    if not size:  # once: re-serializing every event would slow the receiving loop it measures
                        size = len(event.model_dump_json())

        for _ in range(sequential):
            await asyncio.gather(*(one() for _ in range(streams)))
        return latencies, size

    async def coalesced_tokens(self, streams: int) -> dict[str, Any]:
        """The 50 streams again through a turn worker coalescing tokens (``SMITH_TOKEN_COALESCE``, its own
        prefix): token events per stream, the turn worker's CPU ms per stream, and the latency from the
        event's ``ts`` (stamped when its batch is sent: add the window's wait, up to ``COALESCE`` s)."""
        prefix = f"{self.prefix}c"
        env = worker_env(self.url, prefix, self.base_url, SMITH_TOKEN_COALESCE=str(COALESCE))
        [worker] = start_workers(APP, env, ["turns"], prefix, log_dir=LOGS)
        try:
            await wait_for_workers(self.url, prefix, 1)
            async with SmithClient.from_url(self.url, prefix=prefix) as client:
                await client.send(PROMPTS["text"], conversation_id=self.conversation(), timeout=60)  # warm-up
                cpu = cpu_s(worker.pid)
                latencies, _ = await self.project_tokens(streams, 1, client)
                cpu = cpu_s(worker.pid) - cpu
        finally:
            worker.stop()
        return {"window_s": COALESCE, "project": ms(latencies), "events_per_stream": len(latencies) / streams,
                "cpu_ms_per_stream": cpu * 1000 / streams}

    async def floor_tokens(self, streams: int, sequential: int, size: int) -> tuple[list[float], int]:
        """Raw PUBLISH → subscriber latencies (s), and how many messages never arrived."""
        latencies: list[float] = []
        lost = [0]
        for _ in range(sequential):
            channel = f"{self.prefix}:floor:{uuid.uuid4().hex[:6]}"

            argv = [sys.executable, "-m", "bench.plain_redis", "publish", self.url, channel,
                    str(streams), str(TOKENS), "0.02", str(size)]
            publisher = subprocess.Popen(argv, cwd=ROOT, env=self.env)  # noqa: ASYNC220
            # it waits for every subscriber before it publishes

            async def one(i: int, channel: str = channel, publisher: subprocess.Popen[bytes] = publisher) -> None:
                pubsub = self.redis.pubsub()
                await pubsub.subscribe(f"{channel}:{i}")
                got = 0
                while got < TOKENS:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is not None:
                        latencies.append(time.time() - json.loads(message["data"])["ts"])
                        got += 1
                    elif publisher.poll() is not None:  # it is done (or died): what never came is lost
                        lost[0] += TOKENS - got
                        break
                await pubsub.aclose()

            await asyncio.gather(*(one(i) for i in range(streams)))
            await asyncio.to_thread(publisher.wait, 30)
        return latencies, lost[0]

    async def token_latency(self) -> None:
        result: dict[str, Any] = {}
        for label, streams, sequential in (("1", 1, 3), ("50", self.sizes.many_streams, 1)):
            cpu = cpu_s(self.procs["turn_worker"].pid)
            project, size = await self.project_tokens(streams, sequential)
            cpu = cpu_s(self.procs["turn_worker"].pid) - cpu
            floor, lost = await self.floor_tokens(streams, sequential, size)
            result[label] = {"streams": streams, "payload_bytes": size, "project": ms(project), "pubsub": ms(floor),
                             "pubsub_lost": lost, "events_per_stream": len(project) / (streams * sequential),
                             "cpu_ms_per_stream": cpu * 1000 / (streams * sequential)}
        result["50_coalesced"] = await self.coalesced_tokens(self.sizes.many_streams)
        self.out["token_latency"] = result

    # ---- (f) memory ---------------------------------------------------------------------------------

    async def memory(self) -> None:
        pid = self.procs["turn_worker"].pid
        before, peak = rss_mib(pid), 0.0
        handles = [await self.client.submit(PROMPTS["slow"], conversation_id=self.conversation())
                   for _ in range(self.sizes.in_flight)]
        results = asyncio.gather(*(handle.result(timeout=120) for handle in handles))
        while not results.done():
            peak = max(peak, rss_mib(pid))
            await asyncio.sleep(0.02)
        await results
        self.out["memory"] = {"rss_before_mib": before, "rss_peak_mib": peak, "turns": self.sizes.in_flight,
                              "per_turn_kib": (peak - before) * 1024 / self.sizes.in_flight}

    # ---- anchors ------------------------------------------------------------------------------------

    def anchors(self) -> None:
        """The Agents SDK in ``.bench-venv`` against a fresh scripted server (nothing else running)."""
        from bench.anchor_env import anchor_python

        python = str(anchor_python())
        llm = subprocess.Popen([sys.executable, "-m", "bench.llm_server"], cwd=ROOT, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
        try:
            assert llm.stdout is not None
            base_url = llm.stdout.readline().strip()
            script = str(ROOT / "bench" / "sdk_anchor.py")

            def sdk(*mode: str) -> dict[str, Any]:
                done = subprocess.run([python, script, base_url, json.dumps(PROMPTS), *mode], check=True,
                                      capture_output=True, text=True)
                return dict(json.loads(done.stdout.strip().splitlines()[-1]))

            turns = sdk("turns", str(self.sizes.turns))
            self.out["sdk_turn"] = {name: ms(values) for name, values in turns["wall"].items()}
            self.out["sdk_cpu_ms_per_turn"] = {name: s * 1000 for name, s in turns["cpu_per_turn"].items()}
            self.out["sdk_throughput"] = sdk("throughput", str(self.sizes.burst))
            self.out["sdk_memory"] = sdk("rss")
        finally:
            llm.stdin.close()  # type: ignore[union-attr]
            llm.wait(10)


def main() -> None:
    args = parse_args()
    out = asyncio.run(Bench(args).run())
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text)
    else:
        print(text)


if __name__ == "__main__":
    main()
