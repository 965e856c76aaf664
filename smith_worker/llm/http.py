"""The HTTP client the chat-completions requests go through: httpx's API over aiohttp's connections.

A turn worker streaming many model replies at once spends most of its CPU in
the HTTP layer, once per body chunk: httpx's default transport (httpcore on
anyio) pauses and resumes the socket's reader around every read and scans
its whole connection pool for expired connections on every request. The same
``httpx.AsyncClient`` over ``httpx-aiohttp``'s :class:`AiohttpTransport`
reads through aiohttp's C-parsed protocol instead: at 50 concurrent streams
the turn worker's CPU per streamed reply fell by about 30 % (BENCHMARKS.md,
``make bench``). The rest of the client keeps httpx's API: requests, streamed
responses, ``httpx.Timeout`` and httpx's exception types.

Where aiohttp behaves differently, this module makes it answer as httpx's own
transport does, so callers see one set of errors (the retry policy decides
by them, docs/architecture.md, HTTP retry policy):

* ``httpx-aiohttp`` 0.2 maps every ``aiohttp.ClientConnectionError`` to
  ``httpx.ConnectTimeout``, a refused connection and a server that hung up
  included. :func:`is_timeout` tells a real timeout (the aiohttp cause is a
  ``TimeoutError``) from those, so they stay transport errors (the policy
  retries both, but reports them as different kinds).
* an httpx client with its own transport ignores the proxy environment; the
  aiohttp session is made with ``trust_env=True`` when the environment names
  a proxy, so ``HTTP(S)_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` still apply, as
  they did with httpx's own transport (which reads them once, when the client
  is made: so does this). Only then: a ``trust_env`` session looks the proxy
  and ``~/.netrc`` up again in a thread of the default executor for every
  request, two thread hops per model call.
* aiohttp's parser refuses response heads that httpx's parser (h11) reads: a
  ``Content-Length`` sent twice or as a list of one value, ``Content-Length``
  beside ``Transfer-Encoding: chunked``, bytes past the end of the body in the
  same read, more than 128 header lines. aiohttp then raises
  ``ClientResponseError`` whose ``status`` is its parser's code (400), not the
  response's: a 429 or a 503 was reported as a ``TransportError``. The
  connection's protocol keeps each response's bytes until its head is parsed;
  when aiohttp refuses the head, h11 reads those bytes as httpx would
  (:func:`_reread`) and the caller gets that status, headers and body. aiohttp
  closes the connection at its refusal, so the body is what had arrived by
  then: an error reply keeps its status with that much of its body, a 2xx
  reply cut there fails (``httpx.RemoteProtocolError``).
* header lines may be as long as httpcore allows (:data:`MAX_HEAD_BYTES`;
  aiohttp's own bound is 8 KiB).
* as h11, a response whose ``Transfer-Encoding`` is anything but one
  ``chunked`` is refused (``httpx.RemoteProtocolError``): neither client
  decodes another transfer coding (RFC 9112 §7), so the body is unreadable.
* a broken chunk after the head: aiohttp's C parser drops the body stream
  before raising, nothing ends it and its reader waits forever (aiohttp 3.14);
  here it ends with ``ClientPayloadError`` (httpx's ``ReadError``), as a cut body.

``tests/unit/test_llm_malformed_responses.py`` runs a corpus of malformed
replies over both transports and holds them to the same error kind, status and
retry decision.
"""

from __future__ import annotations

import asyncio
import functools
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import h11
import httpx
from aiohttp.client_proto import ResponseHandler
from aiohttp.http import RawResponseMessage
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.streams import StreamReader
from httpx_aiohttp import AiohttpTransport

from smith_worker.llm.types import DEFAULT_MAX_CONNECTIONS

#: Seconds an idle keep-alive connection is kept (httpx's default ``keepalive_expiry``).
KEEPALIVE_EXPIRY = 5.0
#: The longest response head (status line and headers, bytes) read: httpcore's bound for httpx's own transport.
MAX_HEAD_BYTES = 100 * 1024
#: The most bytes of a response kept for :func:`_reread`: a head, and an error body as long as the excerpt of
#: an ``LlmApiError`` (64 KiB).
MAX_KEPT_BYTES = MAX_HEAD_BYTES + 64 * 1024

#: What a failed request raises: httpx's transport errors, a body httpx could not decode (its
#: ``Content-Encoding``), or an aiohttp error the transport did not map.
NETWORK_ERRORS = (httpx.TransportError, httpx.DecodingError, aiohttp.ClientError)


def model_http_client(max_connections: int = DEFAULT_MAX_CONNECTIONS) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` for chat-completions requests (no client-wide timeout: each request
    passes its own). Its aiohttp session is made on the first request, inside the running event loop;
    close the client with ``aclose()``.

    ``max_connections`` caps the connections open at once to each endpoint (aiohttp's ``limit_per_host``:
    one scheme, host and port); the endpoints together are not capped. Idle connections are kept
    :data:`KEEPALIVE_EXPIRY` seconds for the next requests. Raises ``ValueError`` below 1.
    """
    if max_connections < 1:
        raise ValueError(f"max_connections must be at least 1, got {max_connections!r}")
    return httpx.AsyncClient(
        timeout=None, transport=_ModelTransport(client=functools.partial(_session, max_connections))
    )


def _session(max_connections: int) -> aiohttp.ClientSession:
    connector = _Connector(limit=0, limit_per_host=max_connections, keepalive_timeout=KEEPALIVE_EXPIRY)
    return aiohttp.ClientSession(
        connector=connector,
        trust_env=proxy_in_environment(),
        max_line_size=MAX_HEAD_BYTES,
        max_field_size=MAX_HEAD_BYTES,
    )


class _ModelTransport(AiohttpTransport):
    """``AiohttpTransport`` reading, as httpx's own transport does, the responses aiohttp's parser refuses."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except aiohttp.ClientResponseError as exc:
            refused = exc.__cause__
            if not isinstance(refused, _RefusedResponse):
                raise
            return _reread(request, refused.received, refused=exc)
        codings = response.headers.get_list("transfer-encoding")
        if codings and [coding.lower() for coding in codings] != ["chunked"]:
            await response.aclose()
            raise httpx.RemoteProtocolError(f"unsupported Transfer-Encoding {', '.join(codings)!r} (only chunked)")
        return response


class _RefusedResponse(HttpProcessingError):
    """aiohttp's parser refused a response's head; ``received`` is the response's bytes until then."""

    def __init__(self, error: HttpProcessingError, received: bytes) -> None:
        super().__init__(code=error.code, message=error.message, headers=error.headers)
        self.received = received


class _ResponseProtocol(ResponseHandler):
    """aiohttp's protocol of one connection, for the two ways its parser fails a response (aiohttp 3.14).

    * The head refused: the response's bytes until then (one copy of, usually,
      its first read; nothing once the head is parsed) go with the error, as
      :class:`_RefusedResponse`, to the transport.
    * The body refused (a broken chunk): aiohttp's C parser drops its body
      stream before raising, so nothing ends that stream and a reader waits
      forever (the read timeout stops with the error). It gets aiohttp's own
      ``ClientPayloadError`` instead, as a body cut by a closed connection
      does (httpx's ``ReadError``).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._unparsed: bytearray | None = None  # the current response's bytes while its head is not parsed
        self._body: StreamReader | None = None  # the current response's body stream, once its head is parsed

    def set_response_params(self, **params: Any) -> None:  # a request is sent: its response comes next
        self._unparsed, self._body = bytearray(), None
        super().set_response_params(**params)

    def data_received(self, data: bytes) -> None:
        if self._unparsed is not None:
            self._unparsed += data[: MAX_KEPT_BYTES - len(self._unparsed)]
        super().data_received(data)

    def feed_data(self, data: tuple[RawResponseMessage, StreamReader], size: int = 0) -> None:  # a parsed head
        self._unparsed, self._body = None, data[1]
        super().feed_data(data, size)

    def set_exception(self, exc: BaseException, exc_cause: BaseException | None = None) -> None:
        if isinstance(exc, HttpProcessingError):
            if self._unparsed is not None:
                exc = _RefusedResponse(exc, bytes(self._unparsed))
                self._unparsed = None
            elif self._body is not None and not self._body.is_eof():
                self._body.set_exception(aiohttp.ClientPayloadError(f"Response payload is not completed: {exc!r}"), exc)
        if exc_cause is None:
            super().set_exception(exc)
        else:
            super().set_exception(exc, exc_cause)


class _Connector(aiohttp.TCPConnector):
    """``TCPConnector`` whose connections use :class:`_ResponseProtocol`.

    aiohttp offers no argument for the protocol class; its connectors make
    each connection's protocol with ``self._factory`` (aiohttp 3.10 to 3.14).
    """

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        protocol: type[ResponseHandler] = _ResponseProtocol
        self._factory = functools.partial(protocol, loop=self._loop)


def _reread(request: httpx.Request, received: bytes, *, refused: Exception) -> httpx.Response:
    """The response h11 (httpx's own parser) reads from ``received``, the bytes aiohttp's parser ``refused``.

    Interim (1xx) responses are skipped. Raises ``httpx.RemoteProtocolError``
    when h11 cannot read a head either (the response is unreadable). The
    body is what ``received`` holds; its stream ends with
    ``httpx.RemoteProtocolError`` where h11 finds it malformed, and where it
    is cut short in a 2xx response (aiohttp closed the connection: an error
    reply's status and what arrived of its body are kept instead).
    """
    connection = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEAD_BYTES)
    url = request.url
    connection.send(h11.Request(method=request.method, target=url.raw_path, headers=[(b"Host", url.netloc)]))
    connection.send(h11.EndOfMessage())
    connection.receive_data(received)
    head: h11.Response | None = None
    body: list[bytes] = []
    ending: httpx.RemoteProtocolError | None = None
    try:
        event = connection.next_event()
        while event is not h11.NEED_DATA and not isinstance(event, h11.EndOfMessage):
            if isinstance(event, h11.Response):
                head = event
            elif isinstance(event, h11.Data):
                body.append(bytes(event.data))
            event = connection.next_event()
    except h11.RemoteProtocolError as exc:
        ending = httpx.RemoteProtocolError(f"{exc} (aiohttp: {refused})")
    else:
        if event is h11.NEED_DATA and head is not None and 200 <= head.status_code < 300:
            ending = httpx.RemoteProtocolError(f"response body cut where aiohttp refused it: {refused}")
    if head is None:
        raise ending or httpx.RemoteProtocolError(f"response head unreadable: {refused}")
    return httpx.Response(
        head.status_code,
        headers=head.headers.raw_items(),
        stream=_Replay(body, ending),
        request=request,
        extensions={"http_version": b"HTTP/" + head.http_version, "reason_phrase": head.reason},
    )


class _Replay(httpx.AsyncByteStream):
    """A body already read: its chunks, then ``ending`` raised when it is set."""

    def __init__(self, chunks: list[bytes], ending: httpx.RemoteProtocolError | None) -> None:
        self._chunks = chunks
        self._ending = ending

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
        if self._ending is not None:
            raise self._ending


def release(response: httpx.Response) -> None:
    """Break the reference cycle between a closed ``response`` and its stream (httpx's client wraps the
    transport's stream in one that refers back to the response), so the response, its request and the
    request's body are freed by refcounting instead of waiting for the cyclic garbage collector."""
    response.stream = httpx.ByteStream(b"")


def proxy_in_environment() -> bool:
    """Whether the environment names a proxy (``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``…, either case;
    ``NO_PROXY`` alone names none), as :func:`urllib.request.getproxies_environment` reads it."""
    return any(scheme != "no" for scheme in urllib.request.getproxies_environment())


def origin(exc: BaseException) -> BaseException:
    """The error a failed request really met: the aiohttp error under the httpx one the transport
    raised in its place (its ``__cause__``), else ``exc`` itself."""
    cause = exc.__cause__
    return cause if isinstance(cause, aiohttp.ClientError) else exc


def is_timeout(exc: BaseException) -> bool:
    """Whether a failed request timed out, rather than failed to connect, was refused or was cut off.

    ``exc`` is what the request raised: an httpx exception (the aiohttp error
    under it, if any, decides: the transport's mapping calls most of those
    timeouts), or an aiohttp error the transport passed through unmapped.
    """
    failure = origin(exc)
    if isinstance(failure, aiohttp.ClientError):
        return isinstance(failure, TimeoutError)
    return isinstance(exc, httpx.TimeoutException)
