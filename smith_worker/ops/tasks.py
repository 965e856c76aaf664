"""Small asyncio helpers shared by the worker's background tasks."""

from __future__ import annotations

import asyncio
from typing import Any

#: Seconds :func:`cancel_and_wait` waits for a cancelled task before cancelling it again.
RECANCEL_AFTER = 0.5


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has stopped; its cancellation is not re-raised.

    A task still running :data:`RECANCEL_AFTER` seconds after a cancel is cancelled again: on Python 3.11 a cancel
    landing inside redis-py's read can be turned into a ``TimeoutError`` it treats as "no data" (the cancel is lost,
    see smith_worker/queue/worker.py), and a loop that then carries on, a worker's registration heartbeat, would
    keep a stopping worker waiting for ever. If the caller itself is cancelled while waiting, that cancellation
    propagates; an error the task ends with is raised, as awaiting it would.
    """
    if task is None:
        return
    task.cancel()
    while not (await asyncio.wait([task], timeout=RECANCEL_AFTER))[0]:
        task.cancel()
    if not task.cancelled():
        task.result()
