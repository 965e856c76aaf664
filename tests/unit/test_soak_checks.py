"""The soak's checks (bench/soak.py) on hand-made inputs: what they must flag, and what they must let pass."""

from __future__ import annotations

import pytest

from bench.soak import (
    Turn,
    duplicated,
    event_problems,
    expected_shape,
    fault_schedule,
    history_problems,
    slope_per_1000,
)
from smith_client.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage

DONE = [(1, "turn.started"), (2, "token"), (3, "message"), (4, "turn.completed")]


def test_a_complete_log_passes():
    assert event_problems(DONE, 4, "completed") == []
    assert event_problems(DONE, None, None) == []


@pytest.mark.parametrize(
    ("events", "counter", "status", "problem"),
    [
        ([(1, "turn.started"), (3, "turn.completed")], 3, "completed", "seq 3 where 2 was due"),
        ([(1, "turn.started"), (1, "turn.started"), (3, "turn.completed")], 3, "completed", "seq 1 where 2 was due"),
        (DONE, 5, "completed", "seq counter 5 but 4 events"),
        (DONE[:3], 3, "completed", "0 terminal events"),
        ([*DONE, (5, "turn.failed")], 5, "completed", "2 terminal events"),
        ([*DONE, (5, "token")], 5, "completed", "token after the terminal event"),
        (DONE, 4, "failed", "terminal event turn.completed but status failed"),
    ],
)
def test_a_broken_log_is_flagged(events, counter, status, problem):
    assert problem in event_problems(events, counter, status)


def test_slope_is_mib_per_1000_turns_by_least_squares():
    assert slope_per_1000([(0, 10.0), (1000, 12.0), (2000, 14.0), (3000, 16.0)]) == pytest.approx(2.0)
    assert slope_per_1000([(0, 5.0), (500, 5.0), (1000, 5.0)]) == pytest.approx(0.0)
    assert slope_per_1000([(0, 1.0), (1000, 2.0)]) is None  # too few points
    assert slope_per_1000([(7, 1.0), (7, 2.0), (7, 3.0)]) is None  # no turn finished between the samples


def test_duplicated_lists_labels_run_more_than_once_with_their_workers():
    records = [b"t1.0|w1", b"t2.0|w1", b"t1.0|w2", "t3.1|w2"]
    assert duplicated(records) == {"t1.0": ["w1", "w2"]}
    assert duplicated([]) == {}


def test_the_fault_schedule_scales_with_the_duration():
    plan = fault_schedule(1800)
    assert [at for at, fault in plan if fault == "kill"] == [180.0 * k for k in range(1, 10)]
    assert (600.0, "redis-restart") in plan and (1200.0, "redis-stop") in plan
    assert plan == sorted(plan) and all(0 < at < 1800 for at, _ in plan)
    assert fault_schedule(240) == [(at / 7.5, fault) for at, fault in plan]


# ---- histories ---------------------------------------------------------------------------------------------


def turn(turn_id: str, calls: int, status: str = "completed") -> Turn:
    return Turn(turn_id, "c1", calls, 0.0, status=status)


def messages(turn_id: str, calls: int, answered: bool = True) -> list:
    """A turn's messages as the runtime stores them (calls made in one step)."""
    out: list = [UserMessage(content=f"[[scenario:soak]] {f'tool{calls}' if calls else 'text'} {turn_id}")]
    if calls:
        ids = [f"{turn_id}-call{i}" for i in range(calls)]
        out.append(AssistantMessage(tool_calls=[ToolCall(id=i, name="record_effect") for i in ids]))
        out += [ToolMessage(tool_call_id=i, name="record_effect", content="ok") for i in ids]
    if answered:
        out.append(AssistantMessage(content=f"done {turn_id} word"))
    return out


def test_a_well_formed_history_passes():
    turns = [turn("t1", 0), turn("t2", 2), turn("t3", 1)]
    history = messages("t1", 0) + messages("t2", 2) + messages("t3", 1)
    assert history_problems(history, turns) == []
    assert expected_shape(2) == "U C2 T T A"


def test_a_trimmed_head_passes_but_a_missing_completed_turn_after_it_does_not():
    turns = [turn("t1", 1), turn("t2", 0), turn("t3", 0)]
    for cut in (1, 3):  # trimming takes whole tool-call groups: t1's user message, then its calls and results
        assert history_problems(messages("t1", 1)[cut:] + messages("t2", 0) + messages("t3", 0), turns) == []
    assert history_problems(messages("t1", 1) + messages("t3", 0), turns) == ["t2: completed, not in the history"]


def test_an_unfinished_last_turn_may_leave_calls_unanswered_a_completed_one_may_not():
    dangling = messages("t1", 0) + messages("t2", 2)[:2]
    assert history_problems(dangling, [turn("t1", 0), turn("t2", 2, status="cancelled")]) == []
    problems = history_problems(dangling, [turn("t1", 0), turn("t2", 2)])
    assert any("pairing broken" in p for p in problems) and any(p.startswith("t2: 'U C2'") for p in problems)


@pytest.mark.parametrize(
    ("history", "problem"),
    [
        (messages("t1", 1) + messages("t1", 1)[:1] + messages("t2", 0), "t1: user message 2 times"),
        (messages("t2", 0) + messages("t1", 1), "user messages out of submission order"),
        (messages("t1", 1) + messages("t1", 1)[2:3] + messages("t2", 0), "tool-call pairing broken"),
        (messages("t1", 1) + messages("t1", 1)[-1:] + messages("t2", 0), "t1: 'U C1 T A A', not 'U C1 T A'"),
        (
            messages("t1", 1)[:-1] + messages("t2", 0)[1:] + messages("t2", 0),
            "t1: answer 'done t2 word' of another turn",
        ),
        (messages("t1", 1) + messages("t9", 0) + messages("t2", 0), "user message of unknown turn t9"),
    ],
)
def test_a_broken_history_is_flagged(history, problem):
    problems = history_problems(history, [turn("t1", 1), turn("t2", 0)])
    assert any(p.startswith(problem) for p in problems), problems
