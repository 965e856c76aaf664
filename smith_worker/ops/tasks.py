"""Small asyncio helpers shared by the worker's background tasks."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has stopped; its cancellation is not re-raised.

    If the caller itself is cancelled while waiting, that cancellation propagates.
    """
    if task is None:
        return
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        # the task's own end is swallowed; a cancel of the caller meanwhile (its count went up) is not
        if current is not None and current.cancelling() > before:
            raise
