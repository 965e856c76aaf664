"""Tool retries end to end (docs/architecture.md, Tool calls): a flaky idempotent tool is run again inside its
tool job, and a tool's ``RetryWithMessage`` reaches the model, which calls again, within ``tool_retries``.

Real worker processes (``tests.support.app:app``), real Redis, the scripted model recording its requests.
"""

from __future__ import annotations

import uuid

import orjson
import pytest

from smith_client.messages import ToolMessage
from smith_worker.testing import Reply, Script
from tests.integration.test_turns import collect, of_type

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def attempts(client, label: str) -> int:
    return int(await client.redis.llen(f"{client.keys.prefix}:test:attempts:{label}"))


def tool_messages(request) -> list[dict]:
    return [m for m in request.messages if m.get("role") == "tool"]


@pytest.mark.parametrize("tool", ["flaky", "flaky_in_process"])
async def test_a_flaky_idempotent_tool_succeeds_on_its_second_try_with_one_tool_message(
    client, scenario, scripted_llm, tool
):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(Reply.tool_calls([(tool, {"label": label, "failures": 1})]), Reply.text("fine")))
    events = await collect(client, f"{marker} go", f"conv-{key}", agent="retrying")

    assert events[-1].type == "turn.completed" and events[-1].final_message().content == "fine"
    assert await attempts(client, label) == 2  # the first attempt and one retry, in one tool job
    results = of_type(events, "tool.result")
    assert len(results) == 1 and results[0].data["content"] == "ok after 2 attempts"
    assert not results[0].data["is_error"]
    history = await client.history(f"conv-{key}")
    assert [m.content for m in history if isinstance(m, ToolMessage)] == ["ok after 2 attempts"]
    second = scripted_llm.requests_for(key)[1]  # the model saw the one outcome, never the refused attempt
    assert [m["content"] for m in tool_messages(second)] == ["ok after 2 attempts"]


async def test_a_tool_failing_past_its_retries_gives_the_last_error(client, scenario, scripted_llm):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(Reply.tool_calls([("flaky", {"label": label, "failures": 9})]), Reply.text("ok")))
    await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="retrying")

    assert await attempts(client, label) == 3  # retries=2: three attempts, then the error
    (message,) = tool_messages(scripted_llm.requests_for(key)[1])
    assert orjson.loads(message["content"]) == {"error": True, "message": "ConnectionError: attempt 3 refused"}


async def test_retry_with_message_reaches_the_model_and_the_next_call_succeeds(client, scenario, scripted_llm):
    key, marker = scenario(
        Script(
            Reply.tool_calls([("even_only", {"n": 3})]),
            Reply.tool_calls([("even_only", {"n": 4})]),
            Reply.text("took it"),
        )
    )
    reply = await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="retrying")
    assert reply.content == "took it"

    requests = scripted_llm.requests_for(key)
    assert len(requests) == 3
    correction = tool_messages(requests[1])[-1]
    assert orjson.loads(correction["content"]) == {
        "error": True,
        "message": "n must be even, got 3",
        "kind": "RetryWithMessage",
        "retries_left": 0,  # tool_retries=1 (the default): this was the one correction allowed
        "corrections": 1,
    }
    assert tool_messages(requests[2])[-1]["content"] == "took 4"
    history = await client.history(f"conv-{key}")
    tools = [m for m in history if isinstance(m, ToolMessage)]
    assert [m.is_error for m in tools] == [True, False]


def corrections(request) -> list[tuple[str, int | None]]:
    """The (kind, retries_left) of each error tool message the model was sent."""
    out = []
    for message in tool_messages(request):
        content = orjson.loads(message["content"]) if message["content"].startswith("{") else {}
        if content.get("error"):
            out.append((content.get("kind"), content.get("retries_left")))
    return out


@pytest.mark.parametrize(
    "agent, expected",
    [
        # tool_retries=1: one correction, then an ordinary tool error; a success starts the count again
        ("retrying", [("RetryWithMessage", 0), ("ToolError", None), ("RetryWithMessage", 0)]),
        # tool_retries=2: two corrections in a row, then the error; after a success, corrections again
        ("lenient", [("RetryWithMessage", 1), ("RetryWithMessage", 0), ("ToolError", None), ("RetryWithMessage", 1)]),
    ],
)
async def test_tool_retries_bounds_the_corrections_in_a_row(client, scenario, scripted_llm, agent, expected):
    steps = [
        Reply.tool_calls([("even_only", {"n": 1})]),
        Reply.tool_calls([("even_only", {"n": 3})]),
        Reply.tool_calls([("even_only", {"n": 2})]),  # succeeds: the count starts again
        Reply.tool_calls([("even_only", {"n": 5})]),
        Reply.text("done"),
    ]
    if agent == "lenient":
        steps = [steps[0], steps[1], steps[3], steps[2], Reply.tool_calls([("even_only", {"n": 7})]), steps[4]]
    key, marker = scenario(Script(*steps))
    events = await collect(client, f"{marker} go", f"conv-{key}", agent=agent)

    assert events[-1].type == "turn.completed"  # a tool's errors never fail the turn
    last = scripted_llm.requests_for(key)[-1]
    assert corrections(last) == expected
    if agent == "retrying":
        exceeded = orjson.loads(tool_messages(last)[1]["content"])
        assert exceeded["message"].startswith("n must be even, got 3 (tool 'even_only' asked for more than")
        assert exceeded["retryable"] is False
