"""Faults of a fleet, on a redis-server of this module's own (frozen with SIGSTOP) and real workers:

* a claim whose reply never reached its worker (Redis ran it after the worker's socket timeout) returns
  its jobs after the claim lease, and nothing runs twice (smith_worker/queue/claim.py, lua/claim.lua);
* the attempt limit counts only what a turn can be blamed for: a worker killed with several turns in
  flight, or a Redis stall longer than a turn's lease, spends none of its attempts (smith_worker/turn/lifecycle.py).
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
from smith_client.turn_record import CRASHES, SHARED_CRASHES
from smith_worker.queue.claim import CLAIM_LEASE_MS, HeldTokens, claim_jobs
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env, worker_pair
from smith_worker.turn.attempt import DEFAULT_LEASE
from tests.conftest import LOGS
from tests.integration.test_redis_outage import RedisOnPort

pytestmark = [pytest.mark.integration]

APP = "tests.support.app:app"
STALL = 10.0  # seconds Redis is stopped while turns are submitted
TURNS = 12
#: Acceptance: every turn runs within 15 s of the stall ending; asserted with room for a loaded machine.
AFTER_STALL_CEILING = 60.0


@pytest.fixture(scope="module")
def lease_redis():  # the module's own Redis: its tests freeze it
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
                                in_progress_ms=600_000, tokens_held=HeldTokens(), take_aborts=False,
                                claimer="ghost:0", capset=None)  # fmt: skip
        assert [job.job_id for job in lost.jobs] == [Keys(prefix).turn_job_id(handle.turn_id)]
        claimed_at = time.monotonic()
        env = worker_env(lease_redis.url, prefix, scripted_llm.base_url)
        async with worker_pair(APP, lease_redis.url, prefix, env, log_dir=LOGS):
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
    procs = start_workers(APP, env, ["turns", "turns", "tools", "tools"], prefix, log_dir=LOGS)
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


# ---- the attempt limit: SMITH_TURN_MAX_ATTEMPTS=1, so any attempt counted fails the turn ------------


def slow_text(scenario, tag: str) -> tuple[str, str]:
    """A turn streaming its answer for ~8 s, long enough to be in flight when a fault lands."""
    return scenario(Reply.text(f"done {tag} " + "word " * 31, chunk_size=8, delay=0.4))  # 21 chunks


async def _running(client: SmithClient, scripted_llm, handles, keys: list[str]) -> None:
    """Wait until every turn runs and has asked the model."""
    async with asyncio.timeout(30):
        for handle, key in zip(handles, keys, strict=True):
            while (await handle.status()) != "running" or scripted_llm.attempts(key) < 1:
                await asyncio.sleep(0.05)


async def test_a_worker_killed_with_several_turns_in_flight_spends_none_of_their_attempts(
    lease_redis, scripted_llm, scenario
):
    prefix = f"shared{uuid.uuid4().hex[:6]}"
    env = worker_env(lease_redis.url, prefix, scripted_llm.base_url, SMITH_TURN_MAX_ATTEMPTS="1")
    procs = start_workers(APP, env, ["turns"], prefix, log_dir=LOGS)
    try:
        await wait_for_workers(lease_redis.url, prefix, 1)
        async with SmithClient.from_url(lease_redis.url, prefix=prefix) as client:
            turns = [slow_text(scenario, str(i)) for i in range(3)]
            handles = [await client.submit(f"{marker} talk", conversation_id=f"c-{key}", agent="plain")
                       for key, marker in turns]  # fmt: skip
            await _running(client, scripted_llm, handles, [key for key, _ in turns])
            procs += start_workers(APP, env, ["turns"], f"{prefix}-b", log_dir=LOGS)  # takes the turns over
            await wait_for_workers(lease_redis.url, prefix, 2)
            procs[0].signal(signal.SIGKILL)
            finals = [await handle.result(timeout=90) for handle in handles]
            states = [await handle.state() for handle in handles]
    finally:
        for proc in procs:
            proc.stop()
    assert [final.content.split()[:2] for final in finals] == [["done", str(i)] for i in range(3)]
    for state in states:  # the dead worker ran three turns: bad luck for each, not counted
        assert (state.get(CRASHES, "0"), state[SHARED_CRASHES], state["attempt"]) == ("0", "1", "2")


async def test_a_redis_stall_longer_than_the_lease_spends_no_attempt(lease_redis, scripted_llm, scenario):
    prefix = f"stall{uuid.uuid4().hex[:6]}"
    env = worker_env(lease_redis.url, prefix, scripted_llm.base_url, SMITH_TURN_MAX_ATTEMPTS="1")
    procs = start_workers(APP, env, ["turns", "turns"], prefix, log_dir=LOGS)  # one runs the turn, the other sweeps too
    try:
        await wait_for_workers(lease_redis.url, prefix, len(procs))
        async with SmithClient.from_url(lease_redis.url, prefix=prefix) as client:
            key, marker = slow_text(scenario, "stalled")
            handle = await client.submit(f"{marker} talk", conversation_id=f"c-{key}", agent="plain")
            await _running(client, scripted_llm, [handle], [key])
            lease_redis.signal(signal.SIGSTOP)
            try:
                await asyncio.sleep(DEFAULT_LEASE * 1.5)  # every lease runs out
            finally:
                lease_redis.signal(signal.SIGCONT)
            final = await _completed_result(client, handle.turn_id)
            state = await handle.state()
    finally:
        for proc in procs:
            proc.stop()
    assert final.content.startswith("done stalled")
    assert state.get(CRASHES, "0") == "0" and state.get(SHARED_CRASHES, "0") == "0"


async def _completed_result(client: SmithClient, turn_id: str):
    deadline = time.monotonic() + 90
    while True:
        try:
            return await client.turn(turn_id).result(timeout=60)
        except (TransportError, SmithTimeoutError):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)
