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

4. **Streamable HTTP** (``--http``): the loopback test server
   (``tests/support/mcp_servers/http_server.py``), pooled calls (through the
   pool's HTTP transport: retries, session watch) interleaved with
   the SDK's ``ClientSession`` alone on the same server.

Usage: ``.venv/bin/python bench/mcp_pool.py [--calls 500] [--fresh 10] [--turns 30] [--no-jobs] [--http]``
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
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
from smith_worker.mcp import ServerConfig, ServerHandle  # noqa: E402
from smith_worker import testing  # noqa: E402

EXAMPLE = str(ROOT / "smith_worker" / "demo" / "mcp_server_example.py")
#: The tests' Streamable HTTP MCP server, run as a script (its own process), never imported.
HTTP_SERVER = str(ROOT / "tests" / "support" / "mcp_servers" / "http_server.py")


def example_config() -> ServerConfig:
    return ServerConfig("example", command=sys.executable, args=[EXAMPLE])


async def timed(coro) -> float:
    started = time.perf_counter()
    await coro
    return time.perf_counter() - started


async def interleaved(pool_call, sdk_call, calls: int, block: int = 50) -> tuple[list[float], list[float]]:
    """Sequential call times of the pool and of the SDK alone, alternating in blocks of ``block``.

    The order flips every block, so load on a shared machine hits both alike; 50 warm-up calls each first.
    """
    for _ in range(50):
        await pool_call(-1)
        await sdk_call(-1)
    sides = {"pool": (pool_call, []), "sdk": (sdk_call, [])}
    for first in range(0, calls, block):
        order = ("pool", "sdk") if (first // block) % 2 == 0 else ("sdk", "pool")
        for side in order:
            call, out = sides[side]
            out += [await timed(call(i)) for i in range(first, min(calls, first + block))]
    return sides["pool"][1], sides["sdk"][1]


async def pooled(calls: int) -> dict[str, object]:
    """Pooled calls and, side by side, the floor: the SDK's own ``ClientSession`` on the same server script."""
    from mcp.client.session import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    handle = ServerHandle(example_config())
    try:
        startup = await timed(handle.catalog())
        async with stdio_client(StdioServerParameters(command=sys.executable, args=[EXAMPLE])) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                sequential, floor = await interleaved(lambda i: handle.call_tool("echo", {"text": f"s{i}"}),
                                                      lambda i: session.call_tool("echo", {"text": f"r{i}"}), calls)
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
    return {"startup": startup, "sequential": sequential, "floor": floor, "concurrent": concurrent,
            "throughput": throughput, "ping": pings}


async def http_pooled(calls: int) -> tuple[list[float], list[float]]:
    """Streamable HTTP on loopback (tests/support/mcp_servers/http_server.py, JSON responses): pooled calls
    (through the pool's retrying, session-watching HTTP transport) vs the SDK's ``ClientSession`` alone."""
    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    token = uuid.uuid4().hex
    server = subprocess.Popen([sys.executable, HTTP_SERVER, "--token", token], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(server.stdout.readline().split()[1])}/mcp"
        handle = ServerHandle(ServerConfig("web", url=url, bearer_token=token))
        try:
            await handle.catalog()
            async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http, \
                    streamable_http_client(url, http_client=http) as (read, write), \
                    ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                return await interleaved(lambda i: handle.call_tool("echo", {"text": f"s{i}"}),
                                         lambda i: session.call_tool("echo", {"text": f"r{i}"}), calls)
        finally:
            await handle.close()
    finally:
        server.kill()
        server.wait()


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
    with testing.ScriptedLlmServer() as llm:
        mcp_key, native_key = uuid.uuid4().hex[:10], uuid.uuid4().hex[:10]
        llm.add_scenario(mcp_key, testing.Script(testing.Reply.tool_calls([("mcp_lab__echo", {"text": "hi"})]),
                                                 testing.Reply.text("ok")))
        llm.add_scenario(native_key, testing.Script(testing.Reply.tool_calls([("add", {"a": 1, "b": 2})]),
                                                    testing.Reply.text("3")))
        procs = testing.start_workers("tests.support.app:app", testing.worker_env(redis_url, prefix, llm.base_url),
                              ["turns", "tools"], prefix, log_dir=LOGS)
        try:
            await testing.wait_for_workers(redis_url, prefix, 2)
            async with SmithClient.from_url(redis_url, prefix=prefix) as client:
                cold = await tool_hop(client, testing.scenario_marker(mcp_key), "cold", "mcp")
                out: dict[str, list[float]] = {"cold": [cold], "mcp": [], "native": []}
                for i in range(turns):
                    out["mcp"].append(await tool_hop(client, testing.scenario_marker(mcp_key), f"m{i}", "mcp"))
                    out["native"].append(await tool_hop(client, testing.scenario_marker(native_key), f"n{i}", "mcp"))
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
    parser.add_argument("--http", action="store_true", help="also Streamable HTTP on loopback, pooled vs SDK alone")
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
    if args.http:
        http_seq, http_floor = await http_pooled(args.calls)
        print(f"| HTTP (loopback, JSON responses), pooled, {args.calls} sequential calls | {summary(http_seq)} |")
        print(f"| HTTP, SDK ClientSession alone, same server, interleaved (floor) | {summary(http_floor)} |")
    if not args.no_jobs:
        jobs = await through_jobs(args.turns)
        print(f"| tool hop, MCP tool (pooled in the tool worker) | {summary(jobs['mcp'])} |")
        print(f"| tool hop, native tool, same run | {summary(jobs['native'])} |")
        print(f"| tool hop, first MCP call (cold start in the tool worker) | {jobs['cold'][0] * 1000:.0f} ms |")


if __name__ == "__main__":
    asyncio.run(main())
