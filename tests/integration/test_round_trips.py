"""The Redis commands of a text turn and of a one-tool turn stay few, counted with INFO commandstats
on the test's private redis-server, idle workers included (their fallback polls, one claim script each per
``SMITH_FALLBACK_POLL``, add a tenth at most). commandstats also counts the commands scripts run, so the
commands counted here are those no script sends: MULTI, WATCH and ZSCORE were arq's per-job start
(smith_worker/queue/claim.py replaced it with one EVALSHA). A tool worker's reply carries the outcome, so the
turn reads no result key unless it is oversized. The last test counts every command sent (MONITOR,
scripts' own commands left out), close to the round trips of a turn."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
import uuid

import pytest
import redis.asyncio

from smith_client.jobs import REPLY_INLINE_MAX, ToolJob, ToolOutcome
from smith_client.messages import ToolCall, ToolMessage
from smith_worker.testing import Reply, Script
from smith_worker.tools.waiter import ToolJobWaiter, WorkerSubscription

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

TURNS = 10
COUNTED = ("evalsha", "xrange", "mget", "subscribe", "multi", "watch", "zscore")
#: Per turn, arq's start of a job (WATCH, ZSCORE) left to no job: the claim script does it.
NO_ARQ_START = 0.2
#: EVALSHA per text and per one-tool turn (measured 15.8–16.1 and 27.0; idle workers' fallback polls add a claim)
TEXT_EVALSHA = 18
TOOL_EVALSHA = 30.5


async def _calls(client) -> dict[str, int]:
    stats = await client.redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in COUNTED}


async def _per_turn(client, marker: str, agent: str = "default") -> dict[str, float]:
    """Commands per turn over TURNS turns, less what the idle workers' fallback polls (a claim each) send in
    as long again with no turn: on a loaded machine the turns take longer and more polls land among them."""
    await client.send(marker, conversation_id=f"warm-{uuid.uuid4().hex[:8]}", agent=agent, timeout=60)
    before, started = await _calls(client), time.monotonic()
    for _ in range(TURNS):
        await client.send(marker, conversation_id=f"rt-{uuid.uuid4().hex[:8]}", agent=agent, timeout=60)
    after = await _calls(client)
    await asyncio.sleep(time.monotonic() - started)
    idle = await _calls(client)
    return {name: (after[name] - before[name] - (idle[name] - after[name])) / TURNS for name in COUNTED}


async def _sent_per_turn(client, marker: str) -> tuple[float, collections.Counter[str]]:
    """Commands sent to Redis per turn (MONITOR), not counting those that scripts run: close to round trips
    (a MULTI/EXEC or a pipeline counts each of its commands). Also the commands seen, by name."""
    await client.send(marker, conversation_id=f"warm-{uuid.uuid4().hex[:8]}", timeout=60)
    seen: collections.Counter[str] = collections.Counter()

    async def record(monitor) -> None:
        async for command in monitor.listen():
            if command["client_type"] != "lua":
                seen[command["command"].split(" ", 1)[0].upper()] += 1

    async with client.redis.monitor() as monitor:
        recorder = asyncio.create_task(record(monitor))
        for _ in range(TURNS):
            await client.send(marker, conversation_id=f"rt-{uuid.uuid4().hex[:8]}", timeout=60)
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder
    return sum(seen.values()) / TURNS, seen


async def test_a_text_turn_sends_few_scripts_and_no_log_or_registry_reads(client, scenario):
    _, marker = scenario(Script(Reply.text("hello there")))
    counts = await _per_turn(client, marker)
    # before the speed work: 19 EVALSHA (one per event), 2 XRANGE, 1 MGET, 1 SUBSCRIBE per text turn; the
    # enqueue is one more EVALSHA now (lua/enqueue.lua, instead of arq's WATCH/MULTI/EXEC): 20 unbatched
    # the opening events go in one call, the history's tail rides with the attempt's start, the reply's
    # append carries the tree's token count and the inbox's closing, the token events are batched: 15
    # + 2 for claiming jobs (lua/claim.lua, at the job's start and at the poll after its end), which
    # replaced arq's 2 MULTI, WATCH, ZSCORE and 3 ZRANGEBYSCORE, EXISTS, LPOP (3.9 MULTI per turn before);
    # the submit script enqueues the turn's job itself: 16; + 1 confirming the claim (lua/confirm_claims.lua)
    assert counts["evalsha"] <= TEXT_EVALSHA, counts
    assert counts["multi"] <= 2.5, counts
    assert counts["watch"] <= NO_ARQ_START and counts["zscore"] <= NO_ARQ_START, counts
    assert counts["xrange"] <= 0.5 and counts["mget"] <= 0.5, counts
    assert counts["subscribe"] <= 1, counts


async def test_a_tool_turn_sends_few_scripts_and_no_log_or_registry_reads(client, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    counts = await _per_turn(client, marker)
    # before the speed work: 25 EVALSHA, 2 XRANGE, 1 MGET per one-tool turn; + 2 for the turn's and the tool's enqueue;
    # + 4 for claiming the turn's and the tool's job (a claim at each start and at the poll after each end),
    # which replaced 6 MULTI (arq's start, run_job's first, its abort check), 2 WATCH, 2 ZSCORE (9 MULTI before);
    # the tool worker's store, tool.result event and reply are one script call (lua/store_tool_result.lua),
    # the round trips of the call's hop are counted below; + 2 confirming the turn's and the tool's claim
    assert counts["evalsha"] <= TOOL_EVALSHA, counts
    assert counts["multi"] <= 3.5, counts
    assert counts["watch"] <= NO_ARQ_START and counts["zscore"] <= NO_ARQ_START, counts
    assert counts["xrange"] <= 0.5 and counts["mget"] <= 0.5, counts


async def test_a_burst_of_tokens_goes_out_in_few_script_calls(client, scenario):
    """Token events that arrive while a publish is in flight go in the next one (smith_worker/agent/event_batch.py)."""
    _, marker = scenario(Script(Reply.text("x" * 60, chunk_size=1)))  # 60 token deltas, sent at once
    counts = await _per_turn(client, marker)
    # one script call per token before: 60 + the turn's 11 others; batched, a handful
    assert counts["evalsha"] <= 30, counts


async def _hop(client, redis_url: str, marker: str, agent: str) -> tuple[list[str], list[bytes], str]:
    """One tool turn seen from Redis: the commands that name its call's result key sent by clients (not by
    scripts), the messages on the turn workers' reply channels, and the turn's id."""
    seen: list[dict] = []
    end = f"end-{uuid.uuid4().hex}"
    monitored = redis.asyncio.Redis.from_url(redis_url)
    pubsub = client.redis.pubsub()
    await pubsub.psubscribe(client.keys.worker_replies_channel("*"))
    assert (await pubsub.get_message(timeout=10))["type"] == "psubscribe"  # subscribed before the turn starts
    try:
        async with monitored.monitor() as monitor:

            async def collect() -> None:
                while end not in (command := await monitor.next_command())["command"]:
                    seen.append(command)

            collecting = asyncio.create_task(collect())
            handle = await client.submit(marker, conversation_id=f"hop-{uuid.uuid4().hex[:8]}", agent=agent)
            await handle.result(timeout=60)
            await client.redis.echo(end)  # the last command the monitor collects
            await asyncio.wait_for(collecting, 30)
        messages = []  # all published before the turn's next step, so they are in by now
        while (message := await pubsub.get_message(timeout=0.5)) is not None:
            messages.append(message["data"])
    finally:
        await pubsub.aclose()
        await monitored.aclose()
    key = client.keys.tool_result(handle.turn_id, 1, 0)
    named = [c["command"].split() for c in seen if c["client_type"] != "lua"]
    return [words[0].upper() for words in named if key in words], messages, handle.turn_id


async def _tool_message(client, turn_id: str) -> ToolMessage:
    conversation = (await client.turn(turn_id).state())["conversation_id"]
    [tool] = [m for m in await client.history(conversation) if isinstance(m, ToolMessage)]
    return tool


# the tool dispatch's enqueue (which also says whether the call is answered), the tool worker's "answered
# already?" check, its store with the tool.result event and the reply; before: a GET before the enqueue, a
# SET NX then a pipeline with the PUBLISH of the key, and a GET after the wake-up (a hop over the waiter's 1 s
# re-check interval would add a GET of its own)
HOP = ["EVALSHA", "EXISTS", "EVALSHA"]


async def test_the_reply_carries_a_small_outcome_and_the_turn_reads_no_result_key(client, redis_url, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    commands, messages, turn_id = await _hop(client, redis_url, marker, "default")
    key = client.keys.tool_result(turn_id, 1, 0)
    assert messages == [key.encode() + b"\n" + await client.redis.get(key)]
    assert commands == HOP  # so the turn took the outcome from the reply: its history has it
    assert (await _tool_message(client, turn_id)).content == "3"


async def test_an_oversized_outcome_is_announced_bare_and_read_from_its_key(client, redis_url, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("big_structured", {"kib": 100})]), Reply.text("ok")))
    commands, messages, turn_id = await _hop(client, redis_url, marker, "contain")
    key = client.keys.tool_result(turn_id, 1, 0)
    assert len(await client.redis.get(key)) > REPLY_INLINE_MAX and messages == [key.encode()]
    assert commands == [*HOP, "GET"]  # the turn worker's read after the wake-up
    assert len((await _tool_message(client, turn_id)).content.encode()) >= 64 * 1024  # all of the capped content


async def test_an_answered_call_is_read_from_its_key_and_not_enqueued_again(client):
    """What a resumed turn does with a call answered before its turn worker died: the enqueue says "answered"."""
    keys, turn_id = client.keys, f"answered-{uuid.uuid4().hex[:8]}"
    subscription = WorkerSubscription(client.redis, keys.worker_replies_channel(f"test-{turn_id}"))
    job = ToolJob(turn_id=turn_id, conversation_id=f"c-{turn_id}", agent="default", step=1, index=0,
                  call=ToolCall(id="call-1", name="add", arguments={"a": 1, "b": 2}), timeout=5.0,
                  reply_channel=subscription.channel, result_key=keys.tool_result(turn_id, 1, 0))
    answered = ToolOutcome(content="3", worker="a tool worker gone since")
    await client.redis.set(job.result_key, answered.model_dump_json(), ex=60)
    await subscription.start()
    try:
        assert await ToolJobWaiter(client.redis, keys, subscription).run(job) == (answered, False)
    finally:
        await subscription.stop()
    job_id = keys.tool_job_id(turn_id, 1, 0)
    assert not await client.redis.exists(keys.arq_job(job_id), keys.arq_result(job_id))  # never enqueued


#: Commands sent per turn before claim.lua (arq's poll and start: 54.6 per text turn, 107.5 per one-tool
#: turn) and the ceilings now (measured 33.9 and 62.0, then + 1 per job claimed to confirm the claim:
#: lua/confirm_claims.lua; idle workers' fallback polls add a little), then + 1 per model call for its usage count
#: (smith_worker/ops/lua/usage_count.lua, in the reply's append round trip; docs/architecture.md, Token usage).
SENT_CEILINGS = {"text": 38, "tool": 69}


@pytest.mark.parametrize("kind", ["text", "tool"])
async def test_a_turn_sends_few_commands(client, scenario, kind):
    replies = [Reply.text("hello there")] if kind == "text" else [
        Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")]  # fmt: skip
    _, marker = scenario(Script(*replies))
    sent, seen = await _sent_per_turn(client, marker)
    assert sent <= SENT_CEILINGS[kind], (sent, seen)
