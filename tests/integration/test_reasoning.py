"""``finish_reason`` and ``reasoning_content`` reach the caller (docs/architecture.md, Events and Model requests):
the final message keeps the server's finish reason, streamed reasoning arrives as ``reasoning`` events and
stays out of the history unless the agent keeps it; neither is ever sent back to the model.

Real worker processes (``tests.support.app:app``), real Redis, the scripted model recording its requests.
"""

from __future__ import annotations

import pytest

from smith_client.events import ReasoningData, TokenData
from smith_client.messages import AssistantMessage
from smith_worker.testing import Reply, Script
from tests.integration.test_turns import collect, of_type

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def test_streamed_reasoning_is_published_but_not_stored(client, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.text("Answer", reasoning="Thinking hard", chunk_size=4)))
    events = await collect(client, f"{marker} go", f"conv-{key}")

    reasoning = of_type(events, "reasoning")
    assert [e.payload for e in reasoning] == [ReasoningData(text=t) for t in ("Thin", "king", " har", "d")]
    first_token = next(i for i, e in enumerate(events) if e.type == "token")
    assert events.index(reasoning[-1]) < first_token  # the server sent the reasoning first
    assert "".join(e.payload.text for e in of_type(events, "token") if isinstance(e.payload, TokenData)) == "Answer"

    final = events[-1].final_message()
    assert (final.content, final.finish_reason, final.reasoning_content) == ("Answer", "stop", None)
    (stored,) = [m for m in await client.history(f"conv-{key}") if isinstance(m, AssistantMessage)]
    assert stored.reasoning_content is None and stored.finish_reason == "stop"


async def test_keep_reasoning_stores_it_and_the_wire_never_carries_it(client, scenario, scripted_llm):
    key, marker = scenario(
        Script(
            Reply.tool_calls([("add", {"a": 1, "b": 2})]),
            Reply.text("3", reasoning="1 plus 2", finish_reason="length"),
        )
    )
    reply = await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="thoughtful")
    assert (reply.content, reply.reasoning_content, reply.finish_reason) == ("3", "1 plus 2", "length")

    history = [m for m in await client.history(f"conv-{key}") if isinstance(m, AssistantMessage)]
    assert [(m.finish_reason, m.reasoning_content) for m in history] == [("tool_calls", None), ("length", "1 plus 2")]

    # the next turn sends the history back: standard fields only
    await client.send(f"{marker} again", conversation_id=f"conv-{key}", agent="thoughtful")
    next_turn = scripted_llm.requests_for(key)[2]  # its first model call
    assistants = [m for m in next_turn.messages if m["role"] == "assistant"]
    assert len(assistants) == 2
    assert all(set(m) <= {"role", "content", "tool_calls"} for m in assistants)


async def test_a_non_streamed_reply_keeps_its_finish_reason(client, scenario):
    key, marker = scenario(Script(Reply.text("cut sho", finish_reason="length")))
    reply = await client.send(f"{marker} go", conversation_id=f"conv-{key}", agent="unstreamed")
    assert (reply.content, reply.finish_reason) == ("cut sho", "length")
