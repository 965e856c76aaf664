"""Whether this worker process can reach Redis now, and how it waits for Redis to come back.

A worker outlives Redis (docs/architecture.md, Fault model): every loop that talks to Redis (arq's
polling, the worker's subscription, the sweeper, heartbeats) reports its successes
and failures to one :class:`RedisHealth` per process. That is the process's
*readiness*: ``ready`` is False from the first failed Redis command until the
next one that succeeds. *Liveness* stays process-local (the event loop runs),
so a Redis outage never makes every pod restart at once.

Waits between reconnection attempts are exponential with full jitter
(https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/),
so a fleet does not reconnect in lockstep after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import AuthenticationError, AuthorizationError, NoPermissionError, RedisError

from smith_client.errors import ConfigurationError
from smith_client.redis_errors import is_cluster_redirection, smith_error

logger = logging.getLogger("agent_smith.worker")

#: First reconnection delay, seconds (doubled per failure, capped at :data:`BACKOFF_CAP`).
BACKOFF_BASE = 0.2
#: Longest delay between two reconnection attempts, seconds.
BACKOFF_CAP = 3.0
#: Failures that mean "Redis is not answering" (a restart, a freeze, a network cut), not a bug.
REDIS_DOWN_ERRORS: tuple[type[BaseException], ...] = (RedisError, OSError)
#: Redis answers but refuses these credentials: a configuration error, never retried.
REDIS_REFUSED_ERRORS: tuple[type[BaseException], ...] = (AuthenticationError, AuthorizationError, NoPermissionError)

_T = TypeVar("_T")


def backoff_delay(failures: int, base: float = BACKOFF_BASE, cap: float = BACKOFF_CAP) -> float:
    """Seconds to wait after ``failures`` consecutive failures (>= 1): uniform in ``[cap_n / 2, cap_n]``,
    ``cap_n = min(cap, base * 2 ** (failures - 1))``."""
    ceiling = min(cap, base * 2 ** max(0, failures - 1))
    return random.uniform(ceiling / 2, ceiling)


class RedisHealth:
    """Process-local readiness: does Redis answer this worker right now?

    ``ready`` (bool) and ``since`` (``time.monotonic()`` of the last change)
    are read by anything exposing readiness (a heartbeat file, a probe).
    ``failures`` counts consecutive failures, for the backoff.
    """

    def __init__(self) -> None:
        self.ready = False
        self.since = time.monotonic()
        self.failures = 0
        #: Set when the process shuts down: :meth:`until_ok` stops retrying.
        self.stopping = False

    def ok(self) -> None:
        """A Redis command succeeded; "answers again" is logged only after failures were (not at start)."""
        if not self.ready:
            if self.failures:
                logger.info("Redis answers again after %.1f s", time.monotonic() - self.since)
            self.ready, self.since = True, time.monotonic()
        self.failures = 0

    def failed(self, where: str, exc: BaseException) -> float:
        """A Redis command failed in ``where``: mark not ready, log, and return the seconds to back off."""
        self.failures += 1
        if self.ready:
            self.ready, self.since = False, time.monotonic()
        delay = backoff_delay(self.failures)
        log = logger.warning if self.failures <= 3 or self.failures % 20 == 0 else logger.debug
        log("Redis unavailable in %s (%s: %s); retrying in %.2f s", where, type(exc).__name__, exc, delay)
        return delay

    async def until_ok(self, where: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """Await ``call()`` until it succeeds, backing off between Redis failures; return its result.

        Raises ``asyncio.CancelledError`` once :attr:`stopping` is set (the process shuts down) and
        :class:`ConfigurationError` when Redis refuses the credentials or permissions, or answers as a Redis Cluster
        node without ``SMITH_REDIS_CLUSTER`` (a worker exits on it).
        """
        while True:
            try:
                result = await call()
            except REDIS_REFUSED_ERRORS as exc:
                raise ConfigurationError(
                    f"Redis refused the credentials in {where}: {exc}", setting="SMITH_REDIS_URL"
                ) from exc
            except REDIS_DOWN_ERRORS as exc:
                if is_cluster_redirection(exc):  # a cluster, and SMITH_REDIS_CLUSTER unset: never answers otherwise
                    raise smith_error(exc) from exc
                if self.stopping:
                    raise asyncio.CancelledError(f"shutting down while Redis is unavailable in {where}") from exc
                await asyncio.sleep(self.failed(where, exc))
                continue
            self.ok()
            return result
