"""The HTTP retry policy, shared by the LLM client and the MCP Streamable HTTP transport.

See docs/architecture.md, HTTP retry policy.

=========================================  =====================================================
connect failure, request timeout           retry after the backoff delay
HTTP 5xx                                   retry after the backoff delay
HTTP 429 with ``Retry-After`` ≤ max        retry after ``Retry-After`` (seconds or HTTP date)
HTTP 429 with ``Retry-After`` > max        give up at once
HTTP 429 without ``Retry-After``           retry after the backoff delay
=========================================  =====================================================

Backoff before retry *n* (1-based): ``backoff_base * 2**(n-1) + uniform(0, 0.25)``
seconds, capped at :data:`BACKOFF_CAP` (8 s). Callers decide which failures
are retryable for them (a streamed response that delivered a byte, or an MCP
``tools/call`` that may have reached the server, never is); this module only
says how long to wait and when to give up.
"""

from __future__ import annotations

import email.utils
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC

logger = logging.getLogger("agent_smith.retry")

BACKOFF_BASE = 0.5  # seconds
BACKOFF_CAP = 8.0  # seconds
BACKOFF_JITTER = 0.25  # seconds, upper bound of the uniform jitter
MAX_RETRIES = 3  # retries after the first attempt


def retryable_status(status: int) -> bool:
    """HTTP statuses the table retries: 429 and every 5xx."""
    return status == 429 or status >= 500


@dataclass(frozen=True)
class RetryPolicy:
    """The policy's numbers: ``max_retries`` after the first attempt, ``backoff_base`` and
    ``max_retry_after`` in seconds (the longest ``Retry-After`` honoured)."""

    max_retries: int = MAX_RETRIES
    backoff_base: float = BACKOFF_BASE
    max_retry_after: float = BACKOFF_CAP

    def backoff(self, number: int, rng: Callable[[], float] = random.random) -> float:
        """``backoff_base * 2**(number-1) + uniform(0, 0.25)`` seconds, capped at 8 s; ``rng()`` is in [0, 1)."""
        delay: float = self.backoff_base * 2 ** (number - 1) + rng() * BACKOFF_JITTER
        return min(delay, BACKOFF_CAP)

    def delay(
        self, number: int, retry_after: float | None = None, rng: Callable[[], float] = random.random
    ) -> float | None:
        """Seconds to wait before retrying after failed attempt ``number`` (1-based), or None to give up.

        ``retry_after`` is the reply's parsed ``Retry-After`` (see :func:`parse_retry_after`), if any.
        """
        if retry_after is not None and retry_after > self.max_retry_after:
            logger.debug("not retrying: Retry-After %.1fs exceeds %.1fs", retry_after, self.max_retry_after)
            return None
        if number > self.max_retries:
            logger.debug("not retrying: %d retries exhausted", self.max_retries)
            return None
        return retry_after if retry_after is not None else self.backoff(number, rng)


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """A ``Retry-After`` header in seconds (RFC 9110 §10.2.3): delay-seconds or an HTTP date.

    Returns ``None`` when absent or unparseable; a date in the past gives 0.
    """
    if not value or not value.strip():
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value.strip())
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
