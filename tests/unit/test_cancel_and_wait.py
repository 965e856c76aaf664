"""smith_worker/ops/tasks.py's ``cancel_and_wait``: a task whose cancel was lost (as one landing in redis-py's read on
Python 3.11 can be) is cancelled again instead of being waited for until it ends by itself."""

from __future__ import annotations

import asyncio

import pytest

from smith_worker.ops.tasks import cancel_and_wait


async def test_a_task_that_lost_its_cancel_is_cancelled_again():
    async def heartbeat_like() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            pass  # lost, as the read's TimeoutError loses it
        await asyncio.sleep(30)  # and the loop goes on

    task = asyncio.create_task(heartbeat_like())
    await asyncio.sleep(0)
    async with asyncio.timeout(5):  # before: 60 s, the task's own end
        await cancel_and_wait(task)
    assert task.cancelled()


async def test_the_tasks_own_error_is_raised_and_the_callers_cancel_propagates():
    async def fails() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("broke while stopping") from None

    task = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="broke while stopping"):
        await cancel_and_wait(task)

    holding = True

    async def holds_on() -> None:
        while holding:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                pass

    stubborn = asyncio.create_task(holds_on())
    waiter = asyncio.create_task(cancel_and_wait(stubborn))
    await asyncio.sleep(0.1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    holding = False
    await cancel_and_wait(stubborn)
    assert stubborn.done()
