"""Redis failures reach callers as typed errors: :class:`~smith_client.errors.TransportError`.

The clients' runners (:mod:`smith_client.runners`) perform every request through
a function wrapped with :func:`typed_redis_errors`, so a web app catches one base class,
:class:`~smith_client.errors.SmithError`, for everything this package raises.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from redis.exceptions import RedisError

from smith_client.errors import error_from_redis

F = TypeVar("F", bound=Callable[..., Any])


def typed_redis_errors(fn: F) -> F:
    """Re-raise ``redis.exceptions.RedisError`` from ``fn`` as ``TransportError``.

    ``fn`` is a coroutine function, an async generator function or a plain function.
    """
    if not inspect.iscoroutinefunction(fn) and not inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        def function(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except RedisError as exc:
                raise error_from_redis(exc) from exc

        return function  # type: ignore[return-value]

    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def generator(*args: Any, **kwargs: Any) -> Any:
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except RedisError as exc:
                raise error_from_redis(exc) from exc

        return generator  # type: ignore[return-value]

    @functools.wraps(fn)
    async def coroutine(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fn(*args, **kwargs)
        except RedisError as exc:
            raise error_from_redis(exc) from exc

    return coroutine  # type: ignore[return-value]
