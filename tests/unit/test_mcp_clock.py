"""CallClock: a tool call's request budget stands still while the call waits for a person, and its waits share
one allowance (docs/architecture.md, MCP)."""

from __future__ import annotations

import asyncio
import time

from smith_worker.mcp.server import CallClock, _Timer


async def test_a_timer_does_not_run_while_the_call_waits_for_a_person():
    clock, fired = CallClock(10.0), asyncio.Event()
    started = time.monotonic()
    timer = _Timer(0.3, fired.set)
    with clock.timing(timer):
        with clock.waiting() as left:
            assert 9.9 < left <= 10.0
            await asyncio.sleep(0.5)  # past the timer's 0.3 s: stopped, it must not fire
            assert not fired.is_set()
        await asyncio.wait_for(fired.wait(), 5)
    assert time.monotonic() - started >= 0.5 + 0.3 - 0.05  # the wait was added to the budget


async def test_the_waits_of_a_call_share_one_allowance():
    clock = CallClock(0.4)
    with clock.waiting():
        await asyncio.sleep(0.3)
        with clock.waiting() as nested:  # overlapping waits spend the allowance once
            assert nested <= 0.1 + 0.02
    assert clock.left() <= 0.1 + 0.02
    await asyncio.sleep(0.2)  # the allowance is spent only while a person is asked
    assert 0.0 < clock.left() <= 0.1 + 0.02
    with clock.waiting():
        await asyncio.sleep(0.2)
    assert clock.left() == 0.0


async def test_a_timer_attached_during_a_wait_starts_stopped():
    clock, fired = CallClock(10.0), asyncio.Event()
    with clock.waiting():
        timer = _Timer(0.1, fired.set)
        with clock.timing(timer):
            await asyncio.sleep(0.3)
            assert not fired.is_set()
    timer.stop()
