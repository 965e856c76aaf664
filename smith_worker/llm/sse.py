"""Incremental Server-Sent Events frame parser (WHATWG HTML, server-sent events: https://html.spec.whatwg.org/multipage/server-sent-events.html).

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
* the last event id, as the spec's "last event ID string", changes at the
  blank line ending the event; deviation: so does ``retry`` (the spec applies
  it at once), so the fields of an unterminated last event have no effect;
* deviation: an ``error`` field line (old llama.cpp servers report a failure
  inside an HTTP 200 stream as ``error: {json}``) is read as ``event: error``
  with that value as its data;
* an empty line dispatches the event, unless no ``data`` line was seen;
* at end of stream an unterminated event is discarded.

Deviation: bytes that are not valid UTF-8 raise :class:`ParseError` with the
byte offset instead of being replaced by U+FFFD — the payloads are JSON and
silently corrupting them would only move the error elsewhere.

How it is fast: chat-completions streams are almost all
``data: {json}\\n\\n`` frames, so while a stream uses LF line endings and no
event is half-parsed, a chunk is cut into events with one ``bytes.split`` on
the blank line, and an event that is one ``data: `` line is sliced and decoded
once — no per-line copy, regex or decode. Anything else (CR line endings,
comments, several lines, other fields) goes line by line through the same
rules. Bytes are split before decoding, so a multibyte character split across
chunks is decoded whole. Parsing is linear in the bytes fed: bytes of an
incomplete event or line are buffered and only the new bytes are searched.
"""

from __future__ import annotations

from collections.abc import Iterator

from smith_client.errors import ParseError

_BOM = b"\xef\xbb\xbf"

#: One dispatched event: ``(type, data, last_event_id, offset)`` — ``type`` is
#: ``"message"`` by default, ``data`` the joined data lines, ``last_event_id``
#: the last event id seen so far in the stream (``None`` if never set),
#: ``offset`` the byte offset in the stream (the BOM counted) of the event's
#: first field line. A plain tuple: one is built per frame, and a class
#: instance costs more than the framing itself.
SseEvent = tuple[str, str, str | None, int]


class SseParser:
    """Feed raw bytes as they arrive; get complete events (:data:`SseEvent` tuples) back.

    ``feed(data) -> list[SseEvent]`` may be called with chunks split at any
    byte; ``close() -> list[SseEvent]`` marks the end of the stream. Raises
    :class:`ParseError` (``offset`` = byte offset in the stream) on invalid
    UTF-8, and ``RuntimeError`` when fed after ``close()``.
    """

    def __init__(self) -> None:
        # bytes not parsed yet: an incomplete event (no blank line in it, no CR), or in line mode an incomplete line
        self._buffer = bytearray()
        self._base = 0  # stream offset of the first byte not parsed yet
        self._bom_checked = False
        self._skip_lf = False  # the previous line ended with a CR at the end of the data
        self._closed = False
        # the event being assembled line by line; _event_offset is None while no field line was seen
        self._data: list[str] = []
        self._event_type = ""
        self._event_offset: int | None = None
        self._id_buffer: str | None = None  # the spec's "last event ID buffer": the last valid `id` line
        self._retry_buffer: int | None = None  # a `retry` line of the event being assembled
        #: The id of the last event (the spec's "last event ID string"), ``None`` while no ``id`` line came.
        self.last_event_id: str | None = None
        #: Reconnection time requested by the server with ``retry:`` (milliseconds), if any.
        self.retry: int | None = None

    @property
    def offset(self) -> int:
        """Bytes parsed so far (complete events, or complete lines after a CR), counting the BOM."""
        return self._base

    def feed(self, data: bytes) -> list[SseEvent]:
        """Parse the next chunk; return the events it completes (possibly none)."""
        return list(self.iter_feed(data))

    def iter_feed(self, data: bytes) -> Iterator[SseEvent]:
        """Like :meth:`feed`, but yields each event as soon as it is parsed.

        ``data`` is buffered at once; events are parsed as the iterator is
        consumed, so an error in a later event does not hide earlier ones.
        Events left unparsed by an abandoned iterator are lost.
        """
        if self._closed:
            raise RuntimeError("SseParser.feed() after close()")
        return self._parse(data)

    def close(self) -> list[SseEvent]:
        """End of stream: an unterminated event is discarded (WHATWG), so this returns ``[]``."""
        self._closed = True
        self._buffer.clear()
        self._data.clear()
        return []

    def _parse(self, data: bytes) -> Iterator[SseEvent]:
        if not self._bom_checked:
            data = self._skip_bom(data)
            if not self._bom_checked:
                return
        if self._skip_lf and data:
            self._skip_lf = False
            if data[0] == 0x0A:
                data = data[1:]
                self._base += 1
        buffer = self._buffer
        if 0x0D in data or self._event_offset is not None:
            if buffer:
                if 0x0A not in data and 0x0D not in data:  # still inside one long line: keep it, scan nothing again
                    buffer += data
                    return
                data = bytes(buffer) + data
                buffer.clear()
            yield from self._lines(data)
            return
        if buffer:
            start = len(buffer) - 1  # a blank line may start at the buffered LF
            buffer += data
            if buffer.find(b"\n\n", start) < 0:  # the event is still incomplete: only new bytes were searched
                return
            data = bytes(buffer)
            buffer.clear()
        events = data.split(b"\n\n")
        buffer += events.pop()  # the rest, up to the next blank line: an incomplete event
        offset = self._base
        last_event_id = self.last_event_id
        try:
            for event in events:
                start, offset = offset, offset + len(event) + 2
                if event[:6] == b"data: " and 0x0A not in event:  # the usual frame: a single data line
                    try:
                        text = event[6:].decode()
                    except UnicodeDecodeError as exc:
                        raise _utf8_error(exc, start + 6) from exc
                    yield ("message", text, last_event_id, start)
                else:
                    self._base = start
                    yield from self._lines(event + b"\n\n")
                    last_event_id = self.last_event_id
        finally:  # also when the iterator is abandoned: the offset stays the stream's
            self._base = offset

    def _skip_bom(self, data: bytes) -> bytes:
        """Skip one leading BOM; the data to parse, all kept back while the first bytes could still be a BOM."""
        head = bytes(self._buffer) + data
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._buffer[:] = head
            return b""
        self._buffer.clear()
        self._bom_checked = True
        if head.startswith(_BOM):
            self._base = len(_BOM)
            return head[len(_BOM) :]
        return head

    def _lines(self, data: bytes) -> Iterator[SseEvent]:
        """Parse ``data`` line by line (any line ending); an incomplete last line is buffered."""
        lines = data.splitlines(keepends=True)
        if lines and lines[-1][-1] not in b"\r\n":
            self._buffer += lines.pop()
        elif data.endswith(b"\r"):
            self._skip_lf = True  # a LF starting the next chunk belongs to this line ending
        for line in lines:
            start = self._base
            self._base += len(line)
            content = line.rstrip(b"\r\n")
            if not content:
                event = self._dispatch()
                if event is not None:
                    yield event
            elif content[0] != 0x3A:  # not a comment
                self._field(content, start)

    def _field(self, raw: bytes, offset: int) -> None:
        try:
            line = raw.decode()
        except UnicodeDecodeError as exc:
            raise _utf8_error(exc, offset) from exc
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if self._event_offset is None:
            self._event_offset = offset
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id":
            if "\0" not in value:
                self._id_buffer = value
        elif name == "retry":
            if value.isascii() and value.isdigit():
                self._retry_buffer = int(value)
        elif name == "error":  # legacy llama.cpp server: `error: {json}` instead of `event: error` + data
            self._event_type = "error"
            self._data.append(value)

    def _dispatch(self) -> SseEvent | None:
        self.last_event_id = self._id_buffer
        if self._retry_buffer is not None:
            self.retry, self._retry_buffer = self._retry_buffer, None
        offset = self._event_offset or 0
        self._event_offset = None
        event_type, self._event_type = self._event_type, ""
        if not self._data:
            return None
        data = "\n".join(self._data)
        self._data = []
        return (event_type or "message", data, self.last_event_id, offset)


def _utf8_error(exc: UnicodeDecodeError, offset: int) -> ParseError:
    """``exc`` from decoding bytes that start at stream offset ``offset``."""
    return ParseError(f"invalid UTF-8 in event stream: {exc.reason}", offset=offset + exc.start)


__all__ = ["SseEvent", "SseParser"]
