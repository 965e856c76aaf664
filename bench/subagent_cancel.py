"""Cancelling a root turn while two sub-agents run in parallel.

Starts a private redis-server, the scripted chat-completions server, one turn
worker and two tool workers serving ``tests.support.app:app``. Each round:
``lead`` calls ``fetcher`` twice in one step, each child calls ``slow_tool``
(30 s); once both tool calls run, the client cancels the root and measures
``handle.cancel()`` → ``turn.cancelled`` received, and until both children's
tool jobs were cancelled on their tool workers (the ``slow_tool`` marker).

Usage: ``.venv/bin/python bench/subagent_cancel.py [--rounds 20]``
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.fleet import fleet  # noqa: E402
from bench.stats import summary  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_worker import testing  # noqa: E402


def _scenario(llm: testing.ScriptedLlmServer, *replies: testing.Reply) -> str:
    key = uuid.uuid4().hex[:10]
    llm.add_scenario(key, testing.Script(*replies))
    return testing.scenario_marker(key)


async def one_round(client: SmithClient, llm: testing.ScriptedLlmServer) -> tuple[float, float]:
    children = [_scenario(llm, testing.Reply.tool_calls([("slow_tool", {"seconds": 30})]), testing.Reply.text("late"))
                for _ in range(2)]
    lead = _scenario(llm, testing.Reply.tool_calls([("fetcher", {"task": f"{m} wait"}) for m in children]),
                     testing.Reply.text("late"))
    handle = await client.submit(f"{lead} go", conversation_id=f"c-{uuid.uuid4().hex[:8]}", agent="lead")
    marks = f"{client.keys.prefix}:test:slow:{handle.turn_id}"
    while await client.redis.llen(marks) < 2:
        await asyncio.sleep(0.005)
    started = time.monotonic()
    await handle.cancel()
    async for event in handle.events(timeout=30):
        if event.type == "turn.cancelled":
            break
    cancelled = time.monotonic() - started
    while (await client.redis.lrange(marks, 0, -1)).count(b"cancelled") < 2:
        await asyncio.sleep(0.005)
    return cancelled, time.monotonic() - started


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    cancelled: list[float] = []
    aborted: list[float] = []
    async with fleet("tests.support.app:app", ["turns", "tools", "tools"]) as f:
        for _ in range(args.rounds):
            c, a = await one_round(f.client, f.llm)
            cancelled.append(c)
            aborted.append(a)
    print(f"cancel -> turn.cancelled received        {summary(cancelled)}")
    print(f"cancel -> both child tool jobs cancelled {summary(aborted)}")


if __name__ == "__main__":
    asyncio.run(main())
