"""The one place Redis connections are built, for the client and the workers.

Every process of a deployment (``SmithClient``, turn and tool workers, the
CLI) connects through :func:`connect_redis`, and ``SyncSmithClient`` through
:func:`connect_sync_redis`, so connection options (timeouts,
TLS, Sentinel) are decided here once.
"""

from __future__ import annotations

import redis
from arq.connections import ArqRedis
from redis.asyncio import ConnectionPool

from smith_client.serialization import job_deserializer, job_serializer


def connect_redis(url: str) -> ArqRedis:
    """An :class:`ArqRedis` client for ``url`` (``redis://host:port/db``) using the project's JSON job serializer.

    Connects lazily: no command is sent until the first use.
    """
    return ArqRedis(ConnectionPool.from_url(url), job_serializer=job_serializer, job_deserializer=job_deserializer)


def connect_sync_redis(url: str) -> redis.Redis:
    """A blocking :class:`redis.Redis` for ``url``, for :class:`SyncSmithClient`.

    Its connection pool is thread-safe (one connection per command in flight).
    Connects lazily: no command is sent until the first use.
    """
    return redis.Redis(connection_pool=redis.ConnectionPool.from_url(url))
