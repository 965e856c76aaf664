"""A paused turn from a terminal (docs/architecture.md, Pausing for a person): ``smith pending``, ``smith approve``,
``smith reject`` and ``smith result`` deciding it, ``smith ask`` leaving it paused, and ``smith chat`` asking
y/n and a value, on the session's real workers and the scripted model (the ``guarded`` agent of
tests/support/app.py)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid

import pexpect
import pytest

from smith_client import SmithClient
from smith_client.approvals import REJECTED
from smith_client.cli import PAUSED_EXIT
from smith_worker.testing import Reply, Script
from tests.conftest import ROOT
from tests.integration.test_human_in_the_loop import paused_turn, runs, tool_messages

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

SMITH = [sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()"]


async def smith(redis_url: str, prefix: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``smith ARGV… --redis-url … --prefix …`` in a subprocess (off the event loop)."""
    return await asyncio.to_thread(
        subprocess.run, [*SMITH, *argv, "--redis-url", redis_url, "--prefix", prefix],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )  # fmt: skip


def three_calls(label: str) -> Reply:
    """A step with two approval-gated calls and an external tool's."""
    return Reply.tool_calls(
        [("guarded_delete", {"label": label, "target": "repo-a"}), ("guarded_delete", {"label": label, "target": "x"}),
         ("pick_color", {"hint": "sky"})],
        ids=["call_a", "call_b", "call_ext"],
    )  # fmt: skip


async def test_smith_pending_approve_reject_and_result_decide_a_paused_turn(
    client, scenario, scripted_llm, redis_url, prefix
):
    label = uuid.uuid4().hex[:8]
    key, marker = scenario(Script(three_calls(label), Reply.text("all decided")))
    turn = (await paused_turn(client, marker, f"conv-{key}")).turn_id

    listed = await smith(redis_url, prefix, "pending", turn)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split() == ["call", "kind", "tool", "agent", "arguments"]
    assert [row.split(maxsplit=4) for row in rows] == [
        ["call_a", "approval", "guarded_delete", "guarded", f'{{"label":"{label}","target":"repo-a"}}'],
        ["call_b", "approval", "guarded_delete", "guarded", f'{{"label":"{label}","target":"x"}}'],
        ["call_ext", "external", "pick_color", "guarded", '{"hint":"sky"}'],
    ]

    unfit = await smith(redis_url, prefix, "approve", turn, "call_a", "--arguments", '{"label": 1}')
    assert unfit.returncode == 1 and unfit.stdout == ""
    assert unfit.stderr.startswith("smith: InvalidRequestError: arguments for guarded_delete do not fit its schema")
    approved = await smith(redis_url, prefix, "approve", turn, "call_a", "--arguments",
                           f'{{"label": "{label}", "target": "repo-b"}}')  # fmt: skip
    assert approved.returncode == 0, approved.stderr
    assert approved.stdout.splitlines() == [
        f'call_a: {{"action":"approve","arguments":{{"label":"{label}","target":"repo-b"}}}}',
        f"turn {turn} still waits on call_b, call_ext",
    ]
    rejected = await smith(redis_url, prefix, "reject", turn, "call_b", "--message", "not that one")
    assert rejected.returncode == 0, rejected.stderr
    assert rejected.stdout.splitlines()[0] == 'call_b: {"action":"reject","message":"not that one"}'
    again = await smith(redis_url, prefix, "approve", turn, "call_b")  # the first decision stays
    assert again.returncode == 1 and again.stdout.startswith('call_b: {"action":"reject"')
    assert again.stderr == "smith: call call_b was decided before; this decision changed nothing\n"
    missing = await smith(redis_url, prefix, "reject", turn, "call_nope")
    assert missing.returncode == 1 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("smith: NoPendingCallError: turn ") and "['call_ext']" in missing.stderr
    assert (await smith(redis_url, prefix, "approve", turn, "call_ext")).stderr.startswith(
        "smith: InvalidRequestError: call call_ext (external) takes submit_tool_result"
    )
    given = await smith(redis_url, prefix, "result", turn, "call_ext", '{"color": "blue"}')
    assert given.returncode == 0, given.stderr
    assert given.stdout.splitlines()[-1] == f"turn {turn} is no longer paused: it resumes on a turn worker"

    assert (await client.turn(turn).result(timeout=30)).content == "all decided"
    assert await runs(client, label) == [b"repo-b"]  # once, with the edited arguments
    contents = [m["content"] for m in tool_messages(scripted_llm.requests_for(key)[-1])]
    assert contents[1:] == ['{"error":true,"message":"not that one"}', '{"color": "blue"}']  # the value as given
    after = await smith(redis_url, prefix, "pending", turn)
    assert (after.returncode, after.stdout, after.stderr) == (0, "", f"turn {turn} waits on no call: it is completed\n")
    unknown = await smith(redis_url, prefix, "pending", "no-such-turn")
    assert unknown.returncode == 1
    assert unknown.stderr == f"smith: TurnNotFoundError: no turn no-such-turn under prefix '{prefix}' (or it expired)\n"


async def test_smith_ask_on_a_turn_that_pauses_says_how_to_decide_it_and_leaves_it_paused(
    client, scenario, redis_url, prefix
):
    label = uuid.uuid4().hex[:8]
    _, marker = scenario(Script(three_calls(label), Reply.text("unused")))
    asked = await smith(redis_url, prefix, "ask", "--agent", "guarded", "--timeout", "60", f"{marker} go")
    assert asked.returncode == PAUSED_EXIT == 3 and asked.stdout == "", asked.stderr
    assert "Traceback" not in asked.stderr
    turn = re.search(r"^turn (\S+) is paused; it resumes once each call below is decided:$", asked.stderr, re.M)
    assert turn, asked.stderr
    turn_id = turn.group(1)
    lines = asked.stderr.splitlines()
    assert lines[lines.index(turn.group(0)) - 1] == "[turn paused] 3 call(s) wait for a person"
    options = f"--prefix {prefix} --redis-url {redis_url}"  # as given: the commands work from any shell

    def decide(call: str) -> str:
        return (f"    smith approve {options} {turn_id} {call} [--arguments JSON]  or  "
                f"smith reject {options} {turn_id} {call} [--message TEXT]")

    assert lines[lines.index(turn.group(0)) + 1 :] == [
        f'  call_a (approval): guarded_delete({{"label":"{label}","target":"repo-a"}})', decide("call_a"),
        f'  call_b (approval): guarded_delete({{"label":"{label}","target":"x"}})', decide("call_b"),
        '  call_ext (external): pick_color({"hint":"sky"})',
        f"    smith result {options} {turn_id} call_ext VALUE [--error]",
        f"smith pending {options} {turn_id} lists the calls still waiting",
    ]  # fmt: skip
    handle = client.turn(turn_id)
    assert await handle.status() == "paused"  # not cancelled: a person decides it later
    assert await handle.cancel() == "cancelling"
    assert await runs(client, label) == []


async def test_smith_ask_behind_a_paused_turn_names_it_and_pending_fits_a_long_call_id(client, scenario, redis_url,
                                                                                      prefix):  # fmt: skip
    label = uuid.uuid4().hex[:8]
    long_id = f"call_{'0123456789' * 3}"
    key, marker = scenario(Script(
        Reply.tool_calls([("guarded_delete", {"label": label, "target": "repo-a"})], ids=[long_id]),
        Reply.text("unused"),
    ))  # fmt: skip
    conv = f"conv-{key}"
    turn_id = (await paused_turn(client, marker, conv)).turn_id
    listed = await smith(redis_url, prefix, "pending", turn_id)
    header, row = listed.stdout.splitlines()
    assert [header.index(name) for name in ("kind", "tool", "agent")] == [
        row.index(f"{cell} ") for cell in ("approval", "guarded_delete", "guarded")
    ]
    behind = await smith(redis_url, prefix, "ask", "--conversation", conv, "--agent", "guarded", "--timeout", "2",
                         f"{marker} and then")  # fmt: skip
    assert behind.returncode == 1 and "SmithTimeoutError" in behind.stderr  # it waited: nothing decided the pause
    waiting = re.search(r"^\[turn (\S+) waits behind paused turn (\S+): it starts once that one is decided "
                        r"\(smith pending (.*) (\S+)\) or cancelled\]$", behind.stderr, re.M)  # fmt: skip
    assert waiting, behind.stderr
    assert waiting.group(2) == waiting.group(4) == turn_id
    assert waiting.group(3) == f"--prefix {prefix} --redis-url {redis_url}"
    assert await client.turn(waiting.group(1)).status() == "cancelled"  # at --timeout, as ever
    assert await client.turn(turn_id).cancel() == "cancelling"


def spawn_smith_chat(redis_url: str, prefix: str) -> pexpect.spawn:
    """``smith chat --agent guarded`` (the REPL of ``make chat``) in a pseudo-terminal."""
    argv = [*SMITH[1:], "chat", "--agent", "guarded", "--redis-url", redis_url, "--prefix", prefix]
    return pexpect.spawn(SMITH[0], argv, env=dict(os.environ, PYTHONPATH=str(ROOT)), encoding="utf-8", timeout=60)


async def paused_turns(client: SmithClient) -> list[str]:
    return [raw.decode() for raw in await client.redis.zrange(client.keys.paused, 0, -1)]


async def test_smith_chat_asks_y_n_and_a_value_then_follows_the_resumed_turn(client, scenario, scripted_llm,
                                                                           redis_url, prefix):  # fmt: skip
    label = uuid.uuid4().hex[:8]
    gated = ("guarded_delete", {"label": label, "target": "repo-a"})
    _, approve = scenario(Script(three_calls(label), Reply.text("approved and coloured")))
    reject_key, reject = scenario(Script(Reply.tool_calls([gated], ids=["call_r"]), Reply.text("left alone")))
    _, leave = scenario(Script(Reply.tool_calls([gated], ids=["call_l"]), Reply.text("unused")))
    before = set(await paused_turns(client))
    child = spawn_smith_chat(redis_url, prefix)
    try:
        child.expect_exact("you> ")
        child.sendline(f"{approve} go")
        child.expect_exact("[turn paused] 3 call(s) wait for a person")
        child.expect_exact(f'approve guarded_delete({{"label":"{label}","target":"repo-a"}})? [y/n] ')
        child.sendline("maybe")  # neither: asked again
        child.expect_exact("? [y/n] ")
        child.sendintr()  # Ctrl-C at a question does not cancel the turn
        child.expect_exact("(answer the question; Ctrl-D leaves the turn paused)")
        child.sendline("y")
        child.expect_exact(f'approve guarded_delete({{"label":"{label}","target":"x"}})? [y/n] ')
        child.sendline("n")
        child.expect_exact('result of pick_color({"hint":"sky"})> ')
        child.sendline("blue")
        child.expect_exact(f'[tool call approved] guarded_delete({{"label":"{label}","target":"repo-a"}})')
        child.expect_exact(f"[tool call rejected] guarded_delete: {REJECTED}")
        child.expect_exact("[tool call answered from outside] pick_color")
        child.expect_exact("[tool result] guarded_delete -> deleted repo-a (worker ")
        child.expect_exact("approved and coloured")
        child.expect_exact("you> ")

        child.sendline("/reset")  # each scenario is routed by a conversation's first message
        child.sendline(f"{reject} go")
        child.expect_exact("? [y/n] ")
        child.sendline("no")
        child.expect_exact("left alone")
        child.expect_exact("you> ")

        child.sendline("/reset")
        child.sendline(f"{leave} go")
        child.expect_exact("? [y/n] ")
        child.sendeof()  # Ctrl-D at a question: the turn stays paused, the REPL says how to decide it
        child.expect(r"turn (\S+) is paused; it resumes once each call below is decided:")
        left = child.match.group(1)
        child.expect_exact(f"smith approve --prefix {prefix} --redis-url {redis_url} {left} call_l [--arguments JSON]")
        child.expect_exact("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert await runs(client, label) == [b"repo-a"]
    rejection = tool_messages(scripted_llm.requests_for(reject_key)[-1])[0]["content"]
    assert rejection == f'{{"error":true,"message":"{REJECTED}"}}'
    assert set(await paused_turns(client)) - before == {left}
    assert await client.turn(left).cancel() == "cancelling"
