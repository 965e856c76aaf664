"""Cancellation and recovery times through real processes.

Targets: a cancel answered within 1 s, a killed worker's turn resumed within 30 s.

Starts a private redis-server, the scripted chat-completions server, two turn
workers and one tool worker, then measures from the client:

* cancel mid-stream: ``handle.cancel()`` → ``turn.cancelled`` received;
* kill -9 of the turn worker mid-stream → ``turn.resumed`` and → ``turn.completed``;
* SIGTERM of the turn worker mid-stream → ``turn.resumed`` (hand-off).

Usage: ``.venv/bin/python bench/durability.py [--cancels 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import fleet  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_client.registry import live_workers  # noqa: E402
from smith_worker import testing  # noqa: E402

APP = "tests.support.app:app"


async def first_event(client: SmithClient, turn_id: str, wanted: str) -> float:
    async for event in client.turn(turn_id).events():
        if event.type == wanted:
            return time.monotonic()
    raise RuntimeError(f"no {wanted}")


async def cancel_latency(client: SmithClient, llm: testing.ScriptedLlmServer, runs: int) -> list[float]:
    key = uuid.uuid4().hex[:8]
    llm.add_scenario(key, testing.Script(testing.Reply.text("tick " * 400, chunk_size=5, delay=0.05)))
    out = []
    for i in range(runs):
        handle = await client.submit(testing.scenario_marker(key), conversation_id=f"cancel-{key}-{i}", agent="plain")
        await first_event(client, handle.turn_id, "token")
        started = time.monotonic()
        await handle.cancel()
        out.append(await first_event(client, handle.turn_id, "turn.cancelled") - started)
    return out


async def worker_pid(client: SmithClient, turn_id: str) -> int:
    while True:
        state = await client.turn(turn_id).state()
        if state.get("status") == "running" and state.get("worker"):
            return int(state["worker"].split(":")[1])
        await asyncio.sleep(0.02)


async def registered(client: SmithClient, pid: int) -> None:
    """Wait until the worker process ``pid`` has registered (it is up and taking jobs)."""
    async with asyncio.timeout(60):
        while pid not in {info.get("pid") for info in await live_workers(client.redis, client.keys)}:
            await asyncio.sleep(0.05)


async def recovery(client: SmithClient, llm: testing.ScriptedLlmServer, signum: int) -> tuple[float, float]:
    gate = threading.Event()
    key = uuid.uuid4().hex[:8]
    llm.add_scenario(key, testing.Script(testing.Reply.text("recovered", chunk_size=3, gate=gate)))
    handle = await client.submit(testing.scenario_marker(key), conversation_id=f"rec-{key}", agent="plain")
    await first_event(client, handle.turn_id, "turn.started")
    pid = await worker_pid(client, handle.turn_id)
    killed = time.monotonic()
    os.kill(pid, signum)
    resumed = await first_event(client, handle.turn_id, "turn.resumed")
    # the model answers only once another worker resumed the turn: a worker that got SIGTERM cannot finish
    # it first (a reply already on its socket could beat the signal), so the figure is always a hand-off
    gate.set()
    completed = await first_event(client, handle.turn_id, "turn.completed")
    return resumed - killed, completed - killed


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cancels", type=int, default=20)
    args = parser.parse_args()
    async with fleet(APP, ["turns", "turns", "tools"]) as f:
        cancels = await cancel_latency(f.client, f.llm, args.cancels)
        kill = await recovery(f.client, f.llm, signal.SIGKILL)
        [replacement] = f.start(["turns"])
        await registered(f.client, replacement.pid)  # not a count: the killed worker's entry outlives it
        term = await recovery(f.client, f.llm, signal.SIGTERM)
    ms = [c * 1000 for c in cancels]
    print(f"cancel mid-stream → turn.cancelled   p50 {statistics.median(ms):6.1f} ms   max {max(ms):6.1f} ms  (n={len(ms)})")
    print(f"kill -9 mid-stream → turn.resumed     {kill[0]:6.2f} s   → turn.completed {kill[1]:6.2f} s")
    print(f"SIGTERM mid-stream → turn.resumed     {term[0]:6.2f} s   → turn.completed {term[1]:6.2f} s")


if __name__ == "__main__":
    asyncio.run(main())
