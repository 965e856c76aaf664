"""Key hygiene: every key the project writes has a TTL or a documented owner (docs/architecture.md, Lifetimes).

:func:`conversation_keys` lists one conversation's keys with their TTLs
(``smith keys --conversation ID`` prints it); :func:`keys_without_ttl` finds
keys of a prefix that would live forever and have no owner, and
:func:`owned_keys_without_ttl` lists the ones without a TTL by design, each with
its documented owner (the arq queues: a queue no worker serves keeps its jobs,
and its key, until a worker of that queue takes them).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import cast

from redis.asyncio import Redis

from smith_client import turn_record as record
from smith_client.keys import Keys


@dataclass(frozen=True)
class KeyInfo:
    """One Redis key: its name, type and TTL in seconds (-1: none)."""

    key: str
    type: str
    ttl: int


#: Owner of an arq queue ZSET (see the table in :mod:`smith_client.keys`).
QUEUE_OWNER = (
    "arq and the workers of this queue: a worker removes a job when it takes it and Redis deletes "
    "the ZSET with its last member; never a TTL (it would drop queued jobs)"
)


#: Owner of the ZSET of paused turns (see the table in :mod:`smith_client.keys`).
PAUSED_OWNER = (
    "the scripts that decide, cancel or end a paused turn and the sweeper (past its deadline) remove its entry, "
    "and Redis deletes the ZSET with its last member; never a TTL (a pause may outlive any)"
)


#: Owner of a tenant's limits hash (see the table in :mod:`smith_client.keys`; docs/tenants.md).
TENANT_LIMITS_OWNER = (
    "the operator: a tenant's limits are configuration (smith tenant set), kept until smith tenant clear "
    "(clear_tenant_limits) deletes them; never a TTL (limits would lapse unseen)"
)


def owned_keys(keys: Keys) -> dict[str, str]:
    """Keys without a TTL by design → who deletes them (the arq queues, the paused turns)."""
    return {keys.turns_queue: QUEUE_OWNER, keys.tools_queue: QUEUE_OWNER, keys.paused: PAUSED_OWNER}


def owned_patterns(keys: Keys) -> dict[str, str]:
    """Glob patterns (``SCAN MATCH``) of the keys without a TTL by design that are one per tenant → their owner."""
    return {keys.tenant_limits("*"): TENANT_LIMITS_OWNER}


def _owned(keys: Keys, name: str) -> bool:
    return name in owned_keys(keys) or any(fnmatchcase(name, pattern) for pattern in owned_patterns(keys))


async def owned_keys_without_ttl(redis: Redis, keys: Keys) -> dict[str, str]:
    """The keys of :func:`owned_keys` and :func:`owned_patterns` that exist and have no TTL → their documented owner.

    A queue listed here while no worker serves it (``smith status``: 0 workers) holds jobs nobody takes.
    """
    found = {name: owner for name, owner in owned_keys(keys).items() if await redis.ttl(name) == -1}
    for pattern, owner in owned_patterns(keys).items():
        async for raw in redis.scan_iter(match=pattern, count=1000):
            if await redis.ttl(raw) == -1:
                found[raw.decode()] = owner
    return found


async def _describe(redis: Redis, names: list[str]) -> list[KeyInfo]:
    infos = []
    for name in sorted(set(names)):
        kind = (await redis.type(name)).decode()
        if kind != "none":
            infos.append(KeyInfo(name, kind, int(await redis.ttl(name))))
    return infos


async def conversation_keys(redis: Redis, keys: Keys, conversation_id: str) -> list[KeyInfo]:
    """Every key of one conversation and of its turns, with TTLs. Scans the turn states (a diagnostic, O(keys))."""
    names = [
        *keys.conversation_state(conversation_id),
        keys.conversation_turns(conversation_id),
        keys.conversation_statuses(conversation_id),
    ]
    async for state_key in redis.scan_iter(match=keys.turn_state("*"), count=1000):
        owner = await cast("Awaitable[bytes | None]", redis.hget(state_key, record.CONVERSATION_ID))
        if owner != conversation_id.encode():
            continue
        for pattern in keys.turn_patterns(keys.turn_id_of_state(state_key.decode())):
            names += [k.decode() async for k in redis.scan_iter(match=pattern, count=1000)]
    return await _describe(redis, names)


async def keys_without_ttl(redis: Redis, keys: Keys) -> list[str]:
    """Keys of this prefix (arq's keys of its jobs included) with no TTL and no documented owner."""
    found: list[str] = []
    for pattern in (keys.all_pattern, keys.arq_pattern):
        async for raw in redis.scan_iter(match=pattern, count=1000):
            name = raw.decode()
            if not _owned(keys, name) and await redis.ttl(name) == -1:
                found.append(name)
    return sorted(found)
