"""Every wait has a bound — a model that never finishes, a tool that kills its worker,
a turn whose keys vanish, a turn past its attempt limit.

Real worker processes of their own prefixes (the tool workers here are killed
by the tool they run, and restarted by the test acting as a supervisor), the
session's redis-server and scripted model server (its ``trickle`` reply is a
model that keeps the connection open with keep-alive comments forever).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid

import pytest

from smith_client import SmithClient
from smith_client.errors import InternalError, SmithTimeoutError, TurnNotFoundError
from smith_client.jobs import TurnJob
from smith_client.messages import ToolMessage, UserMessage
from smith_client.turns import submit
from smith_worker.config import Settings
from smith_worker.local.processes import ManagedProcess
from smith_worker.runtime import WorkerRuntime
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from smith_worker.turn.lifecycle import TurnExecution
from smith_worker.turn.role import TurnRole
from tests.conftest import LOGS
from tests.support.app import app as test_app

pytestmark = [pytest.mark.integration]

APP = "tests.support.app:app"
#: A short job timeout for the worker of the job-timeout test (seconds).
SHORT_JOB_TIMEOUT = 3.0


class Supervised:
    """Worker processes of one prefix; a supervisor task restarts any that exits (like honcho or Kubernetes)."""

    def __init__(self, redis_url: str, llm_url: str, queues: list[str], **env: str) -> None:
        self.redis_url = redis_url
        self.prefix = f"bound{uuid.uuid4().hex[:6]}"
        self.env = worker_env(redis_url, self.prefix, llm_url, **env)
        self.queues = queues
        self.procs: list[ManagedProcess] = []
        self.restarts = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> "Supervised":
        self.procs = start_workers(APP, self.env, self.queues, self.prefix, log_dir=LOGS)
        await wait_for_workers(self.redis_url, self.prefix, len(self.procs))
        self._task = asyncio.create_task(self._supervise())
        return self

    async def _supervise(self) -> None:
        while True:
            await asyncio.sleep(0.2)
            for i, proc in enumerate(self.procs):
                if not proc.alive():
                    proc.stop()
                    self.procs[i] = start_workers(APP, self.env, [self.queues[i]], self.prefix, log_dir=LOGS)[0]
                    self.restarts += 1

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for proc in self.procs:
            proc.stop()

    def client(self) -> SmithClient:
        return SmithClient.from_url(self.redis_url, prefix=self.prefix)


@contextlib.asynccontextmanager
async def supervised(redis_url: str, llm_url: str, queues: list[str], **env: str):
    fleet = await Supervised(redis_url, llm_url, queues, **env).start()
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm):
    """A turn worker and a supervised tool worker with default timeouts."""
    async with supervised(redis_url, scripted_llm.base_url, ["turns", "tools"]) as fleet:
        yield fleet


@pytest.fixture
async def bound_client(fleet):
    async with fleet.client() as client:
        yield client


async def test_model_trickling_keep_alives_ends_at_response_timeout(bound_client, scenario, scripted_llm):
    key, marker = scenario(Reply.trickle(0.2))
    started = time.monotonic()
    with pytest.raises(SmithTimeoutError) as info:
        await bound_client.send(f"{marker} never ends", conversation_id=f"c-{key}", agent="response_bounded",
                                timeout=60)
    elapsed = time.monotonic() - started
    assert info.value.operation == "llm.response" and info.value.budget == 3.0
    assert elapsed < 3.0 + 15.0  # response_timeout plus a generous margin
    assert scripted_llm.attempts(key) <= Settings().turn_max_attempts  # in fact 1: it is never re-run
    assert scripted_llm.attempts(key) == 1


async def test_a_silent_model_ends_the_turn_within_twice_the_read_timeout(bound_client, scenario, scripted_llm):
    """The model sends its response head, then nothing. ``max_retries=10`` would allow 11 silent attempts of
    ``request_timeout`` (1 s) and the backoffs between them (over a minute); the silence budget ends the call,
    and so the turn (not re-run), at 2 x request_timeout."""
    key, marker = scenario(Reply.silent())
    started = time.monotonic()
    with pytest.raises(SmithTimeoutError) as info:
        await bound_client.send(f"{marker} hello?", conversation_id=f"c-{key}", agent="silence_bounded", timeout=120)
    elapsed = time.monotonic() - started
    assert (info.value.operation, info.value.budget) == ("chat_completions", 2.0)
    assert elapsed < 5 * 2.0  # 2 x request_timeout x the one run of the turn, with a generous margin
    assert scripted_llm.attempts(key) == 2  # one retry after the first silence, cut short by the budget


@pytest.fixture(scope="module")
async def strict_fleet(redis_url, scripted_llm):
    """A supervised turn worker with a short job timeout and a single attempt per turn."""
    async with supervised(redis_url, scripted_llm.base_url, ["turns"], SMITH_TURN_MAX_ATTEMPTS="1",
                          SMITH_TURN_JOB_TIMEOUT=str(SHORT_JOB_TIMEOUT)) as fleet:
        yield fleet


async def test_job_timeout_shorter_than_response_timeout_ends_the_turn_once(strict_fleet, scripted_llm, scenario):
    async with strict_fleet.client() as strict_client:
        key, marker = scenario(Reply.trickle(0.2))
        handle = await strict_client.submit(f"{marker} never ends", conversation_id=f"c-{key}",
                                            agent="response_unbounded")
        with pytest.raises(SmithTimeoutError) as info:
            await handle.result(timeout=60)
        assert info.value.operation == "turn.job"
        await asyncio.sleep(SHORT_JOB_TIMEOUT * 2)  # a hand-off would have started attempt 2 by now
        events = [e async for e in handle.events()]
        assert [e.type for e in events].count("turn.failed") == 1
        assert "turn.resumed" not in [e.type for e in events]
        assert scripted_llm.attempts(key) == 1
        assert (await handle.state())["attempt"] == "1"


async def test_a_turn_whose_worker_crashed_past_the_attempt_limit_fails(strict_fleet, scripted_llm, scenario):
    """kill -9 of the turn worker with SMITH_TURN_MAX_ATTEMPTS=1: the sweeper's re-run fails the turn, typed."""
    async with strict_fleet.client() as strict_client:
        key, marker = scenario(Reply.text("slow " * 40, chunk_size=5, delay=0.25))
        handle = await strict_client.submit(f"{marker} talk", conversation_id=f"c-{key}", agent="plain")
        # killed mid-stream: once the model was asked (a turn is "running" a few ms before that now)
        while (await handle.status()) != "running" or scripted_llm.attempts(key) < 1:
            await asyncio.sleep(0.05)
        strict_fleet.procs[0].signal(signal.SIGKILL)  # the supervisor starts a new worker; the lease runs out
        with pytest.raises(InternalError) as info:
            await handle.result(timeout=60)
        assert info.value.exception_type == "TurnAttemptsExhausted"
        assert "SMITH_TURN_MAX_ATTEMPTS=1" in info.value.message
        assert scripted_llm.attempts(key) == 1  # the refused run never asked the model


async def test_idempotent_tool_that_kills_its_worker_runs_at_most_twice(bound_client, fleet, scenario):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(Reply.tool_calls([("kills_its_worker", {"label": label})]),
                                  Reply.text("gave up on the tool")))
    conv = f"c-{key}"
    restarts = fleet.restarts
    final = await bound_client.send(f"{marker} go", conversation_id=conv, agent="deadly", timeout=120)
    assert final.content == "gave up on the tool"
    runs = await bound_client.redis.lrange(f"{fleet.prefix}:test:counted:{label}", 0, -1)
    assert 1 <= len(runs) <= 2
    assert fleet.restarts - restarts == len(runs)  # each run killed its worker; the supervisor restarted it
    tool_messages = [m for m in await bound_client.history(conv) if isinstance(m, ToolMessage)]
    assert len(tool_messages) == 1 and tool_messages[0].is_error
    assert "interrupted" in tool_messages[0].content


async def _delete_turn_keys(client: SmithClient, turn_id: str) -> None:
    keys = client.keys
    await client.redis.delete(keys.turn_state(turn_id), keys.turn_log(turn_id), keys.turn_seq(turn_id),
                              keys.turn_inbox(turn_id))


@pytest.mark.parametrize("waiter", ["follower", "result"])
async def test_deleted_turn_keys_raise_turn_not_found(bound_client, scenario, waiter):
    key, marker = scenario(Script(Reply.text("a slow answer " * 20, chunk_size=4, delay=0.5)))
    handle = await bound_client.submit(f"{marker} talk", conversation_id=f"c-{key}", agent="plain")
    events = handle.events(timeout=None)
    assert (await anext(events)).type == "turn.started"
    await _delete_turn_keys(bound_client, handle.turn_id)
    started = time.monotonic()
    with pytest.raises(TurnNotFoundError):
        if waiter == "follower":
            async for _ in events:
                pass
        else:
            await handle.result(timeout=None)
    assert time.monotonic() - started < 10.0


async def test_deleted_keys_under_send_raise_turn_not_found(bound_client, scenario):
    key, marker = scenario(Script(Reply.text("a slow answer " * 20, chunk_size=4, delay=0.5)))
    turn_id = f"t-{key}"

    async def delete_when_running() -> None:
        while (await bound_client.turn(turn_id).status()) != "running":
            await asyncio.sleep(0.05)
        await _delete_turn_keys(bound_client, turn_id)

    deleter = asyncio.create_task(delete_when_running())
    started = time.monotonic()
    with pytest.raises(TurnNotFoundError):
        await bound_client.send(f"{marker} talk", conversation_id=f"c-{key}", agent="plain", turn_id=turn_id)
    await deleter
    assert time.monotonic() - started < 20.0


# ---- the attempt limit, on a runtime in this process (its rule needs no worker process) ---------


async def _run_with_state(
    redis_url: str, llm_url: str, scenario_marker: str, **state: int
) -> tuple[list[str], dict[str, str]]:
    """Submit a turn, set its attempt counters to ``state``, run one attempt; return its event types."""
    prefix = f"att{uuid.uuid4().hex[:6]}"
    settings = Settings(redis_url=redis_url, prefix=prefix, llm_base_url=llm_url, llm_model="scripted")
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        job = TurnJob(turn_id=uuid.uuid4().hex, conversation_id=f"c-{uuid.uuid4().hex[:6]}", agent="plain",
                      message=UserMessage(content=f"{scenario_marker} hi"), submitted_at=time.time())
        await submit(client, job, "enqueue")
        await client.redis.hset(client.keys.turn_state(job.turn_id), mapping=state)
        role = TurnRole()
        rt = WorkerRuntime(app=test_app, role=role, settings=settings, redis=client.redis)
        await rt.start()
        try:
            assert role.services is not None  # a started turn role has them
            await TurnExecution(rt, role.services, job).run()
        finally:
            await rt.stop()
        return [e.type for e in await client.events.read(job.turn_id)], await client.turn(job.turn_id).state()


async def test_a_run_past_the_attempt_limit_fails_the_turn(redis_url, scripted_llm, scenario):
    _key, marker = scenario(Reply.text("should not be asked"))
    # three earlier runs' workers died while running this turn alone: the fourth is refused
    types, state = await _run_with_state(redis_url, scripted_llm.base_url, marker, attempt=3, crashes=3)
    assert types[-1] == "turn.failed" and state["status"] == "failed"
    assert "TurnAttemptsExhausted" in state["error"] and "SMITH_TURN_MAX_ATTEMPTS=3" in state["error"]


async def test_workers_that_died_running_other_turns_too_do_not_use_up_attempts(redis_url, scripted_llm, scenario):
    _key, marker = scenario(Reply.text("finished despite bad luck"))
    # two crashes alone and six with other turns in flight: bad luck, below the bound in all (9)
    types, state = await _run_with_state(redis_url, scripted_llm.base_url, marker, attempt=8, crashes=2,
                                         shared_crashes=6)  # fmt: skip
    assert types[-1] == "turn.completed" and state["status"] == "completed"


async def test_a_turn_whose_busy_workers_keep_dying_still_stops(redis_url, scripted_llm, scenario):
    _key, marker = scenario(Reply.text("should not be asked"))
    # nine crashes, all with other turns in flight: 3 x SMITH_TURN_MAX_ATTEMPTS in all refuses the tenth
    types, state = await _run_with_state(redis_url, scripted_llm.base_url, marker, attempt=9, shared_crashes=9)
    assert types[-1] == "turn.failed" and "TurnAttemptsExhausted" in state["error"]


async def test_graceful_hand_offs_do_not_use_up_attempts(redis_url, scripted_llm, scenario):
    _key, marker = scenario(Reply.text("finished after a rolling deploy"))
    # five earlier attempts, four of them hand-offs at SIGTERM: this is the second real run
    types, state = await _run_with_state(redis_url, scripted_llm.base_url, marker, attempt=5, handoffs=4)
    assert types[-1] == "turn.completed" and state["status"] == "completed"
    assert InternalError.__name__ not in state.get("error", "")
