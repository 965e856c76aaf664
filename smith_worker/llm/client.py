"""The chat-completions client with the HTTP retry policy (docs/architecture.md, Model requests, HTTP retry policy).

``LlmClient.complete`` posts a non-streamed request; ``complete_stream``
posts ``stream: true`` and delivers :data:`~smith_worker.llm.types.StreamEvent`
objects to a callback *while* the response arrives, then returns
the assembled :class:`~smith_worker.llm.types.LlmResponse`.

Retry policy, per model call, at most ``max_retries`` retries:

=========================================  =====================================================
connect failure, request timeout           retry after the backoff delay
HTTP 5xx                                   retry after the backoff delay
HTTP 429 with ``Retry-After`` ≤ max        retry after ``Retry-After`` (seconds or HTTP date)
HTTP 429 with ``Retry-After`` > max        fail at once with the 429 ``LlmApiError``
HTTP 429 without ``Retry-After``           retry after the backoff delay
stream failing after ≥ 1 body byte         no retry
other status, bad JSON, stream error       no retry
=========================================  =====================================================

Backoff before retry *n* (1-based): ``backoff_base * 2**(n-1) + uniform(0, 0.25)``
seconds, capped at 8 s. Every wait goes through the injected ``sleep``.

With a :class:`~smith_worker.llm.rate_limit.RateGate` (an endpoint with a fleet-wide ``rpm`` / ``tpm``;
docs/architecture.md, Model rate limits) every attempt first takes its request and estimated tokens from the
limit, waiting as long as it says (the two deadlines below move by each such wait: it is not the model's
silence); a 429 with ``Retry-After`` pauses the endpoint for every worker, and the retry waits for that pause
in the gate (announced as ``llm.waiting``) instead of sleeping on its own.

Two deadlines bound a call, retries and their waits included (nothing waits forever):
``response_timeout`` the whole response, and, until the first data arrives
(an SSE data line; a non-streamed response's whole body), the silence budget
:attr:`~smith_worker.llm.types.LlmClientConfig.silence_budget`
(``2 × request_timeout``): a model that takes requests and never answers fails
its call then, whatever ``max_retries`` ("retry up to N times" holds
within it), not after ``(max_retries + 1) × request_timeout`` plus the backoffs.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast
from urllib.parse import urlsplit

import httpx
import orjson

from smith_client.errors import (
    ConfigurationError,
    LlmApiError,
    ParseError,
    SmithError,
    SmithTimeoutError,
    TransportError,
)
from smith_client.messages import parse_json_object
from smith_worker.llm.http import NETWORK_ERRORS, is_timeout, model_http_client, origin, release
from smith_worker.llm.json_schema_tools import JsonReplyReader, rewrite_request
from smith_worker.llm.rate_limit import RateGate, estimate_tokens
from smith_worker.llm.stream import ChatStreamDecoder
from smith_worker.llm.types import (
    LlmClientConfig,
    LlmRequest,
    LlmResponse,
    SamplingParams,
    StreamEvent,
    StreamFinished,
    StreamTokenDelta,
    StreamToolCallCompleted,
    StreamToolCallStarted,
)
from smith_worker.llm.wire import assistant_from_openai, to_openai
from smith_worker.ops import tracing
from smith_worker.ops.redaction import redact_body, redact_headers, redact_text
from smith_worker.ops.retry import BACKOFF_CAP, BACKOFF_JITTER, RetryPolicy, parse_retry_after

logger = logging.getLogger("agent_smith.llm")

OPERATION = "chat_completions"
#: ``SmithTimeoutError.operation`` when ``response_timeout`` ends a response.
RESPONSE_OPERATION = "llm.response"
RESERVED_BODY_KEYS = frozenset({"model", "messages", "tools", "tool_choice", "stream"})
#: Bounds on reading a streamed body past ``[DONE]`` to keep its connection (bytes, seconds; see ``_drain``).
DRAIN_BYTES = 64 * 1024
DRAIN_TIMEOUT = 0.05

OnEvent = Callable[[StreamEvent], Awaitable[None] | None]
_T = TypeVar("_T")


class _RetryableFailure(Exception):
    """Internal: an attempt failed in a way the retry table allows retrying."""

    def __init__(self, error: SmithError, retry_after: float | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry_after = retry_after


@dataclass(frozen=True)
class EncodedRequest:
    """A request ready to send (:meth:`LlmClient.encode`): ``body`` its JSON (UTF-8 bytes), ``stream`` whether
    it asks for a streamed reply, ``json_reply`` whether the reply is json_schema tool calling's, to be
    mapped back to tool calls (:mod:`~smith_worker.llm.json_schema_tools`), ``tokens`` the tokens it is taken
    to use until its reply reports them (:func:`~smith_worker.llm.rate_limit.estimate_tokens`)."""

    body: bytes
    stream: bool
    json_reply: bool
    tokens: int = 0


class LlmClient:
    """An OpenAI-compatible chat-completions client (https://platform.openai.com/docs/api-reference/chat/create).

    ``http``: a shared :class:`httpx.AsyncClient` (not closed by
    :meth:`aclose`); when ``None`` the client creates and owns one.
    ``sleep(seconds)`` is awaited for every retry wait and ``rng()`` (uniform
    in [0, 1)) draws the jitter — both injectable for tests. ``gate``: the endpoint's fleet-wide rate limit
    (:meth:`~smith_worker.llm.rate_limit.RateLimits.gate`; None: none, and no Redis command).

    Errors raised by :meth:`complete` / :meth:`complete_stream`:
    ``ConfigurationError`` (reserved key in ``sampling.extra``, bad URL),
    ``LlmApiError`` (non-2xx status, or an error reported inside a 200 body
    or stream), ``TransportError`` (connection failures or a reply that
    cannot be read, once retries are exhausted, or a stream cut after bytes
    arrived), ``SmithTimeoutError``
    (``operation="chat_completions"``, ``budget=request_timeout``: a phase or
    a stream's wait for its next data line, ``budget=silence_budget``: no data
    within 2 × ``request_timeout``, retries included; ``operation="llm.response"``,
    ``budget=response_timeout``: the whole response, retries included),
    ``ParseError`` (malformed JSON or shape). With a ``gate``, also what
    :meth:`~smith_worker.llm.rate_limit.RateGate.admit` raises (``SmithTimeoutError`` with
    ``operation="llm.waiting"``, a 429 ``LlmApiError``). ``asyncio.CancelledError``
    propagates after the HTTP request is closed.
    """

    def __init__(
        self,
        config: LlmClientConfig,
        http: httpx.AsyncClient | None = None,
        *,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
        gate: RateGate | None = None,
    ) -> None:
        self.config = config
        self._owns_http = http is None
        self._http = http if http is not None else model_http_client()
        self._sleep = sleep
        self._rng = rng
        self._gate = gate

    async def aclose(self) -> None:
        """Close the HTTP client if this object created it."""
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> LlmClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # -- request construction ---------------------------------------------

    def build_body(self, req: LlmRequest, *, stream: bool) -> dict[str, Any]:
        """The JSON body for ``req``.

        Order: ``model``, ``messages`` (wire form), ``tools`` (omitted when
        empty) and ``tool_choice`` (only with tools and when set), the merged
        sampling fields (config defaults, then the request's set fields),
        ``stream`` (+ ``stream_options.include_usage`` when streaming and
        configured), then ``sampling.extra`` last. Raises
        ``ConfigurationError`` when ``extra`` holds a reserved key. With
        ``tool_calling="json_schema"`` the request is first rewritten without
        tool fields (:func:`~smith_worker.llm.json_schema_tools.rewrite_request`).
        """
        if self.config.tool_calling == "json_schema":
            req = rewrite_request(req, self.config.default_sampling)
        sampling = self.config.default_sampling.merged_with(req.sampling)
        _check_reserved(sampling.extra)
        body: dict[str, Any] = {"model": self.config.model, "messages": [to_openai(m) for m in req.messages]}
        if req.tools:
            body["tools"] = [tool.to_openai() for tool in req.tools]
            if req.tool_choice is not None:
                body["tool_choice"] = req.tool_choice
        body.update(_sampling_fields(sampling))
        body["stream"] = stream
        if stream and self.config.include_usage:
            body["stream_options"] = {"include_usage": True}
        body.update(sampling.extra)
        return body

    def _headers(self, *, stream: bool) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream" if stream else "application/json",
        }
        if self.config.authorization:
            headers["Authorization"] = self.config.authorization
        return headers

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.config.request_timeout)

    # -- public calls -------------------------------------------------------

    def encode(self, req: LlmRequest, *, stream: bool) -> EncodedRequest:
        """``req`` encoded for the wire (its :meth:`build_body` as JSON bytes), for :meth:`complete` (``stream``
        False) or :meth:`complete_stream` (True). A caller that keeps only this while the model answers
        holds the body's bytes, not the parsed messages too. Raises as :meth:`build_body`."""
        fields = self.build_body(req, stream=stream)
        body = orjson.dumps(fields)
        json_reply = self.config.tool_calling == "json_schema" and bool(req.tools)
        return EncodedRequest(body, stream, json_reply, estimate_tokens(body, fields.get("max_tokens")))

    async def complete(self, req: LlmRequest | EncodedRequest) -> LlmResponse:
        """Post a non-streamed request and parse the completion. Errors: see class doc.

        ``req``: an :class:`LlmRequest`, or one :meth:`encode` made with ``stream=False`` (else ``ValueError``).
        """
        encoded = self._encoded(req, stream=False)
        headers = self._headers_for(encoded)
        with self._span(encoded) as span:
            response = await self._whole_response(
                lambda _silence: self._complete_once(encoded.body, headers), encoded.tokens
            )
            response = JsonReplyReader(None).finish(response) if encoded.json_reply else response
            self._traced(span, response)
        return response

    async def complete_stream(self, req: LlmRequest | EncodedRequest, on_event: OnEvent) -> LlmResponse:
        """Post a streamed request; call ``on_event(event)`` for each event as it arrives.

        ``on_event`` may return an awaitable, which is awaited before reading
        on. Exceptions from ``on_event`` propagate (the request is closed).
        A server that ignores ``stream: true`` and answers one JSON completion
        is accepted: its content is replayed as events. Returns once the
        stream ended; errors: see class doc. ``req``: an :class:`LlmRequest`, or
        one :meth:`encode` made with ``stream=True`` (else ``ValueError``).
        """
        encoded = self._encoded(req, stream=True)
        headers = self._headers_for(encoded)
        body = encoded.body
        with self._span(encoded) as span:
            if not encoded.json_reply:
                response = await self._whole_response(
                    lambda silence: self._stream_once(body, headers, on_event, silence), encoded.tokens
                )
            else:
                reader = JsonReplyReader(on_event)
                response = reader.finish(
                    await self._whole_response(
                        lambda silence: self._stream_once(body, headers, reader.on_event, silence), encoded.tokens
                    )
                )
            self._traced(span, response)
        return response

    def _span(self, encoded: EncodedRequest) -> tracing.NoSpan:
        """The request's ``chat <model>`` span (GenAI conventions; docs/architecture.md, Tracing); its message
        content only when :func:`~smith_worker.ops.tracing.capture_content`, redacted."""
        if not tracing.ENABLED:
            return tracing.NO_SPAN
        url = urlsplit(self.config.base_url)
        attributes: dict[str, str | int | bool] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self.config.model,
            "gen_ai.output.type": "json" if encoded.json_reply else "text",
            "server.address": url.hostname or "",
            "smith.llm.stream": encoded.stream,
        }
        if url.port:
            attributes["server.port"] = url.port
        if tracing.capture_content():
            attributes["gen_ai.input.messages"] = tracing.content(orjson.loads(encoded.body).get("messages"))
        return tracing.span(f"chat {self.config.model}", kind="client", attributes=attributes)

    @staticmethod
    def _traced(span: tracing.NoSpan, response: LlmResponse) -> None:
        """The response's attributes on its ``chat`` span: model, finish reason, token usage (content when
        captured)."""
        if span is tracing.NO_SPAN:
            return
        usage = response.message.usage
        span.update({
            "gen_ai.response.model": response.model or None,
            "gen_ai.response.finish_reasons": [response.finish_reason] if response.finish_reason else None,
            "gen_ai.usage.input_tokens": usage.prompt if usage is not None else None,
            "gen_ai.usage.output_tokens": usage.completion if usage is not None else None,
        })  # fmt: skip
        if tracing.capture_content():
            span.set("gen_ai.output.messages", tracing.content([response.message.model_dump(mode="json")]))

    def _encoded(self, req: LlmRequest | EncodedRequest, *, stream: bool) -> EncodedRequest:
        if isinstance(req, LlmRequest):
            return self.encode(req, stream=stream)
        if req.stream != stream:
            raise ValueError(f"request encoded with stream={req.stream} sent with stream={stream}")
        return req

    async def _whole_response(
        self, attempt: Callable[[asyncio.Timeout], Awaitable[LlmResponse]], tokens: int
    ) -> LlmResponse:
        """:meth:`_with_retries`, all attempts bounded by ``response_timeout`` and, until the first data arrives,
        by the silence budget (never retried after either fires; see the module docstring), both moved by the
        waits for the rate limit; ``tokens``: the request's estimate, taken by each attempt from the limit and
        corrected by the reply's usage (:class:`~smith_worker.llm.rate_limit.RateGate`).

        ``attempt(silence)`` lifts the silence budget with ``silence.reschedule(None)`` when data arrives.
        """
        budget, silent = self.config.response_timeout, self.config.silence_budget
        whole, silence = asyncio.timeout(budget), asyncio.timeout(silent)
        try:
            async with whole, silence:
                response = await self._with_retries(lambda: attempt(silence), tokens, (whole, silence))
            if self._gate is not None:
                usage = response.message.usage
                self._gate.settle(tokens, usage.total if usage is not None else None)
            return response
        except TimeoutError as exc:
            if whole.expired():
                raise SmithTimeoutError(
                    f"the model's response did not end within {budget:g} s (response_timeout)",
                    operation=RESPONSE_OPERATION,
                    budget=budget,
                ) from exc
            if silence.expired():
                raise SmithTimeoutError(
                    f"the model sent no data within {silent:g} s (2 x request_timeout, retries included)",
                    operation=OPERATION,
                    budget=silent,
                ) from exc
            raise

    def _headers_for(self, encoded: EncodedRequest) -> dict[str, str]:
        headers = self._headers(stream=encoded.stream)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "POST %s headers=%s body=%s",
                self.config.chat_completions_url,
                redact_headers(headers),
                redact_body(encoded.body, [self.config.api_key]),
            )
        return headers

    # -- one attempt ---------------------------------------------------------

    async def _complete_once(self, content: bytes, headers: dict[str, str]) -> LlmResponse:
        with self._network_errors(retryable=True):
            async with self._post(content, headers) as response:
                if not response.is_success:
                    raise await self._error_reply(response)
                body = await self._read_body(response)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("response body=%s", redact_body(body, [self.config.api_key]))
        return parse_completion(body)

    async def _stream_once(
        self, content: bytes, headers: dict[str, str], on_event: OnEvent, silence: asyncio.Timeout
    ) -> LlmResponse:
        with self._network_errors(retryable=True):
            async with self._post(content, headers) as response:
                if not response.is_success:
                    raise await self._error_reply(response)
                if _is_json(response):
                    return await self._consume_json(response, on_event)
                return await self._consume_stream(response, on_event, silence)

    @contextlib.asynccontextmanager
    async def _post(self, content: bytes, headers: dict[str, str]) -> AsyncIterator[httpx.Response]:
        """POST ``content`` to the chat-completions URL; the response, streamed, closed on exit.

        httpx leaves a closed response in a reference cycle with its stream, which keeps the
        request and its body (the whole prompt: megabytes for a long history) until the cyclic
        garbage collector runs, and that runs rarely for objects that lived through a long reply.
        :func:`~smith_worker.llm.http.release` breaks it, so refcounting frees them at once.
        """
        response: httpx.Response | None = None
        try:
            async with self._http.stream(
                "POST", self.config.chat_completions_url, content=content, headers=headers, timeout=self._timeout()
            ) as response:
                yield response
        finally:
            if response is not None:
                release(response)

    async def _error_reply(self, response: httpx.Response) -> Exception:
        """The error for a non-2xx reply (see :func:`_status_failure`). A body that cannot be decoded (a broken
        ``Content-Encoding``) still leaves the status, which decides the retry."""
        try:
            body = _text(await self._read_body(response))
        except httpx.DecodingError as exc:
            body = f"(body not decodable: {exc})"
        return _status_failure(response.status_code, response.headers, body)

    async def _read_body(self, response: httpx.Response) -> bytes:
        """The whole body, refusing one longer than ``max_response_bytes`` (``ParseError``, offset = the limit)."""
        limit = self.config.max_response_bytes
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():
            size += len(chunk)
            _check_size(size, limit)
            chunks.append(chunk)
        return b"".join(chunks)

    async def _consume_json(self, response: httpx.Response, on_event: OnEvent) -> LlmResponse:
        """A server that ignored ``stream: true`` and sent one completion: replay it as events."""
        with self._network_errors(retryable=False):
            body = await self._read_body(response)
        result = parse_completion(body)
        for event in events_for_response(result):
            await _deliver(on_event, event)
        return result

    async def _consume_stream(
        self, response: httpx.Response, on_event: OnEvent, silence: asyncio.Timeout
    ) -> LlmResponse:
        """Decode the body as it arrives; once a byte arrived, failures are final (no retry).

        Bytes are counted before they are parsed: the read that crosses
        ``max_response_bytes`` ends the call with ``ParseError``. The first data frame lifts ``silence``.
        """
        decoder = ChatStreamDecoder()
        delivered = False
        size = 0
        loop = asyncio.get_running_loop()
        frames, idle_until = 0, loop.time() + self.config.request_timeout
        async with contextlib.aclosing(cast(AsyncGenerator[bytes, None], response.aiter_bytes())) as chunks:
            while not decoder.done:
                with self._network_errors(retryable=not delivered):
                    chunk = await self._next_chunk(chunks, idle_until)
                events: Iterable[StreamEvent]
                if chunk is None:
                    events = decoder.close()
                else:
                    delivered = delivered or bool(chunk)
                    size += len(chunk)
                    _check_size(size, self.config.max_response_bytes)
                    events = decoder.feed(chunk)
                for event in events:
                    await _deliver(on_event, event)
                if decoder.frames != frames:  # only data frames show progress; comments and blank lines do not
                    if not frames:
                        silence.reschedule(None)
                    frames, idle_until = decoder.frames, loop.time() + self.config.request_timeout
                if chunk is None:
                    break
            else:
                await _drain(chunks)
        return decoder.finish()

    @staticmethod
    async def _next_chunk(chunks: Any, idle_until: float) -> bytes | None:
        """The next body chunk (None at EOF); ``httpx.ReadTimeout`` once no data frame came by ``idle_until``
        (loop time): a server trickling keep-alive comments resets httpx's own read timeout, not this one."""
        bound = asyncio.timeout_at(idle_until)
        try:
            async with bound:
                return await anext(chunks, None)
        except TimeoutError as exc:
            if not bound.expired():
                raise
            raise httpx.ReadTimeout("no SSE data line within request_timeout") from exc

    @contextlib.contextmanager
    def _network_errors(self, *, retryable: bool) -> Iterator[None]:
        """Translate httpx failures into typed errors, wrapped for retry when ``retryable``."""
        try:
            yield
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ConfigurationError(f"bad LLM base_url: {exc}", setting="base_url") from exc
        except NETWORK_ERRORS as exc:
            error: SmithError
            if is_timeout(exc):
                error = SmithTimeoutError(
                    f"chat completions timed out ({type(exc).__name__}, budget {self.config.request_timeout}s)",
                    operation=OPERATION,
                    budget=self.config.request_timeout,
                )
            else:
                error = TransportError(
                    f"chat completions request failed: {type(origin(exc)).__name__}: {exc}",
                    operation=OPERATION,
                    endpoint_or_server=self.config.chat_completions_url,
                )
            raise (_RetryableFailure(error) if retryable else error) from origin(exc)

    # -- retry loop -------------------------------------------------------

    async def _with_retries(
        self, attempt: Callable[[], Awaitable[_T]], tokens: int, budgets: tuple[asyncio.Timeout, ...]
    ) -> _T:
        started = time.monotonic()
        for number in itertools.count(1):
            if self._gate is not None:
                await self._gate.admit(tokens, lambda seconds: _postpone(budgets, seconds))
            try:
                return await attempt()
            except _RetryableFailure as failure:
                paused = await self._pause_fleet(failure)
                if number > 1:  # say how long it really took: N attempts, not one budget
                    failure.error.message += f" (after {number} attempts in {time.monotonic() - started:.1f} s)"
                    failure.error.args = (failure.error.message,)
                delay = self._retry_delay(failure, number)
                tracing.event(
                    "smith.llm.retry",
                    {"smith.retry.number": number, "smith.retry.delay_s": delay, "error.type": failure.error.kind},
                )
                logger.warning(
                    "LLM request failed (%s); retry %d/%d in %.2fs",
                    failure.error.message,
                    number,
                    self.config.max_retries,
                    delay,
                )
                if not paused:  # a fleet-wide pause is waited for by the next admit, announced
                    await self._sleep(delay)
        raise AssertionError("unreachable")

    async def _pause_fleet(self, failure: _RetryableFailure) -> bool:
        """Pause the endpoint for every worker when ``failure`` is a 429 with ``Retry-After`` and the endpoint has
        a gate, whether this call retries or not (the server's word holds for every request); True if paused."""
        if self._gate is None or failure.retry_after is None:
            return False
        await self._gate.pause(failure.retry_after)
        return True

    def _retry_delay(self, failure: _RetryableFailure, number: int) -> float:
        """Seconds to wait before retrying after failed attempt ``number``; raises the error to give up."""
        delay = self._policy().delay(number, failure.retry_after, self._rng)
        if delay is None:
            raise failure.error from failure.__cause__
        return delay

    def _policy(self) -> RetryPolicy:
        return RetryPolicy(self.config.max_retries, self.config.backoff_base, self.config.max_retry_after)

    def backoff_delay(self, number: int) -> float:
        """``backoff_base * 2**(number-1) + uniform(0, 0.25)`` seconds, capped at 8 s."""
        return self._policy().backoff(number, self._rng)


# -- helpers -------------------------------------------------------------------


def _check_reserved(extra: dict[str, Any]) -> None:
    reserved = sorted(RESERVED_BODY_KEYS.intersection(extra))
    if reserved:
        raise ConfigurationError(
            f"sampling.extra may not set reserved request fields: {', '.join(reserved)}", setting="sampling.extra"
        )


def _sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in ("temperature", "top_p", "max_tokens", "response_format"):
        value = getattr(sampling, name)
        if value is not None:
            fields[name] = value
    if sampling.stop:
        fields["stop"] = list(sampling.stop)
    return fields


def _postpone(budgets: tuple[asyncio.Timeout, ...], seconds: float) -> None:
    """Move each of ``budgets`` still running ``seconds`` later (a wait for the rate limit is not the model's)."""
    for budget in budgets:
        when = budget.when()
        if when is not None:
            budget.reschedule(when + seconds)


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what follows ``[DONE]`` (normally just the body's last chunk) so the connection goes back to
    the pool: aiohttp, like httpcore, closes the connection of a response released before its end, and the
    next model request would open a new one. Bounded by :data:`DRAIN_BYTES` and :data:`DRAIN_TIMEOUT`; past
    either, or on a network error, the connection is dropped as before (the reply is complete either way)."""
    size = 0
    with contextlib.suppress(TimeoutError, *NETWORK_ERRORS):
        async with asyncio.timeout(DRAIN_TIMEOUT):
            async for chunk in chunks:
                size += len(chunk)
                if size > DRAIN_BYTES:
                    return


async def _deliver(on_event: OnEvent, event: StreamEvent) -> None:
    result = on_event(event)
    if inspect.isawaitable(result):
        await result


def _check_size(size: int, limit: int) -> None:
    if size > limit:
        raise ParseError(f"LLM response exceeds max_response_bytes={limit}; cut off", offset=limit)


def _text(body: bytes) -> str:
    return body.decode("utf-8", errors="replace")


def _is_json(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip().lower() == "application/json"


def events_for_response(response: LlmResponse) -> list[StreamEvent]:
    """The stream events equivalent to a complete response (text, each tool call, finish)."""
    message = response.message
    events: list[StreamEvent] = [StreamTokenDelta(message.content)] if message.content else []
    calls = list(enumerate(message.tool_calls))
    events += [StreamToolCallStarted(call.id, call.name, index) for index, call in calls]
    events += [StreamToolCallCompleted(index, call.arguments, call.id, call.name) for index, call in calls]
    events.append(StreamFinished(response.finish_reason, message.usage))
    return events


def _status_failure(status: int, headers: httpx.Headers, body: str) -> Exception:
    """The error for a non-2xx reply, wrapped for retry when the table allows it."""
    # the excerpt goes into events and logs: sensitive JSON keys and known secrets removed
    # (docs/architecture.md, Hooks and logs)
    excerpt = redact_body(body[: 64 * 1024])
    error = LlmApiError(
        redact_text(f"chat completions failed with HTTP {status}: {_error_message(body)}"), status, excerpt
    )
    if status == 429:
        return _RetryableFailure(error, retry_after=parse_retry_after(headers.get("retry-after")))
    if status >= 500:
        return _RetryableFailure(error)
    return error


def _error_message(body: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body's start."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:200]
        if isinstance(error, str):
            return error[:200]
    return body[:200]


def parse_completion(raw: bytes) -> LlmResponse:
    """Parse a non-streamed ``chat.completion`` body.

    Raises ``ParseError`` (bad JSON or shape) or ``LlmApiError``
    (``http_status=200``) when the body is an ``{"error": ...}`` object.
    """
    data = parse_json_object(raw, "chat completion")
    text = raw.decode("utf-8", errors="replace")
    if data.get("error") is not None:
        raise LlmApiError(f"chat completion error: {_error_message(text)}", 200, text)
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ParseError("chat completion has no choices")
    choice = choices[0]
    message = assistant_from_openai(choice.get("message"), data.get("usage"))
    reasoning = choice["message"].get("reasoning_content") or choice["message"].get("reasoning") or ""
    return LlmResponse(
        message=message,
        finish_reason=str(choice.get("finish_reason") or ""),
        reasoning_content=reasoning if isinstance(reasoning, str) else "",
        model=data["model"] if isinstance(data.get("model"), str) else "",
    )


__all__ = [
    "BACKOFF_CAP",
    "BACKOFF_JITTER",
    "EncodedRequest",
    "LlmClient",
    "OnEvent",
    "events_for_response",
    "parse_completion",
    "parse_retry_after",
]
