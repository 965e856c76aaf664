"""Every event the worker publishes fits its typed model.

Runs a tool turn, an MCP turn, a failed turn and a cancelled turn end to end
and validates each event's envelope and ``data`` strictly: the model of its
type (:data:`smith_client.events.DATA_MODELS`), no field the model lacks, and
the same JSON back from the model (so the client reads what was sent).
"""

from __future__ import annotations

import uuid

import pytest

from smith_client import SmithClient
from smith_client.events import (
    DATA_MODELS,
    PROTOCOL_VERSION,
    Event,
    McpEventData,
    TokenData,
    ToolResultData,
    TurnCancelledData,
    TurnCompletedData,
    TurnFailedData,
    UnknownData,
)
from smith_worker.testing import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


def assert_typed(events: list[Event]) -> list[type]:
    """Validate every event; return the model types seen, in order."""
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    seen = []
    for event in events:
        assert event.v == PROTOCOL_VERSION and event.turn_id and event.ts > 0 and event.agent_path
        assert event.type in DATA_MODELS, event.type
        payload = event.payload
        assert type(payload) is DATA_MODELS[event.type]
        assert payload.model_extra == {}, (event.type, payload.model_extra)  # nothing the model lacks
        assert payload.to_wire() == event.data  # nothing lost or reshaped either way
        seen.append(type(payload))
    return seen


async def test_a_tool_turn_publishes_typed_events(client: SmithClient, scenario):
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3}), ("nope", {})]),
                                  Reply.text("five", chunk_size=2)))
    events = [e async for e in client.stream(f"{marker} add", conversation_id=f"conv-{key}")]
    seen = assert_typed(events)
    assert TokenData in seen and seen[-1] is TurnCompletedData
    results = [e.payload for e in events if isinstance(e.payload, ToolResultData)]
    assert {r.name for r in results} == {"add", "nope"}
    assert [r.worker is None for r in sorted(results, key=lambda r: r.index)] == [False, True]  # unknown: turn side


async def test_an_mcp_turn_publishes_typed_events(client: SmithClient, scenario):
    key, marker = scenario(Script(Reply.tool_calls([("mcp_lab__echo", {"text": "hi"}),
                                                    ("mcp_lab__notify", {"message": "psst"})]),
                                  Reply.text("done")))
    events = [e async for e in client.stream(f"{marker} lab", conversation_id=f"conv-{key}", agent="mcp")]
    seen = assert_typed(events)
    assert McpEventData in seen and seen[-1] is TurnCompletedData


async def test_a_failed_turn_publishes_typed_events(client: SmithClient, scenario):
    calls = [Reply.tool_calls([("add", {"a": i, "b": 1})]) for i in range(4)]
    key, marker = scenario(Script(*calls))
    handle = await client.submit(f"{marker} loop", conversation_id=f"conv-{key}", agent="limited")
    events = [e async for e in handle.events(timeout=30)]
    seen = assert_typed(events)
    assert seen[-1] is TurnFailedData
    assert events[-1].payload.error.kind == "TurnCancelledError"


async def test_a_cancelled_turn_publishes_typed_events(client: SmithClient, scenario):
    _, marker = scenario(Script(Reply.text("tick " * 200, chunk_size=5, delay=0.05)))
    handle = await client.submit(f"{marker} go", conversation_id=f"conv-{uuid.uuid4().hex[:8]}", agent="plain")
    async for event in handle.events():
        if event.type == "token":
            break
    await handle.cancel()
    events = [e async for e in handle.events(timeout=10)]
    seen = assert_typed(events)
    assert seen[-1] is TurnCancelledData and events[-1].payload.reason == "cancel"


def test_an_event_of_an_unknown_type_parses_as_generic_data():
    event = Event(turn_id="t", seq=1, ts=1.0, type="agent.spawned", data={"agent": "helper", "depth": 2})
    assert event.type == "agent.spawned"
    assert isinstance(event.payload, UnknownData) and event.payload.model_extra == {"agent": "helper", "depth": 2}
    known = Event(turn_id="t", seq=2, ts=1.0, type="token", data={"text": "a", "added_later": 1})
    assert known.payload.text == "a"  # a newer worker's extra field does not break an older client
