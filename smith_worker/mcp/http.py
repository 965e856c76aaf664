"""The HTTP layer under the SDK's Streamable HTTP client: retries and stale-session detection.

The retries follow docs/architecture.md, HTTP retry policy.

:class:`McpHttpTransport` is the ``httpx2`` transport of the client that
:func:`~smith_worker.mcp.transport.open_http` hands to the SDK. It wraps the
default transport and, per HTTP request:

* **Retries** (:mod:`smith_worker.ops.retry`) a ``POST`` (one JSON-RPC
  message) that failed to connect, answered 5xx or 429 (``Retry-After`` up to
  8 s honoured), or broke before any response; at most ``max_retries`` times
  with ``0.5 s · 2^(n-1) + U(0, 0.25 s)`` backoff (cap 8 s). A ``tools/call``
  is retried only when the connection could not even be opened: once its
  request may have reached the server it is never resent, whatever
  the answer. ``GET`` (the optional listening stream, which the SDK reconnects
  itself) and ``DELETE`` (best effort at close) are not retried.
* **Detects a lost session**: HTTP 400 or 404 on a request that carries an
  ``Mcp-Session-Id`` (the server restarted or expired it), unless the body is a
  JSON-RPC error about something else (one that does not mention the session:
  any such 400, or a 404 with METHOD_NOT_FOUND / INVALID_PARAMS). It
  then calls ``on_session_lost("session expired")`` before the SDK sees the
  answer, so the pool ends the connection (reconnect, re-initialize) and the
  request fails as a lost connection, not as a protocol error.

The response is returned to the SDK unchanged (a final 5xx becomes the SDK's
``-32603``); transport exceptions propagate unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2
import orjson

from smith_worker.mcp.errors import SESSION_EXPIRED
from smith_worker.ops.retry import RetryPolicy, parse_retry_after, retryable_status

logger = logging.getLogger("agent_smith.mcp")

#: JSON-RPC methods whose request is never resent once it may have reached the server.
REPLAY_UNSAFE = frozenset({"tools/call"})
#: Statuses that, on a request carrying a session id, mean the server no longer knows the session.
STALE_SESSION_STATUSES = frozenset({400, 404})
#: JSON-RPC codes in a 400/404 body that are about the request, not the session.
_NOT_ABOUT_SESSION = frozenset({-32601, -32602, -32700})

SESSION_HEADER = "mcp-session-id"


def rpc_method(request: httpx2.Request) -> str | None:
    """The JSON-RPC method of a ``POST`` body (``None`` for responses, batches, other verbs, bad JSON)."""
    if request.method != "POST":
        return None
    try:
        body = orjson.loads(request.content)
    except (orjson.JSONDecodeError, httpx2.RequestNotRead):
        return None
    method = body.get("method") if isinstance(body, dict) else None
    return method if isinstance(method, str) else None


def says_session_lost(status: int, body: bytes) -> bool:
    """Whether a 400/404 answer to a request with a session id means the session is gone (see module doc)."""
    if status not in STALE_SESSION_STATUSES:
        return False
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return True  # a bare status (proxy page, empty body): the session id was refused
    error = data.get("error") if isinstance(data, dict) else None
    if not isinstance(error, dict):
        return True
    if "session" in str(error.get("message", "")).lower():
        return True
    return status == 404 and error.get("code") not in _NOT_ABOUT_SESSION


class McpHttpTransport(httpx2.AsyncBaseTransport):
    """See module doc. ``inner`` defaults to ``httpx2.AsyncHTTPTransport()``; ``sleep`` and ``rng`` are
    injectable for tests; ``policy`` gives the retry numbers (seconds)."""

    def __init__(
        self,
        alias: str,
        policy: RetryPolicy,
        on_session_lost: Callable[[str], None],
        *,
        inner: httpx2.AsyncBaseTransport | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.alias = alias
        self.policy = policy
        self.on_session_lost = on_session_lost
        self._inner = inner or httpx2.AsyncHTTPTransport()
        self._sleep = sleep
        self._rng = rng

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        method = rpc_method(request)
        retried = request.method == "POST"
        resendable = method not in REPLAY_UNSAFE
        number = 0
        while True:
            number += 1
            try:
                response = await self._inner.handle_async_request(request)
            except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:  # nothing was sent
                failure: httpx2.Response | Exception = exc
                retry_after = None
                give_up = not retried
            except httpx2.TransportError as exc:  # the request may have reached the server
                failure, retry_after, give_up = exc, None, not (retried and resendable)
            else:
                if await self._session_lost(request, response):
                    return response
                if not (retried and resendable and retryable_status(response.status_code)):
                    return response
                failure, give_up = response, False
                retry_after = (
                    parse_retry_after(response.headers.get("retry-after")) if response.status_code == 429 else None
                )
            delay = None if give_up else self.policy.delay(number, retry_after, self._rng)
            if delay is None:
                if isinstance(failure, Exception):
                    raise failure
                return failure
            await self._before_retry(failure, method or request.method, number, delay)

    async def _session_lost(self, request: httpx2.Request, response: httpx2.Response) -> bool:
        if (
            request.method == "DELETE"  # closing the session anyway (and a restarted server never knew it)
            or SESSION_HEADER not in request.headers
            or response.status_code not in STALE_SESSION_STATUSES
        ):
            return False
        body = await response.aread()  # small error body; the SDK reads the cached copy
        if not says_session_lost(response.status_code, body):
            return False
        logger.info(
            "MCP server %r: HTTP %d for our session id: the server lost the session", self.alias, response.status_code
        )
        self.on_session_lost(SESSION_EXPIRED)
        return True

    async def _before_retry(self, failure: httpx2.Response | Exception, what: str, number: int, delay: float) -> None:
        if isinstance(failure, httpx2.Response):
            detail = f"HTTP {failure.status_code}"
            await failure.aclose()
        else:
            detail = f"{type(failure).__name__}: {failure}"
        logger.warning(
            "MCP server %r: %s failed (%s); retry %d/%d in %.2f s",
            self.alias,
            what,
            detail,
            number,
            self.policy.max_retries,
            delay,
        )
        await self._sleep(delay)

    async def aclose(self) -> None:
        await self._inner.aclose()
