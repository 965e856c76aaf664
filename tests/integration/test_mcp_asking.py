"""An MCP server asking a person during a tool call, through real workers and our lab stdio server
(tests/support/asking_app.py): the wait for the answer does not count against ``request_timeout`` and is
bounded by ``elicitation_timeout``; a sampling may need a person's approval first; sampled tokens count toward
the turn's and the tree's budgets (docs/architecture.md, Pausing for a person and MCP)."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest

from smith_client import AgentUsage, InvalidRequestError, NoPendingCallError, SmithClient
from smith_worker.testing import Reply, Script, worker_env, worker_pair
from tests.conftest import LOGS
from tests.support.mcp_helpers import open_input, tool_contents

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
async def asking(redis_url, scripted_llm):
    """A client on workers serving tests/support/asking_app.py (a prefix of their own)."""
    prefix = f"ask{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    async with worker_pair("tests.support.asking_app:app", redis_url, prefix, env, log_dir=LOGS), \
            SmithClient.from_url(redis_url, prefix=prefix) as client:
        yield client



async def events_of(client: SmithClient, turn_id: str) -> list:
    return [event async for event in client.follow(turn_id)]


async def test_an_answer_after_twice_request_timeout_reaches_the_server(asking, scenario, scripted_llm):
    """request_timeout is 3 s; the person answers after 6.5 s: the server gets the accept, the call completes."""
    key, marker = scenario(Script(
        Reply.tool_calls([("mcp_lab_ask__echo", {"text": "first"}), ("mcp_lab_ask__ask", {"question": "Your name?"})]),
        Reply.text("thanks"),
    ))
    handle = await asking.submit(f"{marker} ask me", conversation_id=f"conv-{key}", agent="asker")
    item = await open_input(asking, handle.turn_id)
    assert (item.kind, item.method, item.message, item.tool) == (
        "input", "elicitation/create", "Your name?", "mcp_lab_ask__ask")
    assert (item.step, item.index) == (1, 1)  # the call's place: the first model step, its second call
    assert item.parameters["required"] == ["name"]
    await asyncio.sleep(2 * 3.0 + 0.5)  # the person takes twice the request's budget to answer
    answer = await asking.respond(handle.turn_id, item.request_id, "accept", {"name": "Ada"})
    assert answer.action == "accept"
    assert (await handle.result(timeout=90)).content == "thanks"
    echoed, asked = tool_contents(scripted_llm.requests_for(key)[1])
    assert echoed == "first" and orjson.loads(asked) == {"action": "accept", "name": "Ada"}
    events = await events_of(asking, handle.turn_id)
    requested = [e.data["item"] for e in events if e.type == "input.requested"]
    assert [(i["step"], i["index"], i["method"]) for i in requested] == [(1, 1, "elicitation/create")]


async def test_an_unanswered_elicitation_is_declined_after_elicitation_timeout_past_request_timeout(
    asking, scenario, scripted_llm
):
    """request_timeout 2 s, elicitation_timeout 5 s: the server gets a decline (not a timeout) after 5 s."""
    key, marker = scenario(Script(Reply.tool_calls([("mcp_lab_hasty__ask", {"question": "Name?"})]), Reply.text("ok")))
    started = time.monotonic()
    handle = await asking.submit(f"{marker} ask me", conversation_id=f"conv-{key}", agent="asker_hasty")
    item = await open_input(asking, handle.turn_id)
    assert (await handle.result(timeout=120)).content == "ok"
    assert time.monotonic() - started >= 5.0  # the wait ran its elicitation_timeout, not the 2 s request_timeout
    assert orjson.loads(tool_contents(scripted_llm.requests_for(key)[1])[0]) == {"action": "decline", "name": None}
    with pytest.raises(NoPendingCallError):
        await asking.respond(handle.turn_id, item.request_id, "accept", {"name": "late"})
    answered = [e.data for e in await events_of(asking, handle.turn_id) if e.type == "input.answered"]
    assert answered == [{"request_id": item.request_id, "action": "decline"}]


async def test_sampled_tokens_count_in_the_turns_usage_and_the_tree(asking, scenario, scripted_llm):
    sample_key, sample_marker = scenario(Reply.text("sampled words", usage=(30, 12)))
    key, marker = scenario(Script(
        Reply.tool_calls([("mcp_lab_sampling__sample_text", {"prompt": f"{sample_marker} hi"})], usage=(10, 5)),
        Reply.text("done", usage=(10, 5)),
    ))
    counted = (await asking.usage(agent="sampler")).get("sampler", AgentUsage())
    tenant = f"t-{key}"  # the tool call carries the turn's tenant: the sampling counts for it (Tenants)
    handle = await asking.submit(f"{marker} sample", conversation_id=f"conv-{key}", agent="sampler", tenant=tenant)
    assert (await handle.result(timeout=90)).content == "done"
    assert orjson.loads(tool_contents(scripted_llm.requests_for(key)[1])[0]) == {
        "text": "sampled words", "model": "sampler"}
    [completed] = [e for e in await events_of(asking, handle.turn_id) if e.type == "turn.completed"]
    # the turn's two model calls (15 + 15) and the sampling its tool call served (42)
    assert completed.data["usage"] == {"prompt": 50, "completion": 22, "total": 72}
    assert int(await asking.redis.get(asking.keys.tree_tokens(handle.turn_id))) == 72
    # the deployment's usage buckets count the sampling too, for the agent that asked (docs/architecture.md, Token usage)
    now = (await asking.usage(agent="sampler"))["sampler"]
    assert (now.requests - counted.requests, now.prompt - counted.prompt, now.total - counted.total) == (3, 50, 72)
    assert await asking.usage(agent="sampler", tenant=tenant) == {
        "sampler": AgentUsage(requests=3, prompt=50, completion=22, total=72)}


@pytest.mark.parametrize("agent, operation", [("sampler_tight", "max_total_tokens"),
                                              ("sampler_tight_tree", "tree_max_total_tokens")])
async def test_sampled_tokens_reach_the_turns_and_the_trees_budgets(asking, scenario, scripted_llm, agent, operation):
    """Budgets of 50 tokens: the turn's first model call used 15, the sampling 42, so the second step is refused."""
    sample_key, sample_marker = scenario(Reply.text("sampled words", usage=(30, 12)))
    key, marker = scenario(Script(
        Reply.tool_calls([("mcp_lab_sampling__sample_text", {"prompt": f"{sample_marker} hi"})], usage=(10, 5)),
        Reply.text("never", usage=(10, 5)),
    ))
    handle = await asking.submit(f"{marker} sample", conversation_id=f"conv-{key}", agent=agent)
    failed = (await events_of(asking, handle.turn_id))[-1]
    assert failed.type == "turn.failed"
    error = failed.error()
    assert error.kind == "TurnCancelledError" and error.operation == operation
    assert len(scripted_llm.requests_for(key)) == 1 and len(scripted_llm.requests_for(sample_key)) == 1


async def test_a_sampling_waits_for_approval_past_request_timeout_then_uses_the_model(asking, scenario, scripted_llm):
    sample_key, sample_marker = scenario(Reply.text("approved words"))
    key, marker = scenario(Script(
        Reply.tool_calls([("mcp_lab_approve__sample_text", {"prompt": f"{sample_marker} write a haiku"})]),
        Reply.text("done"),
    ))
    handle = await asking.submit(f"{marker} sample", conversation_id=f"conv-{key}", agent="approver")
    item = await open_input(asking, handle.turn_id)
    assert (item.kind, item.method, item.parameters) == (
        "input", "sampling/createMessage", {"type": "object", "properties": {}})
    assert "'lab_approve' asks to sample" in item.message and "write a haiku" in item.message
    assert (item.step, item.index) == (1, 0)
    assert scripted_llm.requests_for(sample_key) == []  # nothing sampled before the person accepts
    with pytest.raises(InvalidRequestError):  # an approval takes no content
        await asking.respond(handle.turn_id, item.request_id, "accept", {"ok": True})
    await asyncio.sleep(2 * 3.0 + 0.5)  # past twice the 3 s request_timeout
    assert (await asking.respond(handle.turn_id, item.request_id, "accept")).action == "accept"
    assert (await handle.result(timeout=90)).content == "done"
    assert orjson.loads(tool_contents(scripted_llm.requests_for(key)[1])[0]) == {
        "text": "approved words", "model": "sampler"}
    assert len(scripted_llm.requests_for(sample_key)) == 1


@pytest.mark.parametrize("agent, answer", [("approver", "decline"), ("approver_hasty", None)])
async def test_a_declined_or_unanswered_sampling_approval_answers_the_server_with_an_error(
    asking, scenario, scripted_llm, agent, answer
):
    """Declined by the person, or unanswered within elicitation_timeout (4 s, past the 2 s request_timeout)."""
    alias = {"approver": "lab_approve", "approver_hasty": "lab_approve_hasty"}[agent]
    sample_key, sample_marker = scenario(Reply.text("never"))
    key, marker = scenario(Script(
        Reply.tool_calls([(f"mcp_{alias}__sample_text", {"prompt": f"{sample_marker} hi"})]), Reply.text("done"),
    ))
    handle = await asking.submit(f"{marker} sample", conversation_id=f"conv-{key}", agent=agent)
    item = await open_input(asking, handle.turn_id)
    if answer is not None:
        await asking.respond(handle.turn_id, item.request_id, answer)
    assert (await handle.result(timeout=120)).content == "done"
    result = orjson.loads(tool_contents(scripted_llm.requests_for(key)[1])[0])
    assert "the user declined the sampling request" in result["error"]
    assert scripted_llm.requests_for(sample_key) == []
