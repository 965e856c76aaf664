"""Percentiles for the benchmark scripts (values in seconds, printed in milliseconds)."""

from __future__ import annotations

import statistics
import time
from typing import Any


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    """``p50 … ms, p99 … ms (n=…)`` for durations given in seconds."""
    ms = [v * 1000 for v in values]
    return f"p50 {statistics.median(ms):.2f} ms, p99 {pct(ms, 0.99):.2f} ms (n={len(ms)})"


async def tool_hop_and_delivery(events: Any) -> tuple[float | None, list[float]]:
    """Follow one turn's events: the tool hop (``tool_call.completed`` → ``tool.result``, worker clocks)
    and each event's delivery delay (worker timestamp → receipt), in seconds. Raises on ``turn.failed``."""
    start = hop = None
    delivery: list[float] = []
    async for event in events:
        delivery.append(time.time() - event.ts)
        if event.type == "tool_call.completed":
            start = event.ts
        elif event.type == "tool.result" and start is not None:
            hop = event.ts - start
        elif event.type == "turn.failed":
            raise RuntimeError(event.data)
    return hop, delivery
