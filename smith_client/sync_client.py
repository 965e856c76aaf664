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

from collections.abc import Sequence

import redis

from smith_client.client import DEFAULT_REDIS_URL, ClientAPI
from smith_client.connection import connect_sync_redis
from smith_client.keys import Keys
from smith_client.registry import ServedAgents
from smith_client.runners import SyncRunner


class SyncSmithClient(ClientAPI):
    """Blocking client for one Agent Smith deployment (one Redis database, one key prefix).

    Use ``SyncSmithClient.from_url(url, prefix=...)``, as ``with`` or closing
    with :meth:`close`. Thread-safe.
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = "smith",
        owns_redis: bool = False,
        turn_ttl: int | None = None,
        history_ttl: int | None = None,
    ) -> None:
        self.redis = client
        self.keys = Keys.configured(prefix, turn_ttl, history_ttl)
        self.runner = SyncRunner(client)
        self.served = ServedAgents()
        self._owns_redis = owns_redis

    @classmethod
    def from_url(
        cls,
        redis_url: str = DEFAULT_REDIS_URL,
        *,
        prefix: str = "smith",
        sentinels: str | Sequence[str | tuple[str, int]] | None = None,
        sentinel_master: str | None = None,
        socket_timeout: float | None = None,
        turn_ttl: int | None = None,
        history_ttl: int | None = None,
    ) -> SyncSmithClient:
        """Connect lazily to ``redis_url``; options as :meth:`SmithClient.from_url`."""
        redis = connect_sync_redis(
            redis_url, sentinels=sentinels, sentinel_master=sentinel_master, socket_timeout=socket_timeout
        )
        return cls(redis, prefix=prefix, owns_redis=True, turn_ttl=turn_ttl, history_ttl=history_ttl)

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
