"""The one place Redis connections are built, for the client and the workers.

Every process of a deployment (``SmithClient``, turn and tool workers, the
CLI) connects through :func:`connect_redis`, so connection options (timeouts,
TLS, Sentinel) are decided here once.

Every connection is bounded (issue 8): a connect or a command that gets no
answer within ``socket_timeout`` seconds raises ``redis.exceptions.TimeoutError``
(a ``TransportError`` for callers) instead of blocking forever on a frozen
server, and a connection idle for :data:`HEALTH_CHECK_INTERVAL` seconds is
PINGed before it is used again, so one broken by a Redis restart is replaced
rather than failing the next command. Blocking reads (pub/sub ``get_message``)
pass their own, shorter bound.
"""

from __future__ import annotations

import os
from typing import Any

from arq.connections import ArqRedis
from redis.asyncio import ConnectionPool

from smith_client.errors import ConfigurationError
from smith_client.serialization import job_deserializer, job_serializer

#: Default bound on one Redis connect or command, seconds (``SMITH_REDIS_SOCKET_TIMEOUT``).
DEFAULT_SOCKET_TIMEOUT = 5.0
#: Seconds a pooled connection may sit idle before it is checked with PING on its next use.
HEALTH_CHECK_INTERVAL = 10


def socket_timeout_from_env() -> float:
    """``SMITH_REDIS_SOCKET_TIMEOUT`` in seconds (default :data:`DEFAULT_SOCKET_TIMEOUT`).

    Raises :class:`ConfigurationError` unless it is a positive number.
    """
    raw = os.environ.get("SMITH_REDIS_SOCKET_TIMEOUT") or ""
    try:
        value = float(raw) if raw else DEFAULT_SOCKET_TIMEOUT
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ConfigurationError(
            f"SMITH_REDIS_SOCKET_TIMEOUT must be a positive number of seconds, got {raw!r}",
            setting="SMITH_REDIS_SOCKET_TIMEOUT",
        )
    return value


class ConnectOutsideLockPool(ConnectionPool):
    """redis-py's asyncio :class:`ConnectionPool`, connecting new connections outside the pool's lock.

    redis-py 5 (pinned below 6 by arq 0.28) connects while holding the pool
    lock, so with Redis frozen N concurrent callers queue behind each other's
    connect timeouts (N x ``socket_timeout``; 17 s seen with 20 callers and a
    5 s timeout). Connecting outside the lock, as redis-py's own
    ``BlockingConnectionPool`` does, bounds each caller by one timeout.
    """

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        """A connected connection from the pool (see the class docstring)."""
        async with self._lock:
            connection = self.get_available_connection()
        try:
            await self.ensure_connection(connection)
        except BaseException:
            await self.release(connection)
            raise
        return connection


def connect_redis(url: str, *, socket_timeout: float | None = None) -> ArqRedis:
    """An :class:`ArqRedis` client for ``url`` (``redis://host:port/db``) using the project's JSON job serializer.

    ``socket_timeout`` (seconds; default ``SMITH_REDIS_SOCKET_TIMEOUT``, else
    5 s) bounds each connect and each command. Connects lazily: no command is
    sent until the first use.
    """
    timeout = socket_timeout if socket_timeout is not None else socket_timeout_from_env()
    pool = ConnectOutsideLockPool.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        socket_keepalive=True,
        health_check_interval=HEALTH_CHECK_INTERVAL,
    )
    return ArqRedis(pool, job_serializer=job_serializer, job_deserializer=job_deserializer)
