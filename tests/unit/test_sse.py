"""SSE frame parser and chat-stream assembler (WHATWG HTML, server-sent events; OpenAI chat completions streaming).

The corpus in ``tests/unit/streams/``: each ``NAME.sse`` holds the exact bytes
of a recorded stream and ``NAME.json`` the expected outcome —
``events`` (the stream events, in order) and either ``response`` (the
assembled result) or ``error`` (``kind`` plus any fields to check; the
events listed are those delivered before the error).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smith_client.errors import LlmApiError, ParseError, SmithError
from smith_worker.llm.sse import SseEvent, SseParser
from smith_worker.llm.stream import ChatStreamAssembler, ChatStreamDecoder
from smith_worker.llm.types import (
    StreamEvent,
    StreamFinished,
    StreamReasoningDelta,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
)

STREAMS = Path(__file__).parent / "streams"
CASES = sorted(path.stem for path in STREAMS.glob("*.sse"))


def load_case(name: str) -> tuple[bytes, dict[str, Any]]:
    return (STREAMS / f"{name}.sse").read_bytes(), json.loads((STREAMS / f"{name}.json").read_text("utf-8"))


def event_to_json(event: StreamEvent) -> dict[str, Any]:
    if isinstance(event, StreamTokenDelta):
        return {"type": "token", "text": event.text}
    if isinstance(event, StreamReasoningDelta):
        return {"type": "reasoning", "text": event.text}
    if isinstance(event, StreamToolCallStarted):
        return {"type": "tool_call_started", "id": event.id, "name": event.name, "index": event.index}
    if isinstance(event, StreamToolCallCompleted):
        return {
            "type": "tool_call_completed",
            "index": event.index,
            "id": event.id,
            "name": event.name,
            "arguments": event.arguments,
        }
    assert isinstance(event, StreamFinished)
    usage = event.usage.model_dump() if event.usage is not None else None
    return {"type": "finished", "finish_reason": event.finish_reason, "usage": usage}


@dataclass
class Outcome:
    events: list[dict[str, Any]]
    response: dict[str, Any] | None = None
    error: SmithError | None = None


def decode(chunks: list[bytes]) -> Outcome:
    """Feed ``chunks`` to a fresh decoder, then EOF; collect what a client would see."""
    decoder = ChatStreamDecoder()
    events: list[dict[str, Any]] = []
    try:
        for chunk in chunks:
            for event in decoder.feed(chunk):
                events.append(event_to_json(event))
        events.extend(event_to_json(event) for event in decoder.close())
    except SmithError as exc:
        return Outcome(events, error=exc)
    result = decoder.finish()
    response = {
        "content": result.message.content,
        "tool_calls": [call.model_dump() for call in result.message.tool_calls],
        "usage": result.message.usage.model_dump() if result.message.usage else None,
        "finish_reason": result.finish_reason,
        "reasoning_content": result.reasoning_content,
    }
    return Outcome(events, response=response)


def outcome_key(outcome: Outcome) -> tuple[Any, ...]:
    error = outcome.error
    return (outcome.events, outcome.response, (error.kind, error.fields) if error else None)


def split_at(data: bytes, points: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(points)), len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def sse_events(chunks: list[bytes]) -> list[SseEvent]:
    parser = SseParser()
    events = [event for chunk in chunks for event in parser.feed(chunk)]
    return events + parser.close()


# -- the corpus -------------------------------------------------------------------


def test_corpus_is_complete():
    assert len(CASES) >= 20
    for name in CASES:
        assert (STREAMS / f"{name}.json").exists(), name


@pytest.mark.parametrize("name", CASES)
def test_corpus_stream_gives_expected_outcome(name):
    data, expected = load_case(name)
    outcome = decode([data])
    assert outcome.events == expected["events"]
    if "error" in expected:
        assert outcome.error is not None, "expected an error"
        assert outcome.error.kind == expected["error"]["kind"]
        for field, value in expected["error"].items():
            if field != "kind":
                assert getattr(outcome.error, field) == value, field
    else:
        assert outcome.error is None, repr(outcome.error)
        assert outcome.response == expected["response"]


@pytest.mark.parametrize("name", CASES)
def test_corpus_stream_split_at_every_byte_gives_identical_results(name):
    data, _ = load_case(name)
    whole = outcome_key(decode([data]))
    whole_sse = sse_events([data])
    for point in range(1, len(data)):
        chunks = [data[:point], data[point:]]
        assert outcome_key(decode(chunks)) == whole, f"split at byte {point}"
        assert sse_events(chunks) == whole_sse, f"split at byte {point}"


@pytest.mark.parametrize("name", CASES)
def test_corpus_stream_fed_byte_by_byte_gives_identical_results(name):
    data, _ = load_case(name)
    singles = [data[i : i + 1] for i in range(len(data))]
    assert outcome_key(decode(singles)) == outcome_key(decode([data]))
    assert sse_events(singles) == sse_events([data])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CASES), st.data())
def test_corpus_stream_random_multi_splits_give_identical_results(name, data):
    raw, _ = load_case(name)
    points = data.draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=40))
    chunks = split_at(raw, points)
    assert outcome_key(decode(chunks)) == outcome_key(decode([raw]))
    assert sse_events(chunks) == sse_events([raw])


def test_llama_cpp_style_does_not_concatenate_repeated_id_and_name():
    data, _ = load_case("llama_cpp_tool_call")
    outcome = decode([data])
    assert outcome.response is not None
    assert [(c["id"], c["name"]) for c in outcome.response["tool_calls"]] == [("call_x", "add")]


# -- SseParser: the WHATWG rules ----------------------------------------------------


def parse_all(data: bytes) -> list[SseEvent]:
    return sse_events([data])


@pytest.mark.parametrize("newline", [b"\n", b"\r\n", b"\r"])
def test_line_endings(newline):
    data = b"data: a" + newline + b"data: b" + newline + newline + b"data: c" + newline + newline
    assert [e[1] for e in parse_all(data)] == ["a\nb", "c"]


def test_cr_at_chunk_end_and_lf_at_next_chunk_start_is_one_line_ending():
    parser = SseParser()
    assert parser.feed(b"data: x\r") == []
    assert parser.feed(b"\n\r") == [("message", "x", None, 0)]
    assert parser.feed(b"\ndata: y\r\n\r\n") == [("message", "y", None, 11)]


def test_cr_then_cr_is_two_line_endings_across_chunks():
    parser = SseParser()
    assert parser.feed(b"data: x\r") == []
    assert [e[1] for e in parser.feed(b"\r")] == ["x"]


def test_comments_are_ignored():
    assert parse_all(b": keep-alive\n:\ndata: a\n: inside\n\n") == [("message", "a", None, 15)]


def test_data_with_and_without_space_and_only_one_space_removed():
    events = parse_all(b"data:a\n\ndata: b\n\ndata:  c\n\n")
    assert [e[1] for e in events] == ["a", "b", " c"]


def test_field_without_colon_and_empty_data():
    assert [e[1] for e in parse_all(b"data\n\ndata:\ndata:\n\n")] == ["", "\n"]


def test_event_type_and_default():
    events = parse_all(b"event: error\ndata: {}\n\ndata: x\n\n")
    assert [(e[0], e[1]) for e in events] == [("error", "{}"), ("message", "x")]


def test_event_without_data_is_not_dispatched_and_resets_type():
    assert [(e[0], e[1]) for e in parse_all(b"event: ping\n\ndata: x\n\n")] == [("message", "x")]


def test_id_is_remembered_across_events_and_nul_ignored():
    events = parse_all(b"id: 7\ndata: a\n\ndata: b\n\nid: 8\x00\ndata: c\n\nid\ndata: d\n\n")
    assert [e[2] for e in events] == ["7", "7", "7", ""]


def test_retry_field_digits_only():
    parser = SseParser()
    parser.feed(b"retry: 1500\n\nretry: 2x\n\n")
    assert parser.retry == 1500


def test_unknown_fields_are_ignored():
    assert [e[1] for e in parse_all(b"foo: bar\ndata: a\n\n")] == ["a"]


def test_unterminated_event_is_discarded_at_close():
    parser = SseParser()
    assert parser.feed(b"data: a\n\ndata: b\n") == [("message", "a", None, 0)]
    assert parser.close() == []


def test_feed_after_close_is_an_error():
    parser = SseParser()
    parser.close()
    with pytest.raises(RuntimeError):
        parser.feed(b"data: a\n\n")


def test_bom_skipped_once_even_when_split():
    parser = SseParser()
    assert parser.feed(b"\xef") == []
    assert parser.feed(b"\xbb") == []
    assert parser.feed(b"\xbfdata: a\n\n") == [("message", "a", None, 3)]
    assert [e[1] for e in parse_all(b"\xef\xbb\xbf\xef\xbb\xbfdata: a\n\ndata: b\n\n")] == ["b"]


def test_multibyte_utf8_split_across_chunks():
    raw = "data: é🌍\n\n".encode()
    for point in range(len(raw)):
        assert [e[1] for e in sse_events([raw[:point], raw[point:]])] == ["é🌍"]


def test_invalid_utf8_raises_parse_error_with_byte_offset():
    parser = SseParser()
    assert parser.feed(b"data: ok\n\n") != []
    with pytest.raises(ParseError) as info:
        parser.feed(b"data: \xff\n\n")
    assert info.value.offset == 16


def test_events_before_an_error_in_the_same_chunk_are_delivered():
    parser = SseParser()
    seen = []
    with pytest.raises(ParseError):
        for event in parser.iter_feed(b"data: a\n\ndata: \xff\n\n"):
            seen.append(event[1])
    assert seen == ["a"]


def test_offset_counts_consumed_bytes():
    parser = SseParser()
    parser.feed(b"data: a\n\nda")
    assert parser.offset == 9


# -- SseParser against a plain reading of the WHATWG algorithm, on random streams ---------


def reference_events(body: bytes) -> tuple[list[SseEvent], str | None, int | None]:
    """The whole body read line by line the way the spec words it: (events, last event id, retry).

    The id and retry of an event count once its blank line came (see the module doc of sse.py)."""
    start = len(b"\xef\xbb\xbf") if body.startswith(b"\xef\xbb\xbf") else 0
    events: list[SseEvent] = []
    data: list[str] = []
    event_type, first, id_buffer, retry_buffer, last_id, retry = "", None, None, None, None, None
    for line in re.finditer(rb"([^\r\n]*)(?:\r\n|\r|\n)", body[start:]):
        text, offset = line.group(1).decode(), start + line.start()
        if not text:
            last_id, retry = id_buffer, retry if retry_buffer is None else retry_buffer
            if data:
                events.append((event_type or "message", "\n".join(data), last_id, first or 0))
            data, event_type, first, retry_buffer = [], "", None, None
            continue
        if text.startswith(":"):
            continue
        name, colon, value = text.partition(":")
        value = value[1:] if colon and value.startswith(" ") else value
        first = offset if first is None else first
        if name in ("data", "error"):
            data.append(value)
        if name in ("event", "error"):
            event_type = name if name == "error" else value
        if name == "id" and "\0" not in value:
            id_buffer = value
        if name == "retry" and value.isascii() and value.isdigit():
            retry_buffer = int(value)
    return events, last_id, retry


_TEXT = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=12)
_LINES = st.one_of(
    st.builds("data: {}".format, _TEXT),
    st.builds("data:{}".format, _TEXT),
    st.just("data"),
    st.just(""),
    st.just(""),
    st.builds(": {}".format, _TEXT),
    st.builds("event: {}".format, st.sampled_from(["error", "ping", ""])),
    st.builds("id: {}".format, st.sampled_from(["7", "8\0", ""])),
    st.builds("retry: {}".format, st.sampled_from(["1500", "2x", ""])),
    st.builds("error: {}".format, _TEXT),
    st.builds("{}: {}".format, st.sampled_from(["foo", "Data", " data"]), _TEXT),
)


@st.composite
def event_streams(draw: st.DrawFn) -> bytes:
    """A stream of random field lines with LF, CRLF, CR or mixed line endings, maybe a BOM, maybe unterminated."""
    style = draw(st.sampled_from(["\n", "\r\n", "\r", None]))
    body = b"\xef\xbb\xbf" if draw(st.booleans()) else b""
    for line in draw(st.lists(_LINES, max_size=30)):
        ending = style if style is not None else draw(st.sampled_from(["\n", "\r\n", "\r"]))
        body += (line + ending).encode()
    return body + draw(st.sampled_from([b"", b"data: cut", b"\r"]))


@settings(max_examples=500, deadline=None)
@given(event_streams(), st.data())
def test_random_streams_split_anywhere_parse_as_whole_and_as_the_reference(body, data):
    points = data.draw(st.lists(st.integers(min_value=0, max_value=len(body)), max_size=12))
    # also a cut inside each CRLF now and then: the CR ending one chunk, the LF starting the next
    points += [m.start() + 1 for m in re.finditer(rb"\r\n", body) if data.draw(st.booleans())]
    chunks = split_at(body, points)
    split, whole = SseParser(), SseParser()
    split_events = [event for chunk in chunks for event in split.feed(chunk)] + split.close()
    whole_events = whole.feed(body) + whole.close()
    events, last_id, retry = reference_events(body)
    assert split_events == whole_events == events
    assert (split.last_event_id, split.retry) == (whole.last_event_id, whole.retry) == (last_id, retry)


# -- ChatStreamAssembler: direct rules --------------------------------------------


def frame(payload: dict[str, Any]) -> SseEvent:
    return ("message", json.dumps(payload), None, 0)


def test_stream_finished_is_emitted_at_done_not_at_the_finish_reason_frame():
    assembler = ChatStreamAssembler()
    assert assembler.feed(frame({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})) == []
    assert assembler.feed(frame({"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 2}})) == []
    (finished,) = assembler.feed(("message", "[DONE]", None, 0))
    assert finished.finish_reason == "stop" and finished.usage.total == 3
    assert assembler.done


def test_finish_before_the_end_is_a_programming_error():
    with pytest.raises(RuntimeError):
        ChatStreamAssembler().finish()


def test_eof_without_finish_reason_is_a_parse_error():
    assembler = ChatStreamAssembler()
    assembler.feed(frame({"choices": [{"index": 0, "delta": {"content": "x"}}]}))
    with pytest.raises(ParseError):
        assembler.close()


def test_done_without_finish_reason_ends_with_empty_reason():
    assembler = ChatStreamAssembler()
    assembler.feed(frame({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}))
    (finished,) = assembler.feed(("message", "[DONE]", None, 0))
    assert finished.finish_reason == ""
    assert assembler.finish().message.content == ""  # a choice with no text is an empty answer; no choice is not


def test_tool_call_without_name_is_a_parse_error():
    assembler = ChatStreamAssembler()
    assembler.feed(frame({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}}]}))
    with pytest.raises(ParseError):
        assembler.feed(("message", "[DONE]", None, 0))


def test_tool_call_started_waits_for_the_name():
    assembler = ChatStreamAssembler()
    delta = {"tool_calls": [{"index": 0, "id": "c1", "function": {"arguments": ""}}]}
    assert assembler.feed(frame({"choices": [{"index": 0, "delta": delta}]})) == []
    delta = {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": "{}"}}]}
    assert assembler.feed(frame({"choices": [{"index": 0, "delta": delta}]})) == [StreamToolCallStarted("c1", "f", 0)]


def test_other_choices_are_ignored():
    assembler = ChatStreamAssembler()
    payload = {"choices": [{"index": 1, "delta": {"content": "no"}}, {"index": 0, "delta": {"content": "yes"}}]}
    assert assembler.feed(frame(payload)) == [StreamTokenDelta("yes")]


@pytest.mark.parametrize(
    "payload",
    [
        [1, 2],
        {"choices": "x"},
        {"choices": [{"index": 0, "delta": "x"}]},
        {"choices": [{"index": 0, "delta": {"content": 5}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": {}}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": "0"}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 3}}]}}]},
    ],
)
def test_bad_chunk_shapes_are_parse_errors(payload):
    with pytest.raises(ParseError):
        ChatStreamAssembler().feed(("message", json.dumps(payload), None, 0))


def test_error_frame_fields():
    with pytest.raises(LlmApiError) as info:
        ChatStreamAssembler().feed(frame({"error": {"message": "overloaded", "code": 503}}))
    assert info.value.http_status == 200
    assert "overloaded" in info.value.message
    assert "overloaded" in info.value.body_excerpt


def test_invalid_json_offset_is_the_frame_offset():
    with pytest.raises(ParseError) as info:
        ChatStreamAssembler().feed(("message", "{nope", None, 42))
    assert info.value.offset == 42
