"""Small asyncio helpers shared by the worker's background tasks."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait until it has stopped; its cancellation is not re-raised.

    If the caller itself is cancelled while waiting, that cancellation propagates.
    """
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
