"""Counting model calls in the deployment's usage buckets (docs/architecture.md, Token usage) and, for a turn of a
tenant, in the tenant's quota counter (docs/tenants.md).

The buckets' fields and their reading are :mod:`smith_client.usage`'s; this is the workers' writing side: one
``usage_count.lua`` call per count (its ``HINCRBY``\\ s and the bucket's ``EXPIRE`` together, so a bucket never
lives without its TTL, and the quota counter's ``INCRBY`` and ``EXPIRE``), added to a round trip the caller runs
anyway (a reply's append, a sampling's tree counts).
"""

from __future__ import annotations

import time

from smith_client.keys import QUOTA_TTL_MARGIN, USAGE_TTL, Keys
from smith_client.roundtrip import RoundTrip
from smith_client.scripts import LuaScript
from smith_client.tenants import quota_arguments
from smith_client.usage import KINDS, AgentUsage, bucket_of, usage_field

USAGE_COUNT = LuaScript("usage_count", __package__)


def queue_count(
    rt: RoundTrip, keys: Keys, agent: str, used: AgentUsage, now: float | None = None, tenant: str | None = None
) -> None:
    """Add to ``rt`` the count of ``used`` (``agent``'s model calls and tokens, for a turn of ``tenant``, None:
    none) in the bucket of ``now`` (Unix seconds; None: the current time): one script call incrementing each
    non-zero kind's field (:func:`~smith_client.usage.usage_field`) and giving the bucket ``USAGE_TTL``, and for a
    tenant adding ``used``'s prompt + completion tokens to its current quota window's counter
    (:meth:`Keys.tenant_quota`, TTL its window + ``QUOTA_TTL_MARGIN``). Nothing when ``used`` is all zero."""
    at = time.time() if now is None else now
    pairs: list[str | int] = []
    for kind in KINDS:
        if getattr(used, kind):
            pairs += [usage_field(agent, kind, tenant), getattr(used, kind)]
    if not pairs:
        return
    quota: list[str | int | float] = [*quota_arguments(keys, tenant), at]
    args = [USAGE_TTL, *quota, used.prompt + used.completion, QUOTA_TTL_MARGIN, *pairs]
    tenant_keys = [keys.tenant_limits(tenant)] if tenant else []
    rt.script(USAGE_COUNT, [keys.usage_bucket(bucket_of(at)), *tenant_keys], args)
