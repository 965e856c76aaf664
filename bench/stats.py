"""Percentiles for the benchmark scripts (values in seconds, printed in milliseconds)."""

from __future__ import annotations

import statistics


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> str:
    """``p50 … ms, p99 … ms (n=…)`` for durations given in seconds."""
    ms = [v * 1000 for v in values]
    return f"p50 {statistics.median(ms):.2f} ms, p99 {pct(ms, 0.99):.2f} ms (n={len(ms)})"
