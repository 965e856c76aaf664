"""The app the soak's workers serve (``bench.soak_app:app``): one agent and one tool with a side effect to count.

``record_effect(label)`` is not idempotent: each execution appends
``<label>|<worker id>`` to the list :func:`effects_key` (one key with a TTL, about
40 bytes per call, read by ``bench/soak.py`` at the end), then works
:data:`WORK_SECONDS`. The runtime must never run one call twice,
even when its tool worker is killed mid-call, so a label recorded twice is a
duplicated side effect.
"""

from __future__ import annotations

import asyncio
import os

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from smith_worker import SmithApp, ToolContext

#: Seconds a call works after recording itself (so a kill -9 of its tool worker can land mid-call).
WORK_SECONDS = 0.3
#: Lifetime of the effects list after its last append, seconds (every key has a TTL).
EFFECTS_TTL = 3600

app = SmithApp()
_redis: aioredis.Redis | None = None


def effects_key(prefix: str) -> str:
    """The list of executions of ``record_effect`` under key prefix ``prefix``."""
    return f"{prefix}:soak:effects"


def _connection() -> aioredis.Redis:
    """This process's Redis client, created on the worker's event loop at the first call.

    No retries: redis-py re-sending an RPUSH whose reply was lost (a timeout while
    Redis is stopped) would record one execution twice, a duplicate the runtime
    did not cause.
    """
    global _redis
    if _redis is None:
        _redis = aioredis.Redis.from_url(os.environ["SMITH_REDIS_URL"], socket_timeout=5.0, retry=Retry(NoBackoff(), 0))
    return _redis


@app.tool(timeout=10.0)
async def record_effect(label: str, ctx: ToolContext) -> str:
    """Record one execution of call `label`, then work a moment."""
    key = effects_key(os.environ.get("SMITH_PREFIX", "smith"))
    async with _connection().pipeline(transaction=True) as pipe:
        pipe.rpush(key, f"{label}|{ctx.worker_id}")
        pipe.expire(key, EFFECTS_TTL)
        await pipe.execute()
    await asyncio.sleep(WORK_SECONDS)
    return f"recorded {label}"


app.agent("soak", system_prompt="You are the soak test's agent.", tools=[record_effect])
