"""Cost of computing the model's view on a 10 000-message conversation, per memory strategy.

Starts a private redis-server, stores a conversation of ``--messages`` messages
(text turns and tool turns with parallel calls), then runs ``--steps`` steps:
each step appends a new turn (user message, and a tool round on every other
step) and computes the agent's view with the strategy, as the loop does before
a model call. Per step it records the wall time of ``Memory.view`` (ms) and the
bytes Redis sent for it (``INFO stats`` ``total_net_output_bytes`` delta, minus
the INFO reply itself, calibrated). SummaryMemory starts from a stored summary
(steady state: the conversation was summarised before) and its summary call is
a local function that answers at once, so the figures are the memory's own cost,
not the model's; the steps that summarise are reported apart. FullMemory is the
baseline that reads the whole history.

Usage: ``.venv/bin/python bench/memory_view.py [--messages 10000] [--steps 200]``
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

import redis.asyncio as aioredis  # noqa: E402

from bench.stats import pct  # noqa: E402
from smith_client.keys import Keys  # noqa: E402
from smith_client.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage, message_to_json  # noqa: E402
from smith_worker import FullMemory, RollingWindowMemory, SummaryMemory  # noqa: E402
from smith_worker.local.processes import start_redis_server  # noqa: E402
from smith_worker.memory import Memory, MemoryContext  # noqa: E402
from smith_worker.memory.history import ConversationStore  # noqa: E402


def turn(n: int, tools: bool) -> list:
    """One turn: a user message, a tool round with three parallel calls when ``tools``, the answer."""
    out: list = [UserMessage(content=f"question {n}: " + "words " * (n % 40))]
    if tools:
        ids = [f"call_{n}_{i}" for i in range(3)]
        out.append(AssistantMessage(tool_calls=[ToolCall(id=i, name="add", arguments={"a": n, "b": k})
                                                for k, i in enumerate(ids)]))
        out += [ToolMessage(tool_call_id=i, name="add", content=str(n + k)) for k, i in enumerate(ids)]
    out.append(AssistantMessage(content=f"answer {n}: " + "text " * (n % 25)))
    return out


def conversation(messages: int) -> list:
    out: list = []
    n = 0
    while len(out) < messages:
        out += turn(n, tools=n % 2 == 1)
        n += 1
    return out[:messages - 2] + [UserMessage(content="last question"), AssistantMessage(content="last answer")]


async def output_bytes(redis: aioredis.Redis) -> int:
    return int((await redis.info("stats"))["total_net_output_bytes"])


async def measure(redis: aioredis.Redis, memory: Memory, history: list, steps: int, summary_covers: int | None):
    keys = Keys(f"bench{uuid.uuid4().hex[:6]}")
    cid = "c"
    blobs = [message_to_json(m) for m in history]
    for i in range(0, len(blobs), 1000):
        await redis.rpush(keys.history(cid), *blobs[i:i + 1000])
    if summary_covers is not None:
        await redis.hset(keys.conversation_summary(cid), mapping={"text": "an earlier summary " * 20,
                                                                  "covers": summary_covers})
    summaries = 0

    async def summarize(_request: list) -> str:
        nonlocal summaries
        summaries += 1
        return f"summary {summaries} " + "of things " * 30

    async def publish(_data: object) -> int:
        return 0

    info_overhead = min([-(await output_bytes(redis)) + await output_bytes(redis) for _ in range(5)])
    store = ConversationStore(redis, keys, cid)
    end = len(history)
    plain, summarising = [], []
    for step in range(steps):
        new = turn(100_000 + step, tools=step % 2 == 1)
        await redis.rpush(keys.history(cid), *[message_to_json(m) for m in new[:-1]])  # the model answers next
        ctx = MemoryContext(store=store, turn_start=end, summarize=summarize, publish=publish, redis=redis,
                            keys=keys, conversation_id=cid)
        before, count = await output_bytes(redis), summaries
        started = time.perf_counter()
        view = await memory.view(ctx)
        elapsed = time.perf_counter() - started
        sent = await output_bytes(redis) - before - info_overhead
        (summarising if summaries > count else plain).append((elapsed, sent, len(view)))
        await redis.rpush(keys.history(cid), message_to_json(new[-1]))
        end += len(new)
    await redis.delete(*keys.conversation_state(cid))
    return plain, summarising


def row(name: str, samples: list[tuple[float, int, int]]) -> str:
    if not samples:
        return f"| {name} | — | — | — |"
    ms = [s[0] * 1000 for s in samples]
    sent = [s[1] for s in samples]
    return (f"| {name} | p50 {statistics.median(ms):.2f} ms, p99 {pct(ms, 0.99):.2f} ms (n={len(ms)}) "
            f"| p50 {statistics.median(sent) / 1024:.1f} KiB, max {max(sent) / 1024:.1f} KiB "
            f"| {statistics.median([s[2] for s in samples]):.0f} |")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    proc, url = start_redis_server()
    redis = aioredis.Redis.from_url(url)
    try:
        history = conversation(args.messages)
        total = sum(len(message_to_json(m)) for m in history)
        print(f"conversation: {len(history)} messages, {total / 1024:.0f} KiB stored; {args.steps} steps")
        print("| strategy | view time per step | Redis bytes sent per step | messages in view |")
        print("| --- | --- | --- | --- |")
        cases = [
            ("FullMemory (baseline)", FullMemory(), None),
            ("RollingWindowMemory(max_messages=40)", RollingWindowMemory(max_messages=40), None),
            ("RollingWindowMemory(max_tokens=8000)", RollingWindowMemory(max_tokens=8000), None),
            ("SummaryMemory(threshold=40, keep_recent=10)", SummaryMemory(threshold=40, keep_recent=10),
             len(history) - 20),
        ]
        for name, memory, covers in cases:
            plain, summarising = await measure(redis, memory, history, args.steps, covers)
            print(row(name, plain))
            if summarising:
                print(row(f"{name}, steps that summarise", summarising))
        plain, summarising = await measure(redis, SummaryMemory(threshold=40, keep_recent=10), history, 1, None)
        print(row("SummaryMemory, first step without a stored summary (summarises the whole history once)",
                  plain + summarising))
    finally:
        await redis.aclose()
        proc.stop()


if __name__ == "__main__":
    asyncio.run(main())
