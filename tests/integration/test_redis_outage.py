"""Workers outlive Redis — a restart (no persistence), a freeze (SIGSTOP), a Redis that is
down when a worker starts — and calls stay bounded while Redis does not answer.

The module runs its own redis-server on a fixed port (restarted on the same
port) and its own fleet: 2 turn workers + 2 tool workers, shared by the tests
of this module. Test order matters only for cost: the restart test, which
loses every key, runs last.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid

import pytest
import redis as sync_redis

from smith_client import SmithClient
from smith_client.errors import SmithTimeoutError, TransportError, TurnNotFoundError
from smith_client.messages import AssistantMessage
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.local.processes import ManagedProcess, free_port, redis_answers, start_redis_server, wait_until
from smith_worker.runtime import WorkerRuntime
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from smith_worker.tool_worker.role import ToolRole
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]

APP = "tests.support.app:app"
TURNS = 20
FREEZE = 20.0  # seconds Redis is stopped


class RedisOnPort:
    """A private redis-server that can be killed, frozen and restarted on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: ManagedProcess | None = None

    def start(self) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        self.proc, _ = start_redis_server(self.port, log_path=LOGS / f"outage-redis-{self.port}.log")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.signal(signal.SIGKILL)
        self.proc.stop()

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.signal(signum)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.signal(signal.SIGCONT)
            self.proc.stop()


@pytest.fixture(scope="module")
def outage_redis():
    server = RedisOnPort()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
async def outage_fleet(outage_redis, scripted_llm):
    prefix = f"out{uuid.uuid4().hex[:6]}"
    env = worker_env(outage_redis.url, prefix, scripted_llm.base_url)
    procs = start_workers(APP, env, ["turns", "turns", "tools", "tools"], prefix, log_dir=LOGS)
    await wait_for_workers(outage_redis.url, prefix, len(procs))
    yield prefix, procs
    for proc in procs:
        proc.stop()


def redis_lrange(url: str, key: str) -> list[bytes]:
    client = sync_redis.Redis.from_url(url, socket_timeout=2)
    try:
        return client.lrange(key, 0, -1)
    finally:
        client.close()


def assert_all_alive(procs: list[ManagedProcess]) -> None:
    assert [p.alive() for p in procs] == [True] * len(procs), "a worker process exited"


def turn_script(scenario, tag: str):
    """A scripted turn: one tool call, then a streamed answer taking ~2 s (so turns are in flight)."""
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]),
                                  Reply.text(f"done {tag} " + "word " * 10, chunk_size=5, delay=0.2)))
    return key, marker


async def _submit_many(client: SmithClient, scenario, count: int) -> list[str]:
    ids = []
    for i in range(count):
        _key, marker = turn_script(scenario, str(i))
        handle = await client.submit(f"{marker} add", conversation_id=f"c-{uuid.uuid4().hex[:8]}")
        ids.append(handle.turn_id)
    return ids


async def _result_reattaching(
    client: SmithClient, turn_id: str, deadline: float
) -> tuple[AssistantMessage, list[float]]:
    """Wait (``timeout=None``) for the result; on a TransportError (Redis frozen) re-attach with
    ``client.turn``. Returns the result and how long each failed wait took (seconds)."""
    failed_waits = []
    while True:
        started = time.monotonic()
        try:
            return await client.turn(turn_id).result(timeout=None), failed_waits
        except TransportError:
            failed_waits.append(time.monotonic() - started)
            assert time.monotonic() < deadline
            await asyncio.sleep(0.5)


async def _new_turn_completes(url: str, prefix: str, scenario) -> float:
    """Seconds for a new turn (new client) to complete, retrying submission while Redis still warms up."""
    started = time.monotonic()
    _key, marker = turn_script(scenario, "after")
    async with SmithClient.from_url(url, prefix=prefix) as client:
        final = await client.send(f"{marker} add", conversation_id=f"c-{uuid.uuid4().hex[:8]}", timeout=30)
    assert final.content.startswith("done after")
    return time.monotonic() - started


async def test_worker_started_with_redis_down_waits_then_serves(scripted_llm, scenario):
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    prefix = f"late{uuid.uuid4().hex[:6]}"
    procs = start_workers(APP, worker_env(url, prefix, scripted_llm.base_url), ["turns", "tools"], prefix, log_dir=LOGS)
    redis_proc = None
    try:
        await asyncio.sleep(4.0)  # several failed connection attempts
        assert_all_alive(procs)
        assert not redis_answers(url)
        procs[1].signal(signal.SIGTERM)  # a signal still ends a worker waiting for Redis
        wait_until(lambda: not procs[1].alive(), 10.0, "worker exit on SIGTERM")
        redis_proc, _ = start_redis_server(port)
        await wait_for_workers(url, prefix, 1, timeout=30)
        key, marker = scenario(Reply.text("served after Redis came up"))
        async with SmithClient.from_url(url, prefix=prefix) as client:
            final = await client.send(f"{marker} hi", conversation_id=f"c-{key}", agent="plain", timeout=30)
        assert final.content == "served after Redis came up"
    finally:
        for proc in procs:
            proc.stop()
        if redis_proc is not None:
            redis_proc.stop()


async def test_redis_frozen_for_20s(outage_redis, outage_fleet, scenario):
    prefix, procs = outage_fleet
    async with SmithClient.from_url(outage_redis.url, prefix=prefix) as client:
        # a tool call that finishes while Redis is frozen: its result is stored once Redis is back
        _key, marker = scenario(Script(Reply.tool_calls([("slow_tool", {"seconds": 3})]), Reply.text("done slow")))
        slow = await client.submit(f"{marker} sleep", conversation_id=f"c-{uuid.uuid4().hex[:8]}", agent="durable")
        wait_until(lambda: redis_lrange(outage_redis.url, f"{prefix}:test:slow:{slow.turn_id}"), 10, "slow_tool")
        ids = await _submit_many(client, scenario, TURNS)
        deadline = time.monotonic() + 120
        waiters = [asyncio.create_task(_result_reattaching(client, turn_id, deadline)) for turn_id in ids]
        await asyncio.sleep(1.0)  # turns are running: tool calls and streams in flight
        outage_redis.signal(signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            # a bounded call on a frozen Redis, with the pooled client and with a new one
            for fresh in (False, True):
                started = time.monotonic()
                sender = SmithClient.from_url(outage_redis.url, prefix=prefix) if fresh else client
                with pytest.raises((SmithTimeoutError, TransportError)):
                    await sender.send("hello", conversation_id=f"c-{uuid.uuid4().hex[:8]}", agent="plain", timeout=3)
                assert time.monotonic() - started < 10.0
                if fresh:
                    await sender.aclose()
            await asyncio.sleep(max(0.0, FREEZE - (time.monotonic() - frozen_at)))
            assert_all_alive(procs)
        finally:
            outage_redis.signal(signal.SIGCONT)
        results = await asyncio.gather(*waiters)
        assert (await _result_reattaching(client, slow.turn_id, deadline))[0].content == "done slow"
        tool_message = (await client.history((await slow.state())["conversation_id"]))[2]
        assert (tool_message.content, tool_message.is_error) == ("slept", False)  # ran once, result kept
    assert all(final.content.startswith("done") for final, _ in results)  # every in-flight turn completed
    failed_waits = [seconds for _, waits in results for seconds in waits]
    assert failed_waits, "no wait saw the freeze"
    assert max(failed_waits) < 5.0 + 10.0  # timeout=None: TransportError after the 5 s socket timeout
    assert_all_alive(procs)
    assert await _new_turn_completes(outage_redis.url, prefix, scenario) < 30.0


async def test_redis_killed_and_restarted_empty(outage_redis, outage_fleet, scenario):
    prefix, procs = outage_fleet
    async with SmithClient.from_url(outage_redis.url, prefix=prefix) as client:
        callers, ids = [], [uuid.uuid4().hex for _ in range(TURNS)]
        for i, turn_id in enumerate(ids):
            _key, marker = turn_script(scenario, str(i))
            callers.append(asyncio.create_task(client.send(
                f"{marker} add", conversation_id=f"c-{uuid.uuid4().hex[:8]}", turn_id=turn_id, timeout=None)))
        await asyncio.sleep(1.5)
        outage_redis.kill()
        await asyncio.sleep(3.0)
        assert_all_alive(procs)
        outage_redis.start()  # same port, no persistence: every key is gone
        outcomes = await asyncio.wait_for(asyncio.gather(*callers, return_exceptions=True), timeout=60)
        for outcome in outcomes:
            assert isinstance(outcome, (AssistantMessage, TransportError, TurnNotFoundError)), repr(outcome)
        wait_until(lambda: redis_answers(outage_redis.url), 10, "redis")
        lost = [turn_id for turn_id, outcome in zip(ids, outcomes) if not isinstance(outcome, AssistantMessage)]
        for turn_id in lost:  # a caller re-attaching to a turn whose keys were lost is told so
            with pytest.raises(TurnNotFoundError):
                await client.turn(turn_id).result(timeout=None)
    assert_all_alive(procs)
    assert await _new_turn_completes(outage_redis.url, prefix, scenario) < 30.0
    await asyncio.sleep(0.5)
    assert_all_alive(procs)


async def test_start_up_warns_when_redis_may_evict(outage_redis, caplog):
    """A worker's start-up check: any maxmemory-policy but noeviction is logged as a warning."""
    settings = Settings(redis_url=outage_redis.url, prefix=f"evict{uuid.uuid4().hex[:6]}")
    async with SmithClient.from_url(outage_redis.url) as client:
        runtime = WorkerRuntime(app=SmithApp(), role=ToolRole(), settings=settings, redis=client.redis)
        for policy, warned in (("allkeys-lru", True), ("noeviction", False)):
            await client.redis.config_set("maxmemory-policy", policy)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="agent_smith.worker"):
                await runtime.start()
                await runtime.stop()
            assert ("maxmemory-policy is 'allkeys-lru'" in caplog.text) is warned


async def test_a_worker_refused_by_redis_exits_with_a_configuration_error(scripted_llm, tmp_path):
    """Waiting is for outages: a Redis that refuses the worker's credentials ends it (a configuration error)."""
    port = free_port()
    redis_proc, _url_with_password = start_redis_server(port, log_path=tmp_path / "redis.log", password="s3cret")
    url = f"redis://127.0.0.1:{port}/0"  # no password
    prefix = f"auth{uuid.uuid4().hex[:6]}"
    procs = start_workers(APP, worker_env(url, prefix, scripted_llm.base_url), ["turns"], prefix, log_dir=LOGS)
    try:
        wait_until(lambda: not procs[0].alive(), 30.0, "worker exit")
        assert procs[0].proc.returncode != 0
        assert "ConfigurationError" in procs[0].log_path.read_text()
    finally:
        procs[0].stop()
        redis_proc.stop()


def test_a_server_on_an_append_only_dir_keeps_acknowledged_writes_through_a_kill(tmp_path):
    """``start_redis_server(aof_dir=...)`` (the soak's Redis restart): a SIGKILLed server started again on the same
    directory has every write it acknowledged (``appendfsync always``); the directory is left to its owner."""
    port, data = free_port(), tmp_path / "data"
    data.mkdir()
    redis_proc, url = start_redis_server(port, log_path=tmp_path / "redis.log", aof_dir=data)
    try:
        client = sync_redis.Redis.from_url(url)
        for i in range(100):
            client.set(f"k{i}", i)
        client.close()
        redis_proc.signal(signal.SIGKILL)
        redis_proc.stop()
        assert data.is_dir()
        redis_proc, url = start_redis_server(port, log_path=tmp_path / "redis.log", aof_dir=data)
        client = sync_redis.Redis.from_url(url)
        assert client.dbsize() == 100 and client.get("k99") == b"99"
        client.close()
    finally:
        redis_proc.stop()
    assert data.is_dir()
