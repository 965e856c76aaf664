"""A turn's tenant token quota, as its attempt and its agent loops check it (docs/tenants.md).

The counting is :func:`smith_worker.ops.usage.queue_count`'s (each model call's tokens, in the round trip that
appends its reply); this is the enforcing side, and it reads the quota only in round trips the turn makes anyway:
the attempt's first (:meth:`smith_worker.turn.lifecycle.TurnExecution._begin`), so a queued turn whose tenant went
over its quota fails at its start, before its message joins the history; and each step's reads
(:meth:`smith_worker.agent.loop.AgentLoop._begin_step`), so a running turn fails after the model step that crossed
the quota, before its next model call. A turn without a tenant reads nothing; a tenant found without a quota is not
read again by that attempt (limits set meanwhile apply from its next turn on).
"""

from __future__ import annotations

from smith_client.keys import Keys
from smith_client.roundtrip import Pending, RoundTrip
from smith_client.tenants import QuotaStatus, queue_quota


class TurnQuota:
    """The quota of one turn's ``tenant`` (None: none), shared by every agent loop of its tree in one attempt."""

    def __init__(self, keys: Keys, tenant: str | None) -> None:
        self._keys = keys
        self._tenant = tenant
        self._checking = tenant is not None

    def queue_read(self, rt: RoundTrip) -> Pending[QuotaStatus] | None:
        """Add to ``rt`` the read of the tenant's quota (one script call), or nothing (None) when there is no
        tenant or it had no quota when last read."""
        if not self._checking or self._tenant is None:
            return None
        return queue_quota(rt, self._keys, self._tenant)

    def check(self, read: Pending[QuotaStatus] | None) -> None:
        """After ``rt`` ran: raise :class:`~smith_client.errors.QuotaExceededError` when the tenant's window has
        used up its quota (nothing when ``read`` is None)."""
        if read is None:
            return
        status = read.value
        self._checking = status.quota is not None
        status.check()


#: The quota of the turns without a tenant: nothing to read or check.
NO_QUOTA = TurnQuota(Keys(), None)
