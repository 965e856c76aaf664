"""The plain-Redis anchors of ``make bench``, each run as its own process (``python -m bench.plain_redis``).

* ``arq-worker URL QUEUE POLL``: a plain arq worker with one no-op function
  (``noop``) on queue ``QUEUE``, polling every ``POLL`` seconds (arq's default is 0.5);
  the tool-hop anchor, and an idle anchor while it waits.
* ``publish URL CHANNEL_PREFIX STREAMS COUNT INTERVAL SIZE``: once ``STREAMS``
  subscribers are on ``CHANNEL_PREFIX:0..STREAMS-1``, publishes ``COUNT`` JSON
  messages of about ``SIZE`` bytes to each channel, ``INTERVAL`` seconds apart, from one
  shared client (as a worker's pool does); each message carries its ``ts`` (epoch
  seconds), like a stream event. The raw pub/sub floor of the token latency.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import redis.asyncio as aioredis
from arq.connections import RedisSettings
from arq.worker import Worker


async def noop(ctx: dict[str, object]) -> str:
    """The no-op job."""
    return "ok"


def arq_worker(url: str, queue: str, poll: float) -> None:
    worker = Worker(functions=[noop], queue_name=queue, redis_settings=RedisSettings.from_dsn(url),
                    poll_delay=poll, handle_signals=True)
    worker.run()


async def publish(url: str, prefix: str, streams: int, count: int, interval: float, size: int) -> None:
    client = aioredis.Redis.from_url(url)
    channels = [f"{prefix}:{i}" for i in range(streams)]
    while True:  # wait for every subscriber
        numsub = await client.pubsub_numsub(*channels)
        if all(n >= 1 for _, n in numsub):
            break
        await asyncio.sleep(0.01)
    pad = "x" * max(0, size - 60)

    async def one(channel: str) -> None:
        for seq in range(count):
            await client.publish(channel, json.dumps({"seq": seq, "ts": time.time(), "type": "token", "pad": pad}))
            await asyncio.sleep(interval)

    await asyncio.gather(*(one(channel) for channel in channels))
    await client.aclose()


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "arq-worker":
        arq_worker(args[0], args[1], float(args[2]))
    else:
        asyncio.run(publish(args[0], args[1], int(args[2]), int(args[3]), float(args[4]), int(args[5])))
