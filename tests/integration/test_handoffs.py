"""Handoffs (docs/architecture.md, Handoffs), end to end: real worker processes, real Redis, the scripted model.

Agents: tests/support/app.py ("triage" hands off to "billing" or "support"; "ping" and "pong" to each other).
"""

from __future__ import annotations

import os
import signal
import threading
import uuid

import pytest

from smith_client import SmithClient
from smith_client.errors import TurnCancelledError
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.app import SmithApp
from smith_worker.testing import Reply
from tests.integration.test_crash_recovery import fleet, wait_for, worker_pid_running  # noqa: F401 (fleet)

pytestmark = [pytest.mark.integration]


@pytest.fixture
async def killable(fleet):  # noqa: F811 (the imported fixture)
    """A client of the fleet whose turn workers a test may kill (tests/integration/test_crash_recovery.py)."""
    await fleet.ensure(turns=2, tools=1)
    async with SmithClient.from_url(fleet.redis_url, prefix=fleet.prefix) as client:
        yield client


def system_prompt(request) -> str:
    first = request.messages[0]
    return first["content"] if first.get("role") == "system" else ""


def offered(request) -> list[str]:
    return [tool["function"]["name"] for tool in request.body.get("tools", [])]


def last_user_text(request) -> str:
    return next(m["content"] for m in reversed(request.messages) if m.get("role") == "user")


def desk(request):
    """Triage transfers to billing unless asked to answer itself; billing answers."""
    if system_prompt(request) == "You handle billing.":
        return Reply.text(f"billing answers: {last_user_text(request).split()[-1]}")
    if "stay" in last_user_text(request):
        return Reply.text("triage answers")
    return Reply.tool_calls([("transfer_to_billing", {})])


async def test_triage_hands_off_to_billing_mid_turn_and_the_next_turn_runs_billing(
    workers, client, scenario, scripted_llm
):
    key, marker = scenario(desk)
    conversation = f"handoff-{uuid.uuid4().hex[:8]}"
    assert await client.conversation_agent(conversation) is None

    first = await client.submit(f"{marker} my invoice is wrong one", conversation_id=conversation, agent="triage")
    assert (await first.result(timeout=60)).content == "billing answers: one"
    requests = scripted_llm.requests_for(key)
    assert [system_prompt(r) for r in requests] == ["You triage.", "You handle billing."]
    assert offered(requests[0]) == ["add", "transfer_to_billing", "transfer_to_support"]
    described = {t["function"]["name"]: t["function"]["description"] for t in requests[0].body["tools"]}
    assert described["transfer_to_billing"] == "Invoices, refunds, payments."
    assert offered(requests[1]) == ["whoami"]  # billing's own tools, no transfer back

    events = [e async for e in first.events(timeout=60)]
    handoffs = [e for e in events if e.type == "handoff"]
    assert len(handoffs) == 1 and handoffs[0].agent_path == ["triage"]
    assert handoffs[0].data["from_agent"] == "triage" and handoffs[0].data["to_agent"] == "billing"
    after = events[events.index(handoffs[0]) + 1 :]
    assert after and all(e.agent_path == ["billing"] for e in after)  # billing answers the rest of the turn
    assert events[-1].type == "turn.completed"
    call_id = next(e for e in events if e.type == "tool_call.completed").data["id"]
    assert handoffs[0].data["tool_call_id"] == call_id

    history = await client.history(conversation)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    assert history[1].tool_calls[0].name == "transfer_to_billing"
    assert history[2].name == "transfer_to_billing" and not history[2].is_error
    assert await client.conversation_agent(conversation) == "billing"

    scripted_llm_before = len(scripted_llm.requests_for(key))
    second = await client.submit("and my refund two", conversation_id=conversation)  # no agent=
    assert (await second.result(timeout=60)).content == "billing answers: two"
    started = [e async for e in second.events(timeout=60)][0]
    assert started.type == "turn.started" and started.data["agent"] == "billing"
    assert started.agent_path == ["billing"]
    assert [system_prompt(r) for r in scripted_llm.requests_for(key)[scripted_llm_before:]] == ["You handle billing."]

    # an explicit agent= still wins over the conversation's current agent
    third = await client.send("please stay three", conversation_id=conversation, agent="triage")
    assert third.content == "triage answers"
    assert system_prompt(scripted_llm.requests_for(key)[-1]) == "You triage."


async def test_of_two_transfers_in_one_step_the_last_wins(workers, client, scenario):
    def both(request):
        if system_prompt(request) == "You triage.":
            return Reply.tool_calls([("transfer_to_support", {}), ("transfer_to_billing", {})])
        return Reply.text(f"answered by: {system_prompt(request)}")

    _, marker = scenario(both)
    conversation = f"both-{uuid.uuid4().hex[:8]}"
    handle = await client.submit(f"{marker} help", conversation_id=conversation, agent="triage")
    assert (await handle.result(timeout=60)).content == "answered by: You handle billing."
    handoffs = [e.data["to_agent"] async for e in handle.events(timeout=60) if e.type == "handoff"]
    assert handoffs == ["billing"]
    assert await client.conversation_agent(conversation) == "billing"


async def test_a_handoff_cycle_is_bounded_by_the_turn_iteration_budget(workers, client, scenario, scripted_llm):
    def bounce(request):
        target = "pong" if system_prompt(request) == "You are ping." else "ping"
        return Reply.tool_calls([(f"transfer_to_{target}", {})])

    key, marker = scenario(bounce)
    conversation = f"cycle-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TurnCancelledError) as failed:
        await client.send(f"{marker} bounce", conversation_id=conversation, agent="ping", timeout=60)
    assert failed.value.operation == "max_iterations"
    prompts = [system_prompt(r) for r in scripted_llm.requests_for(key)]
    assert prompts == ["You are ping.", "You are pong.", "You are ping.", "You are pong."]  # 4 calls in all
    assert await client.conversation_agent(conversation) == "ping"


def test_a_handoff_to_an_undeclared_agent_is_refused_at_start():
    from smith_client.errors import ConfigurationError

    app = SmithApp()
    app.agent("front", handoffs=["nowhere"])
    with pytest.raises(ConfigurationError) as refused:
        app.resolve_subagents()
    assert refused.value.setting == "handoffs"
    other = SmithApp()
    other.agent("back")
    other.agent("front", handoffs=["back"], subagents=["transfer_to_back"])
    other.agent("transfer_to_back")
    with pytest.raises(ConfigurationError):
        other.resolve_subagents()


async def test_the_current_agent_is_written_fenced_by_the_attempt(redis_url, prefix):
    from redis.asyncio import Redis

    from smith_client.keys import Keys
    from smith_worker.agent.handoffs import HANDOFF

    keys, conversation = Keys(prefix), f"fenced-{uuid.uuid4().hex[:8]}"
    state, current = keys.turn_state(f"t-{conversation}"), keys.conversation_agent(conversation)
    redis = Redis.from_url(redis_url)
    try:
        await redis.hset(state, "attempt", 2)
        assert await HANDOFF(redis, [state, current], [1, "billing", 60]) == -1  # a superseded attempt
        assert await redis.get(current) is None
        assert await HANDOFF(redis, [state, current], [2, "billing", 60]) == 1
        assert await redis.get(current) == b"billing" and 0 < await redis.ttl(current) <= 60
    finally:
        await redis.delete(state, current)
        await redis.aclose()


async def test_clear_forgets_the_current_agent(workers, client, scenario):
    _, marker = scenario(desk)
    conversation = f"cleared-{uuid.uuid4().hex[:8]}"
    await client.send(f"{marker} my invoice four", conversation_id=conversation, agent="triage", timeout=60)
    assert await client.conversation_agent(conversation) == "billing"
    await client.clear(conversation)
    assert await client.conversation_agent(conversation) is None


async def test_a_turn_queued_before_the_handoff_runs_the_target(workers, client, scenario, scripted_llm):
    gate = threading.Event()

    def held_desk(request):
        if system_prompt(request) == "You triage.":  # the transfer streams only once the gate opens
            return Reply.tool_calls([("transfer_to_billing", {})], gate=gate)
        return desk(request)

    key, marker = scenario(held_desk)
    conversation = f"queued-{uuid.uuid4().hex[:8]}"
    try:
        first = await client.submit(f"{marker} invoice five", conversation_id=conversation, agent="triage")
        second = await client.submit("refund six", conversation_id=conversation)  # no agent=, queued behind
        assert await scripted_llm.wait_until_async(lambda: scripted_llm.attempts(key) == 1, timeout=30)
        assert await client.conversation_agent(conversation) is None  # the handoff has not happened yet
    finally:
        gate.set()
    assert (await first.result(timeout=60)).content == "billing answers: five"
    assert (await second.result(timeout=60)).content == "billing answers: six"
    started = [e async for e in second.events(timeout=60)][0]
    assert started.data["agent"] == "billing"


async def test_a_turn_resumed_after_a_kill_9_goes_on_with_the_handoff_target(killable, scenario, scripted_llm):
    gate = threading.Event()

    def held_billing(request):
        if system_prompt(request) == "You handle billing.":  # billing's answer streams once the gate opens
            return Reply.text("billing survived", chunk_size=3, gate=gate)
        return desk(request)

    key, marker = scenario(held_billing)
    conversation = f"killed-{uuid.uuid4().hex[:8]}"
    try:
        handle = await killable.submit(f"{marker} invoice", conversation_id=conversation, agent="triage")
        pid = await worker_pid_running(killable, handle.turn_id)
        await wait_for(killable, handle.turn_id, "handoff")
        assert await scripted_llm.wait_until_async(lambda: scripted_llm.attempts(key) == 2, timeout=30)
        os.kill(pid, signal.SIGKILL)
        # as if the attempt had stopped between the transfer's append and its handoff.lua (one pipeline, two
        # scripts): the resumed attempt finds the handoff in the history and sets the current agent again
        await killable.redis.delete(killable.keys.conversation_agent(conversation))
    finally:
        gate.set()
    assert (await handle.result(timeout=60)).content == "billing survived"
    prompts = [system_prompt(r) for r in scripted_llm.requests_for(key)]
    assert prompts == ["You triage.", "You handle billing.", "You handle billing."]  # the re-run is billing's
    history = await killable.history(conversation)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, AssistantMessage]
    events = [e async for e in handle.events(timeout=60)]
    assert [e.type for e in events].count("handoff") == 1
    assert events[-1].type == "turn.completed" and events[-1].agent_path == ["billing"]
    assert await killable.conversation_agent(conversation) == "billing"
