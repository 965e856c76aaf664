"""The Redis commands of a text turn and of a one-tool turn stay few (issue 18), counted with INFO commandstats
on the test's private redis-server, idle workers included (their polling sends none of the commands counted)."""

from __future__ import annotations

import uuid

import pytest

from tests.support.scripted_llm import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

TURNS = 10
COUNTED = ("evalsha", "xrange", "mget", "subscribe")


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


async def test_a_text_turn_sends_few_scripts_and_no_log_or_registry_reads(client, scenario):
    _, marker = scenario(Script(Reply.text("hello there")))
    counts = await _per_turn(client, marker)
    # before issue 18: 19 EVALSHA (one per event), 2 XRANGE, 1 MGET, 1 SUBSCRIBE per text turn; the
    # enqueue is one more EVALSHA now (lua/enqueue.lua, instead of arq's WATCH/MULTI/EXEC): 20 unbatched
    # the opening events go in one call, the history's tail rides with the attempt's start, the reply's
    # append carries the tree's token count and the inbox's closing, the token events are batched: 15
    assert counts["evalsha"] <= 16, counts
    assert counts["xrange"] <= 0.5 and counts["mget"] <= 0.5, counts
    assert counts["subscribe"] <= 1, counts


async def test_a_tool_turn_sends_few_scripts_and_no_log_or_registry_reads(client, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    counts = await _per_turn(client, marker)
    # before issue 18: 25 EVALSHA, 2 XRANGE, 1 MGET per one-tool turn; + 2 for the turn's and the tool's enqueue
    assert counts["evalsha"] <= 26.5, counts
    assert counts["xrange"] <= 0.5 and counts["mget"] <= 0.5, counts


async def test_a_burst_of_tokens_goes_out_in_few_script_calls(client, scenario):
    """Token events that arrive while a publish is in flight go in the next one (smith_worker/event_batch.py)."""
    _, marker = scenario(Script(Reply.text("x" * 60, chunk_size=1)))  # 60 token deltas, sent at once
    counts = await _per_turn(client, marker)
    # one script call per token before: 60 + the turn's 11 others; batched, a handful
    assert counts["evalsha"] <= 30, counts
