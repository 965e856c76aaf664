"""Fair pickup: how long a small tenant's turns wait while another tenant's burst drains (docs/architecture.md,
Fair pickup).

Starts a private fleet (redis-server, the scripted chat-completions server answering each request in about
200 ms, two turn workers of 8 slots each: ``bench.app:app``), then, twice: tenant ``big`` submits ``--burst``
turns at once (a conversation each) and, while they drain, tenant ``small`` submits ``--small`` turns one every
``--every`` seconds. The wait of each small turn is its ``turn.started`` time minus its submit time (both from
Redis ``TIME``). The first run gives the turns their tenants (fair pickup); the second sends the same turns with
no tenant, so all of them share one first-in-first-out line, as every turn did before fair pickup: the anchor
measured side by side.

Usage: ``.venv/bin/python bench/fairness.py [--burst 500] [--small 20] [--every 0.25]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import fleet  # noqa: E402
from bench.stats import pct  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_worker import testing  # noqa: E402

APP = "bench.app:app"
#: Seconds the scripted model takes per response (four frames after the first, each after a quarter of it).
LATENCY = 0.2


async def redis_now(client: SmithClient) -> float:
    seconds, micros = await client.redis.time()
    return seconds + micros / 1e6


async def submit(client: SmithClient, marker: str, tenant: str | None) -> str:
    handle = await client.submit(f"{marker} hi", conversation_id=uuid.uuid4().hex, agent="default", tenant=tenant)
    return handle.turn_id


async def started_at(client: SmithClient, turn_id: str) -> float:
    """The turn's ``turn.started`` time (Redis seconds), once it completed."""
    await client.turn(turn_id).result(timeout=600)
    return next(e.ts for e in await client.events.read(turn_id) if e.type == "turn.started")


async def one_run(client: SmithClient, marker: str, args: argparse.Namespace, fair: bool) -> list[float]:
    """Waits (seconds) of the small tenant's turns behind a burst; with ``fair`` False no turn has a tenant."""
    big = [await submit(client, marker, "big" if fair else None) for _ in range(args.burst)]
    sent: dict[str, float] = {}
    for _ in range(args.small):
        at = await redis_now(client)
        sent[await submit(client, marker, "small" if fair else None)] = at
        await asyncio.sleep(args.every)
    waits = [await started_at(client, turn_id) - at for turn_id, at in sent.items()]
    for turn_id in big:
        await client.turn(turn_id).result(timeout=600)
    return waits


def line(name: str, waits: list[float]) -> str:
    ms = [w * 1000 for w in waits]
    return f"{name}: p50 {statistics.median(ms):.0f} ms, p99 {pct(ms, 0.99):.0f} ms, max {max(ms):.0f} ms (n={len(ms)})"


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--small", type=int, default=20)
    parser.add_argument("--every", type=float, default=0.25)
    args = parser.parse_args()
    async with fleet(APP, ["turns", "turns"], SMITH_TURN_MAX_JOBS="8") as f:
        key = uuid.uuid4().hex[:12]
        f.llm.add_scenario(key, testing.Reply.text("done", chunk_size=16, delay=LATENCY / 4))
        marker = f"[[scenario:{key}]]"
        fair = await one_run(f.client, marker, args, fair=True)
        fifo = await one_run(f.client, marker, args, fair=False)
    print(f"fair pickup: a {args.burst}-turn burst, then {args.small} turns of another tenant every {args.every} s; "
          f"2 turn workers x 8 slots, model {LATENCY * 1000:.0f} ms per response")
    print(line("small tenant's wait, fair pickup", fair))
    print(line("same turns, one FIFO line (no tenants)", fifo))
    print(f"p50 ratio fair / FIFO: {statistics.median(fair) / statistics.median(fifo):.3f}")


if __name__ == "__main__":
    asyncio.run(main())
