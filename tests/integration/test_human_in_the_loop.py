"""A turn pauses for a person and resumes on any turn worker (docs/architecture.md, Pausing for a person):
approval-gated and external tools, decided by other clients, timeouts, cancel and the multitask policies
while paused, on the session's real worker processes and the scripted model."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

from smith_client import (
    ConversationBusyError,
    InvalidRequestError,
    NoPendingCallError,
    SmithClient,
    SyncSmithClient,
    TurnCancelledError,
    TurnPausedError,
)
from smith_client.messages import AssistantMessage, ToolMessage, UserMessage
from smith_worker.testing import Reply, Script
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration]


async def runs(client: SmithClient, label: str) -> list[bytes]:
    """What the test app's counting tools recorded under ``label`` (one entry per run)."""
    return await client.redis.lrange(f"{client.keys.prefix}:test:counted:{label}", 0, -1)


def gated_step(label: str) -> Reply:
    """A step calling the approval-gated tool and a plain one."""
    return Reply.tool_calls(
        [("guarded_delete", {"label": label, "target": "repo-a"}), ("counted", {"label": f"{label}-plain"})],
        ids=["call_gated", "call_plain"],
    )


async def paused_turn(client: SmithClient, marker: str, conv: str, agent: str = "guarded") -> TurnPausedError:
    with pytest.raises(TurnPausedError) as paused:
        await client.send(f"{marker} go", conversation_id=conv, agent=agent, timeout=30)
    return paused.value


def tool_messages(request) -> list[dict]:
    return [m for m in request.messages if isinstance(m, dict) and m.get("role") == "tool"]


async def test_a_paused_turn_holds_no_worker_and_runs_the_approved_call_once_with_edited_arguments(
    workers, client, scenario, redis_url, prefix
):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(gated_step(label), Reply.text("done")))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    turn_id = paused.turn_id
    assert [(p["call_id"], p["tool"], p["kind"]) for p in paused.pending] == [
        ("call_gated", "guarded_delete", "approval")
    ]
    assert paused.pending[0]["arguments"] == {"label": label, "target": "repo-a"}
    assert paused.pending[0]["agent_path"] == ["guarded"]
    assert await runs(client, f"{label}-plain") == [b"run"]  # the step's plain call ran
    assert await runs(client, label) == []
    handle = client.turn(turn_id)
    assert await handle.status() == "paused"
    keys = client.keys
    assert await client.redis.zscore(keys.running, turn_id) is None  # no lease: no worker holds it
    async with asyncio.timeout(10):  # arq ends the job once run_turn returned
        while await client.redis.exists(keys.arq_in_progress(keys.turn_job_id(turn_id))):
            await asyncio.sleep(0.05)
    assert [p.call_id for p in await client.pending(turn_id)] == ["call_gated"]
    with pytest.raises(InvalidRequestError):  # edited arguments are checked against the tool's schema
        await client.approve(turn_id, "call_gated", {"label": label, "target": 7})
    approve = (
        "import sys; from smith_client import SyncSmithClient\n"
        "with SyncSmithClient.from_url(sys.argv[1], prefix=sys.argv[2]) as c:\n"
        "    print(c.approve(sys.argv[3], 'call_gated', {'label': sys.argv[4], 'target': 'repo-b'}).action)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", approve, redis_url, prefix, turn_id, label],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "approve", done.stderr
    assert (await handle.result(timeout=30)).content == "done"
    assert await runs(client, label) == [b"repo-b"]  # once, with the edited arguments
    assert await runs(client, f"{label}-plain") == [b"run"]  # not again
    events = [e async for e in handle.events()]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = [e.type for e in events]
    assert types.count("turn.paused") == 1 and types[-1] == "turn.completed"
    decided = [e.data for e in events if e.type == "tool_call.decided"]
    assert decided == [{"id": "call_gated", "name": "guarded_delete", "index": 0, "action": "approve",
                        "arguments": {"label": label, "target": "repo-b"}, "message": ""}]  # fmt: skip
    history = await client.history(conv)
    assert [type(m) for m in history] == [UserMessage, AssistantMessage, ToolMessage, ToolMessage, AssistantMessage]
    assert history[2].content == "deleted repo-b"
    assert not await client.redis.exists(keys.turn_pending(turn_id), keys.turn_decisions(turn_id))


async def test_a_rejected_call_reaches_the_model_as_its_error(workers, client, scenario, scripted_llm):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(gated_step(label), Reply.text("understood")))
    paused = await paused_turn(client, marker, f"conv-{key}")
    await client.reject(paused.turn_id, "call_gated", message="not this repository")
    assert (await client.turn(paused.turn_id).result(timeout=30)).content == "understood"
    assert await runs(client, label) == []
    last = scripted_llm.requests_for(key)[-1]
    assert "not this repository" in tool_messages(last)[0]["content"]


async def test_a_per_call_policy_pauses_only_the_calls_it_asks_for(workers, client, scenario):
    label = uuid.uuid4().hex[:8]
    calls = [("tidy", {"label": label, "target": "scratch/a"}), ("tidy", {"label": label, "target": "home/b"})]
    key, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_s", "call_h"]), Reply.text("tidied")))
    paused = await paused_turn(client, marker, f"conv-{key}")
    assert [p["call_id"] for p in paused.pending] == ["call_h"]
    assert await runs(client, label) == [b"scratch/a"]
    await client.approve(paused.turn_id, "call_h")
    assert (await client.turn(paused.turn_id).result(timeout=30)).content == "tidied"
    assert await runs(client, label) == [b"scratch/a", b"home/b"]


async def test_an_external_result_from_a_sync_client_resumes_the_turn(workers, client, scenario, scripted_llm,
                                                                      redis_url, prefix):  # fmt: skip
    key, marker = scenario(
        Script(Reply.tool_calls([("pick_color", {"hint": "sky"})], ids=["call_ext"]), Reply.text("blue it is"))
    )
    handle = await client.submit(f"{marker} pick", conversation_id=f"conv-{key}", agent="guarded")
    events = [e async for e in client.stream(f"{marker} pick", conversation_id=f"conv-{key}", agent="guarded",
                                             turn_id=handle.turn_id)]  # fmt: skip
    assert events[-1].type == "turn.paused"  # stream() ends at the pause
    assert events[-1].data["pending"][0]["kind"] == "external"
    assert events[-1].data["pending"][0]["parameters"]["required"] == ["hint"]

    def give_result() -> str:
        with SyncSmithClient.from_url(redis_url, prefix=prefix) as sync_client:
            with pytest.raises(InvalidRequestError):  # an external call takes a result, not an approval
                sync_client.approve(handle.turn_id, "call_ext")
            return sync_client.submit_tool_result(handle.turn_id, "call_ext", {"color": "blue"}).action

    assert await asyncio.to_thread(give_result) == "result"
    after = [e async for e in client.follow(handle.turn_id, after_seq=events[-1].seq)]
    assert after[-1].type == "turn.completed" and after[0].type == "turn.resumed"
    assert tool_messages(scripted_llm.requests_for(key)[-1])[0]["content"] == '{"color":"blue"}'


async def test_undecided_calls_time_out_as_rejected(workers, client, scenario, scripted_llm):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(gated_step(label), Reply.text("gave up")))
    paused = await paused_turn(client, marker, f"conv-{key}", agent="guarded_brief")
    events = [e async for e in client.follow(paused.turn_id, timeout=30)]  # through the pause, to the end
    assert events[-1].final_message().content == "gave up"
    assert await runs(client, label) == []
    assert "approval timed out" in tool_messages(scripted_llm.requests_for(key)[-1])[0]["content"]
    assert await client.redis.zscore(client.keys.paused, paused.turn_id) is None


async def test_cancel_while_paused_ends_the_turn_and_keeps_the_results_of_calls_that_ran(workers, client, scenario):
    """A turn worker ends the cancelled paused turn: the step's call that ran keeps its real result in the
    history, the undecided one is answered as cancelled before it started (docs/architecture.md, Tool-call
    pairing)."""
    label = uuid.uuid4().hex[:8]
    first = gated_step(label)  # the conversation's next turn gets a text answer
    key, marker = scenario(lambda request: first if request.attempt == 1 else Reply.text("next answer"))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    handle = client.turn(paused.turn_id)
    assert await handle.cancel() == "cancelling"
    with pytest.raises(TurnCancelledError):
        await handle.result(timeout=10)
    assert [e.type async for e in handle.events()][-1] == "turn.cancelled"
    keys = client.keys
    assert not await client.redis.exists(keys.turn_pending(paused.turn_id))
    assert await client.redis.zscore(keys.paused, paused.turn_id) is None
    with pytest.raises(NoPendingCallError):
        await client.approve(paused.turn_id, "call_gated")
    tools = {m.tool_call_id: m for m in await client.history(conv) if isinstance(m, ToolMessage)}
    assert tools["call_plain"].content == f"counted {label}-plain" and not tools["call_plain"].is_error
    assert tools["call_gated"].is_error and "cancelled before this tool call started" in tools["call_gated"].content
    reply = await client.send(f"{marker} again", conversation_id=conv, agent="guarded", timeout=30)
    assert reply.content == "next answer"
    assert await runs(client, label) == [] and await runs(client, f"{label}-plain") == [b"run"]


async def test_interrupt_cancels_the_paused_turn(workers, client, scenario):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(gated_step(label), Reply.text("fresh answer")))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    reply = await client.send(f"{marker} instead", conversation_id=conv, agent="plain", multitask="interrupt",
                              timeout=30)  # fmt: skip
    assert reply.content == "fresh answer"
    assert await client.turn(paused.turn_id).status() == "cancelled"
    events = [e async for e in client.turn(paused.turn_id).events()]
    assert events[-1].type == "turn.cancelled" and events[-1].data["reason"] == "interrupt"


async def test_enqueue_waits_behind_the_paused_turn(workers, client, scenario):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(gated_step(label), Reply.text("answer")))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    later = await client.submit(f"{marker} later", conversation_id=conv, agent="plain")
    await asyncio.sleep(1.0)
    assert await later.status() == "queued"
    await client.approve(paused.turn_id, "call_gated")
    assert (await client.turn(paused.turn_id).result(timeout=30)).content == "answer"
    assert (await later.result(timeout=30)).content == "answer"


async def test_reject_refuses_a_turn_behind_the_paused_one(workers, client, scenario):
    key, marker = scenario(Script(gated_step(uuid.uuid4().hex[:8]), Reply.text("answer")))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    with pytest.raises(ConversationBusyError) as busy:
        await client.send(f"{marker} more", conversation_id=conv, agent="guarded", multitask="reject")
    assert busy.value.active_turn_id == paused.turn_id


async def test_merge_joins_the_resumed_step(workers, client, scenario, scripted_llm):
    first = gated_step(uuid.uuid4().hex[:8])
    key, marker = scenario(lambda request: first if request.attempt == 1 else Reply.text("both answered"))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    merged = await client.submit(f"{marker} and also this", conversation_id=conv, agent="guarded",
                                 multitask="merge")  # fmt: skip
    assert merged.turn_id == paused.turn_id
    await client.approve(paused.turn_id, "call_gated")
    assert (await merged.result(timeout=30)).content == "both answered"
    resumed = [e.data for e in await client.events.read(paused.turn_id) if e.type == "turn.resumed"]
    assert resumed == [{"attempt": 2, "reason": "decision"}]  # not a restart: the step goes on where it stopped
    users = [m["content"] for m in scripted_llm.requests_for(key)[-1].messages if m.get("role") == "user"]
    assert users[-1] == f"{marker} and also this"


async def test_deciding_twice_keeps_the_first_decision(workers, client, scenario):
    key, marker = scenario(Script(
        Reply.tool_calls([("guarded_delete", {"label": "x", "target": "a"}), ("pick_color", {"hint": "h"})],
                         ids=["call_gated", "call_ext"]),
        Reply.text("ok"),
    ))  # fmt: skip
    paused = await paused_turn(client, marker, f"conv-{key}")
    first = await client.reject(paused.turn_id, "call_gated", message="no")
    again = await client.approve(paused.turn_id, "call_gated", {"label": "x", "target": "b"})
    assert again == first and again.action == "reject"
    assert await client.turn(paused.turn_id).status() == "paused"
    assert [p.call_id for p in await client.pending(paused.turn_id)] == ["call_ext"]
    await client.submit_tool_result(paused.turn_id, "call_ext", "red")
    assert (await client.turn(paused.turn_id).result(timeout=30)).content == "ok"


async def test_concurrent_decisions_all_get_the_first_one_also_after_the_turn_resumed_and_completed(
    workers, client, scenario, redis_url, prefix
):
    """Ten approves at once from two clients, half with edited arguments: one wins, every caller gets it; once
    the resumed step took it (the decisions hash gone), deciding again, identically or not, still returns it
    (from the turn's ``tool_call.decided`` events), an external tool's result included."""
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(
        Reply.tool_calls([("guarded_delete", {"label": label, "target": "repo-a"}), ("pick_color", {"hint": "h"})],
                         ids=["call_gated", "call_ext"]),
        Reply.text("ok"),
    ))  # fmt: skip
    turn_id = (await paused_turn(client, marker, f"conv-{key}")).turn_id
    given = await client.submit_tool_result(turn_id, "call_ext", {"color": "blue"})
    edited = {"label": label, "target": "repo-b"}
    async with SmithClient.from_url(redis_url, prefix=prefix) as other:
        decisions = await asyncio.gather(*(
            (client if n % 2 else other).approve(turn_id, "call_gated", edited if n < 5 else None) for n in range(10)
        ))  # fmt: skip
        first = decisions[0]
        assert first.action == "approve" and first.arguments in (edited, None)
        assert all(decision == first for decision in decisions)
        assert (await client.turn(turn_id).result(timeout=30)).content == "ok"
        assert not await client.redis.exists(client.keys.turn_decisions(turn_id))  # the resumed step's append
        later = [other.approve(turn_id, "call_gated"), client.approve(turn_id, "call_gated", edited),
                 other.reject(turn_id, "call_gated", message="too late")]  # fmt: skip
        assert await asyncio.gather(*later) == [first] * 3
        assert await client.submit_tool_result(turn_id, "call_ext", "red", is_error=True) == given
    assert given.content == '{"color":"blue"}' and not given.is_error
    assert await runs(client, label) == [b"repo-b" if first.arguments else b"repo-a"]  # once
    with pytest.raises(NoPendingCallError):  # never pending: not in the log either
        await client.approve(turn_id, "call_nope")


async def test_deciding_a_call_that_is_not_pending_names_the_pending_ones(workers, client, scenario):
    key, marker = scenario(Script(gated_step(uuid.uuid4().hex[:8]), Reply.text("ok")))
    paused = await paused_turn(client, marker, f"conv-{key}")
    with pytest.raises(NoPendingCallError) as missing:
        await client.approve(paused.turn_id, "call_plain")
    assert missing.value.pending == ["call_gated"] and missing.value.call_id == "call_plain"
    await client.turn(paused.turn_id).cancel()


async def test_cancel_while_paused_keeps_merged_messages_and_starts_the_next_turn_at_once(
    workers, client, scenario
):
    """The turn queued behind the paused one parked itself (it re-checks every PARK_RECHECK = 15 s): the
    cancel wakes it, so it answers well within that; a message merged into the paused turn stays in the
    conversation's history."""
    first = gated_step(uuid.uuid4().hex[:8])
    key, marker = scenario(lambda request: first if request.attempt == 1 else Reply.text("next answer"))
    conv = f"conv-{key}"
    paused = await paused_turn(client, marker, conv)
    await client.submit(f"{marker} merged while paused", conversation_id=conv, agent="guarded", multitask="merge")
    later = await client.submit(f"{marker} later", conversation_id=conv, agent="plain", multitask="enqueue")
    await asyncio.sleep(1.0)  # the later turn has parked behind the paused one
    assert await later.status() == "queued"
    assert await client.turn(paused.turn_id).cancel() == "cancelling"
    started = asyncio.get_running_loop().time()
    assert (await later.result(timeout=30)).content == "next answer"
    assert asyncio.get_running_loop().time() - started < 10  # not at the parked turn's next check (15 s)
    contents = [m.content for m in await client.history(conv) if isinstance(m, UserMessage)]
    assert f"{marker} merged while paused" in contents


# ---- MCP servers and agent trees (docs/architecture.md, Pausing for a person and Sub-agents) ----


def tool_results(events: list) -> dict[tuple[tuple[str, ...], str], list[str]]:
    """The contents of the ``tool.result`` events by (agent path, tool name), in order."""
    found: dict[tuple[tuple[str, ...], str], list[str]] = {}
    for event in events:
        if event.type == "tool.result":
            found.setdefault((tuple(event.agent_path), event.data["name"]), []).append(event.data["content"])
    return found


async def test_an_mcp_servers_listed_tool_waits_for_approval_and_its_other_tools_run(workers, client, scenario):
    label = uuid.uuid4().hex[:8]
    calls = [("mcp_lab_gated__echo", {"text": label}), ("mcp_lab_gated__pid", {}), ("counted", {"label": label})]
    key, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_echo", "call_pid", "call_n"]), Reply.text("ok")))
    paused = await paused_turn(client, marker, f"conv-{key}", agent="mcp_guarded")
    assert [(p["call_id"], p["tool"], p["kind"]) for p in paused.pending] == [
        ("call_echo", "mcp_lab_gated__echo", "approval")
    ]
    assert paused.pending[0]["parameters"]["required"] == ["text"]  # the server's input schema
    assert await runs(client, label) == [b"run"]
    await client.approve(paused.turn_id, "call_echo")
    handle = client.turn(paused.turn_id)
    assert (await handle.result(timeout=30)).content == "ok"
    events = [e async for e in handle.events()]
    results = tool_results(events)
    assert results[(("mcp_guarded",), "mcp_lab_gated__echo")] == [label]  # ran once, after the approval
    assert len(results[(("mcp_guarded",), "mcp_lab_gated__pid")]) == 1  # ran before the pause, not again
    seqs = {e.data["name"]: e.seq for e in events if e.type == "tool.result"}
    pause_seq = next(e.seq for e in events if e.type == "turn.paused")
    assert seqs["mcp_lab_gated__pid"] < pause_seq < seqs["mcp_lab_gated__echo"]
    assert await runs(client, label) == [b"run"]


async def test_a_sub_agent_that_needs_approval_runs_only_once_approved(workers, client, scenario, scripted_llm):
    label = uuid.uuid4().hex[:8]
    child_key, child = scenario(Script(Reply.tool_calls([("counted", {"label": f"{label}-child"})]),
                                       Reply.text("vetted done")))  # fmt: skip
    key, marker = scenario(Script(
        Reply.tool_calls([("vetted", {"task": f"{child} do it"}), ("counted", {"label": label})],
                         ids=["call_vet", "call_n"]),
        Reply.text("lead done"),
    ))  # fmt: skip
    paused = await paused_turn(client, marker, f"conv-{key}", agent="hitl_lead")
    assert [(p["call_id"], p["tool"], p["agent_path"]) for p in paused.pending] == [
        ("call_vet", "vetted", ["hitl_lead"])
    ]
    assert paused.pending[0]["arguments"] == {"task": f"{child} do it"}
    assert scripted_llm.attempts(child_key) == 0  # the sub-agent did not start
    assert await runs(client, label) == [b"run"]
    await client.approve(paused.turn_id, "call_vet")
    handle = client.turn(paused.turn_id)
    assert (await handle.result(timeout=30)).content == "lead done"
    assert tool_results([e async for e in handle.events()])[(("hitl_lead",), "vetted")] == ["vetted done"]
    assert await runs(client, f"{label}-child") == [b"run"]
    assert await runs(client, label) == [b"run"]


async def test_a_childs_gated_call_pauses_the_root_with_its_agent_path_and_approving_it_finishes_the_tree(
    workers, client, scenario, scripted_llm
):
    """The child and the root both call a gated tool with the id ``call_del``: two pending items, each decided
    on its own; the calls that ran before the pause (the root's and the child's) ran once."""
    label = uuid.uuid4().hex[:8]
    child_key, child = scenario(Script(
        Reply.tool_calls([("guarded_delete", {"label": f"{label}-child", "target": "repo-c"}),
                          ("counted", {"label": f"{label}-child-plain"})], ids=["call_del", "call_plain"]),
        Reply.text("child done"),
    ))  # fmt: skip
    key, marker = scenario(Script(
        Reply.tool_calls([("careful", {"task": f"{child} clean up"}),
                          ("guarded_delete", {"label": label, "target": "repo-r"}),
                          ("counted", {"label": f"{label}-plain"})], ids=["call_care", "call_del", "call_plain"]),
        Reply.text("tree done"),
    ))  # fmt: skip
    paused = await paused_turn(client, marker, f"conv-{key}", agent="hitl_lead")
    turn_id = paused.turn_id
    items = {p["call_id"]: p for p in paused.pending}
    assert sorted(items) == ["call_care/call_del", "call_del"]
    assert items["call_del"]["agent_path"] == ["hitl_lead"] and items["call_del"]["call_path"] == []
    child_item = items["call_care/call_del"]
    assert child_item["agent_path"] == ["hitl_lead", "careful"] and child_item["call_path"] == ["call_care"]
    assert (child_item["tool"], child_item["arguments"]["target"]) == ("guarded_delete", "repo-c")
    assert await runs(client, f"{label}-plain") == [b"run"]  # both levels' other calls ran
    assert await runs(client, f"{label}-child-plain") == [b"run"]
    assert await runs(client, label) == [] and await runs(client, f"{label}-child") == []
    handle = client.turn(turn_id)
    assert await handle.status() == "paused"
    assert [p.call_id for p in await client.pending(turn_id)] == ["call_del", "call_care/call_del"]
    await client.reject(turn_id, "call_del", message="not the root's")
    assert await handle.status() == "paused"  # the child's call still waits
    with pytest.raises(NoPendingCallError) as missing:
        await client.approve(turn_id, "call_care/call_plain")
    assert missing.value.pending == ["call_care/call_del"]
    await client.approve(turn_id, "call_care/call_del", {"label": f"{label}-child", "target": "repo-d"})
    assert (await handle.result(timeout=30)).content == "tree done"
    assert await runs(client, f"{label}-child") == [b"repo-d"]  # the child's approved call, edited, once
    assert await runs(client, label) == []  # the root's rejected call never ran
    assert await runs(client, f"{label}-plain") == [b"run"]  # nothing that ran ran again
    assert await runs(client, f"{label}-child-plain") == [b"run"]
    assert scripted_llm.attempts(child_key) == 2 and scripted_llm.attempts(key) == 2  # no model step again
    events = [e async for e in handle.events()]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert [e.agent_path for e in events if e.type == "turn.paused"] == [["hitl_lead"]]  # one pause, the root's
    decided = [(e.agent_path, e.data["id"], e.data["action"]) for e in events if e.type == "tool_call.decided"]
    assert sorted(decided) == [(["hitl_lead"], "call_del", "reject"), (["hitl_lead", "careful"], "call_del", "approve")]
    results = tool_results(events)
    assert results[(("hitl_lead",), "careful")] == ["child done"]
    assert results[(("hitl_lead", "careful"), "guarded_delete")] == ["deleted repo-d"]
    assert "not the root's" in tool_messages(scripted_llm.requests_for(key)[-1])[1]["content"]
    keys = client.keys
    assert not await client.redis.exists(keys.turn_pending(turn_id), keys.turn_decisions(turn_id))


async def test_an_approved_sub_agent_that_waits_again_keeps_its_approval(workers, client, scenario, scripted_llm):
    """The root's approved sub-agent call starts the child, whose gated call pauses the turn a second time:
    the first decision stays, so approving the child's call finishes the tree."""
    label = uuid.uuid4().hex[:8]
    child_key, child = scenario(Script(
        Reply.tool_calls([("guarded_delete", {"label": label, "target": "repo-v"})], ids=["call_del"]),
        Reply.text("vetted done"),
    ))  # fmt: skip
    key, marker = scenario(Script(Reply.tool_calls([("vetted", {"task": f"{child} go"})], ids=["call_vet"]),
                                  Reply.text("all done")))  # fmt: skip
    paused = await paused_turn(client, marker, f"conv-{key}", agent="hitl_lead")
    turn_id = paused.turn_id
    assert [p["call_id"] for p in paused.pending] == ["call_vet"]
    await client.approve(turn_id, "call_vet")
    async with asyncio.timeout(30):  # the child runs, then waits for a person in turn
        while [p.call_id for p in await client.pending(turn_id)] != ["call_vet/call_del"]:
            await asyncio.sleep(0.05)
    await client.approve(turn_id, "call_vet/call_del")
    handle = client.turn(turn_id)
    assert (await handle.result(timeout=30)).content == "all done"
    assert await runs(client, label) == [b"repo-v"]
    assert scripted_llm.attempts(child_key) == 2 and scripted_llm.attempts(key) == 2
    events = [e async for e in handle.events()]
    assert [e.data["pending"][0]["call_id"] for e in events if e.type == "turn.paused"] == [
        "call_vet", "call_vet/call_del"
    ]  # fmt: skip
    # each decision announced once, though the root's step planned its approved call again after its second pause
    decided = [(e.call_path, e.data["id"], e.data["action"]) for e in events if e.type == "tool_call.decided"]
    assert decided == [([], "call_vet", "approve"), (["call_vet"], "call_del", "approve")]
