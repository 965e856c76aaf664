"""Turns paused for a person cost Redis bytes only: no worker slot, no task, no memory in a worker.

Starts a private redis-server, the scripted chat-completions server, one turn worker and one tool worker
(``bench.app:app``), then:

* pauses ``--turns`` turns (default 10,000) whose step calls ``stamp``, a tool that needs approval, and
  reports Redis's ``used_memory`` per paused turn, the turn worker's RSS before and after, and the job
  slots they hold (turns in ``{p}:running`` and arq in-progress keys of the turns queue: 0);
* approves ``--approvals`` of them one at a time and reports approve → tool started (the tool answers the
  epoch time it started at; same machine, same clock) p50 / p99.

Usage: ``.venv/bin/python bench/paused_turns.py [--turns 10000] [--approvals 200]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import fleet  # noqa: E402
from smith_client import SmithClient, TurnHandle  # noqa: E402
from smith_worker import testing  # noqa: E402

APP = "bench.app:app"
#: Turns submitted at once while pausing them (a web app's burst).
BATCH = 200


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid``, MiB (/proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


async def used_memory(client: SmithClient) -> int:
    return int((await client.redis.info("memory"))["used_memory"])


async def slots_held(client: SmithClient) -> int:
    """Turns holding a worker: listed as running, or an arq in-progress key of the turns queue."""
    running = int(await client.redis.zcard(client.keys.running))
    in_progress = [key async for key in client.redis.scan_iter(match="arq:in-progress:*", count=1000)]
    return running + len(in_progress)


async def pause_all(client: SmithClient, marker: str, turns: int) -> list[TurnHandle]:
    """Submit ``turns`` turns (a conversation each) and return once all of them paused."""
    paused, tag, handles = await client.redis.zcard(client.keys.paused), uuid.uuid4().hex[:6], []
    for first in range(0, turns, BATCH):
        batch = range(first, min(first + BATCH, turns))
        handles += await asyncio.gather(
            *(client.submit(f"{marker} {i}", conversation_id=f"paused-{tag}-{i}", agent="gated") for i in batch)
        )
    deadline = time.monotonic() + 600
    while await client.redis.zcard(client.keys.paused) < paused + turns:
        if time.monotonic() > deadline:
            raise RuntimeError("the turns did not all pause within 600 s")
        await asyncio.sleep(0.5)
    return handles


async def approve_latency(client: SmithClient, handle: TurnHandle) -> float:
    """Seconds from the approval to the approved tool's start (its answer)."""
    [item] = await client.pending(handle.turn_id)
    approved = time.time()
    await client.approve(handle.turn_id, item.call_id)
    async for event in handle.events():
        if event.type == "tool.result":
            return float(event.data["content"]) - approved
    raise RuntimeError(f"turn {handle.turn_id} ended without its tool result")


async def memory_by_kind(client: SmithClient, handles: list[TurnHandle]) -> dict[str, int]:
    """Bytes (``MEMORY USAGE``) of every key, by kind: the key with each paused turn's id and conversation id
    replaced by ``{t}`` and ``{c}`` (other keys are named as they are)."""
    names = {h.turn_id: "{t}" for h in handles}
    kinds: dict[str, int] = {}
    keys = [key.decode() async for key in client.redis.scan_iter(count=1000)]
    for first in range(0, len(keys), 1000):
        batch = keys[first : first + 1000]
        async with client.redis.pipeline(transaction=False) as pipe:
            for key in batch:
                pipe.memory_usage(key, samples=0)
            sizes = await pipe.execute()
        for key, size in zip(batch, sizes, strict=True):
            kind = key
            for part in key.replace(":", " ").split():
                if part in names or part.startswith("paused-"):
                    kind = kind.replace(part, names.get(part, "{c}"))
            kinds[kind] = kinds.get(kind, 0) + int(size or 0)
    return kinds


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--approvals", type=int, default=200)
    args = parser.parse_args()
    async with fleet(APP, ["turns", "tools"]) as f:
        key, client = uuid.uuid4().hex[:8], f.client
        f.llm.add_scenario(key, testing.Script(testing.Reply.tool_calls([("stamp", {})]), testing.Reply.text("ok")))
        marker = testing.scenario_marker(key)
        turn_worker = f.procs[0].pid
        await pause_all(client, marker, 1)  # warm up: a paused turn of its own, kept paused
        memory, rss = await used_memory(client), rss_mib(turn_worker)
        started = time.monotonic()
        handles = await pause_all(client, marker, args.turns)
        seconds = time.monotonic() - started
        await asyncio.sleep(1.0)  # arq's job ends after run_turn returned
        per_turn = (await used_memory(client) - memory) / args.turns
        slots, rss_after = await slots_held(client), rss_mib(turn_worker)
        kinds = await memory_by_kind(client, handles)
        latencies = [await approve_latency(client, h) * 1000 for h in handles[: args.approvals]]
    print(f"paused turns: {args.turns} in {seconds:.1f} s ({args.turns / seconds:.0f}/s)")
    print(f"Redis used_memory per paused turn: {per_turn / 1024:.2f} KiB")
    print("bytes per paused turn by key (MEMORY USAGE), the largest first:")
    for kind, size in sorted(kinds.items(), key=lambda item: -item[1])[:12]:
        print(f"  {size / args.turns:9.0f}  {kind}")
    print(f"turn worker RSS: {rss:.1f} MiB before, {rss_after:.1f} MiB with them paused; job slots held: {slots}")
    print(
        f"approve -> tool started: p50 {statistics.median(latencies):.2f} ms, "
        f"p99 {percentile(latencies, 99):.2f} ms (n={len(latencies)})"
    )


if __name__ == "__main__":
    asyncio.run(main())
