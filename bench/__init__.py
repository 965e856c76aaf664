"""The benchmarks (``make bench``, ``make soak``): scripts run from the repository root."""

from pathlib import Path

#: Where the benchmarks' worker, Redis and monitor processes write their logs (beside the tests' own).
LOGS = Path(__file__).resolve().parents[1] / ".pytest_cache" / "worker-logs"
