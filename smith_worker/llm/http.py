"""The HTTP client the chat-completions requests go through: httpx's API over aiohttp's connections (issue 18).

A turn worker streaming many model replies at once spends most of its CPU in
the HTTP layer, once per body chunk: httpx's default transport (httpcore on
anyio) pauses and resumes the socket's reader around every read and scans
its whole connection pool for expired connections on every request. The same
``httpx.AsyncClient`` over ``httpx-aiohttp``'s :class:`AiohttpTransport`
reads through aiohttp's C-parsed protocol instead: at 50 concurrent streams
the turn worker's CPU per streamed reply fell by about 30 % (BENCHMARKS.md,
issue 18). The rest of the client keeps httpx's API: requests, streamed
responses, ``httpx.Timeout`` and httpx's exception types.

Two differences are handled here, not by the callers:

* ``httpx-aiohttp`` 0.2 maps every ``aiohttp.ClientConnectionError`` to
  ``httpx.ConnectTimeout``, a refused connection and a server that hung up
  included. :func:`is_timeout` tells a real timeout (the aiohttp cause is a
  ``TimeoutError``) from those, so they stay transport errors (seed §6.3
  retries both, but reports them as different kinds).
* an httpx client with its own transport ignores the proxy environment; the
  aiohttp session is made with ``trust_env=True`` when the environment names
  a proxy, so ``HTTP(S)_PROXY``, ``ALL_PROXY`` and ``NO_PROXY`` still apply, as
  they did with httpx's own transport (which reads them once, when the client
  is made: so does this). Only then: a ``trust_env`` session looks the proxy
  and ``~/.netrc`` up again in a thread of the default executor for every
  request, two thread hops per model call.
"""

from __future__ import annotations

import urllib.request

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

#: Most connections open at once to model servers, per worker process (httpx's default too).
MAX_CONNECTIONS = 100
#: Seconds an idle keep-alive connection is kept (httpx's default ``keepalive_expiry``).
KEEPALIVE_EXPIRY = 5.0

#: What a failed request raises: httpx's transport errors, or an aiohttp error the transport did not map.
NETWORK_ERRORS = (httpx.TransportError, aiohttp.ClientError)


def model_http_client() -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` for chat-completions requests (no client-wide timeout: each request
    passes its own). Its aiohttp session is made on the first request, inside the running event loop;
    close the client with ``aclose()``."""
    return httpx.AsyncClient(timeout=None, transport=AiohttpTransport(client=_session))


def _session() -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_EXPIRY)
    return aiohttp.ClientSession(connector=connector, trust_env=proxy_in_environment())


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
