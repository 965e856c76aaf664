"""Fleet-wide model rate limits: requests and tokens per minute per endpoint, shared through Redis
(docs/architecture.md, Model rate limits).

An endpoint (a chat-completions URL and a model name, :func:`endpoint_id`) configured with ``rpm`` and/or
``tpm`` (:class:`~smith_worker.llm.types.LlmClientConfig`; ``SMITH_LLM_RPM`` / ``SMITH_LLM_TPM`` for the
environment's) has one Redis hash (:meth:`~smith_client.keys.Keys.llm_rate_limit`) that every worker's
requests to it go through, in one script call each (``lua/rate_limit.lua``): GCRA, the generic cell rate
algorithm (ITU-T I.371), over requests and over tokens, with a burst of ``rate_burst`` seconds' worth of the
allowance, and the pause a ``429`` with ``Retry-After`` started. Its clock is the Redis server's.

:class:`RateGate` is what the model client (:class:`~smith_worker.llm.client.LlmClient`) sees, per agent loop:

* :meth:`RateGate.admit` before each HTTP attempt: one request and the request's estimated tokens
  (:func:`estimate_tokens`) are taken now, or reserved for later; the gate then publishes ``llm.waiting``
  (:class:`~smith_client.events.LlmWaitingData`, the real wait) and sleeps (no slot is held) until its
  reservation, so waiting requests go in the order they asked. While a ``Retry-After`` pause lasts nothing is
  reserved: the gate sleeps until it ends and asks again. A wait that would
  end past the turn's deadline (without one: ``response_timeout`` from the call's start) fails at once with
  ``SmithTimeoutError`` (operation ``llm.waiting``); a ``Retry-After`` pause longer than ``max_retry_after``
  with the 429's ``LlmApiError``, as the HTTP retry policy does for the worker that saw it.
* :meth:`RateGate.settle` after a reply: its reported usage minus the estimate is kept in this process and
  added by the endpoint's next ``admit`` (no round trip of its own; lost if the process sends no more).
* :meth:`RateGate.pause` on a ``429`` with ``Retry-After``: the endpoint pauses for every worker.

An endpoint without limits has no gate (:meth:`RateLimits.gate` returns None): its requests send no Redis command.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from smith_client.errors import LlmApiError, SmithTimeoutError
from smith_client.events import LlmWaitingData
from smith_client.keys import Keys
from smith_client.scripts import LuaScript
from smith_worker.llm.types import LlmClientConfig

RATE_LIMIT = LuaScript("rate_limit", __package__)
#: ``SmithTimeoutError.operation`` when a wait for the rate limit would pass the turn's deadline.
WAIT_OPERATION = "llm.waiting"
#: Characters per token of :func:`estimate_tokens` (the usual rule of thumb for English text and JSON).
CHARS_PER_TOKEN = 4

#: ``llm.waiting`` publisher (the agent loop's fenced publish) and the turn's deadline (``time.monotonic()``
#: instant, None: none).
OnWait = Callable[[LlmWaitingData], Awaitable[Any]]
Deadline = Callable[[], float | None]


def endpoint_id(config: LlmClientConfig) -> str:
    """The endpoint's id in its Redis key: 16 hex digits of the SHA-256 of its chat-completions URL and model
    (no credentials: they are not part of ``base_url``, see :class:`~smith_worker.llm.types.LlmClientConfig`)."""
    text = f"{config.chat_completions_url}\n{config.model}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def estimate_tokens(body: bytes, max_tokens: int | None) -> int:
    """The tokens a request is taken to use before its reply reports them: its JSON body's bytes over
    :data:`CHARS_PER_TOKEN` (the prompt: messages and tool schemas) plus ``max_tokens`` (the most it may
    answer; 0 when unset)."""
    return len(body) // CHARS_PER_TOKEN + (max_tokens or 0)


@dataclass
class _Endpoint:
    """One endpoint as this process sees it: its key and the tokens its replies used beyond (or, negative,
    below) their estimates, not yet sent to Redis."""

    key: str
    correction: int = 0


class RateLimits:
    """A worker process's gates to the fleet-wide limits (one per turn worker; :class:`TurnServices`).

    ``redis``: the worker's asyncio client; ``keys``: its prefix's :class:`~smith_client.keys.Keys`.
    """

    def __init__(self, redis: Any, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys
        self._endpoints: dict[str, _Endpoint] = {}

    def gate(self, config: LlmClientConfig, on_wait: OnWait, deadline: Deadline) -> RateGate | None:
        """The gate of ``config``'s endpoint for one agent loop, or None when it has no ``rpm`` or ``tpm``.

        ``on_wait`` publishes the loop's ``llm.waiting`` events; ``deadline()`` is the turn's deadline."""
        if not config.rate_limited:
            return None
        endpoint = endpoint_id(config)
        state = self._endpoints.get(endpoint)
        if state is None:
            state = self._endpoints[endpoint] = _Endpoint(self._keys.llm_rate_limit(endpoint))
        return RateGate(self._redis, state, config, on_wait, deadline)


class RateGate:
    """One agent loop's way through its endpoint's fleet-wide limit (see the module docstring).

    ``clock`` is :func:`time.monotonic` (the deadline's clock) and ``sleep`` :func:`asyncio.sleep`, injectable.
    """

    def __init__(
        self,
        redis: Any,
        endpoint: _Endpoint,
        config: LlmClientConfig,
        on_wait: OnWait,
        deadline: Deadline,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._redis = redis
        self._endpoint = endpoint
        self._config = config
        self._on_wait = on_wait
        self._deadline = deadline
        self._clock = clock
        self._sleep = sleep

    async def admit(self, tokens: int, postpone: Callable[[float], None]) -> None:
        """Return once one request and ``tokens`` (the request's estimate) are taken from the endpoint's limit:
        at once, or by a reservation for later, whose time has come (waiters go in the order they asked).

        Each wait is announced by an ``llm.waiting`` event (once per reason in a row), given to ``postpone``
        (seconds: the caller moves its own timeouts by as much) and slept. Raises ``SmithTimeoutError``
        (operation ``llm.waiting``, ``budget``: the seconds the turn had left) when a wait would end past the
        turn's deadline, or ``response_timeout`` after this call when the turn has none; ``LlmApiError``
        (``http_status`` 429) when the endpoint is paused by a ``Retry-After`` for longer than
        ``max_retry_after``. Redis errors propagate."""
        bound = self._bound()
        announced = ""
        reserved = False
        while True:
            if reserved:  # its time came: only a pause stored meanwhile holds it
                wait, reason = await self._paused(), "retry_after"
            else:
                wait, reason, reserved = await self._take(tokens, max(bound - self._clock(), 0.0))
            if not wait:
                return
            if reason == "retry_after" or not reserved:  # a reservation's wait fits the bound already
                self._check(wait, reason, bound)
            if reason != announced:
                announced = reason
                await self._on_wait(
                    LlmWaitingData(
                        endpoint=self._config.chat_completions_url,
                        model=self._config.model,
                        reason=reason,  # type: ignore[arg-type]  # the script's two reasons
                        wait_s=wait,
                    )
                )
            postpone(wait)
            await self._sleep(wait)

    def settle(self, estimate: int, used: int | None) -> None:
        """A reply arrived: its reported total tokens ``used`` (None: not reported, nothing to correct) minus
        the ``estimate`` taken for it are added by the endpoint's next :meth:`admit` in this process."""
        if used is not None and self._config.tpm is not None:
            self._endpoint.correction += used - estimate

    async def pause(self, seconds: float) -> None:
        """Pause the endpoint for every worker for ``seconds`` (a ``429``'s ``Retry-After``) from now, unless a
        pause already ends later. Redis errors propagate."""
        await RATE_LIMIT(self._redis, [self._endpoint.key], ["pause", math.ceil(seconds * 1000)])

    async def _take(self, tokens: int, longest: float) -> tuple[float, str, bool]:
        """One script call: (0, "", False) when taken; (seconds to wait, "rate_limit", True) when reserved for
        then, which ``longest`` (seconds) bounds; else (seconds to wait, reason, False), nothing taken."""
        config, endpoint = self._config, self._endpoint
        correction, endpoint.correction = endpoint.correction, 0  # the script applies it either way
        args = [
            "take",
            config.rpm or 0,
            config.tpm or 0,
            math.ceil(config.rate_burst * 1000),
            tokens,
            correction,
            math.floor(longest * 1000),
        ]
        wait_ms, reason, *reserved = await RATE_LIMIT(self._redis, [endpoint.key], args)
        return int(wait_ms) / 1000, reason.decode() if isinstance(reason, bytes) else str(reason), bool(reserved)

    async def _paused(self) -> float:
        """Seconds left of the endpoint's ``Retry-After`` pause (0: none), in one script call."""
        wait_ms, _ = await RATE_LIMIT(self._redis, [self._endpoint.key], ["paused"])
        return int(wait_ms) / 1000

    def _bound(self) -> float:
        """The instant (``clock``) no wait may pass: the turn's deadline, else ``response_timeout`` from now."""
        deadline = self._deadline()
        return deadline if deadline is not None else self._clock() + self._config.response_timeout

    def _check(self, wait: float, reason: str, bound: float) -> None:
        """Raise when waiting ``wait`` seconds for ``reason`` is not allowed (see :meth:`admit`)."""
        url = self._config.chat_completions_url
        if reason == "retry_after" and wait > self._config.max_retry_after:
            raise LlmApiError(
                f"{url} is paused for every worker for {wait:.1f} s more (a 429's Retry-After), over "
                f"max_retry_after={self._config.max_retry_after:g} s",
                429,
            )
        left = bound - self._clock()
        if wait > left:
            raise SmithTimeoutError(
                f"the next request to {url} would wait {wait:.1f} s ({reason}), past the turn's "
                f"{'deadline' if self._deadline() is not None else 'response_timeout'} ({max(left, 0):.1f} s left)",
                operation=WAIT_OPERATION,
                budget=max(left, 0.0),
            )


__all__ = ["RATE_LIMIT", "WAIT_OPERATION", "RateGate", "RateLimits", "endpoint_id", "estimate_tokens"]
