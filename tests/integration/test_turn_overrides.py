"""Per-turn overrides (docs/architecture.md, Per-turn overrides), end to end: each override changes the
request the scripted model receives for its turn, and not the next turn's.

Agent: tests/support/app.py ("overridable": tools add and whoami, max_iterations 6, max_total_tokens 10 000;
"big_model" configures the model name "scripted-large").
"""

from __future__ import annotations

import uuid

import pytest

from smith_client.errors import ConfigurationError, InvalidRequestError, TurnCancelledError
from smith_worker.testing import Reply, Script

pytestmark = [pytest.mark.integration]

AGENT = "overridable"


def offered(request) -> list[str]:
    return [tool["function"]["name"] for tool in request.body.get("tools", [])]


async def two_turns(client, scenario, scripted_llm, handler, **overrides):
    """Send a turn with ``overrides``, then one without; the scripted model's requests of each."""
    key, marker = scenario(handler)
    conversation = f"override-{uuid.uuid4().hex[:8]}"
    await client.send(f"{marker} first", conversation_id=conversation, agent=AGENT, timeout=60, **overrides)
    first = scripted_llm.requests_for(key)
    await client.send("second", conversation_id=conversation, agent=AGENT, timeout=60)
    return first, scripted_llm.requests_for(key)[len(first) :]


async def test_instructions_are_appended_to_the_system_prompt_of_that_turn_only(
    workers, client, scenario, scripted_llm
):
    first, second = await two_turns(client, scenario, scripted_llm, Reply.text("ok"), instructions="Answer in French.")
    assert first[0].messages[0] == {"role": "system", "content": "You are overridable.\n\nAnswer in French."}
    assert second[0].messages[0] == {"role": "system", "content": "You are overridable."}


async def test_tool_choice_changes_that_turn_only(workers, client, scenario, scripted_llm):
    first, second = await two_turns(client, scenario, scripted_llm, Reply.text("ok"), tool_choice="whoami")
    assert first[0].body["tool_choice"] == {"type": "function", "function": {"name": "whoami"}}
    assert "tool_choice" not in second[0].body  # the agent sets none


async def test_tools_subset_changes_that_turn_only(workers, client, scenario, scripted_llm):
    first, second = await two_turns(client, scenario, scripted_llm, Reply.text("ok"), tools=["add"])
    assert offered(first[0]) == ["add"]
    assert offered(second[0]) == ["add", "whoami"]


async def test_model_changes_that_turn_only(workers, client, scenario, scripted_llm):
    first, second = await two_turns(client, scenario, scripted_llm, Reply.text("ok"), model="scripted-large")
    assert first[0].body["model"] == "scripted-large"
    assert second[0].body["model"] == "scripted"


async def test_max_iterations_stops_that_turn_only(workers, client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("three")))
    conversation = f"override-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TurnCancelledError) as stopped:
        await client.send(f"{marker} add", conversation_id=conversation, agent=AGENT, timeout=60, max_iterations=1)
    assert stopped.value.operation == "max_iterations"
    assert scripted_llm.attempts(key) == 1  # the second model call was never made
    assert (await client.send("again", conversation_id=conversation, agent=AGENT, timeout=60)).content == "three"
    assert scripted_llm.attempts(key) == 3


async def test_max_tokens_budget_stops_that_turn_only(workers, client, scenario, scripted_llm):
    key, marker = scenario(
        Script(Reply.tool_calls([("add", {"a": 1, "b": 2})], usage=(40, 10)), Reply.text("three", usage=(40, 10)))
    )
    conversation = f"override-{uuid.uuid4().hex[:8]}"
    with pytest.raises(TurnCancelledError) as stopped:
        await client.send(f"{marker} add", conversation_id=conversation, agent=AGENT, timeout=60, max_tokens=20)
    assert stopped.value.operation == "max_total_tokens"
    assert scripted_llm.attempts(key) == 1
    assert (await client.send("again", conversation_id=conversation, agent=AGENT, timeout=60)).content == "three"


@pytest.mark.parametrize(
    ("override", "field"),
    [
        ({"tools": ["not_a_tool_here"]}, "tools"),
        ({"tool_choice": "not_a_tool_here"}, "tool_choice"),
        ({"model": "no-such-model"}, "model"),
        ({"max_iterations": 7}, "max_iterations"),  # over the agent's 6
        ({"max_tokens": 10_001}, "max_tokens"),  # over the agent's max_total_tokens
    ],
)
async def test_a_name_or_limit_the_worker_does_not_know_fails_the_turn_typed(
    workers, client, scenario, scripted_llm, override, field
):
    key, marker = scenario(Reply.text("never"))
    with pytest.raises(ConfigurationError) as failed:
        await client.send(f"{marker} hi", conversation_id=f"bad-{key}", agent=AGENT, timeout=60, **override)
    assert failed.value.setting == field
    assert scripted_llm.attempts(key) == 0


async def test_a_malformed_override_is_refused_at_send(workers, client):
    with pytest.raises(InvalidRequestError) as refused:
        await client.send("hi", conversation_id="never-sent", agent=AGENT, max_iterations=0)
    assert refused.value.field == "max_iterations"
