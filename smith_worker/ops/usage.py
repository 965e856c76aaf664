"""Counting model calls in the deployment's usage buckets (docs/architecture.md, Token usage).

The buckets' fields and their reading are :mod:`smith_client.usage`'s; this is the workers' writing side: one
``usage_count.lua`` call per count (its ``HINCRBY``\\ s and the bucket's ``EXPIRE`` together, so a bucket never
lives without its TTL), added to a round trip the caller runs anyway (a reply's append, a sampling's tree counts).
"""

from __future__ import annotations

import time

from smith_client.keys import USAGE_TTL, Keys
from smith_client.roundtrip import RoundTrip
from smith_client.scripts import LuaScript
from smith_client.usage import KINDS, AgentUsage, bucket_of, usage_field

USAGE_COUNT = LuaScript("usage_count", __package__)


def queue_count(
    rt: RoundTrip, keys: Keys, agent: str, used: AgentUsage, now: float | None = None, tenant: str | None = None
) -> None:
    """Add to ``rt`` the count of ``used`` (``agent``'s model calls and tokens, for a turn of ``tenant``, None:
    none) in the bucket of ``now`` (Unix seconds; None: the current time): one script call incrementing each
    non-zero kind's field (:func:`~smith_client.usage.usage_field`) and giving the bucket ``USAGE_TTL``. Nothing
    when ``used`` is all zero."""
    counts = [(usage_field(agent, kind, tenant), getattr(used, kind)) for kind in KINDS]
    args: list[str | int] = [USAGE_TTL]
    for field, amount in counts:
        if amount:
            args += [field, amount]
    if len(args) == 1:
        return
    bucket = keys.usage_bucket(bucket_of(time.time() if now is None else now))
    rt.script(USAGE_COUNT, [bucket], args)
