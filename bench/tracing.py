"""What tracing costs a turn (docs/architecture.md, Tracing; BENCHMARKS.md, Tracing).

Starts a private redis-server, the scripted chat-completions server, an in-process OTLP/HTTP receiver
(smith_worker/testing/otlp.py) and two fleets of one turn worker and one tool worker each, serving
``tests.support.tracing_app:app``: one with tracing off, one with ``SMITH_OTEL=1`` exporting every span to the
receiver (the SDK's batch processor, its default schedule). Then, alternating the fleets turn by turn so
both see the same machine, it measures a one-tool turn (``stream`` → ``turn.completed``, from the client) and
prints each fleet's p50/p99 and the ratio on/off of the p50s (target: ≤ 1.10).

"Off costs nothing measurable": the off path is a few calls of the no-op interface per turn (the client's
``submit_span`` without OpenTelemetry, the worker's ``span``/``inject`` with tracing off); their cost per
turn is measured in-process and printed beside the off turn's p50.

Usage: ``.venv/bin/python bench/tracing.py [--turns 150] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import timeit
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import LOGS  # noqa: E402
from bench.stats import pct, summary  # noqa: E402
from smith_client import SmithClient  # noqa: E402
from smith_client.jobs import TurnJob  # noqa: E402
from smith_client.messages import UserMessage  # noqa: E402
from smith_client.tracing import submit_span  # noqa: E402
from smith_worker import testing  # noqa: E402
from smith_worker.local.processes import start_redis_server  # noqa: E402
from smith_worker.ops import tracing  # noqa: E402
from smith_worker.testing.otlp import OtlpReceiver  # noqa: E402

APP = "tests.support.tracing_app:app"
#: Calls of the no-op interface per one-tool turn with tracing off (an upper bound, counted from the code:
#: the client's submit span; per attempt one span and one inject per tool job; per model request one span,
#: two model requests; the tool job's span).
OFF_CALLS = {"submit_span": 1, "span": 5, "inject": 1}


async def one_turn(client: SmithClient, text: str, conversation: str) -> float:
    started = time.perf_counter()
    async for event in client.stream(text, conversation_id=conversation, agent="adder", timeout=60):
        if event.type == "turn.failed":
            raise RuntimeError(event.data)
    return time.perf_counter() - started


def off_path_us() -> float:
    """Microseconds per turn spent in the no-op tracing interface (tracing off, no OpenTelemetry in the
    client's process)."""
    assert not tracing.ENABLED and "opentelemetry.trace" not in sys.modules
    job = TurnJob(turn_id="t", conversation_id="c", message=UserMessage(content="x"))

    def submit() -> None:
        with submit_span(job):
            pass

    def span() -> None:
        with tracing.span("chat m", attributes=None):
            pass

    n = 20000
    per_call = {
        "submit_span": timeit.timeit(submit, number=n) / n,
        "span": timeit.timeit(span, number=n) / n,
        "inject": timeit.timeit(tracing.inject, number=n) / n,
    }
    return sum(per_call[name] * count for name, count in OFF_CALLS.items()) * 1e6


async def measure(redis_url: str, prefixes: dict[str, str], llm: testing.ScriptedLlmServer, turns: int):
    key = uuid.uuid4().hex[:10]
    script = testing.Script(testing.Reply.tool_calls([("add", {"a": 1, "b": 2})]), testing.Reply.text("3"))
    llm.add_scenario(key, script)
    text = testing.scenario_marker(key)
    out: dict[str, list[float]] = {name: [] for name in prefixes}
    clients = {name: SmithClient.from_url(redis_url, prefix=prefix) for name, prefix in prefixes.items()}
    try:
        for i in range(10):  # warm-up: connections, scripts, imports
            for name, client in clients.items():
                await one_turn(client, text, f"warm-{name}-{i}")
        for i in range(turns):
            order = list(clients.items()) if i % 2 == 0 else list(reversed(clients.items()))
            for name, client in order:
                out[name].append(await one_turn(client, text, f"{name}-{i}"))
    finally:
        for client in clients.values():
            await client.aclose()
    return out


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=150)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    off_us = off_path_us()
    redis_proc, redis_url = start_redis_server()
    procs = []
    try:
        with testing.ScriptedLlmServer() as llm, OtlpReceiver() as receiver:
            prefixes = {"off": f"troff{uuid.uuid4().hex[:6]}", "on": f"tron{uuid.uuid4().hex[:6]}"}
            extra = {"off": {}, "on": {"SMITH_OTEL": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}}
            for name, prefix in prefixes.items():
                env = testing.worker_env(redis_url, prefix, llm.base_url, **extra[name])
                if name == "off":
                    env.pop("SMITH_OTEL", None)
                procs += testing.start_workers(APP, env, ["turns", "tools"], prefix, log_dir=LOGS)
            for prefix in prefixes.values():
                await testing.wait_for_workers(redis_url, prefix, 2)
            results = await measure(redis_url, prefixes, llm, args.turns)
            await asyncio.sleep(6)  # the batch processor's default schedule is 5 s
            exported = len(receiver.spans)
    finally:
        for proc in procs:
            proc.stop()
        redis_proc.stop()
    off, on = (statistics.median(results[name]) for name in ("off", "on"))
    ratio = on / off
    print(f"one-tool turn, tracing off            {summary(results['off'])}")
    print(f"one-tool turn, tracing on (exporting) {summary(results['on'])}")
    print(f"tracing on / off, p50                 {ratio:.3f}x ({(on - off) * 1000:+.2f} ms; target <= 1.10x)")
    print(f"spans exported to the receiver        {exported} ({exported / (args.turns + 10):.1f} per turn)")
    share = off_us / (off * 1e6) * 100
    print(f"off path, no-op interface             {off_us:.2f} us per turn ({share:.3f} % of the off p50)")
    print(f"{'PASS' if ratio <= 1.10 else 'MISS'}  tracing on costs <= 10 % of a one-tool turn (p50)")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "off_p50_ms": off * 1000, "on_p50_ms": on * 1000, "ratio": ratio,
            "off_p99_ms": pct(results["off"], 0.99) * 1000, "on_p99_ms": pct(results["on"], 0.99) * 1000,
            "off_path_us": off_us, "spans": exported,
        }))  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main())
