"""TurnExecution.hand_off_soon: a turn still running after a worker's immediate stop is cancelled directly."""

from __future__ import annotations

import asyncio

from smith_worker.turn import lifecycle as turn_module
from smith_worker.turn.lifecycle import TurnExecution


def execution(task: asyncio.Task[None]) -> TurnExecution:
    made = object.__new__(TurnExecution)  # only the hand-off state is exercised
    made._task, made._ending = task, False
    return made


async def test_a_turn_whose_cancel_was_lost_is_cancelled_after_the_check(monkeypatch):
    monkeypatch.setattr(turn_module, "HANDOFF_CHECK", 0.01)
    lost = asyncio.Event()

    async def reads_on() -> None:  # swallows the first cancel, as the lost one did
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            lost.set()
        await asyncio.sleep(3600)

    task = asyncio.ensure_future(reads_on())
    await asyncio.sleep(0)
    task.cancel()
    await lost.wait()
    execution(task).hand_off_soon()
    await asyncio.sleep(0.05)
    assert task.cancelled()


async def test_a_turn_already_handing_off_is_not_cancelled_again(monkeypatch):
    monkeypatch.setattr(turn_module, "HANDOFF_CHECK", 0.01)
    task = asyncio.ensure_future(asyncio.sleep(0.2))
    ending = execution(task)
    ending._ending = True
    ending.hand_off_soon()
    await asyncio.sleep(0.05)
    assert not task.done()
    await task


async def test_the_lease_renewal_ends_even_when_its_cancel_is_lost_inside_a_renewal(monkeypatch):
    """redis-py can retry a read the cancel interrupted (the renewal then succeeds): the flag still stops it."""
    from smith_client.keys import Keys
    from smith_worker.turn import attempt as attempt_module
    from smith_worker.turn.attempt import TurnAttempt

    renewals = []
    stop_now = asyncio.Event()

    swallowed = []

    async def renew_swallowing_a_cancel(redis, keys, args):
        renewals.append(args)
        try:
            stop_now.set()
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)  # the lost cancel: the renewal goes on and succeeds
        return 1

    monkeypatch.setattr(attempt_module, "RENEW", renew_swallowing_a_cancel)
    attempt = TurnAttempt(None, Keys("t"), "t1", "c1", "w", lease=0.15)
    attempt.start_renewing(lambda: None)
    await stop_now.wait()  # a renewal is in flight
    await asyncio.wait_for(attempt.stop_renewing(), 1.0)  # it used to renew on, forever
    count = len(renewals)
    await asyncio.sleep(0.2)
    assert len(renewals) == count  # no renewal after the stop
