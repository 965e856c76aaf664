"""``SyncSmithClient``: the blocking twin of :class:`~smith_client.client.SmithClient`, for WSGI apps.

Same methods, arguments, events and errors (both inherit
:class:`~smith_client.client.ClientAPI`), run on redis-py's blocking client:
no event loop is started. One instance can be shared by all threads of a WSGI
server (Flask, Django): commands take pooled connections and every ``stream`` /
``follow`` shares the client's one pub/sub connection (read by a daemon thread,
:class:`~smith_client.fanout.SyncFanout`), unsubscribing its channel when the
iterator ends or is closed. Under WSGI every open stream holds a worker thread; fan out to many
browsers with the ASGI relay in ``examples/web/`` instead.
"""

from __future__ import annotations

import redis

from smith_client.client import ClientAPI
from smith_client.connection import connect_sync_redis
from smith_client.runners import SyncRunner


class SyncSmithClient(ClientAPI):
    """Blocking client for one Agent Smith deployment (one Redis database, one key prefix).

    Use ``SyncSmithClient.from_url(url, prefix=...)``, as ``with`` or closing
    with :meth:`close`. Thread-safe.
    """

    _connect = staticmethod(connect_sync_redis)
    _runner = SyncRunner
    redis: redis.Redis
    runner: SyncRunner

    def __enter__(self) -> SyncSmithClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the Redis connections this client created; later calls raise :class:`TransportError`."""
        self.runner.close()
        if self._owns_redis:
            self.redis.close()
            self.redis.connection_pool.disconnect()
