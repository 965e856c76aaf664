"""Stream events published behind the model stream, batched while a publish is in flight.

A streamed model reply arrives as many small events (token deltas, tool-call
starts and completions), often several in one burst. Publishing each before
reading on costs one Redis round trip per token. :class:`EventBatcher` lets
the loop read on: the first event queues a publish for the worker's next
auto-pipeline (:meth:`AgentContext.submit_publish`), which takes every event
that arrived by the time that pipeline is built (one script call,
``lua/publish_batch.lua``); the events that arrive while it is in flight go
in the next one. Nothing waits for a timer: an event that arrives alone is
published at once, and a burst costs one round trip per in-flight publish
rather than one per event. No task runs per publish either: the next publish
is queued from the reply's done-callback. Each event still gets its own
``seq``, log entry and pub/sub message, and ``ts`` is stamped by Redis when its
batch is logged.

Token coalescing (``SMITH_TOKEN_COALESCE``, seconds, off by default): with
a window, a publish waits that long after its first event, and consecutive
token deltas of its batch become one ``token`` event (their texts joined; ``reasoning`` deltas alike),
trading that much latency for fewer events and round trips per stream.

Order is kept (one publish at a time, in arrival order). A publish's failure
(:class:`~smith_worker.memory.fencing.StaleAttemptError`, a Redis error) is raised by
the next :meth:`EventBatcher.add` or by :meth:`EventBatcher.flush`, so a
superseded attempt stops reading the stream soon.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from smith_client.events import EventData, ReasoningData, TokenData

#: ``submit(take)``: queue a publish of the events ``take()`` returns when it is sent; the future is done when
#: it is published, or raises why not (a superseded attempt: :class:`~smith_worker.memory.fencing.StaleAttemptError`).
Submit = Callable[[Callable[[], list[EventData]]], "asyncio.Future[None]"]


class EventBatcher:
    """Publish events in arrival order, batching those that arrive while a publish is in flight.

    ``submit`` queues one publish (:meth:`AgentContext.submit_publish`), whose
    future raises when it failed (the attempt was superseded:
    :class:`~smith_worker.memory.fencing.StaleAttemptError`). ``coalesce`` is
    the token-coalescing window in seconds (0: off; see the module docstring).
    """

    def __init__(self, submit: Submit, coalesce: float = 0.0) -> None:
        self._submit = submit
        self._coalesce = coalesce
        self._pending: list[EventData] = []
        self._error: BaseException | None = None
        self._detaching = False
        self._idle = asyncio.Event()  # set while no publish is queued, in flight or waiting out its window
        self._idle.set()
        self._timer: asyncio.TimerHandle | None = None
        self._reply: asyncio.Future[None] | None = None

    def add(self, data: EventData) -> None:
        """Queue ``data`` for publishing; raises the error of an earlier publish that failed."""
        if self._error is not None:
            raise self._error
        self._pending.append(data)
        if self._idle.is_set():
            self._begin()

    def _begin(self) -> None:
        self._idle.clear()
        if self._coalesce > 0:  # detach() cancels nothing: it waits the window out
            self._timer = asyncio.get_running_loop().call_later(self._coalesce, self._send)
        else:
            self._send()

    def _send(self) -> None:
        self._timer = None
        self._reply = self._submit(self._take)
        self._reply.add_done_callback(self._sent)

    def _take(self) -> list[EventData]:
        batch, self._pending = self._pending, []
        return merge_tokens(batch) if self._coalesce > 0 else batch

    def _sent(self, reply: asyncio.Future[None]) -> None:
        self._reply = None
        if reply.cancelled():  # aclose()
            self._idle.set()
            return
        try:
            reply.result()
        except BaseException as exc:  # whatever it is, detach() must not wait for a publish that never comes
            self._error = exc
        if self._error is None and self._pending and not self._detaching:
            self._begin()  # the events that came while it was in flight
        else:
            self._idle.set()

    async def flush(self) -> None:
        """Return once every added event is published; raises a failed publish's error."""
        rest = await self.detach()
        if rest:
            await self._submit(lambda: rest)

    async def detach(self) -> list[EventData]:
        """Wait for the publish in flight, then return (and forget) the events not sent yet: the caller
        publishes them in its own next round trip, ahead of its own events. Raises a failed publish's error."""
        self._detaching = True
        try:
            await self._idle.wait()
        finally:
            self._detaching = False
        if self._error is not None:
            raise self._error
        pending, self._pending = self._pending, []
        return pending

    async def aclose(self) -> None:
        """Stop a publish still queued (the stream failed or was cancelled); unsent events are dropped.
        One already sent finishes on its own, its reply unread. A failed publish's error is dropped too: it
        was raised to the caller already, and its traceback holds the caller's frames (with their locals,
        a turn's whole request body), which would otherwise stay in a reference cycle through this object."""
        self._pending = []
        self._error = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._reply is not None:
            self._reply.cancel()
        self._idle.set()


def merge_tokens(events: list[EventData]) -> list[EventData]:
    """``events`` with each run of consecutive :class:`TokenData` replaced by one (texts joined, in order),
    and each run of consecutive :class:`ReasoningData` alike."""
    merged: list[EventData] = []
    for event in events:
        last = merged[-1] if merged else None
        if isinstance(event, TokenData) and isinstance(last, TokenData):
            merged[-1] = TokenData(text=last.text + event.text)
        elif isinstance(event, ReasoningData) and isinstance(last, ReasoningData):
            merged[-1] = ReasoningData(text=last.text + event.text)
        else:
            merged.append(event)
    return merged
