"""Token usage accounting in Redis: what each agent's model calls used, per minute (docs/architecture.md, Token usage).

Every model call a turn worker or a tool worker makes for an agent (its replies, its memory's summaries, the MCP
sampling its tool calls served) is counted in the bucket of the minute it ended in, ``Keys.usage_bucket(m)``
(``m`` = Unix seconds // :data:`USAGE_BUCKET_SECONDS`), a hash whose fields are ``<agent>:<kind>``, ``kind`` one of
:data:`KINDS`: ``requests`` (model calls answered), ``prompt``, ``completion``, ``total`` (the server-reported
tokens, :class:`~smith_client.messages.TokenUsage`). The workers count in the round trip that already stores the
reply (``smith_worker/ops/usage.py``), so counting costs no round trip; each bucket lives ``USAGE_TTL`` (25 h)
after its last count, so a window of up to :data:`USAGE_MAX_WINDOW` (24 h) is read whole (:func:`usage`).

Agent names match ``ID_PATTERN``, which has no ``/``: a turn's tenant (``send(..., tenant=)``, docs/architecture.md,
Tenants) goes in front of the agent, ``<tenant>/<agent>:<kind>``, beside the fields without one (the turns with no
tenant), so the buckets written before tenants stay readable; :func:`parse_field` reads such a field as
``(tenant, agent, kind)``.
"""

from __future__ import annotations

import math
import time
from typing import Any

from smith_client.errors import InvalidRequestError
from smith_client.keys import Keys
from smith_client.messages import TokenUsage
from smith_client.protocol import Operation, run
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.validation import check_id, check_tenant

#: Seconds per usage bucket: windows are read to the minute.
USAGE_BUCKET_SECONDS = 60
#: The longest window :func:`usage` reads, seconds (24 h; under ``USAGE_TTL``).
USAGE_MAX_WINDOW = 24 * 3600
#: The counted kinds, each a field suffix: model calls answered, then the server-reported tokens.
KINDS = ("requests", "prompt", "completion", "total")
#: Separates a tenant from the agent in a field (outside ``ID_PATTERN``, so in no agent name).
TENANT_SEPARATOR = "/"


class AgentUsage(TokenUsage):
    """One agent's counted use over a window: ``requests`` (model calls answered) and the server-reported
    ``prompt``, ``completion`` and ``total`` tokens (:class:`~smith_client.messages.TokenUsage`)."""

    requests: int = 0

    def plus(self, other: TokenUsage, requests: int = 0) -> AgentUsage:
        """This use with ``other``'s tokens and ``requests`` more calls (``other``'s own when it is an
        :class:`AgentUsage`) added."""
        more = other.requests if isinstance(other, AgentUsage) else requests
        return AgentUsage(
            requests=self.requests + more,
            prompt=self.prompt + other.prompt,
            completion=self.completion + other.completion,
            total=self.total + other.total,
        )


def bucket_of(epoch_seconds: float) -> int:
    """The usage bucket (epoch minute) of Unix time ``epoch_seconds``."""
    return int(epoch_seconds // USAGE_BUCKET_SECONDS)


def usage_field(agent: str, kind: str, tenant: str | None = None) -> str:
    """The bucket field counting ``kind`` (one of :data:`KINDS`) for ``agent``: ``<agent>:<kind>``, or
    ``<tenant>/<agent>:<kind>`` for a turn of ``tenant``."""
    return f"{tenant}{TENANT_SEPARATOR}{agent}:{kind}" if tenant else f"{agent}:{kind}"


def parse_field(field: str) -> tuple[str, str, str] | None:
    """``(tenant, agent, kind)`` of a bucket field (tenant ``""``: none); None for a field of an unknown kind."""
    name, _, kind = field.rpartition(":")
    if kind not in KINDS or not name:
        return None
    tenant, _, agent = name.rpartition(TENANT_SEPARATOR)
    return tenant, agent, kind


def window_buckets(window_seconds: float, now: float) -> list[int]:
    """The buckets a window of ``window_seconds`` ending at ``now`` reads: the current minute and the ones
    before it, as many as the window has minutes (rounded up), oldest first."""
    last = bucket_of(now)
    count = max(1, math.ceil(window_seconds / USAGE_BUCKET_SECONDS))
    return list(range(last - count + 1, last + 1))


def check_window(window_seconds: Any) -> float:
    """``window_seconds`` as a float when it is a number in (0, :data:`USAGE_MAX_WINDOW`]; else
    :class:`InvalidRequestError` (``field="window_seconds"``)."""
    ok = isinstance(window_seconds, int | float) and not isinstance(window_seconds, bool)
    if not ok or not 0 < window_seconds <= USAGE_MAX_WINDOW:
        raise InvalidRequestError(
            f"window_seconds must be a number of seconds in (0, {USAGE_MAX_WINDOW}], got {window_seconds!r}",
            field="window_seconds",
        )
    return float(window_seconds)


def sum_by_tenant(
    buckets: list[dict[bytes, bytes]], agent: str | None = None, tenant: str | None = None
) -> dict[str, dict[str, AgentUsage]]:
    """The per-tenant, per-agent sums of ``buckets`` (``HGETALL`` replies): tenant (``""``: the turns with none)
    → agent → :class:`AgentUsage`, in name order; only ``agent``'s and ``tenant``'s when given. Fields of unknown
    kinds are skipped."""
    sums: dict[str, dict[str, dict[str, int]]] = {}
    for bucket in buckets:
        for raw_field, raw_value in bucket.items():
            parsed = parse_field(raw_field.decode())
            if parsed is None:
                continue
            owner, name, kind = parsed
            if (agent is not None and name != agent) or (tenant is not None and owner != tenant):
                continue
            counts = sums.setdefault(owner, {}).setdefault(name, dict.fromkeys(KINDS, 0))
            counts[kind] += int(raw_value)
    return {owner: {name: AgentUsage(**sums[owner][name]) for name in sorted(sums[owner])} for owner in sorted(sums)}


def sum_buckets(
    buckets: list[dict[bytes, bytes]], agent: str | None = None, tenant: str | None = None
) -> dict[str, AgentUsage]:
    """The per-agent sums of ``buckets`` (``HGETALL`` replies), every tenant's counts included unless ``tenant``
    is given; only ``agent``'s when given. Agents in name order; fields of unknown kinds are skipped."""
    sums: dict[str, AgentUsage] = {}
    for per_agent in sum_by_tenant(buckets, agent, tenant).values():
        for name, used in per_agent.items():
            sums[name] = sums.get(name, AgentUsage()).plus(used)
    return {name: sums[name] for name in sorted(sums)}


def _read_window(
    keys: Keys, window_seconds: Any, agent: Any, tenant: Any, now: float | None
) -> Operation[list[dict[bytes, bytes]]]:
    """Operation reading the buckets of the window (one round trip), after checking the arguments."""
    window = check_window(window_seconds)
    if agent is not None:
        check_id(agent, "agent")
    check_tenant(tenant)
    rt = RoundTrip()
    replies: list[Pending[dict[bytes, bytes]]] = [
        rt.call("hgetall", keys.usage_bucket(minute))
        for minute in window_buckets(window, time.time() if now is None else now)
    ]
    yield from run(rt)
    return [reply.value for reply in replies]


def usage(
    keys: Keys, window_seconds: Any = 3600, agent: Any = None, now: float | None = None, tenant: Any = None
) -> Operation[dict[str, AgentUsage]]:
    """Operation of ``usage``: agent name → :class:`AgentUsage` counted over the last ``window_seconds`` (to the
    minute: :func:`window_buckets`), in one round trip; only ``agent`` when given, only the turns of ``tenant``
    when given. Agents with nothing counted are absent. Raises :class:`InvalidRequestError` for a window outside
    (0, 24 h] or a malformed agent or tenant name."""
    buckets = yield from _read_window(keys, window_seconds, agent, tenant, now)
    return sum_buckets(buckets, agent, tenant)


def usage_by_tenant(
    keys: Keys, window_seconds: Any = 3600, agent: Any = None, now: float | None = None, tenant: Any = None
) -> Operation[dict[str, dict[str, AgentUsage]]]:
    """Operation of ``usage_by_tenant``: :func:`usage` grouped by tenant (:func:`sum_by_tenant`); the same rules."""
    buckets = yield from _read_window(keys, window_seconds, agent, tenant, now)
    return sum_by_tenant(buckets, agent, tenant)
