"""A tenant's limits and its token quota (docs/tenants.md).

An operator sets a tenant's limits (:class:`TenantLimits`) in the hash :meth:`Keys.tenant_limits`, one field per
limit, an absent field meaning its default; they are configuration, with no TTL, until :func:`clear_limits` deletes
them. The turns sent without a tenant (``tenant=None``) have no limits.

The quota: every model call made for a tenant's turn (its replies, its memory's summaries, its sub-agents' calls and
the MCP sampling of its tool calls) adds its prompt + completion tokens to the counter of the current fixed window,
:meth:`Keys.tenant_quota` (window start = ``floor(now / quota_window_seconds) * quota_window_seconds``, UTC epoch
seconds), in the round trip that counts its usage (``smith_worker/ops/usage.py``). Once the counter reaches
``token_quota``, the tenant's sends are refused with :class:`QuotaExceededError` by the submit script itself
(``lua/submit.lua``, no round trip of its own), a queued turn fails at its start and a running one after its
current model step. The check and the count share ``lib.lua``'s ``quota_window``, so both name the same counter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    field_validator,
    model_validator,
)

from smith_client import scripts
from smith_client.errors import InvalidRequestError, QuotaExceededError
from smith_client.keys import Keys
from smith_client.protocol import Operation, call, run
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.validation import check_tenant

#: A quota window when a tenant's limits set none, seconds: a day.
DEFAULT_QUOTA_WINDOW = 24 * 3600
#: The smallest weight: a tenant's pass grows by 1 / weight per admitted turn, which must stay finite
#: (docs/architecture.md, Fair pickup).
MIN_WEIGHT = 0.001
#: The largest weight: with weights in [MIN_WEIGHT, MAX_WEIGHT] a pass step 1 / weight stays at least 1e-6, far above
#: a double's resolution at any pass the ring reaches, so the claim's pass arithmetic stays exact enough to share
#: pickup by weight (``smith_worker/queue/lua/claim.lua``, ``admit_fairly``).
MAX_WEIGHT = 1_000_000.0
#: The largest running cap: more than any fleet runs at once (a bigger cap is no cap).
MAX_RUNNING = 1_000_000
#: The largest token quota: 2**53, the largest whole number a Lua number (a double) holds exactly, so the scripts
#: compare the count with it and reply it as a Redis integer unchanged (docs/tenants.md).
MAX_TOKEN_QUOTA = 2**53
#: The shortest quota window, seconds.
MIN_QUOTA_WINDOW = 60
#: The longest quota window, seconds: 366 days (a window's end must stay a date; a counter's TTL a valid EXPIRE).
MAX_QUOTA_WINDOW = 366 * 24 * 3600
#: Each limit's range (least, most), as :class:`TenantLimits` checks it and :meth:`TenantLimits.from_fields` and the
#: scripts bound a stored value to it (docs/tenants.md, Values out of range).
LIMIT_RANGES: dict[str, tuple[float, float]] = {
    "weight": (MIN_WEIGHT, MAX_WEIGHT),
    "max_running": (1, MAX_RUNNING),
    "token_quota": (1, MAX_TOKEN_QUOTA),
    "quota_window_seconds": (MIN_QUOTA_WINDOW, MAX_QUOTA_WINDOW),
}


class TenantLimits(BaseModel):
    """One tenant's limits, stored field by field in :meth:`Keys.tenant_limits` (a field at its default is not
    stored). An invalid value (an unknown field too) raises :class:`InvalidRequestError` naming the first bad
    field (``field``), however the limits are built: ``TenantLimits(...)``, ``model_validate``,
    :func:`checked_limits` (docs/tenants.md).

    * ``weight``: the tenant's share of turn pickup, relative to the others' (:data:`MIN_WEIGHT` to
      :data:`MAX_WEIGHT`; default 1.0).
    * ``max_running``: the most turns of the tenant running at once (1 to :data:`MAX_RUNNING`; None: no cap).
    * ``token_quota``: the most tokens (prompt + completion, as the model server reports them) the tenant's
      turns may use per window (1 to :data:`MAX_TOKEN_QUOTA`; None: no quota).
    * ``quota_window_seconds``: the length of the quota's fixed window, seconds (60 to :data:`MAX_QUOTA_WINDOW`;
      default 86 400, a day).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    weight: float = Field(1.0, ge=MIN_WEIGHT, le=MAX_WEIGHT, allow_inf_nan=False)
    max_running: int | None = Field(None, ge=1, le=MAX_RUNNING)
    token_quota: int | None = Field(None, ge=1, le=MAX_TOKEN_QUOTA)
    quota_window_seconds: int = Field(DEFAULT_QUOTA_WINDOW, ge=MIN_QUOTA_WINDOW, le=MAX_QUOTA_WINDOW)

    @model_validator(mode="wrap")
    @classmethod
    def _invalid_request(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        """pydantic's errors as one :class:`InvalidRequestError` about the first bad field (as the client's other
        checks of a request raise)."""
        try:
            return handler(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            name = str(first["loc"][0]) if first["loc"] else "limits"
            raise InvalidRequestError(f"tenant limits: {name} {first['msg']}", field=name) from None

    @field_validator("max_running", "token_quota", "quota_window_seconds", mode="before")
    @classmethod
    def _whole(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("must be a whole number")
        return value

    def to_fields(self) -> dict[str, str]:
        """The hash fields of these limits, as strings: ``weight`` always (a tenant's limits, once set, give its
        weight, over the turn workers' ``SMITH_TENANT_WEIGHTS``: docs/architecture.md, Fair pickup), the others when
        not at their default."""
        fields = {name: str(value) for name, value in self.model_dump(exclude_defaults=True).items()}
        return {"weight": str(self.weight), **fields}

    @classmethod
    def from_fields(cls, fields: dict[bytes, bytes]) -> TenantLimits:
        """The limits a hash holds (an ``HGETALL`` reply; unknown fields are skipped, absent ones default). A
        number out of its field's range (written by hand or by an older version) is read as the nearest bound of
        :data:`LIMIT_RANGES`, as the scripts that enforce it read it (docs/tenants.md, Values out of range); a
        value that is no number of its field raises :class:`InvalidRequestError`."""
        known = {name.decode(): value.decode() for name, value in fields.items() if name.decode() in cls.model_fields}
        return cls.model_validate({name: _bounded(name, raw) for name, raw in known.items()})


def _bounded(name: str, raw: str) -> Any:
    """Stored value ``raw`` of limit ``name``: the nearest bound of its :data:`LIMIT_RANGES` when it is a number
    out of that range, else ``raw`` as stored."""
    try:
        value = float(raw)
    except ValueError:
        return raw
    least, most = LIMIT_RANGES[name]
    if math.isnan(value) or least <= value <= most:
        return raw
    return min(max(value, least), most)


def checked_tenant(tenant: Any) -> str:
    """``tenant`` when it is a tenant name (:func:`~smith_client.validation.check_tenant`); else
    :class:`InvalidRequestError` (``field="tenant"``), None included: the turns without a tenant have no limits."""
    name = check_tenant(tenant)
    if name is None:
        raise InvalidRequestError("the turns without a tenant have no limits: name a tenant", field="tenant")
    return name


def checked_limits(limits: Any = None, /, **values: Any) -> TenantLimits:
    """``limits`` when it is a :class:`TenantLimits`, else limits built from ``limits`` (a mapping) or ``values``;
    a bad value raises :class:`InvalidRequestError` naming the field (:class:`TenantLimits`'s validation)."""
    if isinstance(limits, TenantLimits):
        return limits
    return TenantLimits.model_validate(values if limits is None else limits)


def set_limits(keys: Keys, tenant: Any, limits: Any) -> Operation[None]:
    """Operation: replace tenant ``tenant``'s limits with ``limits`` (:meth:`TenantLimits.to_fields`), in one
    transaction. Raises :class:`InvalidRequestError` for a bad tenant or limits."""
    name, checked = checked_tenant(tenant), checked_limits(limits)
    rt = RoundTrip(transaction=True)  # a reader sees the old limits or the new ones, never none
    rt.call("delete", keys.tenant_limits(name))
    rt.call("hset", keys.tenant_limits(name), mapping=checked.to_fields())
    yield from run(rt)


def update_limits(keys: Keys, tenant: Any, changes: Mapping[str, Any]) -> Operation[None]:
    """Operation: change only the limits ``changes`` names (field → value; the field's default resets it)
    in tenant ``tenant``'s hash, the others kept as they are, in one transaction: ``HSET`` of the values given,
    ``HDEL`` of the fields reset, and ``weight`` stored when the hash had none (:meth:`TenantLimits.to_fields`), so
    two updates of different fields at once both stand. Raises :class:`InvalidRequestError` for a bad tenant or
    value, or no change."""
    name = checked_tenant(tenant)
    if not changes:
        raise InvalidRequestError("tenant limits: no change given", field="limits")
    checked = checked_limits(dict(changes))  # every value in range; the fields not given at their default
    written = checked.to_fields()
    stored = {field: written[field] for field in changes if field in written}
    reset = [field for field in changes if field not in written]
    rt = RoundTrip(transaction=True)
    rt.call("hsetnx", keys.tenant_limits(name), "weight", written["weight"])
    if stored:
        rt.call("hset", keys.tenant_limits(name), mapping=stored)
    if reset:
        rt.call("hdel", keys.tenant_limits(name), *reset)
    yield from run(rt)


def read_limits(keys: Keys, tenant: Any) -> Operation[TenantLimits]:
    """Operation: tenant ``tenant``'s limits (all defaults when none are set)."""
    fields: dict[bytes, bytes] = yield from call("hgetall", keys.tenant_limits(checked_tenant(tenant)))
    return TenantLimits.from_fields(fields)


def clear_limits(keys: Keys, tenant: Any) -> Operation[bool]:
    """Operation: delete tenant ``tenant``'s limits (its quota counters expire on their own); True when it had
    some."""
    deleted: int = yield from call("delete", keys.tenant_limits(checked_tenant(tenant)))
    return bool(deleted)


@dataclass(frozen=True)
class QuotaStatus:
    """A tenant's quota as of one read: ``used`` tokens counted in the current window, its ``quota`` (None: none),
    ``reset_at`` (epoch seconds: the window's end) and ``window_seconds``."""

    tenant: str
    used: int
    quota: int | None
    reset_at: float
    window_seconds: int

    @property
    def exceeded(self) -> bool:
        """True when the tenant has a quota and ``used`` reached it."""
        return self.quota is not None and self.used >= self.quota

    def error(self) -> QuotaExceededError:
        """The :class:`QuotaExceededError` of this status."""
        return quota_error(self.tenant, self.used, self.quota or 0, self.reset_at)

    def check(self) -> None:
        """Raise :meth:`error` when :attr:`exceeded`."""
        if self.exceeded:
            raise self.error()


def quota_error(tenant: str, used: int, quota: int, reset_at: float) -> QuotaExceededError:
    """The :class:`QuotaExceededError` of tenant ``tenant`` at ``used`` of ``quota`` tokens until ``reset_at``."""
    at = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(reset_at))
    return QuotaExceededError(
        f"tenant {tenant!r} used {used} of its {quota} tokens in the current window; the window resets at {at}",
        tenant=tenant, used=used, quota=quota, reset_at=float(reset_at),
    )  # fmt: skip


def quota_arguments(keys: Keys, tenant: str | None) -> list[Any]:
    """The arguments of ``lib.lua``'s ``quota_window`` for ``tenant`` ahead of the time: its quota counters'
    prefix (``""`` for None: no tenant, nothing to count or check), the default window and the range of a window
    (seconds), and the largest quota (a stored limit out of range is read as the nearest bound: docs/tenants.md)."""
    prefix = "" if tenant is None else keys.tenant_quota_prefix(tenant)
    return [prefix, DEFAULT_QUOTA_WINDOW, MIN_QUOTA_WINDOW, MAX_QUOTA_WINDOW, MAX_TOKEN_QUOTA]


def queue_quota(rt: RoundTrip, keys: Keys, tenant: str, now: float | None = None) -> Pending[QuotaStatus]:
    """Add to ``rt`` the read of ``tenant``'s :class:`QuotaStatus` at ``now`` (epoch seconds; None: the current
    time): one script call reading its limits and its window's counter together."""
    at = time.time() if now is None else now

    def parse(reply: list[int]) -> QuotaStatus:
        used, quota, reset_at, window = (int(value) for value in reply)
        return QuotaStatus(tenant, used, quota or None, float(reset_at), window)

    args = [*quota_arguments(keys, tenant), at]
    return rt.script(scripts.TENANT_QUOTA, [keys.tenant_limits(tenant)], args, parse=parse)


def quota_status(keys: Keys, tenant: Any, now: float | None = None) -> Operation[QuotaStatus]:
    """Operation: tenant ``tenant``'s :class:`QuotaStatus` (one round trip)."""
    rt = RoundTrip()
    status = queue_quota(rt, keys, checked_tenant(tenant), now)
    yield from run(rt)
    return status.value
