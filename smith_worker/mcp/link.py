"""The read and write pumps between an SDK transport and its ``ClientSession`` (research/mcp-notes.md §7.1).

* The **read pump** forwards server messages to the session. A transport
  ``Exception`` item (e.g. a non-JSON line on a stdio server's stdout) is
  logged and dropped, so the session keeps going. At end of stream it calls
  ``on_lost("eof")`` first, then closes the session's read side, which makes
  the SDK fail every pending request with ``CONNECTION_CLOSED`` at once.
* The **write pump** forwards client messages to the transport through an
  unbounded buffer (so the SDK's shielded courtesy ``notifications/cancelled``
  never blocks on a wedged server) and records the tag of every
  ``tools/call`` it hands over (:data:`CALL_TAG` in ``_meta``): a call whose
  tag is in :attr:`Link.sent` may have reached the server and is never
  replayed (seed §11.2).

Both pumps run in the owner task's task group and never raise.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

logger = logging.getLogger("agent_smith.mcp")

#: ``_meta`` key tagging a ``tools/call`` with the pool's call id.
CALL_TAG = "io.agentsmith/call_id"


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


class Link:
    """The pumped stream pair handed to ``ClientSession`` (see module doc).

    ``on_lost(reason)`` is called once when either side of the transport ends.
    """

    def __init__(self, alias: str, transport_read: Any, transport_write: Any,
                 on_lost: Callable[[str], None]) -> None:
        self.alias = alias
        self._t_read = transport_read
        self._t_write = transport_write
        self._on_lost = on_lost
        self._lost_reported = False
        self.sent: set[str] = set()
        self.bad_lines = 0
        self._s_read_send: MemoryObjectSendStream[Any]
        self.session_read: MemoryObjectReceiveStream[Any]
        self._s_read_send, self.session_read = anyio.create_memory_object_stream[Any](0)
        self.session_write: MemoryObjectSendStream[Any]
        self._s_write_recv: MemoryObjectReceiveStream[Any]
        self.session_write, self._s_write_recv = anyio.create_memory_object_stream[Any](math.inf)

    def _lost(self, reason: str) -> None:
        if not self._lost_reported:
            self._lost_reported = True
            self._on_lost(reason)

    async def read_pump(self) -> None:
        """Transport → session until end of stream."""
        try:
            async for item in self._t_read:
                if isinstance(item, Exception):
                    self.bad_lines += 1
                    logger.warning("MCP server %r sent a line that is not a JSON-RPC message (ignored): %.200r",
                                   self.alias, _bad_input(item))
                    continue
                await self._s_read_send.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            pass
        except Exception:  # a transport failure is a lost connection, never a crashed owner
            logger.warning("MCP server %r: read side failed", self.alias, exc_info=True)
        finally:
            self._lost("eof")  # before the session sees the end, so callers classify it as a loss
            self._s_read_send.close()

    async def write_pump(self) -> None:
        """Session → transport; records the tags of forwarded ``tools/call`` requests."""
        try:
            async with self._s_write_recv:
                async for item in self._s_write_recv:
                    tag = _call_tag(item)
                    if tag is not None:
                        self.sent.add(tag)
                    await self._t_write.send(item)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream):
            self._lost("write failed")
        except Exception:
            logger.warning("MCP server %r: write side failed", self.alias, exc_info=True)
            self._lost("write failed")
