"""MCP call latency: pooled vs a fresh connection per call, and through a tool job, side by side in one run.

1. **At the pool**, on the bundled stdio example server
   (``smith_worker/demo/mcp_server_example.py``): ``echo`` called sequentially,
   side by side with the floor, the SDK's ``ClientSession`` called directly on
   another instance of the same server (alternating blocks of 50 calls); then
   concurrently (a semaphore of 20 over all calls), plus ``ping``.
2. **Fresh connection per call**: a new pooled handle for every call (spawn
   through the launcher, ``initialize``, discovery, the call, close): what a
   runtime without pooling pays.
3. **Through a tool job** (unless ``--no-jobs``): a private redis-server, the
   scripted chat-completions server and one turn worker + one tool worker
   serving ``tests.support.app:app``; turns of agent ``mcp`` call
   ``mcp_lab__echo`` (stdio lab server, pooled in the tool worker) and, for
   comparison, the native tool ``add``. Reported: the tool hop
   ``tool_call.completed`` → ``tool.result`` (enqueue, pickup, call, store,
   publish), first MCP call (cold start in the tool worker) excluded.

Usage: ``.venv/bin/python bench/mcp_pool.py [--calls 500] [--fresh 10] [--turns 30] [--no-jobs]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from smith_client import SmithClient  # noqa: E402
from smith_worker.local.processes import start_redis_server  # noqa: E402
from smith_worker.mcp import ServerConfig, ServerHandle  # noqa: E402
from tests.conftest import start_workers, wait_for_workers, worker_env  # noqa: E402
from tests.support.scripted_llm import Reply, Script, ScriptedLlmServer, scenario_marker  # noqa: E402
from bench.stats import summary, tool_hop_and_delivery  # noqa: E402

EXAMPLE = str(ROOT / "smith_worker" / "demo" / "mcp_server_example.py")


def example_config() -> ServerConfig:
    return ServerConfig("example", command=sys.executable, args=[EXAMPLE])


async def timed(coro) -> float:
    started = time.perf_counter()
    await coro
    return time.perf_counter() - started


async def pooled(calls: int, block: int = 50) -> dict[str, object]:
    """Pooled calls and, side by side, the floor: the SDK's own ``ClientSession`` on the same server script.

    Sequential calls alternate between the two in blocks of ``block`` (the order
    flipping every block), so load on a shared machine hits both alike.
    """
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    handle = ServerHandle(example_config())
    try:
        startup = await timed(handle.catalog())
        async with stdio_client(StdioServerParameters(command=sys.executable, args=[EXAMPLE])) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                for _ in range(50):  # warm-up
                    await handle.call_tool("echo", {"text": "warm"})
                    await session.call_tool("echo", {"text": "warm"})
                sides = {
                    "pool": (lambda i: handle.call_tool("echo", {"text": f"s{i}"}), []),
                    "sdk": (lambda i: session.call_tool("echo", {"text": f"r{i}"}), []),
                }
                for first in range(0, calls, block):
                    order = ("pool", "sdk") if (first // block) % 2 == 0 else ("sdk", "pool")
                    for side in order:
                        call, out = sides[side]
                        out += [await timed(call(i)) for i in range(first, min(calls, first + block))]
        gate = asyncio.Semaphore(20)

        async def one(i: int) -> float:
            async with gate:
                return await timed(handle.call_tool("echo", {"text": f"c{i}"}))

        started = time.perf_counter()
        concurrent = await asyncio.gather(*(one(i) for i in range(calls)))
        throughput = calls / (time.perf_counter() - started)
        pings = [await timed(handle.ping()) for _ in range(100)]
    finally:
        await handle.close()
    return {"startup": startup, "sequential": sides["pool"][1], "floor": sides["sdk"][1], "concurrent": concurrent,
            "throughput": throughput, "ping": pings}


async def fresh(calls: int) -> list[float]:
    async def once() -> None:
        handle = ServerHandle(example_config())
        try:
            await handle.call_tool("echo", {"text": "fresh"})
        finally:
            await handle.close()

    return [await timed(once()) for _ in range(calls)]


async def tool_hop(client: SmithClient, text: str, conversation: str, agent: str) -> float:
    hop, _ = await tool_hop_and_delivery(client.stream(text, conversation_id=conversation, agent=agent, timeout=60))
    assert hop is not None
    return hop


async def through_jobs(turns: int) -> dict[str, list[float]]:
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    redis_proc, redis_url = start_redis_server()
    with ScriptedLlmServer() as llm:
        mcp_key, native_key = uuid.uuid4().hex[:10], uuid.uuid4().hex[:10]
        llm.add_scenario(mcp_key, Script(Reply.tool_calls([("mcp_lab__echo", {"text": "hi"})]), Reply.text("ok")))
        llm.add_scenario(native_key, Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
        procs = start_workers("tests.support.app:app", worker_env(redis_url, prefix, llm.base_url),
                              ["turns", "tools"], prefix)
        try:
            await wait_for_workers(redis_url, prefix, 2)
            async with SmithClient.from_url(redis_url, prefix=prefix) as client:
                cold = await tool_hop(client, scenario_marker(mcp_key), "cold", "mcp")
                out: dict[str, list[float]] = {"cold": [cold], "mcp": [], "native": []}
                for i in range(turns):
                    out["mcp"].append(await tool_hop(client, scenario_marker(mcp_key), f"m{i}", "mcp"))
                    out["native"].append(await tool_hop(client, scenario_marker(native_key), f"n{i}", "mcp"))
                return out
        finally:
            for proc in procs:
                proc.stop()
            redis_proc.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--fresh", type=int, default=10)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--no-jobs", action="store_true")
    args = parser.parse_args()

    pool = await pooled(args.calls)
    per_call = await fresh(args.fresh)
    seq, floor = pool["sequential"], pool["floor"]
    print(f"stdio example server ({sys.executable}); load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}, "
          f"{os.cpu_count()} CPUs")
    print(f"| pool start (spawn + initialize + discovery) | {pool['startup'] * 1000:.0f} ms |")
    print(f"| pooled, {args.calls} sequential calls | {summary(seq)} |")
    print(f"| SDK ClientSession alone, same server, {args.calls} sequential calls interleaved with the pooled ones "
          f"(floor, no pool) | {summary(floor)} |")
    print(f"| pooled, {args.calls} concurrent calls (20 at a time) | {summary(pool['concurrent'])}, "
          f"{pool['throughput']:.0f} calls/s |")
    print(f"| pooled ping | {summary(pool['ping'])} |")
    print(f"| fresh connection per call (spawn, initialize, discovery, call, close) | {summary(per_call)} |")
    print(f"| fresh / pooled median | x{statistics.median(per_call) / statistics.median(seq):.0f} |")
    if not args.no_jobs:
        jobs = await through_jobs(args.turns)
        print(f"| tool hop, MCP tool (pooled in the tool worker) | {summary(jobs['mcp'])} |")
        print(f"| tool hop, native tool, same run | {summary(jobs['native'])} |")
        print(f"| tool hop, first MCP call (cold start in the tool worker) | {jobs['cold'][0] * 1000:.0f} ms |")


if __name__ == "__main__":
    asyncio.run(main())
