"""A turn worker's memory: what a turn holds while its model answers, what a Redis restart leaves behind,
and the bound on one history read (``SMITH_VIEW_MAX_BYTES``).

Each test runs its own turn worker process (and the restart test its own
redis-server), so no other test's load moves the RSS it reads. Every figure
is compared with a baseline taken in the same process after a warm-up of the
same shape (connections open, code paths run once, the heap trimmed), and the
RSS is polled until it is under its ceiling (the worker trims its heap every
5 s, ``smith_worker/ops/heap.py``), so a slow machine only waits longer. Ceilings
are about 5x what the worker needs; without the changes they guard, the
figures are several times over them.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from bench.worker_memory import fill, rss_bytes
from smith_client import ContextOverflowError, SmithClient
from smith_client.errors import SmithError
from smith_client.messages import AssistantMessage, UserMessage, message_to_json
from smith_worker.local.processes import ManagedProcess
from smith_worker.testing import Reply, ScriptedLlmServer, scenario_marker, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS
from tests.integration.test_redis_outage import RedisOnPort

pytestmark = [pytest.mark.integration]

APP = "tests.support.app:app"
MIB = 1024 * 1024
#: Concurrent turns per burst, and the stored messages of each one's conversation.
TURNS = 10
MESSAGES = 10_000
#: Seconds the RSS is polled for before a reading counts as over its ceiling (several heap trims).
SETTLE = 30.0


@pytest.fixture(scope="module")
def llm():
    """A private scripted model: every burst's requests are large, and are forgotten after each burst."""
    with ScriptedLlmServer() as server:
        yield server


def short_history(marker: str, count: int) -> list[bytes]:
    """``count`` short stored messages (user questions carrying ``marker``, answers): their parsed form is
    ten times their JSON, so a worker that keeps the parsed history shows it plainly."""
    return [
        message_to_json(UserMessage(content=f"{marker} q{n}") if n % 2 == 0 else AssistantMessage(content=f"a{n}"))
        for n in range(count)
    ]


async def start_worker(url: str, llm: ScriptedLlmServer, **env: str) -> tuple[ManagedProcess, str]:
    """A turn worker of its own (under a fresh prefix), registered."""
    prefix = f"mem{uuid.uuid4().hex[:6]}"
    (proc,) = start_workers(APP, worker_env(url, prefix, llm.base_url, **env), ["turns"], prefix, log_dir=LOGS)
    await wait_for_workers(url, prefix, 1)
    return proc, prefix


async def burst(client: SmithClient, llm: ScriptedLlmServer, messages: int) -> tuple[list, threading.Event, int]:
    """:data:`TURNS` turns over fresh ``messages``-message conversations, whose model holds its reply until
    the returned gate is set; returns once every request arrived, with the bytes of their bodies."""
    key, gate = uuid.uuid4().hex[:10], threading.Event()
    llm.add_scenario(key, Reply.text("fine", chunk_size=2, gate=gate))
    blobs = short_history(scenario_marker(key), messages)
    handles = []
    for _ in range(TURNS):
        conversation = f"c-{uuid.uuid4().hex[:8]}"
        await fill(client, conversation, blobs)
        handles.append(await client.submit(f"{scenario_marker(key)} go", conversation_id=conversation, agent="plain"))
    assert await llm.wait_until_async(lambda: llm.attempts(key) >= TURNS, timeout=120)
    body_bytes = sum(len(request.raw_body) for request in llm.requests_for(key))
    llm.reset()  # the recorded bodies are this process's memory, not the worker's
    return handles, gate, body_bytes


async def settled(pid: int, baseline: int, ceiling: int) -> int:
    """The RSS growth of ``pid`` over ``baseline`` (bytes) once it is under ``ceiling``, or the least seen
    in :data:`SETTLE` seconds."""
    least = rss_bytes(pid) - baseline
    deadline = time.monotonic() + SETTLE
    while least > ceiling and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        least = min(least, rss_bytes(pid) - baseline)
    return least


async def quiet_rss(pid: int) -> int:
    """The RSS of ``pid`` once the heap trims after a burst have run (the least of 12 s of readings)."""
    least = rss_bytes(pid)
    for _ in range(24):
        await asyncio.sleep(0.5)
        least = min(least, rss_bytes(pid))
    return least


async def served(url: str, prefix: str, llm: ScriptedLlmServer) -> None:
    """Until a new turn completed (a new client each try: Redis may have just restarted)."""
    key = uuid.uuid4().hex[:10]
    llm.add_scenario(key, Reply.text("ok"))
    deadline = time.monotonic() + 60
    while True:
        try:
            async with SmithClient.from_url(url, prefix=prefix) as client:
                conversation = uuid.uuid4().hex
                await client.send(f"{scenario_marker(key)} hi", conversation_id=conversation, agent="plain", timeout=20)
            return
        except SmithError:
            assert time.monotonic() < deadline, "the worker did not serve a turn within 60 s"
            await asyncio.sleep(0.5)


async def test_a_turn_waiting_for_its_model_holds_its_request_body_not_the_parsed_history(redis_url, llm):
    proc, prefix = await start_worker(redis_url, llm)
    try:
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            handles, gate, _ = await burst(client, llm, MESSAGES)  # warm-up: the same turns, to the end
            gate.set()
            await asyncio.gather(*(handle.result(timeout=120) for handle in handles))
            baseline = await quiet_rss(proc.pid)
            handles, gate, body_bytes = await burst(client, llm, MESSAGES)
            ceiling = 5 * body_bytes  # the parsed history is ~12x its body: the turns would hold ~2.5x this
            growth = await settled(proc.pid, baseline, ceiling)
            gate.set()
            await asyncio.gather(*(handle.result(timeout=120) for handle in handles))
        assert growth <= ceiling, (
            f"{TURNS} turns waiting for their model hold {growth / MIB:.1f} MiB over the baseline "
            f"{baseline / MIB:.1f} MiB; their request bodies are {body_bytes / MIB:.1f} MiB"
        )
    finally:
        proc.stop()


async def test_turn_worker_rss_does_not_keep_growing_across_redis_restarts(llm):
    redis = RedisOnPort()
    redis.start()
    proc, prefix = await start_worker(redis.url, llm)
    try:
        # warm-up: as many small turns at once as a burst has (connections), then one restart
        async with SmithClient.from_url(redis.url, prefix=prefix) as client:
            handles, gate, _ = await burst(client, llm, 10)
        redis.kill()
        redis.start()
        gate.set()
        await served(redis.url, prefix, llm)
        baseline = await quiet_rss(proc.pid)
        growths = []
        for _ in range(3):
            async with SmithClient.from_url(redis.url, prefix=prefix) as client:
                _, gate, body_bytes = await burst(client, llm, MESSAGES)
            redis.kill()  # with every turn waiting for its model
            await asyncio.sleep(1.0)
            redis.start()  # empty: the turns are lost
            gate.set()
            await served(redis.url, prefix, llm)
            # what a restart may leave: about one burst's request bodies (a burst's parsed histories are ~12x)
            growths.append(await settled(proc.pid, baseline, 5 * body_bytes))
        assert proc.alive()
        assert max(growths) <= 5 * body_bytes, (
            f"RSS over the baseline {baseline / MIB:.1f} MiB after each of 3 Redis restarts: "
            f"{', '.join(f'{g / MIB:.1f}' for g in growths)} MiB; "
            f"one burst's request bodies: {body_bytes / MIB:.1f} MiB"
        )
    finally:
        proc.stop()
        redis.stop()


async def test_a_history_read_over_smith_view_max_bytes_fails_the_turn_with_context_overflow_error(redis_url, llm):
    limit = 64 * 1024
    proc, prefix = await start_worker(redis_url, llm, SMITH_VIEW_MAX_BYTES=str(limit))
    try:
        key = uuid.uuid4().hex[:10]
        llm.add_scenario(key, Reply.text("fine"))
        marker = scenario_marker(key)
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            blobs = short_history(marker, 4000)  # ~200 KiB stored
            await fill(client, "long", blobs)
            with pytest.raises(ContextOverflowError) as raised:
                await client.send(f"{marker} go", conversation_id="long", agent="plain", timeout=30)
            assert raised.value.limit == "SMITH_VIEW_MAX_BYTES" and raised.value.budget == limit
            assert raised.value.size > limit and "SMITH_VIEW_MAX_BYTES=65536" in raised.value.message
            assert llm.attempts(key) == 0  # refused before the model call
            await fill(client, "short", blobs[:100])
            reply = await client.send(f"{marker} go", conversation_id="short", agent="plain", timeout=30)
            assert reply.content == "fine"
    finally:
        proc.stop()
