"""Tenant token quotas on real workers (docs/tenants.md): counted from the model's reported usage across the fleet,
refused at send once used up, failing a queued turn at its start and a running turn after the step that crossed
the quota, and kept in Redis across a worker's SIGKILL and restart."""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest

from smith_client import QuotaExceededError, SmithClient, TenantLimits
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = pytest.mark.integration

#: Generous ceilings (a loaded 2-core machine), seconds.
TURN_TIMEOUT = 60


def tenant_name(label: str) -> str:
    return f"{label}-{uuid.uuid4().hex[:8]}"


async def test_a_running_turn_stops_after_the_step_crossing_the_quota_and_the_next_ones_fail_typed(
    workers, client, scenario, scripted_llm
):
    acme, beta = tenant_name("acme"), tenant_name("beta")
    await client.set_tenant_limits(acme, TenantLimits(token_quota=100))
    # step 1 reports 60 + 50 tokens (over 100) and asks for a tool; the step's tool round runs, no step 2
    key, crossing = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})], usage=(60, 50)),
                                    Reply.text("never asked", usage=(1, 1))))  # fmt: skip
    later_key, later = scenario(Script(Reply.text("never asked either")))
    conversation = f"quota-{acme}"
    running = await client.submit(f"{crossing} go", conversation_id=conversation, tenant=acme)
    queued = await client.submit(f"{later} then", conversation_id=conversation, tenant=acme)  # behind it, accepted
    events = [e async for e in client.follow(running.turn_id, timeout=TURN_TIMEOUT)]
    assert [e.type for e in events if e.type in ("tool.result", "turn.failed")] == ["tool.result", "turn.failed"]
    error = events[-1].error()
    assert isinstance(error, QuotaExceededError) and (error.tenant, error.used, error.quota) == (acme, 110, 100)
    assert error.reset_at > time.time()
    assert scripted_llm.attempts(key) == 1  # no model call after the crossing step
    with pytest.raises(QuotaExceededError):  # the queued turn fails at its start, before any model call
        await queued.result(timeout=TURN_TIMEOUT)
    assert scripted_llm.attempts(later_key) == 0 and await queued.status() == "failed"

    started = time.monotonic()
    with pytest.raises(QuotaExceededError) as refused:  # the next send fails fast, at the client
        await client.send(f"{later} again", conversation_id=f"{conversation}-2", tenant=acme)
    assert time.monotonic() - started < 5 and refused.value.used == 110
    assert not await client.redis.exists(client.keys.conversation_turns(f"{conversation}-2"))  # nothing written

    _, plain = scenario(Script(Reply.text("fine", usage=(500, 500))))
    reply = await client.send(f"{plain} other", conversation_id=f"quota-{beta}", tenant=beta, timeout=TURN_TIMEOUT)
    assert reply.content == "fine"  # another tenant, even without limits, is unaffected
    status = await client.tenant_quota(acme)
    assert (status.used, status.quota) == (110, 100) and (await client.tenant_quota(beta)).used == 1000
    await client.clear_tenant_limits(acme)


async def test_the_count_survives_a_turn_worker_killed_and_restarted(redis_url, scripted_llm, scenario):
    """Its own turn worker (text-only turns need no tool worker), so the session's fleet is never killed."""
    prefix, acme, beta = f"qr{uuid.uuid4().hex[:8]}", tenant_name("acme"), tenant_name("beta")
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    _, marker = scenario(Script(Reply.text("once", usage=(40, 20))))
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        await client.set_tenant_limits(acme, TenantLimits(token_quota=50, quota_window_seconds=3600))
        (first,) = start_workers("tests.support.app:app", env, ["turns"], f"{prefix}-a", log_dir=LOGS)
        try:
            await wait_for_workers(redis_url, prefix, 1)
            reply = await client.send(f"{marker} go", conversation_id="c1", tenant=acme, timeout=TURN_TIMEOUT)
            assert reply.content == "once"  # a final answer crossing the quota completes
        finally:
            first.signal(signal.SIGKILL)
        async with asyncio.timeout(TURN_TIMEOUT):
            while first.alive():
                await asyncio.sleep(0.05)
        assert (await client.tenant_quota(acme)).used == 60  # in Redis, not in the dead worker
        (second,) = start_workers("tests.support.app:app", env, ["turns"], f"{prefix}-b", log_dir=LOGS)
        try:
            await wait_for_workers(redis_url, prefix, 1)
            with pytest.raises(QuotaExceededError) as refused:
                await client.send(f"{marker} again", conversation_id="c2", tenant=acme, timeout=TURN_TIMEOUT)
            assert (refused.value.used, refused.value.quota) == (60, 50)
            _, other = scenario(Script(Reply.text("served")))
            served = await client.send(f"{other} go", conversation_id="c3", tenant=beta, timeout=TURN_TIMEOUT)
            assert served.content == "served"
        finally:
            second.stop()
            found = await client.redis.keys(f"{prefix}:*") + await client.redis.keys(f"arq:*:{prefix}:*")
            await client.redis.delete(*found)
