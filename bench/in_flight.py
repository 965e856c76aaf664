"""Many slow turns in flight on one turn worker process, and the turns/s one Redis core sustains.

Part 1, in flight: a private redis-server, the scripted chat-completions server in its own process
(``bench/llm_server.py``, scenario ``wait2s``: 2 s per response) and one turn worker (``bench.app:app``) with
``SMITH_TURN_MAX_JOBS`` and ``SMITH_LLM_MAX_CONNECTIONS`` at ``--turns`` (default 10,000). It runs
``--sequential`` text turns one at a time (the reference), measures the idle worker for ``--idle`` seconds,
then submits ``--turns`` text turns at once and waits until the turns queue is empty (the worker's
``/metrics``, ``smith_queue_length``), then reads every turn's status. It prints:

* whether all completed, and the wall time from the first submit to the last turn's end;
* the turn worker's RSS idle and at its peak (sampled every 0.1 s), and (peak − idle) / turns against
  the target of :data:`RSS_TARGET_KIB` KiB per in-flight turn (PASS/FAIL);
* Redis commands and network bytes per turn (``INFO commandstats``: every command Redis ran, those
  scripts ran included; ``INFO stats`` bytes in and out), for the sequential turns and the 10,000,
  each less the idle background of the same span (the idle rate, measured with the same ``/metrics``
  scrapes) and the bench's own ``INFO`` calls, and their ratio against :data:`COMMANDS_RATIO_TARGET`
  (PASS/FAIL); the idle worker's commands and bytes per second;
* the worker's peak Redis connections and model connections (``INFO clients``, /proc).

Part 2, saturation: a fresh redis-server, ``--workers`` turn workers (default 3) and the scripted
model at zero latency (scenario ``text``); the bench keeps ``--backlog`` turns queued for
``--seconds`` (after a warm-up) and prints turns/s, Redis's CPU over the same span (``INFO cpu``,
``used_cpu_sys`` + ``used_cpu_user``, per second of wall time), and turns/s extrapolated to 100 % of
one Redis core (turns/s ÷ that fraction).

Usage: ``.venv/bin/python bench/in_flight.py [--turns 10000] [--sequential 5] [--workers 3] [--seconds 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from bench.llm_server import PROMPTS  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_client import turn_record as record  # noqa: E402
from smith_worker import testing  # noqa: E402
from smith_worker.local.processes import ManagedProcess, free_port, start_redis_server  # noqa: E402
from smith_worker.ops.open_files import raise_open_files_limit  # noqa: E402
from smith_worker.queue.claim import CLAIM  # noqa: E402

APP = "bench.app:app"
#: The acceptance target: worker RSS growth per in-flight turn, KiB.
RSS_TARGET_KIB = 60.0
#: Most Redis commands per turn with ``--turns`` in flight, as a multiple of the sequential turns' ("unchanged":
#: within the run-to-run spread of the count, a few commands of arq's bookkeeping and the periodic queue reads).
COMMANDS_RATIO_TARGET = 1.10
#: Microseconds above which a job claim's script is recorded (SLOWLOG), to measure its scan of the jobs in progress.
SLOW_CLAIM_US = 200
#: How a claim's call starts in SLOWLOG.
CLAIM_CALL = f"EVALSHA {CLAIM.sha}".encode()
#: Turns submitted at once (one client, ``asyncio.gather``).
BATCH = 500
_TURNS_ENDED = re.compile(r'^smith_turns_total\{[^}]*status="([a-z_]+)"[^}]*\} ([0-9.e+]+)$', re.M)
# the labels as a whole: a Redis Cluster deployment's queue name has braces, {smith}:turns
_QUEUE_LENGTH = re.compile(r"^smith_queue_length\{.*\} ([0-9.e+]+)$", re.M)


@dataclass
class Sample:
    """Redis's counters at one moment: commands run (``INFO`` excluded), bytes in + out, CPU seconds."""

    at: float
    commands: int
    bytes: int
    cpu: float
    info_calls: int


@dataclass
class Worker:
    """A turn worker process and its ``/metrics`` port."""

    proc: ManagedProcess
    metrics_port: int

    def metrics(self) -> str:
        """The worker's ``/metrics`` page."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            return str(response.read().decode())

    def queue_length(self) -> int | None:
        """Jobs in the turns queue (queued, running, deferred), as the worker's ``/metrics`` reads it; None when
        the page has no figure (a busy worker's scrape gives up reading Redis after a second)."""
        found = _QUEUE_LENGTH.findall(self.metrics())
        return int(float(found[0])) if found else None

    def ended(self) -> dict[str, int]:
        """Turns this worker counted ended, by status (its ``/metrics``)."""
        text = self.metrics()
        counts: dict[str, int] = {}
        for status, value in _TURNS_ENDED.findall(text):
            counts[status] = counts.get(status, 0) + int(float(value))
        return counts

    def rss_kib(self) -> int:
        """The worker's resident memory, KiB."""
        return int(psutil.Process(self.proc.pid).memory_info().rss // 1024)

    def model_connections(self, llm_port: int) -> int:
        """The worker's TCP connections to the model server."""
        return sum(
            1 for c in psutil.Process(self.proc.pid).net_connections("tcp") if c.raddr and c.raddr.port == llm_port
        )


async def sample(client: SmithClient) -> Sample:
    """Redis's counters now (one ``INFO`` call; its own calls counted apart)."""
    info = await client.redis.info("all")
    calls = {k: int(v["calls"]) for k, v in info.items() if k.startswith("cmdstat_") and isinstance(v, dict)}
    info_calls = calls.get("cmdstat_info", 0)
    return Sample(
        at=time.monotonic(),
        commands=sum(calls.values()) - info_calls,
        bytes=int(info["total_net_input_bytes"]) + int(info["total_net_output_bytes"]),
        cpu=float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
        info_calls=info_calls,
    )


@dataclass
class Rate:
    """Per-second figures of a span."""

    commands: float
    bytes: float


def per_turn(before: Sample, after: Sample, turns: int, idle: Rate) -> tuple[float, float]:
    """(commands, bytes) per turn between two samples, less the idle background of that span."""
    span = after.at - before.at
    commands = after.commands - before.commands - idle.commands * span
    data = after.bytes - before.bytes - idle.bytes * span
    return commands / turns, data / turns


@contextmanager
def llm_server() -> Iterator[tuple[str, int]]:
    """The scripted model in its own process: (base URL, port)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.llm_server"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        yield base_url, int(base_url.rsplit(":", 1)[1].split("/", 1)[0])
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(30)


@asynccontextmanager
async def fleet(workers: int, max_jobs: int) -> AsyncIterator[tuple[SmithClient, list[Worker], int]]:
    """redis-server, the scripted model and ``workers`` turn workers of ``max_jobs`` slots (and as many model
    connections): (client, workers, the model server's port)."""
    redis_proc, redis_url = start_redis_server()
    prefix = f"inflight{uuid.uuid4().hex[:6]}"
    started: list[Worker] = []
    try:
        with llm_server() as (base_url, llm_port):
            for _ in range(workers):
                port = free_port()
                env = testing.worker_env(
                    redis_url,
                    prefix,
                    base_url,
                    SMITH_TURN_MAX_JOBS=str(max_jobs),
                    SMITH_LLM_MAX_CONNECTIONS=str(max_jobs),
                    SMITH_METRICS_PORT=str(port),
                )
                [proc] = testing.start_workers(APP, env, ["turns"], f"{prefix}-{len(started)}", log_dir=LOGS)
                started.append(Worker(proc, port))
            try:
                await testing.wait_for_workers(redis_url, prefix, workers)
                async with SmithClient.from_url(redis_url, prefix=prefix, max_connections=200) as client:
                    yield client, started, llm_port
            finally:
                for worker in started:
                    worker.proc.stop()
    finally:
        redis_proc.stop()


def ended(workers: list[Worker]) -> dict[str, int]:
    """Turns the workers counted ended, by status."""
    total: dict[str, int] = {}
    for worker in workers:
        for status, count in worker.ended().items():
            total[status] = total.get(status, 0) + count
    return total


async def submit(client: SmithClient, prompt: str, count: int, tag: str) -> list[str]:
    """Submit ``count`` turns of ``prompt``, a conversation each, ``BATCH`` at a time; their turn ids."""
    ids: list[str] = []
    for first in range(0, count, BATCH):
        handles = await asyncio.gather(
            *(client.submit(prompt, conversation_id=f"{tag}-{i}") for i in range(first, min(first + BATCH, count)))
        )
        ids += [handle.turn_id for handle in handles]
    return ids


async def drained(worker: Worker, timeout: float, interval: float = 0.05) -> None:
    """Wait until the turns queue is empty (arq drops a job when it ends). Raises ``TimeoutError``."""
    deadline = time.monotonic() + timeout
    while (left := await asyncio.to_thread(worker.queue_length)) != 0:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{left} jobs still queued or running after {timeout:.0f} s")
        await asyncio.sleep(interval)


async def statuses(client: SmithClient, turn_ids: list[str]) -> tuple[dict[str, int], int]:
    """How many of ``turn_ids`` are in each status, and how many ran more than one attempt (a re-run after
    its lease was lost), from their state hashes read in pipelines."""
    counts: dict[str, int] = {}
    reruns = 0
    for first in range(0, len(turn_ids), 1000):
        async with client.redis.pipeline(transaction=False) as pipe:
            for turn_id in turn_ids[first : first + 1000]:
                pipe.hmget(client.keys.turn_state(turn_id), [record.STATUS, record.ATTEMPT])
            for status, attempt in await pipe.execute():
                name = status.decode() if status else "missing"
                counts[name] = counts.get(name, 0) + 1
                reruns += int(attempt or 1) > 1
    return counts, reruns


async def idle_rate(client: SmithClient, workers: list[Worker], seconds: float, *, scrape: bool) -> Rate:
    """Commands and bytes per second of the idle fleet; with ``scrape``, while the bench scrapes ``/metrics``
    as it does when waiting for turns (the background its figures are taken less)."""
    before = await sample(client)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if scrape:
            await asyncio.to_thread(workers[0].queue_length)
        await asyncio.sleep(0.05)
    after = await sample(client)
    span = after.at - before.at
    return Rate((after.commands - before.commands) / span, (after.bytes - before.bytes) / span)


async def peak_rss(worker: Worker, stop: asyncio.Event) -> int:
    """The worker's highest RSS (KiB) sampled every 0.1 s until ``stop`` is set."""
    peak = worker.rss_kib()
    while not stop.is_set():
        peak = max(peak, worker.rss_kib())
        await asyncio.sleep(0.1)
    return peak


async def in_flight(turns: int, sequential: int, idle_seconds: float) -> bool:
    """Part 1 (see the module docstring); True when every turn completed and the RSS target held."""
    async with fleet(1, turns) as (client, [worker], llm_port):
        prompt, tag = PROMPTS["wait2s"], uuid.uuid4().hex[:6]
        await submit(client, PROMPTS["text"], 3, f"warm-{tag}")  # warm up: imports, scripts, connections
        await drained(worker, 60)
        quiet = await idle_rate(client, [worker], idle_seconds, scrape=False)
        idle = await idle_rate(client, [worker], idle_seconds, scrape=True)
        before, started = await sample(client), time.monotonic()
        for i in range(sequential):
            await submit(client, prompt, 1, f"seq-{tag}-{i}")
            await drained(worker, 60)
        seq_seconds = (time.monotonic() - started) / sequential
        seq_commands, seq_bytes = per_turn(before, await sample(client), sequential, idle)
        await asyncio.sleep(1.0)
        idle_kib = worker.rss_kib()
        stop = asyncio.Event()
        peak_task = asyncio.create_task(peak_rss(worker, stop))
        connections = [0, 0]

        async def watch_connections() -> None:
            while not stop.is_set():
                clients = int((await client.redis.info("clients"))["connected_clients"])
                model = await asyncio.to_thread(worker.model_connections, llm_port)
                connections[:] = max(connections[0], clients), max(connections[1], model)
                await asyncio.sleep(1.0)

        await client.redis.config_set("slowlog-log-slower-than", SLOW_CLAIM_US)
        await client.redis.config_set("slowlog-max-len", 100_000)
        await client.redis.slowlog_reset()
        before, started = await sample(client), time.monotonic()
        worker_cpu = psutil.Process(worker.proc.pid).cpu_times()
        watcher = asyncio.create_task(watch_connections())
        turn_ids = await submit(client, prompt, turns, f"many-{tag}")
        submitted = time.monotonic() - started
        await drained(worker, 600, interval=0.25)
        wall = time.monotonic() - started
        after = await sample(client)
        cpu_now = psutil.Process(worker.proc.pid).cpu_times()
        worker_cpu_s = cpu_now.user + cpu_now.system - worker_cpu.user - worker_cpu.system
        stop.set()
        peak_kib = await peak_task
        await watcher
        many_commands, many_bytes = per_turn(before, after, turns, idle)
        info_calls = after.info_calls - before.info_calls
        counts, reruns = await statuses(client, turn_ids)
        claims = [e for e in await client.redis.slowlog_get(100_000) if e["command"].startswith(CLAIM_CALL)]
    completed = counts.get("completed", 0)
    growth = (peak_kib - idle_kib) / turns
    ok = completed == turns and growth <= RSS_TARGET_KIB and many_commands / seq_commands <= COMMANDS_RATIO_TARGET
    print(f"in flight: {turns} text turns on one turn worker, the model answering in 2 s")
    print(
        f"  completed: {completed} of {turns} (statuses: {counts}), {reruns} re-run after a lost lease; "
        f"submitted in {submitted:.1f} s"
    )
    print(f"  wall time, first submit to last end: {wall:.1f} s (a sequential turn: {seq_seconds:.2f} s)")
    print(
        f"  CPU over that span: Redis {after.cpu - before.cpu:.1f} s ({(after.cpu - before.cpu) / wall * 100:.0f} % of "
        f"a core), turn worker {worker_cpu_s:.1f} s ({worker_cpu_s / wall * 100:.0f} %), "
        f"{worker_cpu_s / turns * 1000:.2f} ms of worker CPU per turn"
    )
    print(
        f"  turn worker RSS: idle {idle_kib / 1024:.1f} MiB, peak {peak_kib / 1024:.1f} MiB; "
        f"(peak - idle) / {turns} = {growth:.1f} KiB per in-flight turn (target <= {RSS_TARGET_KIB:.0f}): "
        f"{'PASS' if growth <= RSS_TARGET_KIB else 'FAIL'}"
    )
    print(
        f"  Redis commands per turn (INFO commandstats, scripts' commands included, idle background less): "
        f"{many_commands:.1f} with {turns} in flight, {seq_commands:.1f} sequential ({sequential} turns); "
        f"ratio {many_commands / seq_commands:.3f} (target <= {COMMANDS_RATIO_TARGET:.2f}): "
        f"{'PASS' if many_commands / seq_commands <= COMMANDS_RATIO_TARGET else 'FAIL'}"
    )
    print(f"  Redis bytes per turn (in + out): {many_bytes:.0f} with {turns} in flight, {seq_bytes:.0f} sequential")
    print(
        f"  idle turn worker: {quiet.commands:.2f} commands/s, {quiet.bytes:.0f} bytes/s; with the bench's /metrics "
        f"scrapes (subtracted above): {idle.commands:.2f} commands/s, {idle.bytes:.0f} bytes/s"
    )
    print(
        f"  peak connections: Redis clients {connections[0]} (the bench's included), "
        f"worker to model {connections[1]}; bench INFO calls excluded: {info_calls}"
    )
    if claims:
        durations = sorted(e["duration"] / 1000 for e in claims)
        print(
            f"  job claims that ran over {SLOW_CLAIM_US} us in Redis (SLOWLOG): {len(claims)}, "
            f"{sum(durations):.0f} ms in all, mean {sum(durations) / len(durations):.2f} ms, "
            f"max {durations[-1]:.2f} ms"
        )
    return ok


async def saturation(workers: int, backlog: int, seconds: float, max_jobs: int) -> None:
    """Part 2 (see the module docstring)."""
    async with fleet(workers, max_jobs) as (client, started, _):
        tag, submitted = uuid.uuid4().hex[:6], 0
        stop = asyncio.Event()
        done = {"n": 0}

        async def feed() -> None:
            nonlocal submitted
            while not stop.is_set():
                if submitted - done["n"] < backlog:
                    await submit(client, PROMPTS["text"], BATCH // 5, f"sat-{tag}-{submitted}")
                    submitted += BATCH // 5
                else:
                    await asyncio.sleep(0.01)

        feeder = asyncio.create_task(feed())

        async def count() -> int:
            done["n"] = sum((await asyncio.to_thread(ended, started)).values())
            return done["n"]

        warm_until = time.monotonic() + 5.0
        while time.monotonic() < warm_until:
            await count()
            await asyncio.sleep(0.2)
        before, first = await sample(client), await count()
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            await count()
            await asyncio.sleep(0.2)
        after, last = await sample(client), await count()
        stop.set()
        await feeder
        statuses = await asyncio.to_thread(ended, started)
    span = after.at - before.at
    rate = (last - first) / span
    cpu = (after.cpu - before.cpu) / span
    print(f"saturation: {workers} turn workers, the scripted model at zero latency, {backlog} turns kept queued")
    print(f"  {last - first} text turns in {span:.1f} s: {rate:.0f} turns/s")
    print(f"  Redis CPU (used_cpu_sys + used_cpu_user) / wall: {cpu * 100:.0f} % of one core")
    print(f"  turns/s at 100 % of one Redis core (extrapolated): {rate / cpu:.0f}")
    print(f"  Redis commands per turn there: {(after.commands - before.commands) / max(1, last - first):.1f}")
    print(f"  ended by status: {statuses}")


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--sequential", type=int, default=5)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the idle measurement")
    parser.add_argument("--workers", type=int, default=3, help="turn workers of the saturation part")
    parser.add_argument("--backlog", type=int, default=600, help="turns kept queued in the saturation part")
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds of the saturation part")
    parser.add_argument("--skip", choices=["in-flight", "saturation"], help="leave one part out")
    args = parser.parse_args()
    raise_open_files_limit()
    ok = True
    if args.skip != "in-flight":
        ok = await in_flight(args.turns, args.sequential, args.idle)
    if args.skip != "saturation":
        await saturation(args.workers, args.backlog, args.seconds, max_jobs=100)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    asyncio.run(main())
