"""Which skills are active in a conversation: the record the client writes and workers read.

See docs/architecture.md, Skills.

The record is ``Keys.conversation_skills(c)``: a Redis list of declared skill
names in activation order, each at most once. Activation is per conversation,
not per worker, because the next turn may run on another worker; every turn
worker reads the list once per step, so an activation made while a turn runs
takes effect at that turn's next step.

Lifetime: the conversation's history's (``Keys.history_ttl`` after the last
activation, refreshed by every step of a turn), and a conversation clear
deletes it with the history. Deactivating the last skill deletes the key.
"""

from __future__ import annotations

import logging
from typing import Any

from redis.asyncio import Redis

from smith_client import scripts
from smith_client.errors import InvalidRequestError, UnknownSkillError
from smith_client.keys import Keys
from smith_client.protocol import Operation, call, run_script
from smith_client.registry import read_served
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.runners import AsyncRunner
from smith_client.validation import check_id

logger = logging.getLogger("agent_smith")

#: Longest declared skill name accepted, in characters.
SKILL_NAME_MAX = 200


def skill_name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a declared skill name, or None: it must be a ``str`` of
    1-:data:`SKILL_NAME_MAX` printable characters (it heads a prompt section)."""
    if not isinstance(name, str):
        return f"a skill name must be a string, got {type(name).__name__}"
    if not name or len(name) > SKILL_NAME_MAX:
        return f"a skill name must have 1-{SKILL_NAME_MAX} characters, got {len(name)}"
    if not name.isprintable():
        return f"skill name {name!r} contains a control character"
    return None


def check_skill_name(name: Any) -> str:
    """``name`` if it is a valid skill name; raises :class:`InvalidRequestError` (``field="name"``) otherwise."""
    problem = skill_name_problem(name)
    if problem is not None:
        raise InvalidRequestError(problem, field="name")
    return str(name)


def activate(keys: Keys, conversation_id: str, name: str) -> Operation[bool]:
    """Operation: append ``name`` to the conversation's active skills (a no-op if active); True if it was added.

    The list lives ``keys.history_ttl`` seconds. Atomic: concurrent activations never duplicate a name.
    """
    key = keys.conversation_skills(conversation_id)
    return (yield from run_script(scripts.ACTIVATE_SKILL, (key,), (name, keys.history_ttl), parse=bool))


def deactivate(keys: Keys, conversation_id: str, name: str) -> Operation[bool]:
    """Operation: remove ``name`` from the conversation's active skills.

    False (and nothing changes) if it was not active.
    """
    return (yield from call("lrem", keys.conversation_skills(conversation_id), 0, name, parse=bool))


def read_active(keys: Keys, conversation_id: str) -> Operation[list[str]]:
    """Operation: the conversation's active skill names, in activation order."""
    return (yield from call("lrange", keys.conversation_skills(conversation_id), 0, -1, parse=decode))


async def active(redis: Redis, keys: Keys, conversation_id: str) -> list[str]:
    """The conversation's active skill names, in activation order."""
    return await AsyncRunner(redis).run(read_active(keys, conversation_id))


def activate_checked(keys: Keys, conversation_id: Any, name: Any) -> Operation[None]:
    """Operation of the clients' ``activate_skill`` (see :meth:`SmithClient.activate_skill`)."""
    check_id(conversation_id, "conversation_id")
    check_skill_name(name)
    served = yield from read_served(keys, "skills")
    if served is None:
        logger.warning(
            "no turn worker is registered under prefix %r: skill %r is activated unchecked", keys.prefix, name
        )
    elif name not in served:
        raise UnknownSkillError(
            f"no live worker serves skill {name!r} (served: {sorted(served)})", skill_name=name, known=sorted(served)
        )
    yield from activate(keys, conversation_id, name)


def deactivate_checked(keys: Keys, conversation_id: Any, name: Any) -> Operation[None]:
    """Operation of the clients' ``deactivate_skill``."""
    check_id(conversation_id, "conversation_id")
    check_skill_name(name)
    yield from deactivate(keys, conversation_id, name)


def active_checked(keys: Keys, conversation_id: Any) -> Operation[list[str]]:
    """Operation of the clients' ``active_skills``."""
    check_id(conversation_id, "conversation_id")
    return (yield from read_active(keys, conversation_id))


def read_in(rt: RoundTrip, keys: Keys, conversation_id: str) -> Pending[list[str]]:
    """Add the read of the active skills (and a refresh of their TTL, ``keys.history_ttl``) to ``rt``; the
    handle gets the names in activation order. Lets a turn worker read the skills in the same round trip as
    its other per-step reads."""
    key = keys.conversation_skills(conversation_id)
    names = rt.call("lrange", key, 0, -1, parse=decode)
    rt.call("expire", key, keys.history_ttl)
    return names


def decode(raw: list[bytes | str]) -> list[str]:
    """Names from an ``LRANGE`` reply."""
    return [item.decode() if isinstance(item, bytes) else item for item in raw]
