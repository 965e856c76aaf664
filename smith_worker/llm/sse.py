"""Incremental Server-Sent Events frame parser (seed §9.3, "frame parser").

Follows the WHATWG event-stream interpretation
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation):

* one leading UTF-8 BOM is skipped;
* lines end with CRLF, LF or CR — a CR ending one chunk and the LF starting
  the next count as one line ending;
* a line starting with ``:`` is a comment (keep-alive) and is ignored;
* ``field:value`` — one space after the colon is removed if present; a line
  without a colon is a field with an empty value;
* ``data`` lines are joined with ``"\\n"``; ``event`` sets the type (default
  ``"message"``); ``id`` sets the last event id (kept across events, ignored
  when it contains NUL); ``retry`` (digits only) sets :attr:`SseParser.retry`;
  other fields are ignored;
* deviation: an ``error`` field line (old llama.cpp servers report a failure
  inside an HTTP 200 stream as ``error: {json}``) is read as ``event: error``
  with that value as its data;
* an empty line dispatches the event, unless no ``data`` line was seen;
* at end of stream an unterminated event is discarded.

Deviation: bytes that are not valid UTF-8 raise :class:`ParseError` with the
byte offset instead of being replaced by U+FFFD — the payloads are JSON and
silently corrupting them would only move the error elsewhere.
Lines are split on bytes before decoding, so a multibyte character split
across chunks is decoded whole. Line assembly is linear in the bytes fed:
the bytes of an incomplete line are scanned for a line ending only once.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from smith_client.errors import ParseError

_BOM = b"\xef\xbb\xbf"
_LINE_END = re.compile(rb"[\r\n]")


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event.

    ``event`` is the type (``"message"`` by default), ``data`` the joined
    data lines, ``id`` the last event id seen so far in the stream (``None``
    if never set), ``offset`` the byte offset in the stream (after the BOM is
    counted) of the event's first line.
    """

    event: str
    data: str
    id: str | None = None
    offset: int = 0


class SseParser:
    """Feed raw bytes as they arrive; get complete events back.

    ``feed(data) -> list[SseEvent]`` may be called with chunks split at any
    byte; ``close() -> list[SseEvent]`` marks the end of the stream. Raises
    :class:`ParseError` (``offset`` = byte offset in the stream) on invalid
    UTF-8, and ``RuntimeError`` when fed after ``close()``.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._base = 0  # stream offset of self._buffer[0]
        self._pos = 0  # bytes of self._buffer already parsed
        self._scanned = 0  # bytes of self._buffer known to hold no line ending after self._pos
        self._bom_checked = False
        self._skip_lf = False  # the previous line ended with a CR at the end of the data
        self._closed = False
        self._data: list[str] = []
        self._event_type = ""
        self._event_offset: int | None = None
        self.last_event_id: str | None = None
        #: Reconnection time requested by the server with ``retry:`` (milliseconds), if any.
        self.retry: int | None = None

    @property
    def offset(self) -> int:
        """Bytes consumed so far (complete lines), counting the BOM."""
        return self._base + self._pos

    def feed(self, data: bytes) -> list[SseEvent]:
        """Parse the next chunk; return the events it completes (possibly none)."""
        return list(self.iter_feed(data))

    def iter_feed(self, data: bytes) -> Iterator[SseEvent]:
        """Like :meth:`feed`, but yields each event as soon as its line is parsed.

        ``data`` is buffered at once; lines are parsed as the iterator is
        consumed, so an error in a later line does not hide earlier events.
        Lines left unparsed by an abandoned iterator are parsed by the next call.
        """
        if self._closed:
            raise RuntimeError("SseParser.feed() after close()")
        del self._buffer[: self._pos]
        self._base += self._pos
        self._scanned = max(0, self._scanned - self._pos)
        self._pos = 0
        self._buffer += data
        return self._lines()

    def close(self) -> list[SseEvent]:
        """End of stream: an unterminated event is discarded (WHATWG), so this returns ``[]``."""
        self._closed = True
        self._buffer.clear()
        self._pos = 0
        self._data.clear()
        return []

    def _bom_pending(self) -> bool:
        """Skip one leading BOM; True while the first bytes could still be a BOM."""
        if self._bom_checked:
            return False
        head = bytes(self._buffer[: len(_BOM)])
        if len(head) < len(_BOM) and _BOM.startswith(head):
            return True
        if head == _BOM:
            self._pos = len(_BOM)
        self._bom_checked = True
        return False

    def _lines(self) -> Iterator[SseEvent]:
        buffer = self._buffer
        if self._bom_pending():
            return
        if self._skip_lf and self._pos < len(buffer):
            self._skip_lf = False
            if buffer[self._pos] == 0x0A:
                self._pos += 1
        # a long line arriving in many chunks is scanned once, not again with every chunk (linear time)
        while (match := _LINE_END.search(buffer, max(self._pos, self._scanned))) is not None:
            line, line_offset = bytes(buffer[self._pos : match.start()]), self._base + self._pos
            self._pos = self._scanned = match.end()
            if buffer[match.start()] == 0x0D:
                if self._pos == len(buffer):
                    self._skip_lf = True
                elif buffer[self._pos] == 0x0A:
                    self._pos += 1
            event = self._process_line(line, line_offset)
            if event is not None:
                yield event
        self._scanned = len(buffer)

    def _process_line(self, raw: bytes, offset: int) -> SseEvent | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ParseError(f"invalid UTF-8 in event stream: {exc.reason}", offset=offset + exc.start) from exc
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if self._event_offset is None:
            self._event_offset = offset
        self._apply_field(name, value)
        return None

    def _apply_field(self, name: str, value: str) -> None:
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self.retry = int(value)
        elif name == "error":  # legacy llama.cpp server: `error: {json}` instead of `event: error` + data
            self._event_type = "error"
            self._data.append(value)

    def _dispatch(self) -> SseEvent | None:
        offset = self._event_offset or 0
        self._event_offset = None
        event_type, self._event_type = self._event_type, ""
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return SseEvent(event=event_type or "message", data=data, id=self.last_event_id, offset=offset)


__all__ = ["SseEvent", "SseParser"]
