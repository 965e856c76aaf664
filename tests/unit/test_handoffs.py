"""Which agent a resumed turn goes on with (smith_worker/agent/handoffs.py, docs/architecture.md, Handoffs)."""

from __future__ import annotations

from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.agent.handoffs import handed_to


def test_a_resumed_turn_finds_its_last_successful_handoff():
    agents = {"billing", "support"}
    done = [
        UserMessage(content="hi"),
        ToolMessage(tool_call_id="1", name="transfer_to_billing", content="{}"),
        ToolMessage(tool_call_id="2", name="transfer_to_support", content="boom", is_error=True),
        ToolMessage(tool_call_id="3", name="transfer_to_nobody", content="{}"),
        AssistantMessage(content="ok"),
    ]
    assert handed_to(done, agents) == "billing"
    assert handed_to(done[:1], agents) is None
