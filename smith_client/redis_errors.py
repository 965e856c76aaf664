"""Redis failures reach callers as typed errors: :class:`~smith_client.errors.TransportError`,
or :class:`~smith_client.errors.SmithTimeoutError` when no pooled connection came free in time.

The clients' runners (:mod:`smith_client.runners`) perform every request through
a function wrapped with :func:`typed_redis_errors`, so a web app catches one base class,
:class:`~smith_client.errors.SmithError`, for everything this package raises.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError

from smith_client.errors import ConfigurationError, SmithError, SmithTimeoutError, error_from_redis

F = TypeVar("F", bound=Callable[..., Any])

#: A cluster node's redirection or cross-slot refusal, alone or quoted in a pipeline's error: a client without
#: SMITH_REDIS_CLUSTER talking to a cluster (the slot-pinned pools follow these themselves; redis.io, "Redis
#: cluster specification").
_CLUSTER_REDIRECTION = re.compile(r"(?:^|\(')(?:(?:MOVED|ASK) \d+ \S+:\d+(?:'|$)|CROSSSLOT )")


class PoolTimeoutError(RedisConnectionError):
    """Every connection of a capped pool stayed in use for the pool's whole wait (:mod:`smith_client.connection`).

    A ``redis.exceptions.ConnectionError``, so redis-py and the pub/sub reader
    treat it as any failure to get a connection; callers get it as
    :class:`SmithTimeoutError` (:func:`smith_error`).
    """

    def __init__(self, max_connections: int, timeout: float) -> None:
        super().__init__(
            f"no Redis connection came free in {timeout:g} s: all {max_connections} of the pool's connections "
            "were in use (max_connections: SMITH_REDIS_MAX_CONNECTIONS for a client, "
            "SMITH_WORKER_REDIS_MAX_CONNECTIONS for a worker)"
        )
        self.max_connections = max_connections
        self.timeout = timeout


def is_cluster_redirection(exc: BaseException) -> bool:
    """True for a Redis Cluster node's ``MOVED`` / ``ASK`` reply reaching a client that is not in cluster mode."""
    return isinstance(exc, ResponseError) and _CLUSTER_REDIRECTION.search(str(exc)) is not None


def smith_error(exc: BaseException) -> SmithError:
    """The typed error a Redis failure means: :class:`SmithTimeoutError` (operation ``redis.pool``,
    ``budget`` the pool's wait) for :class:`PoolTimeoutError`, :class:`ConfigurationError` (``SMITH_REDIS_CLUSTER``)
    for a cluster's redirection, else :func:`error_from_redis`'s ``TransportError``."""
    if isinstance(exc, PoolTimeoutError):
        return SmithTimeoutError(str(exc), operation="redis.pool", budget=exc.timeout)
    if is_cluster_redirection(exc):
        return ConfigurationError(
            f"{exc}: this Redis is a Redis Cluster node; set SMITH_REDIS_CLUSTER=1 (or cluster=True) on every "
            "worker and client (docs/cluster.md)",
            setting="SMITH_REDIS_CLUSTER",
        )
    return error_from_redis(exc)


def typed_redis_errors(fn: F) -> F:
    """Re-raise ``redis.exceptions.RedisError`` from ``fn`` as its typed error (:func:`smith_error`).

    ``fn`` is a coroutine function, an async generator function or a plain function.
    """
    if not inspect.iscoroutinefunction(fn) and not inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def function(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except RedisError as exc:
                raise smith_error(exc) from exc

        return function  # type: ignore[return-value]

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except RedisError as exc:
                raise smith_error(exc) from exc

        return generator  # type: ignore[return-value]

    @functools.wraps(fn)
    async def coroutine(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except RedisError as exc:
            raise smith_error(exc) from exc

    return coroutine  # type: ignore[return-value]
