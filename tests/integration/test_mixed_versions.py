"""A fleet in a rolling deploy: a turn worker and a tool worker of each of two app versions, real processes.

v2 (``tests/support/app_v2.py``) adds a tool (``convert``) and an agent (``v2agent``) to v1
(``tests/support/app.py``). Every call of the new tool must run on the v2 tool worker and every turn of the
new agent on the v2 turn worker (smith_worker/routing.py), while what both versions have still runs on
both. One job slot per worker (``SMITH_*_MAX_JOBS=1``), so two idle workers share two jobs of a burst.
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from smith_client import SmithClient
from smith_client.events import ToolResultData
from smith_client.keys import Keys
from smith_client.registry import live_workers
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]

V1, V2 = "tests.support.app:app", "tests.support.app_v2:app"
CALLS = 10


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm):
    """(prefix, worker ids by (version, queue)): v1 and v2 turn and tool workers, registered."""
    prefix = f"mixed{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url, SMITH_TOOL_MAX_JOBS="1", SMITH_TURN_MAX_JOBS="1")
    procs = start_workers(V1, env, ["turns", "tools"], f"{prefix}-v1", log_dir=LOGS) + start_workers(
        V2, env, ["turns", "tools"], f"{prefix}-v2", log_dir=LOGS
    )
    try:
        await wait_for_workers(redis_url, prefix, len(procs))
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            workers = await live_workers(client.redis, Keys(prefix))
        ids = {("v2" if "v2agent" in w["agents"] or "convert" in w["tools"] else "v1", w["queue"]): w["id"]
               for w in workers}  # fmt: skip
        assert len(ids) == 4, workers
        yield prefix, ids
    finally:
        for proc in procs:
            proc.stop()


async def run_turn(client: SmithClient, marker: str, agent: str) -> tuple[str, str, list[ToolResultData]]:
    """One turn streamed to its end: (its id, the final text, its tool results)."""
    turn_id, final, results = "", "", []
    async for event in client.stream(f"{marker} go", conversation_id=f"c-{uuid.uuid4().hex[:8]}", agent=agent,
                                     timeout=60):  # fmt: skip
        assert event.type != "turn.failed", event.data
        turn_id = event.turn_id
        if isinstance(event.payload, ToolResultData):
            results.append(event.payload)
        if event.type == "turn.completed":
            final = event.final_message().content
    return turn_id, final, results


async def test_every_call_of_the_new_tool_and_every_turn_of_the_new_agent_run_on_v2(redis_url, fleet, scenario):
    prefix, ids = fleet
    _key, marker = scenario(Script(Reply.tool_calls([("convert", {"amount": 21})]), Reply.text("converted")))
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        turns = await asyncio.gather(*(run_turn(client, marker, "v2agent") for _ in range(CALLS)))
        states = [await client.turn(turn_id).state() for turn_id, _, _ in turns]
    assert [final for _, final, _ in turns] == ["converted"] * CALLS
    results = [result for _, _, results in turns for result in results]
    assert len(results) == CALLS and not any(result.is_error for result in results), results
    assert {result.worker for result in results} == {ids["v2", "tools"]}  # never "unknown tool" from v1
    assert {state["worker"] for state in states} == {ids["v2", "turns"]}  # never UnknownAgentError from v1


async def test_what_both_versions_serve_still_runs_on_both(redis_url, fleet, scenario):
    """Two turns of an agent both versions have, each with two calls of a tool both have: with one slot per
    worker and every worker idle, each turn worker runs a turn and each tool worker runs calls."""
    prefix, ids = fleet
    calls = [("slow_tool", {"seconds": 1.0})] * 2
    _key, marker = scenario(Script(Reply.tool_calls(calls), Reply.text("slept")))
    async with SmithClient.from_url(redis_url, prefix=prefix) as client:
        handles = [await client.submit(f"{marker} go", conversation_id=f"c-{uuid.uuid4().hex[:8]}", agent="durable")
                   for _ in range(2)]  # fmt: skip
        turns = [await client.turn(handle.turn_id).result(timeout=60) for handle in handles]
        states = [await handle.state() for handle in handles]
        events = [[event async for event in client.follow(handle.turn_id, timeout=10)] for handle in handles]
    assert [turn.content for turn in turns] == ["slept", "slept"]
    assert {state["worker"] for state in states} == {ids["v1", "turns"], ids["v2", "turns"]}
    ran = [e.payload.worker for turn in events for e in turn if isinstance(e.payload, ToolResultData)]
    assert len(ran) == 4 and set(ran) == {ids["v1", "tools"], ids["v2", "tools"]}, ran


async def test_a_tool_no_live_tool_worker_serves_is_an_unknown_tool_at_once(redis_url, scripted_llm, scenario):
    """A v2 turn worker with only v1 tool workers live: the call is refused at enqueue, not left to time out."""
    prefix = f"unserved{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    procs = start_workers(V2, env, ["turns"], f"{prefix}-v2", log_dir=LOGS) + start_workers(
        V1, env, ["tools"], f"{prefix}-v1", log_dir=LOGS
    )
    _key, marker = scenario(Script(Reply.tool_calls([("convert", {"amount": 1}), ("whoami", {})]), Reply.text("ok")))
    try:
        await wait_for_workers(redis_url, prefix, len(procs))
        async with SmithClient.from_url(redis_url, prefix=prefix) as client:
            started = asyncio.get_running_loop().time()
            _, final, results = await run_turn(client, marker, "v2agent")
            took = asyncio.get_running_loop().time() - started
    finally:
        for proc in procs:
            proc.stop()
    assert final == "ok"
    by_name = {result.name: result for result in results}
    assert by_name["convert"].is_error and "unknown tool: convert" in by_name["convert"].content
    assert by_name["convert"].worker is None  # answered by the turn worker, nothing enqueued
    assert not by_name["whoami"].is_error and by_name["whoami"].worker  # v1's tool runs on v1
    assert took < 15.0  # not the tool's timeout (300 s default) + the pickup grace
