"""What tests read of the turns queue: turn jobs wait for admission on their tenant's waiting ZSET before they
join the arq queue (docs/architecture.md, Fair pickup)."""

from __future__ import annotations

from typing import Any

from smith_client.keys import Keys


def waiting_key(keys: Keys, tenant: str | None = None) -> str:
    """The ZSET of ``tenant``'s turn jobs waiting for admission (None: turns without a tenant)."""
    return Keys.tenant_waiting(keys.turns_queue, tenant)


def turn_queue_keys(keys: Keys, tenant: str | None = None) -> list[str]:
    """The keys a test that leaves turns queued (no worker) deletes: the queue, the ring, ``tenant``'s waiting ZSET."""
    return [keys.turns_queue, Keys.tenant_ring(keys.turns_queue), waiting_key(keys, tenant)]


async def queued_turn_jobs(redis: Any, keys: Keys) -> int:
    """Turn jobs on the arq queue plus those waiting for admission, every tenant's."""
    tenants = await redis.zrange(Keys.tenant_ring(keys.turns_queue), 0, -1)
    waiting = [await redis.zcard(waiting_key(keys, tenant.decode())) for tenant in tenants]
    return int(await redis.zcard(keys.turns_queue)) + sum(waiting)
