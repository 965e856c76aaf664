"""The one place Redis connections are built, for the client and the workers.

Every process of a deployment (``SmithClient``, turn and tool workers, the
CLI) connects through :func:`connect_redis`, so connection options (timeouts,
TLS, Sentinel) are decided here once.
"""

from __future__ import annotations

from arq.connections import ArqRedis
from redis.asyncio import ConnectionPool

from smith_client.serialization import job_deserializer, job_serializer


def connect_redis(url: str) -> ArqRedis:
    """An :class:`ArqRedis` client for ``url`` (``redis://host:port/db``) using the project's JSON job serializer.

    Connects lazily: no command is sent until the first use.
    """
    return ArqRedis(ConnectionPool.from_url(url), job_serializer=job_serializer, job_deserializer=job_deserializer)
