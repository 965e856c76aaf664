"""Stream events published behind the model stream, batched while a publish is in flight (issue 18).

A streamed model reply arrives as many small events (token deltas, tool-call
starts and completions), often several in one burst. Publishing each before
reading on costs one Redis round trip per token. :class:`EventBatcher` lets
the loop read on: the first event starts a publish in the background, and the
events that arrive while it is in flight go together in the next one (one
script call, ``lua/publish_batch.lua``). Nothing waits for a timer: an event
that arrives alone is published at once, and a burst costs one round trip per
in-flight publish rather than one per event. Each event still gets its own
``seq``, log entry and pub/sub message, and ``ts`` is stamped when its batch
is sent.

Token coalescing (``SMITH_TOKEN_COALESCE``, seconds, off by default): with
a window, a publish waits that long after its first event, and consecutive
token deltas of its batch become one ``token`` event (their texts joined),
trading that much latency for fewer events and round trips per stream.

Order is kept (one publish at a time, in arrival order). A publish's failure
(:class:`~smith_worker.fencing.StaleAttemptError`, a Redis error) is raised by
the next :meth:`EventBatcher.add` or by :meth:`EventBatcher.flush`, so a
superseded attempt stops reading the stream soon.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from smith_client.events import EventData, TokenData
from smith_worker.tasks import cancel_and_wait


class EventBatcher:
    """Publish events in arrival order, batching those that arrive while a publish is in flight.

    ``publish(events)`` publishes consecutive events in one round trip and
    raises on failure (the loop's fenced batch publish). ``coalesce`` is the
    token-coalescing window in seconds (0: off; see the module docstring).
    """

    def __init__(self, publish: Callable[[list[EventData]], Awaitable[None]], coalesce: float = 0.0) -> None:
        self._publish = publish
        self._coalesce = coalesce
        self._pending: list[EventData] = []
        self._task: asyncio.Task[Any] | None = None
        self._detaching = False

    def add(self, data: EventData) -> None:
        """Queue ``data`` for publishing; raises the error of an earlier publish that failed."""
        if self._task is not None and self._task.done():
            task, self._task = self._task, None
            task.result()
        self._pending.append(data)
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        # events added while a publish is awaited are taken by the next pass, unless detach() waits
        while self._pending and not self._detaching:
            if self._coalesce > 0:
                await asyncio.sleep(self._coalesce)  # detach() cancels nothing: it waits this out
            batch, self._pending = self._pending, []
            await self._publish(merge_tokens(batch) if self._coalesce > 0 else batch)

    async def flush(self) -> None:
        """Return once every added event is published; raises a failed publish's error."""
        rest = await self.detach()
        if rest:
            await self._publish(rest)

    async def detach(self) -> list[EventData]:
        """Wait for the publish in flight, then return (and forget) the events not sent yet: the caller
        publishes them in its own next round trip, ahead of its own events. Raises a failed publish's error."""
        task, self._task = self._task, None
        self._detaching = True
        try:
            if task is not None:
                await task
        finally:
            self._detaching = False
        pending, self._pending = self._pending, []
        return pending

    async def aclose(self) -> None:
        """Stop a publish still in flight (the stream failed or was cancelled); unsent events are dropped."""
        task, self._task = self._task, None
        self._pending = []
        await cancel_and_wait(task)


def merge_tokens(events: list[EventData]) -> list[EventData]:
    """``events`` with each run of consecutive :class:`TokenData` replaced by one (texts joined, in order)."""
    merged: list[EventData] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, TokenData) and isinstance(last, TokenData):
            merged[-1] = TokenData(text=last.text + event.text)
        else:
            merged.append(event)
    return merged
