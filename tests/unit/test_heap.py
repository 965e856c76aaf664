"""The worker's heap upkeep (smith_worker/ops/heap.py): a trim every interval, a full collection only when asked."""

from __future__ import annotations

import asyncio
import contextlib
import gc

from smith_worker.ops import heap


def test_trim_returns_whether_memory_was_released_and_never_raises():
    assert heap.trim() in (True, False)


async def test_a_full_collection_runs_at_the_next_trim_after_collect_soon_and_only_then(monkeypatch):
    collections: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *args: collections.append(1) or 0)
    monkeypatch.setattr(heap, "_collect", False)  # a turn failing earlier in this process may have asked
    task = asyncio.create_task(heap.trim_forever(interval=0.01))
    try:
        await asyncio.sleep(0.1)
        assert collections == []  # several trims, no collection
        heap.collect_soon()
        heap.collect_soon()
        await asyncio.sleep(0.1)
        assert collections == [1]  # one, however many asked
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
