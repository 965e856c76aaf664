"""The Lua scripts of the turn protocol, called with ``EVALSHA``: those the client calls (or shares with the
workers) in ``smith_client/lua/*.lua``, the others next to the worker code that calls them.

Each script is read once per process (with ``smith_client/lua/lib.lua``, the helpers they
all share, put in front) and named by its SHA1. A worker module declares its own scripts with
:class:`LuaScript` and its package (``LuaScript("begin", __package__)`` reads ``<package>/lua/begin.lua``);
every script declared in a process is loaded together. Calls send ``EVALSHA``; a
``NOSCRIPT`` reply (a Redis restart or ``SCRIPT FLUSH`` emptied the script
cache) loads every script with ``SCRIPT LOAD`` and repeats the call once.
Several calls in one round trip go through :class:`~smith_client.roundtrip.RoundTrip`,
with the same repair, so no call sends a script's text each time and nothing sends
``SCRIPT EXISTS`` before a pipeline (as redis-py's ``Script`` objects do). Every key a script touches comes in
``KEYS``, built by :class:`~smith_client.keys.Keys`; no script builds a key name,
except that ``claim.lua`` appends the job ids it reads from a queue to arq's key
prefixes, which it is given by :meth:`~smith_client.keys.Keys.arq_claim_prefixes`, and
the enqueue (``lib.lua``) appends the digests of the live capability sets it reads to
the prefixes of :meth:`~smith_client.keys.Keys.capability_prefixes`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError


def _read(package: str, name: str) -> str:
    return resources.files(package).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


class LuaScript:
    """One script: ``<package>/lua/<name>.lua`` (``package`` defaults to ``smith_client``) after ``lib.lua``.

    ``name`` is its file name without ``.lua``, unique across packages.
    """

    def __init__(self, name: str, package: str = __package__) -> None:
        self.name = name
        self.source = _read(__package__, "lib") + "\n" + _read(package, name)
        self.sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        _ALL.append(self)

    async def __call__(self, redis: Any, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        """Run the script (``EVALSHA``; on ``NOSCRIPT`` load all scripts and retry once)."""
        try:
            return await redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            await load_all(redis)
            return await redis.evalsha(self.sha, len(keys), *keys, *args)

    def call_sync(self, redis: Any, keys: Sequence[str], args: Sequence[Any] = ()) -> Any:
        """:meth:`__call__` on a blocking :class:`redis.Redis` (:class:`~smith_client.sync_client.SyncSmithClient`)."""
        try:
            return redis.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            load_all_sync(redis)
            return redis.evalsha(self.sha, len(keys), *keys, *args)


_ALL: list[LuaScript] = []


async def load_all(redis: Any) -> None:
    """``SCRIPT LOAD`` every script, in one round trip (worker start-up, or after ``NOSCRIPT``)."""
    async with redis.pipeline(transaction=False) as pipe:
        for script in _ALL:
            pipe.script_load(script.source)
        await pipe.execute()


def load_all_sync(redis: Any) -> None:
    """:func:`load_all` on a blocking :class:`redis.Redis`."""
    with redis.pipeline(transaction=False) as pipe:
        for script in _ALL:
            pipe.script_load(script.source)
        pipe.execute()


PUBLISH = LuaScript("publish")
PUBLISH_BATCH = LuaScript("publish_batch")
SUBMIT = LuaScript("submit")
CANCEL = LuaScript("cancel")
ACTIVATE_SKILL = LuaScript("activate_skill")
ENQUEUE = LuaScript("enqueue")
CLEAR = LuaScript("clear")
DECIDE = LuaScript("decide")
TENANT_QUOTA = LuaScript("tenant_quota")
