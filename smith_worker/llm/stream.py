"""Chat-completions stream assembly (docs/architecture.md, Model requests).

:class:`ChatStreamAssembler` turns the ``data`` of each SSE event into
:class:`~smith_worker.llm.types.StreamEvent` objects and accumulates the final
assistant message. :class:`ChatStreamDecoder` chains it behind an
:class:`~smith_worker.llm.sse.SseParser` so callers feed raw bytes.

Event order: ``StreamReasoningDelta``, ``StreamTokenDelta`` and ``StreamToolCallStarted`` as the
deltas arrive (a delta's reasoning before its content); at the end (``[DONE]`` or EOF after a ``finish_reason``) one
``StreamToolCallCompleted`` per call in index order, then ``StreamFinished``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from smith_client.errors import LlmApiError, ParseError
from smith_client.messages import AssistantMessage, TokenUsage, ToolCall, parse_json_object
from smith_worker.llm.sse import SseEvent, SseParser
from smith_worker.llm.types import (
    LlmResponse,
    StreamEvent,
    StreamFinished,
    StreamReasoningDelta,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
)
from smith_worker.llm.wire import parse_arguments, usage_from_openai
from smith_worker.ops.redaction import redact_body

DONE_MARKER = "[DONE]"

logger = logging.getLogger("agent_smith.llm")


@dataclass
class _PartialToolCall:
    """A tool call being accumulated: id and name are set once, arguments concatenated."""

    index: int
    wire_index: int | None
    id: str = ""
    name: str = ""
    fragments: list[str] = field(default_factory=list)
    object_arguments: dict[str, Any] | None = None
    started: bool = False

    def arguments(self) -> dict[str, Any]:
        """Parse the accumulated arguments once. Raises ``ParseError``."""
        text = "".join(self.fragments)
        if self.object_arguments is not None:
            if text.strip():
                raise ParseError(f"tool call {self.name!r}: arguments sent both as an object and as text")
            return self.object_arguments
        return parse_arguments(text, tool_name=self.name)


class _ToolCallTable:
    """Tool calls keyed by the wire ``index``, falling back to the ``id``."""

    def __init__(self) -> None:
        self.calls: list[_PartialToolCall] = []
        self._by_wire_index: dict[int, _PartialToolCall] = {}
        self._by_id: dict[str, _PartialToolCall] = {}

    def lookup(self, wire_index: int | None, call_id: str) -> _PartialToolCall:
        """The call a delta belongs to, creating it when the delta starts a new one.

        Same index → same call, unless the delta carries a different non-empty
        id (a new call reusing the index). No index → by id; no index and no
        id → the most recent call.
        """
        call: _PartialToolCall | None
        if wire_index is not None:
            call = self._by_wire_index.get(wire_index)
            if call is not None and call_id and call.id and call_id != call.id:
                call = None
        elif call_id:
            call = self._by_id.get(call_id)
        else:
            call = self.calls[-1] if self.calls else None
        return call if call is not None else self._create(wire_index, call_id)

    def remember_id(self, call: _PartialToolCall, call_id: str) -> None:
        if call_id and not call.id:
            call.id = call_id
            self._by_id.setdefault(call_id, call)

    def _create(self, wire_index: int | None, call_id: str) -> _PartialToolCall:
        taken = {call.index for call in self.calls}
        if wire_index is not None and wire_index not in taken:
            index = wire_index
        else:
            index = max(taken, default=-1) + 1
        call = _PartialToolCall(index=index, wire_index=wire_index)
        self.calls.append(call)
        if wire_index is not None:
            self._by_wire_index[wire_index] = call
        self.remember_id(call, call_id)
        return call

    def ordered(self) -> list[_PartialToolCall]:
        return sorted(self.calls, key=lambda call: call.index)


class ChatStreamAssembler:
    """The delta parser: one instance per streamed response.

    * :meth:`feed` takes one SSE event (its ``data`` is a JSON chunk or
      ``[DONE]``) and returns the stream events it produces.
    * :meth:`close` marks EOF: a normal end after a ``finish_reason``,
      otherwise ``ParseError``.
    * :meth:`finish` returns the :class:`LlmResponse` once the stream ended.

    Raises :class:`LlmApiError` (``http_status=200``) for an error frame
    (``{"error": ...}`` or ``event: error``) and :class:`ParseError`
    (``offset`` = byte offset of the frame in the stream) for invalid JSON,
    a bad chunk shape or malformed tool-call arguments.
    """

    def __init__(self) -> None:
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tools = _ToolCallTable()
        self._usage: TokenUsage | None = None
        self._standard_usage = False  # a standard `usage` was seen (it beats x_groq.usage)
        self._finish_reason: str | None = None
        self._final_calls: list[ToolCall] | None = None
        self._saw_choice = False
        self._ended = False
        self._model = ""

    @property
    def done(self) -> bool:
        """True once the stream ended (``[DONE]`` seen or :meth:`close` succeeded)."""
        return self._ended

    @property
    def finish_reason(self) -> str | None:
        """The last ``finish_reason`` received, ``None`` if none yet."""
        return self._finish_reason

    def feed(self, event: SseEvent) -> list[StreamEvent]:
        """Process one SSE event; events after the end are ignored."""
        if self._ended:
            return []
        event_type, data, _, offset = event
        if event_type == "error":
            raise LlmApiError(f"LLM stream error event: {_excerpt(data, 200)}", 200, data)
        return self.feed_data(data, offset=offset)

    def feed_data(self, data: str, *, offset: int = 0) -> list[StreamEvent]:
        """Process one frame's ``data`` (``offset``: its byte offset, for errors)."""
        if self._ended:
            return []
        text = data.strip()
        if text == DONE_MARKER:
            return self._end()
        if not text:
            return []
        chunk = _load_chunk(text, offset)
        _raise_stream_error(chunk, text)
        return self._apply_chunk(chunk, offset)

    def close(self) -> list[StreamEvent]:
        """EOF: finish normally after a ``finish_reason``, else raise ``ParseError``."""
        if self._ended:
            return []
        if self._finish_reason is None:
            raise ParseError("stream ended before a finish_reason or [DONE]")
        return self._end()

    def finish(self) -> LlmResponse:
        """The assembled response. Raises ``RuntimeError`` before the stream ended."""
        if not self._ended or self._final_calls is None:
            raise RuntimeError("ChatStreamAssembler.finish() before the stream ended")
        message = AssistantMessage(content="".join(self._content), tool_calls=self._final_calls, usage=self._usage)
        return LlmResponse(
            message=message,
            finish_reason=self._finish_reason or "",
            reasoning_content="".join(self._reasoning),
            model=self._model,
        )

    def _end(self) -> list[StreamEvent]:
        if not self._saw_choice:
            # as the non-streamed "chat completion has no choices": nothing to answer with is not an empty answer
            raise ParseError("chat completion has no choices (stream ended without a choice)")
        completed: list[StreamEvent] = []
        calls: list[ToolCall] = []
        for call in self._tools.ordered():
            if not call.name:
                raise ParseError(f"tool call at index {call.index} has no function name")
            arguments = call.arguments()
            calls.append(ToolCall(id=call.id, name=call.name, arguments=arguments))
            completed.append(StreamToolCallCompleted(call.index, arguments, call.id, call.name))
        self._final_calls = calls
        self._ended = True
        return [*completed, StreamFinished(self._finish_reason or "", self._usage)]

    def _apply_chunk(self, chunk: dict[str, Any], offset: int) -> list[StreamEvent]:
        if "usage" in chunk:
            self._take_usage(chunk["usage"])
        self._take_groq_usage(chunk.get("x_groq"))
        if not self._model and isinstance(chunk.get("model"), str):
            self._model = chunk["model"]
        choices = chunk.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise ParseError("stream chunk: choices is not a list", offset=offset)
        choice = _first_choice(choices, offset)
        if choice is None:
            return []
        self._saw_choice = True
        if "usage" in choice:
            self._take_usage(choice["usage"])
        events = self._apply_delta(choice.get("delta"), offset)
        reason = choice.get("finish_reason")
        if reason is not None:
            self._finish_reason = str(reason)
        return events

    def _take_usage(self, raw: Any) -> None:
        usage = usage_from_openai(raw)
        if usage is not None:
            self._usage = usage
            self._standard_usage = True

    def _take_groq_usage(self, x_groq: Any) -> None:
        """Groq reports streamed usage only as ``x_groq.usage``; the standard field wins.

        (https://console.groq.com/docs/api-reference)
        """
        if isinstance(x_groq, dict) and not self._standard_usage:
            usage = usage_from_openai(x_groq.get("usage"))
            if usage is not None:
                self._usage = usage

    def _apply_delta(self, delta: Any, offset: int) -> list[StreamEvent]:
        if delta is None:
            return []
        if not isinstance(delta, dict):
            raise ParseError("stream chunk: delta is not an object", offset=offset)
        events: list[StreamEvent] = []
        reasoning = _optional_str(delta, "reasoning_content", offset) or _optional_str(delta, "reasoning", offset)
        if reasoning:
            self._reasoning.append(reasoning)
            events.append(StreamReasoningDelta(reasoning))
        content = _optional_str(delta, "content", offset)
        if content:
            self._content.append(content)
            events.append(StreamTokenDelta(content))
        tool_calls = delta.get("tool_calls")
        if tool_calls is not None:
            if not isinstance(tool_calls, list):
                raise ParseError("stream chunk: delta.tool_calls is not a list", offset=offset)
            for raw_call in tool_calls:
                started = self._apply_tool_call(raw_call, offset)
                if started is not None:
                    events.append(started)
        return events

    def _apply_tool_call(self, raw: Any, offset: int) -> StreamToolCallStarted | None:
        if not isinstance(raw, dict):
            raise ParseError("stream chunk: tool call delta is not an object", offset=offset)
        function = raw.get("function") or {}
        if not isinstance(function, dict):
            raise ParseError("stream chunk: tool call function is not an object", offset=offset)
        wire_index = raw.get("index")
        if wire_index is not None and not isinstance(wire_index, int):
            raise ParseError("stream chunk: tool call index is not an integer", offset=offset)
        call_id = _optional_str(raw, "id", offset)
        call = self._tools.lookup(wire_index, call_id)
        self._tools.remember_id(call, call_id)
        name = _optional_str(function, "name", offset)
        if name and not call.name:
            call.name = name
        _add_arguments(call, function.get("arguments"), offset)
        if call.started or not call.name:
            return None
        call.started = True
        return StreamToolCallStarted(call.id, call.name, call.index)


class ChatStreamDecoder:
    """Raw bytes in, stream events out: :class:`SseParser` + :class:`ChatStreamAssembler`.

    ``feed(chunk)`` buffers ``chunk`` and returns an iterator over the events
    it completes, produced frame by frame as the iterator is consumed (so
    events before a bad frame are delivered before its error is raised);
    once :attr:`done` is true (``[DONE]`` seen) the rest is ignored.
    ``close()`` at EOF returns the closing events or raises ``ParseError``;
    ``finish()`` returns the :class:`LlmResponse`. Errors as for the parts.
    Frames are logged (redacted) at DEBUG on ``agent_smith.llm``.
    """

    def __init__(self) -> None:
        self.sse = SseParser()
        self.assembler = ChatStreamAssembler()
        #: SSE frames (events with data lines) seen so far: the stream's progress, for the idle timeout.
        self.frames = 0

    @property
    def done(self) -> bool:
        """True once the stream ended."""
        return self.assembler.done

    def feed(self, chunk: bytes) -> Iterator[StreamEvent]:
        """Buffer ``chunk``; iterate the result to parse it (see class doc)."""
        if self.assembler.done:
            return iter(())
        return self._events(self.sse.iter_feed(chunk))

    def _events(self, frames: Iterator[SseEvent]) -> Iterator[StreamEvent]:
        for frame in frames:
            self.frames += 1
            if logger.isEnabledFor(logging.DEBUG):
                logger.debug("sse frame event=%s data=%s", frame[0], redact_body(frame[1]))
            yield from self.assembler.feed(frame)
            if self.assembler.done:
                return

    def close(self) -> list[StreamEvent]:
        """End of input: the closing events, or ``ParseError`` when the stream was cut short."""
        if self.assembler.done:
            return []
        self.sse.close()
        return self.assembler.close()

    def finish(self) -> LlmResponse:
        """The assembled response (after ``[DONE]`` or :meth:`close`)."""
        return self.assembler.finish()


def _load_chunk(text: str, offset: int) -> dict[str, Any]:
    return parse_json_object(text, f"stream frame at byte {offset}", offset=offset)


def _raise_stream_error(chunk: dict[str, Any], text: str) -> None:
    error = chunk.get("error")
    if error is None:
        return
    message = error.get("message") if isinstance(error, dict) else error
    raise LlmApiError(f"LLM stream error: {_excerpt(str(message), 200)}", 200, text)


def _first_choice(choices: list[Any], offset: int) -> dict[str, Any] | None:
    """The choice with ``index`` 0 (or no index); other choices (``n > 1``) are ignored."""
    for choice in choices:
        if not isinstance(choice, dict):
            raise ParseError("stream chunk: choice is not an object", offset=offset)
        if choice.get("index", 0) == 0:
            return choice
    return None


def _optional_str(obj: dict[str, Any], key: str, offset: int) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ParseError(f"stream chunk: {key} is not a string", offset=offset)
    return value


def _add_arguments(call: _PartialToolCall, raw: Any, offset: int) -> None:
    if raw is None:
        return
    if isinstance(raw, str):
        call.fragments.append(raw)
    elif isinstance(raw, dict):
        call.object_arguments = raw
    else:
        raise ParseError(f"tool call {call.name!r}: arguments are neither a string nor an object", offset=offset)


def _excerpt(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


__all__ = ["DONE_MARKER", "ChatStreamAssembler", "ChatStreamDecoder"]
