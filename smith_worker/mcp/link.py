"""The stream pair between an SDK transport and its ``ClientSession``.

Two thin wrappers around the transport's streams (the SDK's ``ReadStream`` /
``WriteStream`` protocols), so a message crosses no extra task or memory
stream on the hot path:

* **Read side** (:attr:`Link.session_read`): passes server messages through.
  A transport ``Exception`` item (e.g. a non-JSON line on a stdio server's
  stdout) is logged and dropped, so the session keeps going. At end of
  stream (or a transport failure) it calls ``on_lost("eof")`` first, then
  ends the session's iteration, which makes the SDK fail every pending
  request with ``CONNECTION_CLOSED`` at once.
* **Write side** (:attr:`Link.session_write`): never blocks the session. A
  message goes straight to the transport's writer when that writer is idle
  (stdio);
  otherwise it is queued in an unbounded backlog that :meth:`Link.write_pump`
  forwards in order (so the SDK's shielded courtesy ``notifications/cancelled``
  never waits on a wedged server). The tag of every ``tools/call`` handed to
  the transport (:data:`CALL_TAG` in ``_meta``) is recorded: a call whose tag
  is in :attr:`Link.sent` may have reached the server and is never replayed
  (docs/architecture.md, MCP). A transport write failure reports ``on_lost("write failed")``
  and drops the message.

:meth:`Link.write_pump` runs in the owner task's task group and never raises.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any, Self

import anyio

logger = logging.getLogger("agent_smith.mcp")

#: ``_meta`` key tagging a ``tools/call`` with the pool's call id.
CALL_TAG = "io.agentsmith/call_id"

_STREAM_ENDED = (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)


def _call_tag(session_message: Any) -> str | None:
    message = getattr(session_message, "message", None)
    if getattr(message, "method", None) != "tools/call":
        return None
    params = getattr(message, "params", None) or {}
    meta = params.get("_meta") if isinstance(params, dict) else None
    tag = meta.get(CALL_TAG) if isinstance(meta, dict) else None
    return tag if isinstance(tag, str) else None


def _bad_input(error: Exception) -> object:
    """The offending input of a parse error (pydantic puts it in its error details), else the error text."""
    errors = getattr(error, "errors", None)
    if callable(errors):
        try:
            return errors()[0].get("input", str(error))
        except (IndexError, TypeError, AttributeError):
            pass
    return str(error)


class _SessionRead:
    """The session's read stream: the transport's, minus bad lines, reporting the end first."""

    def __init__(self, link: Link) -> None:
        self._link = link

    async def receive(self) -> Any:
        link = self._link
        while True:
            try:
                item = await link._t_read.receive()
            except _STREAM_ENDED:
                link._lost("eof")  # before the session sees the end, so callers classify it as a loss
                raise anyio.EndOfStream from None
            except Exception:  # a transport failure is a lost connection, never a crashed session
                logger.warning("MCP server %r: read side failed", link.alias, exc_info=True)
                link._lost("eof")
                raise anyio.EndOfStream from None
            if isinstance(item, Exception):
                logger.warning(
                    "MCP server %r sent a line that is not a JSON-RPC message (ignored): %.200r",
                    link.alias,
                    _bad_input(item),
                )
                continue
            return item

    def __aiter__(self) -> _SessionRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        """The session is done reading; the transport's stream stays the transport's to close."""
        self._link._lost("eof")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _SessionWrite:
    """The session's write stream: hand over now if the transport's writer is idle, else queue (see module doc)."""

    def __init__(self, link: Link) -> None:
        self._link = link
        self.closed = False

    async def send(self, item: Any) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        link = self._link
        if link._write_failed:
            return  # the loss is reported; the request fails through it
        if link._direct and not link._backlog and not link._pumping:
            tag = _call_tag(item)
            try:
                link._t_write.send_nowait(item)
            except anyio.WouldBlock:
                pass
            except _STREAM_ENDED:
                link._write_failure()
                return
            else:
                if tag is not None:
                    link.sent.add(tag)
                return
        link._backlog.append(item)
        link._wake.set()

    async def aclose(self) -> None:
        self.closed = True
        self._link._wake.set()  # let the pump flush what is queued, then stop

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Link:
    """The stream pair handed to ``ClientSession`` (see module doc).

    ``on_lost(reason)`` is called once when either side of the transport ends.
    """

    def __init__(self, alias: str, transport_read: Any, transport_write: Any, on_lost: Callable[[str], None]) -> None:
        self.alias = alias
        self._t_read = transport_read
        self._t_write = transport_write
        self._on_lost = on_lost
        self._lost_reported = False
        self._write_failed = False
        self._backlog: collections.deque[Any] = collections.deque()
        self._pumping = False
        #: hand messages straight to the transport's writer when it waits (memory streams; the HTTP
        #: transport's context streams have no ``send_nowait`` and always go through the pump)
        self._direct = callable(getattr(transport_write, "send_nowait", None))
        self._wake = asyncio.Event()
        self.sent: set[str] = set()
        self.session_read = _SessionRead(self)
        self.session_write = _SessionWrite(self)

    def _lost(self, reason: str) -> None:
        if not self._lost_reported:
            self._lost_reported = True
            self._on_lost(reason)

    def _write_failure(self) -> None:
        self._write_failed = True
        self._backlog.clear()
        self._lost("write failed")

    async def write_pump(self) -> None:
        """Forward the backlog (messages queued while the transport's writer was busy), in order."""
        try:
            while True:
                while self._backlog and not self._write_failed:
                    item = self._backlog[0]
                    self._pumping = True  # keep later messages behind this one
                    tag = _call_tag(item)
                    if tag is not None:
                        self.sent.add(tag)
                    self._backlog.popleft()
                    try:
                        await self._t_write.send(item)
                    except _STREAM_ENDED:
                        self._write_failure()
                    finally:
                        self._pumping = False
                if self.session_write.closed or self._write_failed:
                    return
                self._wake.clear()
                await self._wake.wait()
        except Exception:
            logger.warning("MCP server %r: write side failed", self.alias, exc_info=True)
            self._write_failure()
