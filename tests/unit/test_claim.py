"""Claiming jobs in one round trip (smith_worker/queue/claim.py, lua/claim.lua) on the session's real redis-server.

The script is checked against what arq 0.28 does per job (in-progress key, try counter, abort
request, expired record, deferred jobs, concurrent claimers), then a real SmithWorker runs claimed
jobs through arq's own ``run_job``: the claim's answers must replace run_job's first transaction
exactly, so an arq upgrade that changes it fails here.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest
from arq.constants import abort_jobs_ss
from arq.jobs import Job, serialize_job
from arq.worker import Retry, func
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from smith_client.enqueue import Enqueued, enqueue_job, enqueue_unless
from smith_client.keys import ARQ_RETRY_TTL, Keys, now_ms
from smith_client.serialization import job_deserializer, job_serializer
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.local.processes import free_port
from smith_worker.ops.registration import CapabilitySet, register_worker
from smith_worker.queue.claim import (
    CLAIM_LEASE_MS,
    ClaimedJob,
    ClaimHandOverError,
    HeldTokens,
    PrefetchedPipeline,
    claim_jobs,
    confirm_claims,
)
from smith_worker.queue.worker import SmithWorker, build_worker
from smith_worker.tools.waiter import abort_job

IN_PROGRESS_MS = 60_000


@pytest.fixture
async def redis(redis_url):
    client = Redis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def keys() -> Keys:
    return Keys(f"cl{uuid.uuid4().hex[:8]}")


def jid(keys: Keys, name: str) -> str:
    """A job id of this test's own: arq's per-job keys are global, and other tests' jobs may hold the same name."""
    return f"{keys.prefix}:{name}"


def names(got, keys: Keys) -> list[str]:
    return [job.job_id.removeprefix(f"{keys.prefix}:") for job in got.jobs]


async def enqueue(redis: Redis, keys: Keys, name: str, *, score: int | None = None, function: str = "probe",
                  record: bool = True, wake: bool = False) -> None:  # fmt: skip
    """Queue a job as arq's enqueue_job does (its record, then the queue entry), optionally with a wake-up token."""
    job_id = jid(keys, name)
    if record:
        await redis.psetex(keys.arq_job(job_id), 86_400_000,
                           serialize_job(function, (), {}, None, now_ms(), serializer=job_serializer))  # fmt: skip
    await redis.zadd(keys.tools_queue, {job_id: now_ms() if score is None else score})
    if wake:
        await redis.rpush(Keys.wake_list(keys.tools_queue), "1")


async def claim(redis: Redis, keys: Keys, *, free: int = 10, held: int = 0, held_own: int = 0,
                take_aborts: bool = False, claimer: str = "w:0", capset: str | None = "v1", ended=()):  # fmt: skip
    return await claim_jobs(redis, keys, keys.tools_queue, free=free, read_limit=1000, in_progress_ms=IN_PROGRESS_MS,
                            tokens_held=HeldTokens(held, held_own), take_aborts=take_aborts, claimer=claimer,
                            capset=capset, ended=ended)  # fmt: skip


async def lapse(redis: Redis, keys: Keys, name: str) -> None:
    """Move the lease end of ``name``'s unconfirmed claim into the past (as CLAIM_LEASE_MS passing would)."""
    key = keys.arq_in_progress(jid(keys, name))
    _, _, claimer = (await redis.get(key)).decode().split(":", 2)
    await redis.set(key, f"claim:{now_ms() - 1}:{claimer}", keepttl=True)


async def test_a_claim_marks_ready_jobs_in_progress_counts_their_try_and_returns_their_records(redis, keys):
    await enqueue(redis, keys, "j1", score=now_ms() - 20)
    await enqueue(redis, keys, "j2", score=now_ms() - 10)
    got = await claim(redis, keys)
    assert names(got, keys) == ["j1", "j2"]  # queue order
    for job in got.jobs:
        assert job.record == await redis.get(keys.arq_job(job.job_id))
        assert job.job_try == 1 and not job.aborted
        assert job.score == int(await redis.zscore(keys.tools_queue, job.job_id))
        assert 0 < await redis.pttl(keys.arq_in_progress(job.job_id)) <= IN_PROGRESS_MS
        assert 0 < await redis.ttl(keys.arq_retry(job.job_id)) <= ARQ_RETRY_TTL
    assert got.next_due is None
    assert (await claim(redis, keys)).jobs == []  # in progress now: skipped, as arq's start_jobs does


async def test_a_claim_is_a_lease_until_its_worker_confirms_it(redis, keys):
    await enqueue(redis, keys, "j1")
    got = await claim(redis, keys, claimer="w:1")
    job_id = jid(keys, "j1")
    marker = (await redis.get(keys.arq_in_progress(job_id))).decode()
    assert marker == got.marker and marker.startswith("claim:") and marker.endswith(":w:1")
    assert 0 < int(marker.split(":")[1]) - now_ms() <= CLAIM_LEASE_MS
    assert await confirm_claims(redis, got, IN_PROGRESS_MS) == got.jobs
    assert await redis.get(keys.arq_in_progress(job_id)) == b"1"  # arq's own value from now on
    assert 0 < await redis.pttl(keys.arq_in_progress(job_id)) <= IN_PROGRESS_MS
    assert (await claim(redis, keys, claimer="w:2")).jobs == []  # a confirmed job has no lease to end


async def test_a_claim_whose_reply_was_lost_returns_its_jobs_after_the_lease_without_counting_a_try(redis, keys):
    """Redis ran the claim after its worker gave up waiting: nobody confirms it; the job runs once, later."""
    await enqueue(redis, keys, "lost")
    lost = await claim(redis, keys, claimer="gone:0")
    assert (await claim(redis, keys, claimer="w:1")).jobs == []  # leased: not claimable yet
    await lapse(redis, keys, "lost")
    again = await claim(redis, keys, claimer="w:1")
    assert names(again, keys) == ["lost"] and again.jobs[0].job_try == 1  # the lost claim's try never ran
    assert await confirm_claims(redis, lost, IN_PROGRESS_MS) == []  # a late confirmation is refused
    assert await confirm_claims(redis, again, IN_PROGRESS_MS) == again.jobs


async def test_a_claim_of_a_job_that_ended_meanwhile_is_not_confirmed(redis, keys):
    await enqueue(redis, keys, "ended")
    got = await claim(redis, keys)
    await redis.delete(keys.arq_in_progress(jid(keys, "ended")))  # e.g. the sweeper removed the job
    assert await confirm_claims(redis, got, IN_PROGRESS_MS) == []


async def test_a_claim_takes_no_more_jobs_than_the_free_slots(redis, keys):
    for i in range(3):
        await enqueue(redis, keys, f"j{i}", score=now_ms() - 10 + i)
    assert names(await claim(redis, keys, free=2), keys) == ["j0", "j1"]
    assert (await claim(redis, keys, free=0)).jobs == []
    assert names(await claim(redis, keys, free=2), keys) == ["j2"]


async def test_a_deferred_job_is_not_claimed_before_its_time_and_bounds_the_next_wait(redis, keys):
    due = now_ms() + 60_000
    await enqueue(redis, keys, "later", score=due)
    await enqueue(redis, keys, "much-later", score=due + 1000)
    got = await claim(redis, keys)
    assert got.jobs == [] and got.next_due == due
    assert not await redis.exists(keys.arq_in_progress(jid(keys, "later")), keys.arq_retry(jid(keys, "later")))
    await redis.zadd(keys.tools_queue, {jid(keys, "later"): now_ms() - 1})  # its time has come
    assert names(await claim(redis, keys), keys) == ["later"]


async def test_every_claim_of_a_job_counts_a_try(redis, keys):
    """arq re-runs a job by leaving it queued and deleting its in-progress key; max_tries reads this count."""
    await enqueue(redis, keys, "again")
    for expected in (1, 2, 3):
        (job,) = (await claim(redis, keys)).jobs
        assert job.job_try == expected == int(await redis.get(keys.arq_retry(jid(keys, "again"))))
        await redis.delete(keys.arq_in_progress(jid(keys, "again")))


async def test_an_expired_job_record_is_claimed_without_one(redis, keys):
    await enqueue(redis, keys, "expired", record=False)
    (job,) = (await claim(redis, keys)).jobs
    assert job.record is None and job.job_try == 1  # arq's run_job then fails it: "job expired"


async def test_a_claim_on_an_aborting_worker_takes_the_abort_request(redis, keys):
    await enqueue(redis, keys, "aborted")
    await enqueue(redis, keys, "kept")
    await redis.zadd(keys.abort_set, {jid(keys, "aborted"): now_ms(), jid(keys, "other"): now_ms()})
    await redis.zadd(abort_jobs_ss, {jid(keys, "kept"): now_ms()})  # arq's global set: not the prefix's
    got = await claim(redis, keys, take_aborts=True)
    assert names(got, keys) == ["aborted", "kept"] and [job.aborted for job in got.jobs] == [True, False]
    assert await redis.zscore(keys.abort_set, jid(keys, "aborted")) is None
    assert await redis.zscore(keys.abort_set, jid(keys, "other")) is not None  # not this claim's job
    assert await redis.zscore(abort_jobs_ss, jid(keys, "kept")) is not None  # never read
    await redis.zrem(keys.abort_set, jid(keys, "other"))
    await redis.zrem(abort_jobs_ss, jid(keys, "kept"))


async def test_a_turn_worker_claim_leaves_the_abort_set_alone(redis, keys):
    await enqueue(redis, keys, "job")
    await redis.zadd(keys.abort_set, {jid(keys, "job"): now_ms()})
    (job,) = (await claim(redis, keys, take_aborts=False)).jobs
    assert not job.aborted and await redis.zscore(keys.abort_set, jid(keys, "job")) is not None
    await redis.zrem(keys.abort_set, jid(keys, "job"))


@pytest.mark.parametrize("held", [0, 1])
async def test_a_claim_pops_a_wake_up_token_per_job_beyond_those_the_wait_took(redis, keys, held):
    wake = Keys.wake_list(keys.tools_queue)
    for i in range(3):
        await enqueue(redis, keys, f"j{i}", wake=True)
    await redis.rpush(wake, "1", "1")  # two more: jobs enqueued later, for other workers
    if held:
        await redis.lpop(wake)  # the worker's wait took one (held=0: it was woken otherwise)
    assert len((await claim(redis, keys, held=held)).jobs) == 3
    assert await redis.llen(wake) == 2


async def test_a_worker_woken_by_a_token_leaves_the_jobs_whose_tokens_other_workers_took(redis, keys):
    """Two jobs, two tokens, two idle workers: each wait took one token, so each claim takes one job."""
    wake = Keys.wake_list(keys.tools_queue)
    for i in range(2):
        await enqueue(redis, keys, f"j{i}", wake=True)
    await redis.lpop(wake, 2)  # both waits were served
    first = await claim(redis, keys, held=1)
    second = await claim(redis, keys, held=1)
    assert len(first.jobs) == len(second.jobs) == 1 and first.jobs[0].job_id != second.jobs[0].job_id
    assert await redis.llen(wake) == 0


async def test_a_claim_with_nothing_ready_pops_no_token(redis, keys):
    wake = Keys.wake_list(keys.tools_queue)
    await redis.rpush(wake, "1")
    assert (await claim(redis, keys)).jobs == []
    assert await redis.llen(wake) == 1


# Mixed-version fleets: a job that requires something goes only to a worker whose capability set holds it.


async def fleet(redis: Redis, keys: Keys, **sets: list[str]) -> None:
    """Register one worker per capability set (digest = the set's name here), as worker heartbeats do."""
    for digest, names in sets.items():
        await register_worker(redis, keys, f"{digest}-worker", {"queue": "tools", "instance": digest},
                              CapabilitySet(keys.tools_queue, digest, names))  # fmt: skip


async def enqueue_requiring(redis: Redis, keys: Keys, name: str, requires: str, **options) -> Enqueued:
    """Queue a job through the enqueue script, as a tool dispatch does (refused when no live set serves it)."""
    return await enqueue_unless(redis, "probe", {}, job_id=jid(keys, name), queue=keys.tools_queue,
                                skip_key=f"{keys.prefix}:answered:{name}", requires=requires, **options)  # fmt: skip


async def test_a_job_is_claimed_only_by_a_worker_whose_capability_set_holds_what_it_requires(redis, keys):
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:add", "tool:new"])
    assert await enqueue_requiring(redis, keys, "new", "tool:new") is Enqueued.NEW
    assert await enqueue_requiring(redis, keys, "old", "tool:add") is Enqueued.NEW
    assert names(await claim(redis, keys, capset="v1"), keys) == ["old"]  # "new" is left, untouched
    new = jid(keys, "new")
    assert not await redis.exists(keys.arq_in_progress(new), keys.arq_retry(new))
    assert names(await claim(redis, keys, capset="v1"), keys) == []  # not even when nothing else is ready
    got = await claim(redis, keys, capset="v2")
    assert names(got, keys) == ["new"] and got.jobs[0].job_try == 1


async def test_a_job_only_some_sets_serve_wakes_only_their_workers(redis, keys):
    """Its token goes to the lists of the sets that serve it: a v1 worker never takes (and loses) it."""
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:add", "tool:new"], v3=["tool:new"])
    queue_list = Keys.wake_list(keys.tools_queue)
    lists = {digest: Keys.wake_list(keys.tools_queue, digest) for digest in ("v1", "v2", "v3")}
    await enqueue_requiring(redis, keys, "new", "tool:new")
    assert [await redis.llen(lists[d]) for d in ("v1", "v2", "v3")] == [0, 1, 1]
    assert await redis.llen(queue_list) == 0
    await enqueue_requiring(redis, keys, "old", "tool:add")  # not v3's: on the lists of v1 and v2
    assert [await redis.llen(lists[d]) for d in ("v1", "v2", "v3")] == [1, 2, 1]
    await redis.lpop(lists["v2"])  # a v2 worker's wait took a token
    got = await claim(redis, keys, capset="v2", held_own=1)
    assert sorted(names(got, keys)) == ["new", "old"]
    assert await redis.llen(lists["v2"]) == 0  # the token of the other job it claimed is popped too


async def test_a_job_every_live_set_serves_wakes_any_worker_through_the_queues_list(redis, keys):
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:add", "tool:new"])
    await enqueue_requiring(redis, keys, "old", "tool:add")
    assert await redis.llen(Keys.wake_list(keys.tools_queue)) == 1
    assert not await redis.exists(Keys.wake_list(keys.tools_queue, "v1"), Keys.wake_list(keys.tools_queue, "v2"))
    assert names(await claim(redis, keys, capset="v1", held=1), keys) == ["old"]


async def test_a_worker_woken_for_a_job_it_serves_leaves_the_others_tokens(redis, keys):
    """A v1 worker woken by the queue's list claims the job it can run; the v2-only job keeps its token."""
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:add", "tool:new"])
    await enqueue_requiring(redis, keys, "new", "tool:new")
    await enqueue_requiring(redis, keys, "old", "tool:add")
    await redis.lpop(Keys.wake_list(keys.tools_queue))
    assert names(await claim(redis, keys, capset="v1", held=1), keys) == ["old"]
    assert await redis.llen(Keys.wake_list(keys.tools_queue, "v2")) == 1  # still there for a v2 worker


async def test_a_tool_no_live_set_serves_is_refused_and_nothing_is_queued(redis, keys):
    await fleet(redis, keys, v1=["tool:add"])
    assert await enqueue_requiring(redis, keys, "gone", "tool:gone") is Enqueued.UNSERVED
    assert not await redis.exists(keys.tools_queue, keys.arq_job(jid(keys, "gone")), Keys.wake_list(keys.tools_queue))


async def test_with_no_worker_registered_a_job_is_queued_and_waits(redis, keys):
    """No live set at all (the fleet is starting): the job waits for whichever worker serves it."""
    assert await enqueue_requiring(redis, keys, "early", "tool:new") is Enqueued.NEW
    assert await redis.llen(Keys.wake_list(keys.tools_queue)) == 1
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:new"])
    assert names(await claim(redis, keys, capset="v1"), keys) == []
    assert names(await claim(redis, keys, capset="v2"), keys) == ["early"]


async def test_a_turn_job_that_no_live_set_serves_is_queued_and_waits(redis, keys):
    """Turn enqueues never refuse (a turn must not be lost): the job waits for a worker serving its agent."""
    await fleet(redis, keys, v1=["default"])
    assert await enqueue_job(redis, "probe", {}, job_id=jid(keys, "turn"), queue=keys.tools_queue, requires="v2agent")
    assert names(await claim(redis, keys, capset="v1"), keys) == []
    await fleet(redis, keys, v2=["default", "v2agent"])  # a v2 worker starts
    assert names(await claim(redis, keys, capset="v2"), keys) == ["turn"]


async def test_a_set_without_a_live_worker_serves_nothing(redis, keys):
    await fleet(redis, keys, v1=["tool:add"])
    await redis.zadd(Keys.capability_sets(keys.tools_queue), {"v2": now_ms() - 1})  # its last worker's beat ended
    await redis.sadd(Keys.capability_set(keys.tools_queue, "v2"), "tool:new")
    assert await enqueue_requiring(redis, keys, "new", "tool:new") is Enqueued.UNSERVED


async def test_a_claimer_without_a_set_takes_any_job(redis, keys):
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:new"])
    await enqueue_requiring(redis, keys, "new", "tool:new")
    assert names(await claim(redis, keys, capset=None), keys) == ["new"]


async def test_a_requirement_lives_while_its_job_is_queued(redis, keys):
    requirements = Keys.job_requirements(keys.tools_queue)
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:new"])
    for name in ("done", "rerun", "waiting"):
        await enqueue_requiring(redis, keys, name, "tool:new")
    assert await redis.hget(requirements, jid(keys, "done")) == b"@tool:new"  # its token went to v2's list
    assert await redis.pttl(requirements) >= 86_000_000  # as long as arq keeps the job records
    claimed = await claim(redis, keys, capset="v2", free=2)  # one score: queue order is by id
    assert names(claimed, keys) == ["done", "rerun"]
    await redis.zrem(keys.tools_queue, jid(keys, "done"))  # arq finished it; it re-queued "rerun" (kept queued)
    await redis.delete(keys.arq_in_progress(jid(keys, "rerun")))
    again = await claim(redis, keys, capset="v2", ended=[jid(keys, "done"), jid(keys, "rerun")])
    assert names(again, keys) == ["rerun", "waiting"]
    assert sorted(await redis.hkeys(requirements)) == [jid(keys, "rerun").encode(), jid(keys, "waiting").encode()]
    await redis.delete(keys.tools_queue)  # the queue emptied: nothing left to require anything
    await claim(redis, keys, capset="v2")
    assert not await redis.exists(requirements)


async def test_an_aborted_queued_job_takes_its_requirement_with_it(redis, keys):
    await fleet(redis, keys, v1=["tool:add"])
    await enqueue_requiring(redis, keys, "dropped", "tool:add")
    await enqueue_requiring(redis, keys, "kept", "tool:add")
    await abort_job(redis, keys, jid(keys, "dropped"))
    assert await redis.hkeys(Keys.job_requirements(keys.tools_queue)) == [jid(keys, "kept").encode()]
    await redis.zrem(keys.abort_set, jid(keys, "dropped"))


async def test_racing_claimers_never_both_claim_a_job(redis_url, keys):
    """Two workers polling at once: each job goes to exactly one (the script is atomic; arq needed WATCH)."""
    clients = [Redis.from_url(redis_url) for _ in range(2)]
    try:
        for i in range(50):
            await enqueue(clients[0], keys, f"race-{i}")
            got = await asyncio.gather(*(claim(c, keys) for c in clients))
            winners = [name for result in got for name in names(result, keys)]
            assert winners == [f"race-{i}"], winners
            assert int(await clients[0].get(keys.arq_retry(jid(keys, f"race-{i}")))) == 1
    finally:
        for c in clients:
            await c.aclose()


def test_the_hand_over_refuses_a_run_job_transaction_it_did_not_claim_for():
    keys = Keys("ho")
    job = ClaimedJob("ho:job", 1, b"record", 1, False)
    matching = PrefetchedPipeline(job, keys, False, True)
    matching.get(keys.arq_job(job.job_id)).incr(keys.arq_retry(job.job_id)).expire(keys.arq_retry(job.job_id), 88400)
    assert asyncio.run(matching.execute()) == [b"record", 1, True]
    changed = PrefetchedPipeline(job, keys, False, True)
    changed.get(keys.arq_job(job.job_id)).incrby(keys.arq_retry(job.job_id), 2)
    with pytest.raises(ClaimHandOverError):
        asyncio.run(changed.execute())


# A real SmithWorker: claimed jobs go through arq 0.28's own run_job.

RAN: list[dict] = []


async def probe(ctx: dict) -> str:
    keys: Keys = ctx["keys"]
    RAN.append({"job_id": ctx["job_id"], "job_try": ctx["job_try"],
                "retry": await ctx["redis"].get(keys.arq_retry(ctx["job_id"]))})  # fmt: skip
    return "done"


async def retried(ctx: dict) -> str:
    """Asks arq to run it again 0.2 s later on its first try (arq re-queues it with a later score)."""
    RAN.append({"job_id": ctx["job_id"], "job_try": ctx["job_try"]})
    if ctx["job_try"] == 1:
        raise Retry(defer=0.2)
    return "second try"


async def sleepy(ctx: dict) -> str:
    """Runs until cancelled (an abort)."""
    await asyncio.sleep(3600)
    return "woke"


def tool_worker(redis_url: str, keys: Keys, **settings) -> SmithWorker:
    worker = build_worker(SmithApp(), "tools", Settings(redis_url=redis_url, prefix=keys.prefix, **settings),
                          functions=[func(probe, name="probe", max_tries=2), func(retried, name="retried"),
                                     func(sleepy, name="sleepy")],
                          keep_result=60)  # fmt: skip
    worker.ctx.update(keys=keys, redis=worker.pool)
    return worker


async def poll_and_finish(worker: SmithWorker) -> None:
    await worker._poll_iteration()
    await asyncio.gather(*worker.tasks.values())


def calls(stats: dict, command: str) -> int:
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def result(redis: Redis, job_id: str):
    return await Job(job_id, redis, _deserializer=job_deserializer).result_info()


async def test_a_claimed_job_runs_through_arqs_run_job_without_its_first_transaction(redis_url, redis, keys):
    RAN.clear()
    worker = tool_worker(redis_url, keys)
    await enqueue(redis, keys, "w1")
    before = await redis.info("commandstats")
    await poll_and_finish(worker)
    after = await redis.info("commandstats")
    # the try was counted once, by the claim: arq's own INCRBY would have made it 2
    assert RAN == [{"job_id": jid(keys, "w1"), "job_try": 1, "retry": b"1"}]
    assert (await result(redis, jid(keys, "w1"))).result == "done"
    for command in ("incrby", "watch", "zscore"):  # arq's start_jobs and run_job send these; the claim does not
        assert calls(after, command) == calls(before, command), command
    assert worker.job_counter == 0 and worker.sem._value == worker.max_jobs + 1
    await worker.pool.aclose()


async def test_a_job_arq_deferred_for_a_retry_is_claimed_again_at_its_time_with_its_next_try(redis_url, redis, keys):
    RAN.clear()
    worker = tool_worker(redis_url, keys)
    await enqueue(redis, keys, "again", function="retried")
    await poll_and_finish(worker)  # the first try asks for a retry in 0.2 s
    await worker._poll_iteration()
    due = int(await redis.zscore(keys.tools_queue, jid(keys, "again")))
    assert worker._next_due == due and not worker.tasks  # the wait is bounded by it; not claimed before
    async with asyncio.timeout(5):
        while (info := await result(redis, jid(keys, "again"))) is None:
            await asyncio.sleep(0.05)
            await poll_and_finish(worker)
    assert info.result == "second try" and [run["job_try"] for run in RAN] == [1, 2]
    await worker.pool.aclose()


async def test_a_claimed_job_whose_record_expired_fails_as_arq_fails_it(redis_url, redis, keys):
    RAN.clear()
    worker = tool_worker(redis_url, keys)
    await enqueue(redis, keys, "gone", record=False)
    await poll_and_finish(worker)
    assert RAN == []
    info = await result(redis, jid(keys, "gone"))
    assert not info.success and "job expired" in str(info.result)
    assert not await redis.exists(keys.arq_in_progress(jid(keys, "gone")), keys.arq_retry(jid(keys, "gone")))
    await worker.pool.aclose()


async def test_a_job_past_its_max_tries_fails_without_running(redis_url, redis, keys):
    RAN.clear()
    worker = tool_worker(redis_url, keys)
    await enqueue(redis, keys, "tired")
    await redis.set(keys.arq_retry(jid(keys, "tired")), 2)  # two tries already: probe's max_tries
    await poll_and_finish(worker)
    assert RAN == []
    info = await result(redis, jid(keys, "tired"))
    assert not info.success and "max 2 retries exceeded" in str(info.result)
    await worker.pool.aclose()


async def test_a_job_aborted_before_it_started_fails_without_running(redis_url, redis, keys):
    RAN.clear()
    worker = tool_worker(redis_url, keys)
    await enqueue(redis, keys, "aborted-early")
    await redis.zadd(keys.abort_set, {jid(keys, "aborted-early"): now_ms()})
    await poll_and_finish(worker)
    assert RAN == []
    info = await result(redis, jid(keys, "aborted-early"))
    assert not info.success and "CancelledError" in str(info.result)  # arq's "aborted before start"
    assert await redis.zscore(keys.abort_set, jid(keys, "aborted-early")) is None
    await worker.pool.aclose()


async def test_a_running_job_is_aborted_only_through_its_prefixs_abort_set(redis_url, redis, keys):
    """The abort check and the job's end use the prefix's set: a request in another prefix's set (another tenant
    naming this job) or in arq's global ``arq:abort`` neither cancels the job nor is touched."""
    worker = tool_worker(redis_url, keys)
    job_id, other = jid(keys, "long"), Keys(f"{keys.prefix}-other")
    await enqueue(redis, keys, "long", function="sleepy")
    await worker._poll_iteration()
    async with asyncio.timeout(10):
        while job_id not in worker.job_tasks:  # arq's run_job starts the function's task
            await asyncio.sleep(0.01)
    await abort_job(redis, other, job_id)
    await redis.zadd(abort_jobs_ss, {job_id: now_ms()})
    await worker._cancel_aborted_jobs()
    assert not worker.aborting_tasks and not worker.job_tasks[job_id].cancelling()
    await abort_job(redis, keys, job_id)
    await worker._cancel_aborted_jobs()
    await asyncio.wait_for(asyncio.gather(*worker.tasks.values()), 10)
    info = await result(redis, job_id)
    assert not info.success and "CancelledError" in str(info.result)  # arq's "aborted", not run again:
    assert await redis.zscore(keys.tools_queue, job_id) is None  # off the queue
    assert not await redis.exists(keys.abort_set)  # taken by the check (the job's end removes it too)
    assert await redis.zscore(other.abort_set, job_id) is not None  # the other prefix's, untouched
    assert await redis.zscore(abort_jobs_ss, job_id) is not None  # arq's finish_job would have removed it
    await redis.delete(other.abort_set, abort_jobs_ss)
    await worker.pool.aclose()


async def test_the_abort_check_runs_when_an_abort_is_announced_or_the_fallback_is_due(redis_url, keys, monkeypatch):
    """arq ran its abort check (a transaction) every poll; a woken tool worker polls after every job."""
    worker = tool_worker(redis_url, keys, fallback_poll=3600.0)
    checks = []
    real_check = worker._cancel_aborted_jobs

    async def counted() -> None:
        checks.append(1)
        await real_check()

    monkeypatch.setattr(worker, "_cancel_aborted_jobs", counted)
    await worker._poll_iteration()
    assert checks == [1]  # the first poll checks
    await worker._poll_iteration()
    assert checks == [1]  # not again before the fallback
    worker.pickup._abort_announced = True  # what a message on the tool-aborts channel sets
    await worker._poll_iteration()
    assert checks == [1, 1]
    worker._abort_check_at = worker.loop.time()  # the fallback interval is over
    await worker._poll_iteration()
    assert checks == [1, 1, 1]
    await worker.pool.aclose()


async def test_a_claim_failing_on_redis_takes_no_job_slot():
    """arq took the slot before its start transaction: after max_jobs failed starts a worker would never
    pick a job again. A slot is taken only for a job the claim returned."""
    settings = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", tool_max_jobs=2)
    worker = build_worker(SmithApp(), "tools", settings)
    for _ in range(3):
        with pytest.raises(RedisConnectionError):
            await worker._claim_jobs()
    assert worker.job_counter == 0 and not worker.tasks
    assert worker.sem._value == settings.tool_max_jobs + 1  # arq's semaphore: max_jobs + 1, all free
    await worker.pool.aclose()


# Fair pickup (docs/architecture.md, Fair pickup): jobs enqueued with `fair` wait per tenant until a claim admits them.


async def enqueue_fair(redis: Redis, keys: Keys, tenant: str | None, *names: str, requires: str = "") -> None:
    for name in names:
        assert await enqueue_job(redis, "probe", {}, job_id=jid(keys, name), queue=keys.tools_queue,
                                 requires=requires, fair=True, tenant=tenant)  # fmt: skip


async def claim_weighted(redis: Redis, keys: Keys, free: int, weights=None, capset: str | None = None):
    return await claim_jobs(redis, keys, keys.tools_queue, free=free, read_limit=1000, in_progress_ms=IN_PROGRESS_MS,
                            tokens_held=HeldTokens(), take_aborts=False, claimer="w:0", capset=capset,
                            weights=weights)  # fmt: skip


async def test_waiting_jobs_are_admitted_round_robin_across_tenants_in_order_within_each(redis, keys):
    await enqueue_fair(redis, keys, "big", *(f"b{i}" for i in range(6)))
    await enqueue_fair(redis, keys, "small", "s0", "s1")
    await enqueue_fair(redis, keys, None, "n0")
    assert await redis.zcard(keys.tools_queue) == 0  # nothing joins the queue before its admission
    got = await claim_weighted(redis, keys, free=7)
    assert names(got, keys) == ["n0", "b0", "s0", "b1", "s1", "b2", "b3"]  # equal passes: ring order ("" < "big")
    assert {job.job_try for job in got.jobs} == {1} and all(job.record for job in got.jobs)
    assert await redis.zcard(keys.tools_queue) == 7  # admitted jobs are arq's now (in progress)
    assert await redis.zrange(Keys.tenant_ring(keys.tools_queue), 0, -1) == [b"big"]  # the others left the ring
    assert names(await claim_weighted(redis, keys, free=9), keys) == ["b4", "b5"]
    assert not await redis.exists(Keys.tenant_ring(keys.tools_queue), Keys.tenant_waiting(keys.tools_queue, "big"))


async def test_a_tenant_joining_late_starts_at_the_lowest_pass(redis, keys):
    await enqueue_fair(redis, keys, "early", *(f"e{i}" for i in range(8)))
    assert names(await claim_weighted(redis, keys, free=4), keys) == ["e0", "e1", "e2", "e3"]
    await enqueue_fair(redis, keys, "late", "l0", "l1", "l2")
    # no credit for the time it was absent, no debt for early's history: they alternate from now on
    assert names(await claim_weighted(redis, keys, free=6), keys) == ["e4", "l0", "e5", "l1", "e6", "l2"]


async def test_weights_share_the_slots_and_the_limits_hash_overrides_the_defaults(redis, keys):
    await enqueue_fair(redis, keys, "a", *(f"a{i}" for i in range(12)))
    await enqueue_fair(redis, keys, "b", *(f"b{i}" for i in range(12)))
    got = names(await claim_weighted(redis, keys, free=8, weights={"a": 3.0}), keys)
    assert sum(name.startswith("a") for name in got) == 6  # three of every four
    await redis.hset(keys.tenant_limits("b"), "weight", "3")  # the operator's setting wins over the worker's
    got = names(await claim_weighted(redis, keys, free=8, weights={"a": 3.0, "b": 1.0}), keys)
    await redis.delete(keys.tenant_limits("b"))
    assert sum(name.startswith("b") for name in got) >= 4  # b catches up: its pass grows by 1/3 now


async def test_a_stored_weight_out_of_range_is_read_as_its_bound(redis, keys):
    await enqueue_fair(redis, keys, "a", *(f"a{i}" for i in range(4)))
    await enqueue_fair(redis, keys, "b", *(f"b{i}" for i in range(4)))
    await redis.hset(keys.tenant_limits("b"), "weight", "-1")  # by hand: its pass would shrink at each admission
    try:
        got = names(await claim_weighted(redis, keys, free=4), keys)
    finally:
        await redis.delete(keys.tenant_limits("b"))
    assert got == ["a0", "b0", "a1", "a2"]  # read as MIN_WEIGHT: b's pass grows by 1000 per admission


async def test_max_running_holds_a_tenant_until_its_jobs_end(redis, keys):
    await redis.hset(keys.tenant_limits("capped"), "max_running", "2")
    try:
        await enqueue_fair(redis, keys, "capped", "c0", "c1", "c2")
        await enqueue_fair(redis, keys, "other", "o0", "o1", "o2")
        assert names(await claim_weighted(redis, keys, free=10), keys) == ["c0", "o0", "c1", "o1", "o2"]
        running = Keys.tenant_running(keys.tools_queue, "capped")
        assert 0 < await redis.pttl(running) <= IN_PROGRESS_MS
        assert names(await claim_weighted(redis, keys, free=10), keys) == []  # two still hold arq's in-progress key
        await redis.delete(keys.arq_in_progress(jid(keys, "c0")))  # c0 ended: arq deletes its in-progress key
        await redis.zrem(keys.tools_queue, jid(keys, "c0"))  # and its queue entry
        assert names(await claim_weighted(redis, keys, free=10), keys) == ["c2"]
        assert set(await redis.zrange(running, 0, -1)) == {jid(keys, "c1").encode(), jid(keys, "c2").encode()}
    finally:
        await redis.delete(keys.tenant_limits("capped"))


async def test_tenants_at_their_cap_ahead_in_the_ring_do_not_keep_the_others_from_free_slots(redis, keys):
    """The claim reads the ring 1000 tenants at a time: past a full page of capped tenants it reads the next."""
    capped = [f"c{i:04d}" for i in range(1000)]
    async with redis.pipeline(transaction=False) as pipe:
        for tenant in capped:
            pipe.hset(keys.tenant_limits(tenant), "max_running", "1")
        await pipe.execute()
    try:
        for tenant in capped:
            await enqueue_fair(redis, keys, tenant, f"{tenant}-a", f"{tenant}-b")
        assert len(names(await claim_weighted(redis, keys, free=1000), keys)) == 1000  # each runs one: capped
        await enqueue_fair(redis, keys, "zzz", "z0")  # joins at the lowest pass, ranked after the 1000 ("c" < "z")
        assert names(await claim_weighted(redis, keys, free=5), keys) == ["z0"]
    finally:
        await redis.delete(*(keys.tenant_limits(tenant) for tenant in capped))


async def test_a_limits_key_of_another_type_reads_as_no_limits(redis, keys):
    """A hand-edited limits key that is no hash does not make every claim fail (WRONGTYPE) for every tenant."""
    await redis.set(keys.tenant_limits("odd"), "oops")
    try:
        await enqueue_fair(redis, keys, "odd", "d0")
        await enqueue_fair(redis, keys, "fine", "f0")
        assert sorted(names(await claim_weighted(redis, keys, free=5), keys)) == ["d0", "f0"]
    finally:
        await redis.delete(keys.tenant_limits("odd"))


async def test_jobs_back_on_the_queue_go_before_waiting_ones(redis, keys):
    await enqueue_fair(redis, keys, "t", "w0")
    await enqueue(redis, keys, "rerun", score=now_ms() - 5)  # a re-run of a job admitted once (arq's queue)
    assert names(await claim_weighted(redis, keys, free=1), keys) == ["rerun"]
    assert names(await claim_weighted(redis, keys, free=1), keys) == ["w0"]


async def test_a_tenant_s_jobs_another_set_serves_are_left_for_its_workers(redis, keys):
    await fleet(redis, keys, v1=["tool:add"], v2=["tool:add", "tool:new"])
    await enqueue_fair(redis, keys, "t", "new", requires="tool:new")
    await enqueue_fair(redis, keys, "t", "old", requires="tool:add")
    assert names(await claim_weighted(redis, keys, free=5, capset="v1"), keys) == ["old"]
    assert names(await claim_weighted(redis, keys, free=5, capset="v2"), keys) == ["new"]
    assert not await redis.exists(Keys.tenant_ring(keys.tools_queue))


async def test_a_deferred_fair_job_goes_to_the_queue(redis, keys):
    assert await enqueue_job(redis, "probe", {}, job_id=jid(keys, "d"), queue=keys.tools_queue, defer=60,
                             fair=True, tenant="t")  # fmt: skip
    assert await redis.zscore(keys.tools_queue, jid(keys, "d")) is not None
    assert not await redis.exists(Keys.tenant_waiting(keys.tools_queue, "t"))


def test_the_claim_reads_fields_the_tenant_limits_define():
    from smith_client.tenants import TenantLimits
    from smith_worker.queue.claim import LIMIT_FIELDS

    assert set(LIMIT_FIELDS) <= set(TenantLimits.model_fields)


# Reading the queue's own ready jobs walks every job running on it: on a queue of admitted jobs (turns) a
# claim does it only when asked (lua/claim.lua), and the worker asks now and then (SmithWorker._reads_queue).


async def test_a_claim_not_reading_the_queue_admits_waiting_jobs_only(redis, keys):
    await enqueue(redis, keys, "queued", score=now_ms() - 5)
    await enqueue_fair(redis, keys, "t", "w0")
    got = await claim_jobs(redis, keys, keys.tools_queue, free=5, read_limit=1000, in_progress_ms=IN_PROGRESS_MS,
                           tokens_held=HeldTokens(), take_aborts=False, claimer="w:0", capset=None,
                           scan_queue=False)  # fmt: skip
    assert names(got, keys) == ["w0"] and not got.more_ready
    assert names(await claim(redis, keys), keys) == ["queued"]  # read when asked


async def test_a_job_of_the_worker_still_queued_after_its_end_makes_the_claim_read_the_queue(redis, keys):
    """arq re-queues a job it re-runs: the claim that hears of its end reads the queue, asked or not."""
    await enqueue(redis, keys, "rerun", score=now_ms() - 5)
    got = await claim_jobs(redis, keys, keys.tools_queue, free=5, read_limit=1000, in_progress_ms=IN_PROGRESS_MS,
                           tokens_held=HeldTokens(), take_aborts=False, claimer="w:0", capset=None,
                           ended=[jid(keys, "rerun")], scan_queue=False)  # fmt: skip
    assert names(got, keys) == ["rerun"]


@pytest.mark.parametrize(("free", "more"), [(2, True), (3, False), (5, False)])
async def test_a_claim_says_when_the_queue_s_ready_jobs_filled_its_slots(redis, keys, free, more):
    for i in range(3):
        await enqueue(redis, keys, f"j{i}", score=now_ms() - 10 + i)
    got = await claim(redis, keys, free=free)
    assert len(got.jobs) == min(free, 3) and got.more_ready is more


async def test_a_worker_of_admitted_jobs_reads_the_queue_first_then_at_the_fallback_or_a_deferred_job(
    redis_url, redis, keys
):
    worker = tool_worker(redis_url, keys, fallback_poll=0.4)
    worker.admitted = True  # as on the turns queue (TurnRole.job)

    async def queued(*names: str) -> set[str]:  # arq takes a job off the queue once it ran
        return {name for name in names if await redis.zscore(keys.tools_queue, jid(keys, name)) is not None}

    await enqueue(redis, keys, "first")
    await poll_and_finish(worker)  # the first poll reads the queue
    await enqueue(redis, keys, "rerun")  # a job joining the queue itself, as a re-run does
    await enqueue_fair(redis, keys, "t", "admitted")
    await poll_and_finish(worker)
    assert await queued("first", "admitted", "rerun") == {"rerun"}  # the queue was not read
    await asyncio.sleep(0.45)  # a fallback poll later
    await poll_and_finish(worker)
    assert not await queued("rerun")
    await enqueue(redis, keys, "deferred", score=now_ms() + 150)
    await poll_and_finish(worker)  # the queue is not read, but every claim sees the next deferred job's time
    await enqueue(redis, keys, "unseen")
    await poll_and_finish(worker)
    assert await queued("deferred", "unseen") == {"deferred", "unseen"}
    await asyncio.sleep(0.2)
    await poll_and_finish(worker)  # the deferred job is due: the queue is read again, before the fallback
    assert not await queued("deferred", "unseen")
    await worker.pool.aclose()


async def test_a_fair_job_s_place_in_its_tenant_s_line_can_be_kept_from_an_earlier_time(redis, keys):
    await enqueue_fair(redis, keys, "t", "w0", "w1")
    early = now_ms() - 60_000
    assert await enqueue_job(redis, "probe", {}, job_id=jid(keys, "rerun"), queue=keys.tools_queue, fair=True,
                             tenant="t", since_ms=early)  # fmt: skip
    await asyncio.sleep(0.005)  # "later" (now) scores after "w1", not in the same millisecond
    assert await enqueue_job(redis, "probe", {}, job_id=jid(keys, "later"), queue=keys.tools_queue, fair=True,
                             tenant="t", since_ms=now_ms() + 60_000)  # fmt: skip
    assert await redis.zscore(Keys.tenant_waiting(keys.tools_queue, "t"), jid(keys, "rerun")) == early
    assert await redis.pttl(keys.arq_job(jid(keys, "rerun"))) > 60_000  # an early place does not shorten its life
    assert names(await claim_weighted(redis, keys, free=4), keys) == ["rerun", "w0", "w1", "later"]  # never ahead of now


async def test_a_turn_enqueued_again_waits_at_the_place_of_its_submit(redis_url, redis, keys):
    """A turn run again (its worker died, stopped or lost Redis) or kicked (its job was lost) keeps its place
    in its tenant's line: it is not sent behind the turns submitted after it (docs/architecture.md, Fair pickup)."""
    from smith_client import SmithClient
    from smith_worker.turn.attempt import wake_head

    async with SmithClient.from_url(redis_url, prefix=keys.prefix) as client:
        first = await client.submit("first", conversation_id="c-first", tenant="t")
        # sent one after the other, several within one millisecond: their order is kept to the microsecond
        after = [await client.submit(f"next {i}", conversation_id=f"c-{i}", tenant="t") for i in range(12)]
    waiting = Keys.tenant_waiting(keys.turns_queue, "t")
    assert await redis.zrem(waiting, keys.turn_job_id(first.turn_id))  # its job was lost
    assert await wake_head(redis, keys, "c-first") == first.turn_id  # enqueued again, as a re-run is
    got = await claim_jobs(redis, keys, keys.turns_queue, free=13, read_limit=1000, in_progress_ms=IN_PROGRESS_MS,
                           tokens_held=HeldTokens(), take_aborts=False, claimer="w:0", capset=None)  # fmt: skip
    expected = [keys.turn_kick_job_id(first.turn_id), *(keys.turn_job_id(handle.turn_id) for handle in after)]
    assert [job.job_id for job in got.jobs] == expected


async def test_a_turn_cancelled_before_it_started_leaves_its_tenant_s_line(redis_url, redis, keys):
    from smith_client import SmithClient

    async with SmithClient.from_url(redis_url, prefix=keys.prefix) as client:
        gone = await client.submit("gone", conversation_id="c-gone", tenant="t")
        kept = await client.submit("kept", conversation_id="c-kept", tenant="t")
        assert await gone.cancel() == "cancelled_queued"
    waiting = Keys.tenant_waiting(keys.turns_queue, "t")
    assert await redis.zrange(waiting, 0, -1) == [keys.turn_job_id(kept.turn_id).encode()]
    assert not await redis.hexists(Keys.job_requirements(keys.turns_queue), keys.turn_job_id(gone.turn_id))
