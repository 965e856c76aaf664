"""Turn and tool-job latency through real processes (plain arq's polling is measured in bench/distributed.py).

Starts a private redis-server, the scripted chat-completions server and, for
each configuration, one turn worker and one tool worker serving
``tests.support.app:app``; then measures, from the client:

* a turn without tools (enqueue → ``turn.completed`` received), sequential;
* a turn with one tool call, sequential, and inside it the tool hop
  (``tool_call.completed`` → ``tool.result``, both stamped by workers);
* event delivery (worker's ``ts`` → client receipt);
* throughput of tool turns with 20 conversations in flight.

Usage: ``.venv/bin/python bench/turn_latency.py [--turns 40]``
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

from bench import LOGS  # noqa: E402
from bench.stats import summary, tool_hop_and_delivery  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_worker.local.processes import start_redis_server  # noqa: E402
from smith_worker import testing  # noqa: E402

CONFIGS: dict[str, dict[str, str]] = {"wake-up pickup, fallback poll 2 s": {}}


async def one_turn(client: SmithClient, text: str, conversation: str) -> tuple[float, float | None, list[float]]:
    started = time.time()
    hop, delivery = await tool_hop_and_delivery(client.stream(text, conversation_id=conversation, timeout=60))
    return time.time() - started, hop, delivery


async def measure(redis_url: str, prefix: str, llm: testing.ScriptedLlmServer, turns: int) -> dict[str, list[float]]:
    plain_key, tool_key = uuid.uuid4().hex[:10], uuid.uuid4().hex[:10]
    llm.add_scenario(plain_key, testing.Script(testing.Reply.text("ok", chunk_size=2)))
    llm.add_scenario(tool_key, testing.Script(testing.Reply.tool_calls([("add", {"a": 1, "b": 2})]),
                                              testing.Reply.text("3")))
    out: dict[str, list[float]] = {"plain": [], "tool": [], "hop": [], "delivery": []}
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        for i in range(turns):
            total, _, delivery = await one_turn(client, testing.scenario_marker(plain_key), f"plain-{i}")
            out["plain"].append(total)
            out["delivery"] += delivery
            total, hop, _ = await one_turn(client, testing.scenario_marker(tool_key), f"tool-{i}")
            out["tool"].append(total)
            out["hop"].append(hop or 0.0)
        started = time.monotonic()
        await asyncio.gather(*(one_turn(client, testing.scenario_marker(tool_key), f"par-{i}") for i in range(20)))
        out["throughput"] = [20 / (time.monotonic() - started)]
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()
    redis_proc, redis_url = start_redis_server()
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with testing.ScriptedLlmServer() as llm:
            for name, extra in CONFIGS.items():
                prefix = f"bench{uuid.uuid4().hex[:6]}"
                env = testing.worker_env(redis_url, prefix, llm.base_url, **extra)
                procs = testing.start_workers("tests.support.app:app", env,
                                      ["turns", "tools"], prefix, log_dir=LOGS)
                try:
                    await testing.wait_for_workers(redis_url, prefix, 2)
                    results[name] = await measure(redis_url, prefix, llm, args.turns)
                finally:
                    for proc in procs:
                        proc.stop()
    finally:
        redis_proc.stop()
    for name, r in results.items():
        print(f"\n== {name}")
        print(f"turn, no tools          {summary(r['plain'])}")
        print(f"turn, one tool call     {summary(r['tool'])}")
        print(f"tool hop (job + notify) {summary(r['hop'])}")
        print(f"event delivery          {summary(r['delivery'])}")
        print(f"throughput, 20 in flight  {r['throughput'][0]:.1f} tool turns/s")
    tuned, default = results.values()
    print("\nratios (arq default polling / tuned):")
    for label, key in (("turn, no tools", "plain"), ("turn, one tool", "tool"), ("tool hop", "hop")):
        print(f"  {label:16} p50 x{statistics.median(default[key]) / statistics.median(tuned[key]):.1f}")


if __name__ == "__main__":
    asyncio.run(main())
