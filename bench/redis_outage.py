"""How the fleet rides out Redis outages, through real processes.

Starts a private redis-server on a fixed port, the scripted chat-completions
server, 2 turn workers and 2 tool workers, then measures from the client:

* freeze: ``--turns`` turns in flight, Redis SIGSTOPped for ``--freeze`` s;
  while frozen, how long ``send(timeout=3)`` takes to raise (pooled and new
  client); after SIGCONT, the time until every in-flight turn completed (callers
  re-attach after a ``TransportError``) and until a new turn completed;
* restart: ``--turns`` callers in ``send()``, Redis killed, down 3 s, started
  empty on the same port; the callers' outcomes and the time from the restart
  to a new turn completing;
* late start: a turn worker started while Redis is down; the time from Redis
  starting to the worker being registered.

Usage: ``.venv/bin/python bench/redis_outage.py [--turns 20] [--freeze 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_client.errors import SmithError, TransportError  # noqa: E402
from smith_worker.local.processes import free_port, start_redis_server  # noqa: E402
from smith_worker import testing  # noqa: E402

APP = "tests.support.app:app"


def marker(llm: testing.ScriptedLlmServer) -> str:
    key = uuid.uuid4().hex[:8]
    llm.add_scenario(key, testing.Script(testing.Reply.tool_calls([("add", {"a": 2, "b": 3})]),
                                 testing.Reply.text("done " + "word " * 10, chunk_size=5, delay=0.2)))
    return testing.scenario_marker(key)


def conv() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


async def result_reattaching(client: SmithClient, turn_id: str) -> list[float]:
    """Wait with ``timeout=None``, re-attaching after each ``TransportError``; return the failed waits (seconds)."""
    failed = []
    while True:
        started = time.monotonic()
        try:
            await client.turn(turn_id).result(timeout=None)
            return failed
        except TransportError:
            failed.append(time.monotonic() - started)
            await asyncio.sleep(0.5)


async def new_turn_seconds(url: str, prefix: str, llm: testing.ScriptedLlmServer, since: float) -> float:
    """Seconds from ``since`` until a new turn (new client, retried on Redis errors) completed."""
    while True:
        try:
            async with SmithClient.from_url(url, prefix=prefix) as client:
                await client.send(f"{marker(llm)} add", conversation_id=conv(), timeout=30)
            return time.monotonic() - since
        except SmithError:
            await asyncio.sleep(0.2)


async def frozen_send_seconds(url: str, prefix: str, client: SmithClient | None) -> tuple[float, str]:
    sender = client or SmithClient.from_url(url, prefix=prefix)
    started = time.monotonic()
    try:
        await sender.send("hello", conversation_id=conv(), agent="plain", timeout=3)
        kind = "completed?!"
    except SmithError as exc:
        kind = exc.kind
    finally:
        if client is None:
            await sender.aclose()
    return time.monotonic() - started, kind


async def freeze(redis_proc, url: str, prefix: str, llm: testing.ScriptedLlmServer, turns: int, seconds: float) -> None:
    async with SmithClient.from_url(url, prefix=prefix) as client:
        ids = [(await client.submit(f"{marker(llm)} add", conversation_id=conv())).turn_id for _ in range(turns)]
        waiters = [asyncio.create_task(result_reattaching(client, turn_id)) for turn_id in ids]
        await asyncio.sleep(1.0)
        redis_proc.signal(signal.SIGSTOP)
        frozen = time.monotonic()
        pooled = await frozen_send_seconds(url, prefix, client)
        fresh = await frozen_send_seconds(url, prefix, None)
        await asyncio.sleep(max(0.0, seconds - (time.monotonic() - frozen)))
        redis_proc.signal(signal.SIGCONT)
        resumed = time.monotonic()
        new_turn = asyncio.create_task(new_turn_seconds(url, prefix, llm, resumed))
        failed = [seconds for waits in await asyncio.gather(*waiters) for seconds in waits]
        all_done = time.monotonic() - resumed
        print(f"freeze {seconds:g} s: send(timeout=3) on frozen Redis raised after {pooled[0]:.2f} s ({pooled[1]}, "
              f"pooled client) / {fresh[0]:.2f} s ({fresh[1]}, new client)")
        print(f"freeze {seconds:g} s: {len(failed)} waits (timeout=None) raised TransportError after "
              f"{min(failed):.1f}-{max(failed):.1f} s and re-attached")
        print(f"freeze {seconds:g} s: all {turns} in-flight turns completed {all_done:.1f} s after SIGCONT; "
              f"a new turn completed {await new_turn:.1f} s after SIGCONT")


async def restart(redis_proc, port: int, url: str, prefix: str, llm: testing.ScriptedLlmServer, turns: int):
    async with SmithClient.from_url(url, prefix=prefix) as client:
        callers = [asyncio.create_task(client.send(f"{marker(llm)} add", conversation_id=conv(), timeout=None))
                   for _ in range(turns)]
        await asyncio.sleep(1.5)
        redis_proc.signal(signal.SIGKILL)
        redis_proc.stop()
        await asyncio.sleep(3.0)
        redis_proc, _ = start_redis_server(port)
        restarted = time.monotonic()
        outcomes = await asyncio.gather(*callers, return_exceptions=True)
        counts = collections.Counter(type(o).__name__ for o in outcomes)
        print(f"restart (killed, down 3 s, empty): caller outcomes {dict(counts)}; a new turn completed "
              f"{await new_turn_seconds(url, prefix, llm, restarted):.1f} s after the restart")
    return redis_proc


async def late_start(llm: testing.ScriptedLlmServer) -> None:
    port = free_port()
    url, prefix = f"redis://127.0.0.1:{port}/0", f"late{uuid.uuid4().hex[:6]}"
    procs = testing.start_workers(APP, testing.worker_env(url, prefix, llm.base_url), ["turns"], prefix, log_dir=LOGS)
    await asyncio.sleep(5.0)
    redis_proc, _ = start_redis_server(port)
    started = time.monotonic()
    await testing.wait_for_workers(url, prefix, 1, timeout=60)
    print(f"late start: worker started 5 s before Redis registered {time.monotonic() - started:.1f} s after it "
          f"(alive: {procs[0].alive()})")
    procs[0].stop()
    redis_proc.stop()


async def main(turns: int, seconds: float) -> None:
    port = free_port()
    redis_proc, url = start_redis_server(port)
    prefix = f"bench{uuid.uuid4().hex[:6]}"
    with testing.ScriptedLlmServer() as llm:
        env = testing.worker_env(url, prefix, llm.base_url)
        procs = testing.start_workers(APP, env, ["turns", "turns", "tools", "tools"], prefix,
                              log_dir=LOGS)
        try:
            await testing.wait_for_workers(url, prefix, len(procs))
            await freeze(redis_proc, url, prefix, llm, turns, seconds)
            redis_proc = await restart(redis_proc, port, url, prefix, llm, turns)
            print(f"worker processes alive at the end: {sum(p.alive() for p in procs)}/{len(procs)}")
            await late_start(llm)
        finally:
            for proc in procs:
                proc.stop()
            redis_proc.signal(signal.SIGCONT)
            redis_proc.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--freeze", type=float, default=20.0)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.freeze))
