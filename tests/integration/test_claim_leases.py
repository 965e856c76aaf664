"""A claim whose reply never reached its worker (Redis ran it after the worker's socket timeout) returns
its jobs after the claim lease, and nothing runs twice (smith_worker/claim.py, lua/claim.lua).

The module runs its own redis-server (frozen with SIGSTOP) and its own fleet: 2 turn + 2 tool workers.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid

import pytest
import redis as sync_redis

from smith_client import SmithClient
from smith_client.errors import SmithTimeoutError, TransportError
from smith_client.keys import Keys
from smith_worker.claim import CLAIM_LEASE_MS, claim_jobs
from tests.conftest import start_workers, wait_for_workers, worker_env, worker_pair
from tests.integration.test_redis_outage import RedisOnPort
from tests.support.scripted_llm import Reply, Script

pytestmark = [pytest.mark.integration]

APP = "tests.support.app:app"
STALL = 10.0  # seconds Redis is stopped while turns are submitted
TURNS = 12
#: Acceptance: every turn runs within 15 s of the stall ending; asserted with room for a loaded machine.
AFTER_STALL_CEILING = 60.0


@pytest.fixture(scope="module")
def lease_redis():
    server = RedisOnPort()
    server.start()
    yield server
    server.stop()


def counted_runs(url: str, prefix: str, label: str) -> int:
    """How many times the ``counted`` tool ran with ``label`` (tests/support/app.py records each run)."""
    client = sync_redis.Redis.from_url(url, socket_timeout=2)
    try:
        return int(client.llen(f"{prefix}:test:counted:{label}"))
    finally:
        client.close()


def counted_turn(scenario, label: str) -> tuple[str, str]:
    """A scripted turn calling the non-idempotent ``counted`` tool once, then answering ``done <label>``."""
    return scenario(Script(Reply.tool_calls([("counted", {"label": label})]), Reply.text(f"done {label}")))


async def test_a_claim_nobody_confirmed_runs_after_its_lease_once(lease_redis, scripted_llm, scenario):
    """Deterministic: a claim made by a client that never confirms it (its reply "lost"), then a fleet."""
    prefix = f"lease{uuid.uuid4().hex[:6]}"
    label = uuid.uuid4().hex[:8]
    key, marker = counted_turn(scenario, label)
    async with SmithClient.from_url(lease_redis.url, prefix=prefix) as client:
        handle = await client.submit(f"{marker} count", conversation_id=f"c-{label}", agent="durable")
        lost = await claim_jobs(client.redis, Keys(prefix), Keys(prefix).turns_queue, free=1, read_limit=100,
                                in_progress_ms=600_000, tokens_held=0, take_aborts=False,
                                claimer="ghost:0")  # fmt: skip
        assert [job.job_id for job in lost.jobs] == [Keys(prefix).turn_job_id(handle.turn_id)]
        claimed_at = time.monotonic()
        env = worker_env(lease_redis.url, prefix, scripted_llm.base_url)
        async with worker_pair(APP, lease_redis.url, prefix, env):
            final = await handle.result(timeout=60)
        waited = time.monotonic() - claimed_at
    assert final.content == f"done {label}"
    assert waited >= CLAIM_LEASE_MS / 1000 - 0.5  # not before the lease ended
    assert scripted_llm.attempts(key) == 2 and counted_runs(lease_redis.url, prefix, label) == 1


async def _submit_through_stall(client: SmithClient, marker: str, label: str) -> str:
    """Submit with a fixed turn id, again after each timeout (an idempotent submit: one turn)."""
    turn_id = f"turn-{label}"
    while True:
        try:
            handle = await client.submit(f"{marker} count", conversation_id=f"c-{label}", agent="durable",
                                         turn_id=turn_id)  # fmt: skip
            return handle.turn_id
        except (TransportError, SmithTimeoutError):
            await asyncio.sleep(0.2)


async def _completed_at(client: SmithClient, turn_id: str) -> float:
    while True:
        try:
            await client.turn(turn_id).result(timeout=None)
            return time.monotonic()
        except (TransportError, SmithTimeoutError):
            await asyncio.sleep(0.2)


async def test_turns_submitted_while_redis_stalls_all_run_once_soon_after(lease_redis, scripted_llm, scenario):
    """Claims sent into a frozen Redis run when it thaws, after their workers gave up on the replies."""
    prefix = f"stall{uuid.uuid4().hex[:6]}"
    # a short socket timeout: more claims are abandoned during the stall, each run by Redis when it thaws
    env = worker_env(lease_redis.url, prefix, scripted_llm.base_url, SMITH_REDIS_SOCKET_TIMEOUT="1")
    procs = start_workers(APP, env, ["turns", "turns", "tools", "tools"], prefix)
    labels = [uuid.uuid4().hex[:8] for _ in range(TURNS)]
    scripts = [counted_turn(scenario, label) for label in labels]
    try:
        await wait_for_workers(lease_redis.url, prefix, len(procs))
        async with SmithClient.from_url(lease_redis.url, prefix=prefix) as client:
            lease_redis.signal(signal.SIGSTOP)
            try:
                submits = [asyncio.create_task(_submit_through_stall(client, marker, label))
                           for (_key, marker), label in zip(scripts, labels, strict=True)]  # fmt: skip
                await asyncio.sleep(STALL)
            finally:
                lease_redis.signal(signal.SIGCONT)
            thawed = time.monotonic()
            turn_ids = await asyncio.gather(*submits)
            done = await asyncio.wait_for(asyncio.gather(*(_completed_at(client, t) for t in turn_ids)), 120)
        assert [p.alive() for p in procs] == [True] * len(procs)
    finally:
        for proc in procs:
            proc.stop()
    slowest = max(done) - thawed
    print(f"slowest turn completed {slowest:.1f} s after the stall ended")
    assert slowest < AFTER_STALL_CEILING
    for (key, _marker), label in zip(scripts, labels, strict=True):
        assert counted_runs(lease_redis.url, prefix, label) == 1  # the tool ran once
        assert scripted_llm.attempts(key) == 2  # one model call before the tool, one after: no re-run
