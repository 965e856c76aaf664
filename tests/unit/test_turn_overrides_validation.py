"""The shape checks of per-turn overrides at send (smith_client/overrides.py, docs/architecture.md, Per-turn overrides)
and of a send without ``agent=`` (docs/architecture.md, Handoffs)."""

from __future__ import annotations

import pytest

from smith_client.errors import InvalidRequestError
from smith_client.jobs import TurnJob
from smith_client.overrides import MAX_INSTRUCTIONS_BYTES, MAX_ITERATIONS, TurnOverrides
from smith_client.validation import build_turn_job, check_options


def job(**options) -> TurnJob:
    return build_turn_job("hello", **check_options({"conversation_id": "c1", **options}))[0]


def test_no_override_leaves_the_job_without_one():
    assert job().overrides is None


def test_every_override_reaches_the_job_and_survives_its_json():
    built = job(
        instructions="Be brief.",
        tool_choice="add",
        max_iterations=3,
        max_tokens=500,
        tools=["add", "whoami"],
        model="other",
    )
    assert built.overrides == TurnOverrides(
        instructions="Be brief.", tool_choice="add", max_iterations=3, max_tokens=500, tools=["add", "whoami"],
        model="other",
    )  # fmt: skip
    assert TurnJob.model_validate_json(built.model_dump_json()).overrides == built.overrides


@pytest.mark.parametrize("choice", ["auto", "none", "required", "a_tool"])
def test_tool_choice_is_a_keyword_or_a_tool_name(choice):
    assert job(tool_choice=choice).overrides.tool_choice == choice


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"instructions": "   "}, "instructions"),
        ({"instructions": 5}, "instructions"),
        ({"instructions": "x" * (MAX_INSTRUCTIONS_BYTES + 1)}, "instructions"),
        ({"instructions": "\ud800"}, "instructions"),
        ({"tool_choice": "bad name!"}, "tool_choice"),
        ({"tool_choice": {"type": "function"}}, "tool_choice"),
        ({"tool_choice": "whoami", "tools": ["add"]}, "tool_choice"),
        ({"max_iterations": 0}, "max_iterations"),
        ({"max_iterations": True}, "max_iterations"),
        ({"max_iterations": 2.0}, "max_iterations"),
        ({"max_iterations": MAX_ITERATIONS + 1}, "max_iterations"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": "100"}, "max_tokens"),
        ({"tools": "add"}, "tools"),
        ({"tools": ["add", "add"]}, "tools"),
        ({"tools": ["a b"]}, "tools"),
        ({"tools": [1]}, "tools"),
        ({"model": ""}, "model"),
        ({"model": 3}, "model"),
        ({"model": "m" * 257}, "model"),
    ],
)
def test_a_malformed_override_is_refused_naming_its_field(options, field):
    with pytest.raises(InvalidRequestError) as refused:
        job(**options)
    assert refused.value.field == field


def test_an_empty_tools_list_offers_no_tools():
    assert job(tools=[]).overrides.tools == []


def test_an_unknown_option_is_still_refused():
    with pytest.raises(InvalidRequestError) as refused:
        job(instruction="typo")
    assert refused.value.field == "instruction"


def test_a_send_without_agent_follows_the_conversation_and_an_explicit_one_does_not():
    implicit = job()
    assert implicit.agent == "default" and implicit.agent_given is False
    explicit = job(agent="default")
    assert explicit.agent == "default" and explicit.agent_given is True
