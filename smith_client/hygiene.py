"""Key hygiene: every key the project writes has a TTL or a documented owner (DESIGN.md §8).

:func:`conversation_keys` lists one conversation's keys with their TTLs
(``smith keys --conversation ID`` prints it); :func:`keys_without_ttl` finds
keys of a prefix that would live forever and have no owner.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
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


def owned_keys(keys: Keys) -> set[str]:
    """Keys without a TTL by design, and who deletes them: arq removes a queue's members at job end,
    and Redis deletes a ZSET when its last member goes."""
    return {keys.turns_queue, keys.tools_queue}


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
    """Keys of this prefix (arq's keys of its jobs and arq's abort set included) with no TTL and no documented owner."""
    owned = owned_keys(keys)
    found = [keys.arq_abort_set] if await redis.ttl(keys.arq_abort_set) == -1 else []
    for pattern in (keys.all_pattern, keys.arq_pattern):
        async for raw in redis.scan_iter(match=pattern, count=1000):
            name = raw.decode()
            if name not in owned and await redis.ttl(name) == -1:
                found.append(name)
    return sorted(found)
