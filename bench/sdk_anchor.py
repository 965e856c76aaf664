"""The anchor side of ``make bench``: the OpenAI Agents SDK in process, and the raw httpx floor.

Runs with the anchors' interpreter (``bench.anchor_env.anchor_python()``) and
imports only what ``.bench-venv`` has (openai-agents, openai, httpx, orjson), never
the project. The agent is the project's bench agent (``bench/app.py``): one
system instruction and a plain ``def add(a, b)`` tool, tracing off, against the
scripted server of ``bench/llm_server.py``.

Modes (one JSON object on stdout; durations in seconds):

* ``turns N``: N interleaved iterations (shuffled order) of ``Runner.run`` text,
  ``Runner.run`` one-tool, ``Runner.run_streamed`` one-tool (all events
  consumed) and the floors: the same model requests made directly with httpx
  (``floor_text``/``floor_tool`` non-streamed, ``floor_stream_text``/
  ``floor_stream_tool`` streamed, read to the last byte); per variant the latencies
  and the process CPU seconds per turn;
* ``throughput N``: N text then N one-tool ``Runner.run`` turns, 16 in flight:
  turns/s and process CPU ms per turn;
* ``rss``: RSS after the imports and one turn, then the peak with 100 streamed
  ``slow`` turns in flight (sampled every 20 ms): KiB per in-flight turn.

Usage: ``.bench-venv/bin/python bench/sdk_anchor.py BASE_URL PROMPTS_JSON MODE [N]``
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import sys
import time
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

# run as a script, so bench/ is sys.path[0]: the floor module, not the bench package (no project in this venv)
from floor import INSTRUCTIONS, Floor
from openai import AsyncOpenAI


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def rss_kib() -> int:
    """This process's resident set size (KiB, from /proc)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def make_agent(base_url: str) -> Agent[Any]:
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model="scripted", openai_client=AsyncOpenAI(base_url=base_url, api_key="x"))
    return Agent(name="bench", instructions=INSTRUCTIONS, tools=[add], model=model)


async def run_streamed(agent: Agent[Any], prompt: str) -> None:
    result = Runner.run_streamed(agent, prompt)
    async for _ in result.stream_events():
        pass


async def turns(base_url: str, prompts: dict[str, str], n: int) -> dict[str, Any]:
    agent, floor = make_agent(base_url), Floor(base_url, prompts)
    variants = {
        "sdk_text": lambda: Runner.run(agent, prompts["text"]),
        "sdk_tool": lambda: Runner.run(agent, prompts["tool"]),
        "sdk_stream_tool": lambda: run_streamed(agent, prompts["tool"]),
        "floor_text": lambda: floor.turn("text", stream=False),
        "floor_tool": lambda: floor.turn("tool", stream=False),
        "floor_stream_text": lambda: floor.turn("text", stream=True),
        "floor_stream_tool": lambda: floor.turn("tool", stream=True),
    }
    wall: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, float] = dict.fromkeys(variants, 0.0)
    order = list(variants)
    for i in range(n + 5):  # 5 warm-up iterations, dropped
        random.shuffle(order)
        for name in order:
            started, cpu_started = time.perf_counter(), cpu_s()
            await variants[name]()
            if i >= 5:
                wall[name].append(time.perf_counter() - started)
                cpu[name] += cpu_s() - cpu_started
    return {"wall": wall, "cpu_per_turn": {name: cpu[name] / max(n, 1) for name in variants}}


async def burst(coro: Any, n: int, concurrency: int = 16) -> tuple[float, float]:
    """(turns/s, CPU ms per turn) for ``n`` turns with ``concurrency`` in flight."""
    queue = list(range(n))

    async def lane() -> None:
        while queue:
            queue.pop()
            await coro()

    started, cpu_started = time.perf_counter(), cpu_s()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return n / (time.perf_counter() - started), (cpu_s() - cpu_started) * 1000 / n


async def throughput(base_url: str, prompts: dict[str, str], n: int) -> dict[str, Any]:
    agent = make_agent(base_url)
    out: dict[str, Any] = {}
    for name in ("text", "tool"):
        await burst(lambda name=name: Runner.run(agent, prompts[name]), 32)  # warm-up
        rate, cpu_ms = await burst(lambda name=name: Runner.run(agent, prompts[name]), n)
        out[f"sdk_{name}_turns_per_s"], out[f"sdk_{name}_cpu_ms_per_turn"] = rate, cpu_ms
    return out


async def rss(base_url: str, prompts: dict[str, str]) -> dict[str, Any]:
    agent = make_agent(base_url)
    await Runner.run(agent, prompts["text"])
    idle = rss_kib()
    await asyncio.gather(*(run_streamed(agent, prompts["text"]) for _ in range(20)))  # warm the pools
    before, peak = rss_kib(), 0
    tasks = [asyncio.create_task(run_streamed(agent, prompts["slow"])) for _ in range(100)]
    while not all(task.done() for task in tasks):
        peak = max(peak, rss_kib())
        await asyncio.sleep(0.02)
    await asyncio.gather(*tasks)
    return {"sdk_rss_idle_mib": idle / 1024, "sdk_rss_per_turn_kib": (peak - before) / 100}


def main() -> None:
    base_url, prompts, mode = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    n = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    if mode == "turns":
        result = asyncio.run(turns(base_url, prompts, n))
    elif mode == "throughput":
        result = asyncio.run(throughput(base_url, prompts, n))
    else:
        result = asyncio.run(rss(base_url, prompts))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
