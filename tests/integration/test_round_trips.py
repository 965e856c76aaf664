"""The Redis commands of a text turn and of a one-tool turn stay few (issue 18), counted with INFO commandstats
on the test's private redis-server, idle workers included (their fallback polls, one claim script each per
``SMITH_FALLBACK_POLL``, add a tenth at most). commandstats also counts the commands scripts run, so the
commands counted here are those no script sends: MULTI, WATCH and ZSCORE were arq's per-job start
(smith_worker/claim.py replaced it with one EVALSHA). The last test counts every command sent (MONITOR,
scripts' own commands left out), close to the round trips of a turn."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import uuid

import pytest

from tests.support.scripted_llm import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

TURNS = 10
COUNTED = ("evalsha", "xrange", "mget", "subscribe", "multi", "watch", "zscore")
#: Per turn, arq's start of a job (WATCH, ZSCORE) left to no job: the claim script does it.
NO_ARQ_START = 0.2


async def _calls(client) -> dict[str, int]:
    stats = await client.redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in COUNTED}


async def _per_turn(client, marker: str) -> dict[str, float]:
    await client.send(marker, conversation_id=f"warm-{uuid.uuid4().hex[:8]}", timeout=60)
    before = await _calls(client)
    for _ in range(TURNS):
        await client.send(marker, conversation_id=f"rt-{uuid.uuid4().hex[:8]}", timeout=60)
    after = await _calls(client)
    return {name: (after[name] - before[name]) / TURNS for name in COUNTED}


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
    # before issue 18: 19 EVALSHA (one per event), 2 XRANGE, 1 MGET, 1 SUBSCRIBE per text turn; the
    # enqueue is one more EVALSHA now (lua/enqueue.lua, instead of arq's WATCH/MULTI/EXEC): 20 unbatched
    # + 2 for claiming jobs (lua/claim.lua, at the job's start and at the poll after its end), which
    # replaced arq's 2 MULTI, WATCH, ZSCORE and 3 ZRANGEBYSCORE, EXISTS, LPOP (3.9 MULTI per turn before)
    assert counts["evalsha"] <= 21.5, counts  # the opening events go in one call
    assert counts["multi"] <= 2.5, counts
    assert counts["watch"] <= NO_ARQ_START and counts["zscore"] <= NO_ARQ_START, counts
    assert counts["xrange"] <= 0.5 and counts["mget"] <= 0.5, counts
    assert counts["subscribe"] <= 1, counts


async def test_a_tool_turn_sends_few_scripts_and_no_log_or_registry_reads(client, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    counts = await _per_turn(client, marker)
    # before issue 18: 25 EVALSHA, 2 XRANGE, 1 MGET per one-tool turn; + 2 for the turn's and the tool's enqueue
    # + 4 for claiming the turn's and the tool's job (a claim at each start and at the poll after each end),
    # which replaced 6 MULTI (arq's start, run_job's first, its abort check), 2 WATCH, 2 ZSCORE (9 MULTI before)
    assert counts["evalsha"] <= 30.5, counts
    assert counts["multi"] <= 3.5, counts
    assert counts["watch"] <= NO_ARQ_START and counts["zscore"] <= NO_ARQ_START, counts
    assert counts["xrange"] <= 0.5 and counts["mget"] <= 0.5, counts


#: Commands sent per turn before claim.lua (arq's poll and start: 54.6 per text turn, 107.5 per one-tool
#: turn) and the ceilings now (measured 40.5 and 70.5; idle workers' fallback polls add a little).
SENT_CEILINGS = {"text": 43, "tool": 74}


@pytest.mark.parametrize("kind", ["text", "tool"])
async def test_a_turn_sends_few_commands(client, scenario, kind):
    replies = [Reply.text("hello there")] if kind == "text" else [
        Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")]  # fmt: skip
    _, marker = scenario(Script(*replies))
    sent, seen = await _sent_per_turn(client, marker)
    assert sent <= SENT_CEILINGS[kind], (sent, seen)
