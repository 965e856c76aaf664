"""Turn workers of a prefix of their own, for tests that need their own settings (slots, rate limits)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

from smith_worker.testing import start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS


@contextlib.asynccontextmanager
async def turn_workers(redis_url: str, llm_base_url: str, count: int, tag: str, **settings: str) -> AsyncIterator[str]:
    """Start ``count`` turn workers serving ``tests.support.app:app`` under a new prefix (``tag`` + random), with
    ``settings`` (``SMITH_*`` variables) in their environment; yields the prefix once they registered (60 s at
    most, else ``TimeoutError``) and stops them on exit."""
    prefix = f"{tag}{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, llm_base_url, **settings)
    procs = start_workers("tests.support.app:app", env, ["turns"] * count, prefix, log_dir=LOGS)
    try:
        await wait_for_workers(redis_url, prefix, count)
        yield prefix
    finally:
        for proc in procs:
            proc.stop()
