"""The shared pub/sub reader ends on close even when redis-py swallows its cancellation (Python 3.11)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from smith_client.fanout import AsyncFanout


class SwallowingPubSub:
    """A pub/sub whose read turns a cancel into "no message", as redis-py's read under
    Python 3.11's ``asyncio.timeout`` can."""

    connection: Any = SimpleNamespace(is_connected=True)

    async def follow(self, channels: object, sharded: object) -> None:
        return None

    async def get_message(self, timeout: float) -> None:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            return None  # swallowed
        return None

    async def aclose(self) -> None:
        self.connection = None


class Fanout(AsyncFanout):
    def _open_pubsub(self) -> SwallowingPubSub:
        return SwallowingPubSub()


async def test_close_ends_a_reader_whose_cancel_was_swallowed():
    fanout = Fanout(None)  # type: ignore[arg-type]
    await fanout.add("chan", fanout.open())
    await asyncio.sleep(0.1)
    async with asyncio.timeout(5):
        await fanout.aclose()
    await asyncio.sleep(0.1)  # the reader's next turn sees the flag
    assert fanout._reader is not None and fanout._reader.done()
