"""Sub-agent units: declarations resolved at worker start, tree keys, the CLI's chain."""

from __future__ import annotations

import io
import time

import pytest

from smith_client.cli import StreamPrinter
from smith_client.errors import ConfigurationError
from smith_client.events import Event
from smith_client.keys import ID_PATTERN, Keys, tree_position
from smith_worker import AgentConfig, SmithApp
from smith_worker.queue.worker import build_worker


def _app(*subagents: str, child: str = "helper") -> SmithApp:
    app = SmithApp()

    @app.tool
    def lookup(query: str) -> str:
        """Look something up."""
        return query

    app.agent(child, description="Helps.")
    app.agent("boss", tools=[lookup], subagents=list(subagents))
    return app


def test_subagents_resolve_at_worker_start_not_at_declaration():
    app = _app("later")  # not declared yet: fine at app.agent()
    with pytest.raises(ConfigurationError, match="'later' is not a declared agent"):
        build_worker(app, "turns")
    app.agent("later")
    app.resolve_subagents()


@pytest.mark.parametrize("subagents, child, message", [
    (["lookup"], "lookup", "clashes"),  # an agent named like one of the parent's tools
    (["helper", "helper"], "helper", "clashes"),
    (["a.b"], "a.b", "not a valid tool name"),  # a valid agent id, not a valid tool name
])
def test_a_subagent_needs_a_tool_name_of_its_own(subagents, child, message):
    assert ID_PATTERN.match(child)
    with pytest.raises(ConfigurationError, match=message):
        _app(*subagents, child=child).resolve_subagents()


def test_agent_config_has_the_documented_tree_limits():
    config = AgentConfig()
    assert (config.max_subagent_depth, config.tree_max_iterations, config.tree_max_total_tokens) == (3, 50, None)


def test_tool_keys_of_a_subagent_never_collide_with_the_root_or_a_caller_turn():
    keys = Keys("p")
    child = tree_position("", 1, 0)
    grandchild = tree_position(child, 2, 1)
    assert (child, grandchild) == ("1.0", "1.0/2.1")
    names = {keys.tool_result("t", 1, 0), keys.tool_result("t", 1, 0, child), keys.tool_result("t", 1, 0, grandchild)}
    assert len(names) == 3
    assert not ID_PATTERN.match(f"t#{child}")  # no caller turn id can name a sub-agent's calls
    turn_keys, tool_keys = keys.turn_patterns("t")
    assert keys.tool_job_id("t", 1, 0, child) != keys.tool_job_id("t", 1, 0)
    assert keys.subagent_history("t", child).startswith(turn_keys[:-1])
    assert tool_keys == "p:toolres:t[:#]*"
    scope = keys.subagent_memory_scope("c", "t", child)  # a child's memory state is never the conversation's
    assert keys.conversation_summary(scope) != keys.conversation_summary("c") and not ID_PATTERN.match(scope)


def _event(seq: int, path: list[str], type_: str, data: dict) -> Event:
    return Event(turn_id="t", seq=seq, ts=time.time(), agent_path=path, type=type_, data=data)


def test_smith_ask_shows_the_chain_on_status_lines():
    out, err = io.StringIO(), io.StringIO()
    printer = StreamPrinter(out, err)
    printer(_event(1, ["lead", "researcher"], "token", {"text": "inner"}))
    printer(_event(2, ["lead", "researcher"], "tool_call.completed",
                   {"id": "c", "name": "whoami", "index": 0, "arguments": {}}))
    printer(_event(3, ["lead"], "tool.result",
                   {"tool_call_id": "c", "name": "researcher", "index": 0, "content": "found", "is_error": False}))
    printer(_event(4, ["lead"], "token", {"text": "answer"}))
    assert err.getvalue().splitlines() == [
        "[lead > researcher] [tool call] whoami({})",
        "[tool result] researcher -> found",  # no worker: none is named
    ]
    assert out.getvalue() == "answer"  # only the root agent's tokens are the answer


def test_smith_ask_starts_a_resumed_reply_on_a_new_line_and_says_so():
    out, err = io.StringIO(), io.StringIO()
    printer = StreamPrinter(out, err)
    printer(_event(1, ["lead"], "token", {"text": "The ans"}))
    printer(_event(2, ["lead"], "turn.resumed", {"attempt": 2}))
    printer(_event(3, ["lead"], "token", {"text": "The answer."}))
    printer(_event(4, ["lead"], "turn.completed", {"message": {"role": "assistant", "content": "The answer."}}))
    assert out.getvalue() == "The ans\nThe answer.\n"
    assert err.getvalue() == "[turn resumed, attempt 2: a worker stopped; its unfinished reply streams again]\n"
