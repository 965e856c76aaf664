"""Malformed HTTP replies give the same typed error over either model transport (smith_worker/llm/http.py).

Retries follow docs/architecture.md, HTTP retry policy.

A raw-socket server on 127.0.0.1 answers each chat-completions request with
the exact bytes of one case of the corpus below (the case is named by the
request's path), keeping the connection open for the next request unless the
case closes it. Every case goes through the project's ``LlmClient``, streamed
and not, over both transports it can be given: httpx's own
(``LlmClient(config, httpx.AsyncClient())``: httpcore and h11) and the aiohttp
one (``model_http_client()``, which a worker shares between its agents and
``LlmClient(config)`` makes for itself). Both must give the outcome written in
the table, which was read off httpx's transport: the error kind, the HTTP
status where one was read, and the retry waits (``max_retries=1``):
none, the backoff (0.625 s with ``rng`` at 0.5), or the ``Retry-After``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import httpx
import pytest

from smith_client.errors import LlmApiError, ParseError, SmithError, TransportError
from smith_client.messages import UserMessage
from smith_worker.llm import LlmClient, LlmClientConfig, LlmRequest
from smith_worker.llm.http import model_http_client

BACKOFF = 0.5 + 0.5 * 0.25  # the first backoff with backoff_base 0.5 and rng() = 0.5
PAUSE = 0.05  # seconds between the parts of a reply written in several writes


class Outcome(NamedTuple):
    """What one call ends with: the error's class (None: a reply), its HTTP status, the retry waits."""

    kind: type[SmithError] | None
    status: int | None = None
    sleeps: tuple[float, ...] = ()


def api(status: int, *sleeps: float) -> Outcome:
    return Outcome(LlmApiError, status, sleeps)


OK = Outcome(None)
PARSE = Outcome(ParseError)
UNREADABLE = Outcome(TransportError, None, (BACKOFF,))  # a transport error is retried
CUT_STREAM = Outcome(TransportError)  # ... unless it cut a stream after bytes arrived


@dataclass(frozen=True)
class Case:
    """One reply of the corpus: ``parts`` written in turn (``PAUSE`` apart), then the connection kept open
    unless ``close``; ``streamed`` is the outcome of ``complete_stream`` when it differs from ``outcome``."""

    name: str
    parts: tuple[bytes, ...]
    outcome: Outcome
    streamed: Outcome | None = None
    close: bool = False


ERROR = b'{"error":{"message":"bad request"}}'
JSON = b"Content-Type: application/json"
SSE = b"Content-Type: text/event-stream"
COMPLETION = b'{"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}'
FRAME = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\n'
EVENTS = FRAME + b"data: [DONE]\n\n"
HTML = b"<html><h1>oops</h1></html>"


def reply(status_line: bytes, *headers: bytes, body: bytes = ERROR, eol: bytes = b"\r\n") -> bytes:
    return status_line + eol + b"".join(header + eol for header in headers) + eol + body


def length(body: bytes) -> bytes:
    return b"Content-Length: %d" % len(body)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def case(
    name: str,
    data: bytes | tuple[bytes, ...],
    outcome: Outcome,
    *,
    streamed: Outcome | None = None,
    close: bool = False,
) -> Case:
    return Case(name, data if isinstance(data, tuple) else (data,), outcome, streamed, close)


LENGTH = length(ERROR)
HTML_TYPE = b"Content-Type: text/html"
BAD = b"HTTP/1.1 400 Bad Request"
BUSY = b"HTTP/1.1 429 Too Many Requests"
DOWN = b"HTTP/1.1 503 Service Unavailable"
OK_LINE = b"HTTP/1.1 200 OK"
CHUNKED = b"Transfer-Encoding: chunked"
END = b"0\r\n\r\n"  # the last chunk

CORPUS = [
    case("error_reply", reply(BAD, JSON, LENGTH), api(400)),
    # -- Content-Length: repeated, listed, conflicting, invalid; bodies shorter or longer
    case("content_length_twice", reply(BAD, JSON, LENGTH, LENGTH), api(400)),
    case("content_length_listed_twice", reply(BAD, JSON, LENGTH + b", %d" % len(ERROR)), api(400)),
    case("content_length_twice_split_writes", (reply(BAD, JSON, LENGTH, LENGTH, body=b""), ERROR), api(400)),
    case(
        "content_length_twice_429_retry_after",
        reply(BUSY, JSON, LENGTH, LENGTH, b"Retry-After: 1"),
        api(429, 1.0),
    ),
    case(
        "content_length_twice_429_retry_after_too_long",
        reply(BUSY, JSON, LENGTH, LENGTH, b"Retry-After: 120"),
        api(429),
    ),
    case("content_length_twice_503", reply(DOWN, JSON, LENGTH, LENGTH), api(503, BACKOFF)),
    case(
        "content_length_twice_completion_200",
        reply(OK_LINE, JSON, length(COMPLETION), length(COMPLETION), body=COMPLETION),
        OK,
    ),
    case(
        "content_length_twice_event_stream_200",
        reply(OK_LINE, SSE, length(EVENTS), length(EVENTS), body=EVENTS),
        PARSE,  # complete() asked for JSON
        streamed=OK,
    ),
    case("content_length_conflicting", reply(BAD, JSON, LENGTH, b"Content-Length: 5"), UNREADABLE),
    case("content_length_conflicting_503", reply(DOWN, JSON, LENGTH, b"Content-Length: 5"), UNREADABLE),
    case("content_length_not_a_number", reply(BAD, JSON, b"Content-Length: abc"), UNREADABLE),
    case("content_length_negative", reply(BAD, JSON, b"Content-Length: -1"), UNREADABLE),
    case("content_length_plus_sign", reply(BAD, JSON, b"Content-Length: +%d" % len(ERROR)), UNREADABLE),
    case("body_cut_short", reply(BAD, JSON, b"Content-Length: 100"), UNREADABLE, close=True),
    case("body_cut_short_503", reply(DOWN, JSON, b"Content-Length: 100"), UNREADABLE, close=True),
    case("body_past_content_length", reply(BAD, JSON, b"Content-Length: 10"), api(400), close=True),
    case("body_until_close", reply(BAD, JSON), api(400), close=True),
    # -- chunked transfer coding
    case("chunk_size_not_hex", reply(BAD, JSON, CHUNKED, body=b"zz\r\n" + ERROR + b"\r\n" + END), UNREADABLE),
    case("chunked_cut_short", reply(BAD, JSON, CHUNKED, body=chunk(ERROR)), UNREADABLE, close=True),
    case("chunk_without_line_end", reply(BAD, JSON, CHUNKED, body=chunk(ERROR)[:-2] + b"XX0\r\n\r\n"), UNREADABLE),
    case("chunked_and_content_length", reply(BAD, JSON, CHUNKED, LENGTH, body=chunk(ERROR) + END), api(400)),
    case("chunk_extension", reply(BAD, JSON, CHUNKED, body=b"%x;a=b\r\n%s\r\n" % (len(ERROR), ERROR) + END), api(400)),
    case(
        "chunk_size_trailing_spaces",
        reply(BAD, JSON, CHUNKED, body=b"%x  \r\n%s\r\n" % (len(ERROR), ERROR) + END),
        api(400),
    ),
    case("transfer_coding_unknown", reply(BAD, JSON, b"Transfer-Encoding: foo"), UNREADABLE, close=True),
    case("chunked_twice", reply(BAD, JSON, CHUNKED, CHUNKED, body=chunk(ERROR) + END), UNREADABLE),
    case(
        "gzip_then_chunked", reply(BAD, JSON, b"Transfer-Encoding: gzip, chunked", body=chunk(ERROR) + END), UNREADABLE
    ),
    case(
        "stream_chunk_broken",
        reply(OK_LINE, SSE, CHUNKED, body=chunk(FRAME) + b"zz\r\n"),
        UNREADABLE,
        streamed=CUT_STREAM,  # a frame was delivered: no retry
    ),
    case(
        "stream_chunk_broken_later",
        (reply(OK_LINE, SSE, CHUNKED, body=chunk(FRAME)), b"zz\r\n"),
        UNREADABLE,
        streamed=CUT_STREAM,
    ),
    # -- content types and encodings
    case(
        "html_error_500",
        reply(b"HTTP/1.1 500 Internal Server Error", HTML_TYPE, length(HTML), body=HTML),
        api(500, BACKOFF),
    ),
    case("html_error_400", reply(BAD, HTML_TYPE, length(HTML), body=HTML), api(400)),
    case("html_page_200", reply(OK_LINE, HTML_TYPE, length(HTML), body=HTML), PARSE),
    case("event_stream_200", reply(OK_LINE, SSE, length(EVENTS), body=EVENTS), PARSE, streamed=OK),
    case("gzip_error_body_not_gzip", reply(BAD, JSON, b"Content-Encoding: gzip", LENGTH), api(400)),
    case(
        "gzip_completion_not_gzip",
        reply(OK_LINE, JSON, b"Content-Encoding: gzip", length(COMPLETION), body=COMPLETION),
        UNREADABLE,
        streamed=CUT_STREAM,  # a JSON reply to a stream request is read without retry, as a stream
    ),
    # -- status lines
    case(
        "reason_phrase_utf8",
        reply("HTTP/1.1 429 Zu viele Anfragen ☃".encode(), JSON, LENGTH, b"Retry-After: 2"),
        api(429, 2.0),
    ),
    case("reason_phrase_empty", reply(b"HTTP/1.1 503 ", JSON, LENGTH), api(503, BACKOFF)),
    case("reason_phrase_missing", reply(b"HTTP/1.1 400", JSON, LENGTH), api(400)),
    case("reason_phrase_control_character", reply(b"HTTP/1.1 400 Bad\x01Request", JSON, LENGTH), api(400)),
    case("status_line_lowercase", reply(b"http/1.1 400 Bad Request", JSON, LENGTH), UNREADABLE),
    case("status_line_http_1_0", reply(b"HTTP/1.0 400 Bad Request", JSON, LENGTH), api(400)),
    case("status_line_http_2", reply(b"HTTP/2 400 Bad Request", JSON, LENGTH), UNREADABLE),
    case("status_999", reply(b"HTTP/1.1 999 Weird", JSON, LENGTH), api(999, BACKOFF)),
    case("status_two_digits", reply(b"HTTP/1.1 40 Bad", JSON, LENGTH), UNREADABLE),
    case("status_after_two_spaces", reply(b"HTTP/1.1  400 Bad Request", JSON, LENGTH), UNREADABLE),
    case("interim_100_continue", b"HTTP/1.1 100 Continue\r\n\r\n" + reply(BAD, JSON, LENGTH), api(400)),
    # -- header lines
    case("control_character_in_name", reply(BAD, JSON, LENGTH, b"X-Bad\x01: v"), UNREADABLE),
    case("control_character_in_value", reply(BAD, JSON, LENGTH, b"X-Bad: a\x01b"), api(400)),
    case("nul_in_value", reply(BAD, JSON, LENGTH, b"X-Bad: a\x00b"), UNREADABLE),
    case("space_in_name", reply(BAD, JSON, LENGTH, b"Bad Header: v"), UNREADABLE),
    case("space_before_colon", reply(BAD, JSON, LENGTH, b"X-Foo : v"), UNREADABLE),
    case("line_without_colon", reply(BAD, JSON, LENGTH, b"NoColonHere"), UNREADABLE),
    case("empty_name", reply(BAD, JSON, LENGTH, b": v"), UNREADABLE),
    case("latin1_value", reply(BAD, JSON, LENGTH, b"X-Latin: caf\xe9"), api(400)),
    case("obsolete_line_folding", reply(BAD, JSON, b"X-Folded: a", b"  b", LENGTH), api(400)),
    case("header_of_10_kib", reply(BAD, JSON, LENGTH, b"X-Long: " + b"a" * 10_000), api(400)),
    case("header_of_90_kib", reply(BAD, JSON, LENGTH, b"X-Long: " + b"a" * 90_000), api(400)),
    case("header_of_110_kib", reply(BAD, JSON, LENGTH, b"X-Long: " + b"a" * 110_000), api(400)),
    case("header_of_200_kib", reply(BAD, JSON, LENGTH, b"X-Long: " + b"a" * 200_000), UNREADABLE),
    case("two_hundred_headers", reply(BAD, JSON, LENGTH, *(b"X-H%d: v" % n for n in range(200))), api(400)),
    case("retry_after_not_a_number", reply(BUSY, JSON, LENGTH, b"Retry-After: soon"), api(429, BACKOFF)),
    case("retry_after_twice", reply(BUSY, JSON, LENGTH, b"Retry-After: 1", b"Retry-After: 2"), api(429, BACKOFF)),
    # -- line endings
    case("line_feeds_only", reply(BAD, JSON, LENGTH, eol=b"\n"), api(400)),
    # h11 waits for a line end that never comes: the server's close ends the wait
    case("carriage_returns_only", reply(BAD, JSON, LENGTH, eol=b"\r"), UNREADABLE, close=True),
    case("mixed_line_endings", BAD + b"\r\n" + JSON + b"\n" + LENGTH + b"\r\n\n" + ERROR, api(400)),
    # -- no readable head at all
    case("not_http", b"hello there\r\n\r\n", UNREADABLE),
    case("closed_without_reply", b"", UNREADABLE, close=True),
    case("status_line_cut", b"HTTP/1.1 40", UNREADABLE, close=True),
    case("head_cut", BAD + b"\r\nContent-Type: appl", UNREADABLE, close=True),
    case("body_without_head", ERROR, UNREADABLE, close=True),
]


class CorpusServer:
    """Answers ``POST /<case>/v1/chat/completions`` with the case's bytes (see the module doc)."""

    def __init__(self, corpus: list[Case]) -> None:
        self.cases = {entry.name: entry for entry in corpus}
        self.port = 0
        self._connections: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> CorpusServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._server.close()
        for writer in self._connections:
            writer.close()
        await self._server.wait_closed()

    def base_url(self, entry: Case) -> str:
        return f"http://127.0.0.1:{self.port}/{entry.name}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        with contextlib.suppress(ConnectionError):
            while (name := await _read_request(reader)) is not None:
                entry = self.cases[name]
                for number, part in enumerate(entry.parts):
                    if number:
                        await asyncio.sleep(PAUSE)
                    writer.write(part)
                    await writer.drain()
                if entry.close:
                    break
        self._connections.discard(writer)
        writer.close()


async def _read_request(reader: asyncio.StreamReader) -> str | None:
    """The case a request names (the first path segment), its body read; None when the client closed."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    request_line, *fields = head.decode("latin-1").split("\r\n")
    lengths = [value for name, _, value in (line.partition(":") for line in fields) if name.lower() == "content-length"]
    await reader.readexactly(int(lengths[0]) if lengths else 0)
    return request_line.split(" ")[1].split("/")[1]


@pytest.fixture(scope="module")
async def corpus_server():
    async with CorpusServer(CORPUS) as server:
        yield server


#: The two transports ``LlmClient`` can be given: httpx's own (httpcore and h11; plain http, so no CA bundle to
#: load) and the aiohttp one a worker makes and shares (``smith_worker.runtime``).
TRANSPORTS = {
    "httpx": lambda: httpx.AsyncClient(timeout=None, verify=False),
    "aiohttp": model_http_client,
}


async def outcome(server: CorpusServer, entry: Case, *, stream: bool, http: httpx.AsyncClient) -> Outcome:
    """Call the case once through ``LlmClient`` over ``http``."""
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        await asyncio.sleep(0)  # a real wait lets the event loop run

    config = LlmClientConfig(
        base_url=server.base_url(entry), model="m", request_timeout=5.0, response_timeout=20.0, max_retries=1
    )
    request = LlmRequest(messages=[UserMessage(content="hi")])
    client = LlmClient(config, http, sleep=sleep, rng=lambda: 0.5)
    try:
        if stream:
            await client.complete_stream(request, lambda event: None)
        else:
            await client.complete(request)
    except SmithError as exc:
        return Outcome(type(exc), exc.http_status if isinstance(exc, LlmApiError) else None, tuple(sleeps))
    return Outcome(None, None, tuple(sleeps))


@pytest.mark.parametrize("entry", CORPUS, ids=lambda entry: entry.name)
async def test_a_malformed_reply_gives_the_same_typed_error_over_httpx_and_aiohttp(corpus_server, entry):
    got, expected = {}, {}
    for transport, make_http in TRANSPORTS.items():
        async with make_http() as http:
            for mode in ("complete", "stream"):
                got[transport, mode] = await outcome(corpus_server, entry, stream=mode == "stream", http=http)
                expected[transport, mode] = entry.streamed if mode == "stream" and entry.streamed else entry.outcome
    assert got == expected


@pytest.mark.parametrize("name", ["content_length_twice", "body_past_content_length", "header_of_90_kib"])
async def test_a_reply_aiohttp_refuses_keeps_its_error_message(corpus_server, name):
    """The body h11 reads again is the error's: the server's message, not aiohttp's parser error (here the
    client makes its own aiohttp transport)."""
    config = LlmClientConfig(base_url=corpus_server.base_url(corpus_server.cases[name]), model="m", max_retries=0)
    async with LlmClient(config) as client:
        with pytest.raises(LlmApiError) as caught:
            await client.complete(LlmRequest(messages=[UserMessage(content="hi")]))
    expected = "bad request" if name != "body_past_content_length" else ERROR[:10].decode()
    assert caught.value.message == f"chat completions failed with HTTP 400: {expected}"
