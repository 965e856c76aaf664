"""The pairing invariant (docs/architecture.md, Tool-call pairing): ``strip_orphans`` for every drop
position, over random histories with parallel tool calls, and the repair of dangling tool calls."""

from __future__ import annotations

import orjson
from hypothesis import given, settings, strategies as st

from smith_client.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from smith_worker import strip_orphans
from smith_worker.memory.pairing import NO_RESULT, answer_dangling, is_well_formed, well_formed, with_answers


@st.composite
def tool_round(draw, serial: list[int]) -> list:
    """An assistant message with 1-4 (parallel) calls and one tool message per call, in call order.
    Ids are unique, or all empty, or repeated (servers send both)."""
    count = draw(st.integers(1, 4))
    style = draw(st.sampled_from(["unique", "unique", "empty", "repeated"]))
    serial[0] += 1
    ids = {"unique": [f"c{serial[0]}_{i}" for i in range(count)], "empty": [""] * count,
           "repeated": [f"r{serial[0]}"] * count}[style]
    calls = [ToolCall(id=i, name="add", arguments={"a": n, "b": 1}) for n, i in enumerate(ids)]
    tools = [ToolMessage(tool_call_id=i, name="add", content=str(n + 1)) for n, i in enumerate(ids)]
    return [AssistantMessage(content=draw(st.sampled_from(["", "let me add"])), tool_calls=calls), *tools]


@st.composite
def histories(draw) -> list:
    """Well-formed conversations: turns of a user message, 0-3 tool rounds and a text answer."""
    serial = [0]
    out: list = []
    for turn in range(draw(st.integers(1, 6))):
        out.append(UserMessage(content=f"question {turn}"))
        for _ in range(draw(st.integers(0, 3))):
            out += draw(tool_round(serial))
        out.append(AssistantMessage(content=f"answer {turn}"))
    return out


def group_heads(messages: list) -> list[int]:
    """For each message, the index of the message opening its tool-call group (itself when it opens one)."""
    heads, head = [], 0
    for index, message in enumerate(messages):
        if not isinstance(message, ToolMessage):
            head = index
        heads.append(head)
    return heads


def wire_ok(messages: list) -> bool:
    """The invariant as a provider checks it: every tool message answers a call of the assistant message just
    before its run, and every call of an assistant message is answered before the next non-tool message."""
    open_calls: list[str] | None = None
    for message in [*messages, UserMessage(content="end")]:
        if isinstance(message, ToolMessage):
            if open_calls is None or message.tool_call_id not in open_calls:
                return False
            open_calls.remove(message.tool_call_id)
            continue
        if open_calls:
            return False
        open_calls = [c.id for c in message.tool_calls] if isinstance(message, AssistantMessage) else None
    return True


@settings(max_examples=150, deadline=None)
@given(histories())
def test_a_well_formed_history_is_left_alone(history):
    assert wire_ok(history)
    assert strip_orphans(history) == history and is_well_formed(history)
    assert well_formed(history) == history


@settings(max_examples=150, deadline=None)
@given(histories())
def test_every_drop_position_of_the_oldest_messages(history):
    for drop in range(len(history) + 1):
        rest = history[drop:]
        kept = strip_orphans(rest)
        assert wire_ok(kept), drop
        # only the tail of the group the cut went through goes: the tool messages left at the front
        orphans = next((i for i, m in enumerate(rest) if not isinstance(m, ToolMessage)), len(rest))
        assert kept == rest[orphans:], drop


@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_every_dropped_range_removes_exactly_the_groups_it_broke(history, data):
    start = data.draw(st.integers(0, len(history)))
    end = data.draw(st.integers(start, len(history)))
    heads = group_heads(history)
    sizes = {h: heads.count(h) for h in set(heads)}
    remaining = [i for i in range(len(history)) if not start <= i < end]
    kept_per_group = {h: sum(1 for i in remaining if heads[i] == h) for h in sizes}
    expected = [history[i] for i in remaining if kept_per_group[heads[i]] == sizes[heads[i]]]
    result = strip_orphans([history[i] for i in remaining])
    assert wire_ok(result)
    ids = [c.id for m in history if isinstance(m, AssistantMessage) for c in m.tool_calls]
    if len(set(ids)) == len(ids) and "" not in ids:
        assert result == expected
    else:  # a cut can join a call and a result of two groups that share an id: valid on the wire, so kept
        assert all(m in result for m in expected)


@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_duplicated_tool_messages_are_dropped(history, data):
    tools = [i for i, m in enumerate(history) if isinstance(m, ToolMessage)]
    if not tools:
        return
    index = data.draw(st.sampled_from(tools))
    duplicated = history[:index + 1] + [history[index]] + history[index + 1:]
    result = strip_orphans(duplicated)
    assert wire_ok(result)


@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_dangling_calls_get_the_error_tool_message_right_after_their_assistant_message(history, data):
    rounds = [i for i, m in enumerate(history) if isinstance(m, AssistantMessage) and m.tool_calls]
    if not rounds:
        return
    at = data.draw(st.sampled_from(rounds))
    calls = history[at].tool_calls
    answered = data.draw(st.integers(0, len(calls) - 1))  # the turn ended with some results missing
    broken = history[:at + 1 + answered] + history[at + 1 + len(calls):]
    assert not wire_ok(broken)

    (index, repair), = answer_dangling(broken)
    assert index == at + 1 + answered
    assert [m.tool_call_id for m in repair] == [c.id for c in calls[answered:]]
    assert all(m.is_error and orjson.loads(m.content) == orjson.loads(NO_RESULT) for m in repair)
    assert orjson.loads(NO_RESULT) == {"error": True, "message": "no result: the turn ended before the tool finished"}
    repaired = with_answers(broken)
    assert wire_ok(repaired) and well_formed(broken) == repaired
    assert len(repaired) == len(history)


def test_a_tool_message_after_a_user_or_text_message_is_an_orphan():
    user, text = UserMessage(content="hi"), AssistantMessage(content="hello")
    orphan = ToolMessage(tool_call_id="x", content="1")
    assert strip_orphans([orphan, user, orphan, text, orphan]) == [user, text]
