"""An MCP server's request for input during a tool call, answered from a terminal (docs/architecture.md, Pausing
for a person: MCP elicitation): ``smith ask`` printing the ``smith respond`` command, ``smith pending`` listing the
request, ``smith respond`` answering it, and ``smith chat`` asking for each field. On the session's real workers,
the scripted model and the ``elicit`` agent of tests/support/app.py (tests/support/mcp_servers/elicit_server.py)."""

from __future__ import annotations

import os
import subprocess

import pexpect
import pytest

from smith_worker.testing import Reply, Script
from tests.conftest import ROOT
from tests.integration.test_human_in_the_loop import tool_messages
from tests.integration.test_pause_terminal import SMITH

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

ENV = dict(os.environ, PYTHONPATH=str(ROOT))
QUESTION = "accept, decline or cancel? [a/d/c] "


def order_pen(scenario, answer: str = "pen ordered") -> tuple[str, str]:
    """A scenario whose model calls the elicit server's ``order_pen`` tool, then answers ``answer``."""
    return scenario(Script(Reply.tool_calls([("mcp_elicit__order_pen", {"purpose": "notes"})]), Reply.text(answer)))


def smith(redis_url: str, prefix: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SMITH, *argv, "--redis-url", redis_url, "--prefix", prefix], capture_output=True,
                          text=True, timeout=120, env=ENV)  # fmt: skip


def spawn_smith(redis_url: str, prefix: str, *argv: str) -> pexpect.spawn:
    return pexpect.spawn(SMITH[0], [*SMITH[1:], *argv, "--agent", "elicit", "--redis-url", redis_url, "--prefix",
                                    prefix], env=ENV, encoding="utf-8", timeout=60)  # fmt: skip


def tool_result(scripted_llm, key: str) -> str:
    return tool_messages(scripted_llm.requests_for(key)[-1])[0]["content"]


def test_smith_ask_prints_the_respond_command_and_smith_pending_and_respond_answer_the_request(
    scenario, scripted_llm, redis_url, prefix
):
    key, marker = order_pen(scenario)
    ask = spawn_smith(redis_url, prefix, "ask", f"{marker} order a pen")
    try:
        ask.expect_exact('[input requested] mcp_elicit__order_pen({"purpose":"notes"}): Which pen for notes?')
        ask.expect(r"input (\S+) for mcp_elicit__order_pen\(\{\"purpose\":\"notes\"\}\) waits for a person: "
                   r"Which pen for notes\?")  # fmt: skip
        request = ask.match.group(1)
        ask.expect_exact("  content fields: colour (one of red|green|blue, required: the ink); "
                         "width (integer, required: millimetres); bold (y/n, default n: Bold); note (string: Note)")
        options = f"--prefix {prefix} --redis-url {redis_url}"
        ask.expect(rf"  smith respond {options} (\S+) {request} accept --content JSON  or  "
                   rf"smith respond {options} \S+ {request} decline")  # fmt: skip
        turn = ask.match.group(1)

        listed = smith(redis_url, prefix, "pending", turn)
        assert listed.returncode == 0, listed.stderr
        assert listed.stdout.splitlines()[0] == (f'input {request} for mcp_elicit__order_pen({{"purpose":"notes"}}) '
                                                 "waits for a person: Which pen for notes?")
        assert f"smith respond {options} {turn} {request} accept --content JSON" in listed.stdout

        for argv, says in (
            (["decline", "--content", "{}"], "smith: InvalidRequestError: decline takes no content\n"),
            (["accept"], "smith: InvalidRequestError: accept needs content: a JSON object\n"),
            (["accept", "--content", '{"colour": "purple", "width": 3}'],
             "smith: InvalidRequestError: content does not fit the requested schema: "
             "content.colour: 'purple' is not one of ['red', 'green', 'blue']\n"),
        ):  # fmt: skip
            refused = smith(redis_url, prefix, "respond", turn, request, *argv)
            assert (refused.returncode, refused.stdout, refused.stderr) == (1, "", says)
        content = '{"colour": "green", "width": 3, "bold": true}'
        answered = smith(redis_url, prefix, "respond", turn, request, "accept", "--content", content)
        assert answered.returncode == 0, answered.stderr
        assert answered.stdout == f'{request}: {{"action":"accept","content":{content.replace(" ", "")}}}\n'
        again = smith(redis_url, prefix, "respond", turn, request, "cancel")
        assert again.returncode == 1 and again.stderr.startswith(
            f"smith: NoPendingCallError: turn {turn} has no open input request '{request}'")

        ask.expect_exact(f"[input {request} answered: accept]")
        ask.expect_exact("pen ordered")
        ask.expect(pexpect.EOF)
    finally:
        ask.close(force=True)
    assert ask.exitstatus == 0, ask.before
    assert tool_result(scripted_llm, key) == 'accepted {"colour":"green","width":3,"bold":true}'
    gone = smith(redis_url, prefix, "pending", turn)
    assert gone.returncode == 0 and gone.stderr == f"turn {turn} waits on no call: it is completed\n"


def test_smith_chat_asks_for_each_field_then_the_turn_goes_on(scenario, scripted_llm, redis_url, prefix):
    accept_key, accept = order_pen(scenario)
    decline_key, decline = order_pen(scenario, "no pen then")
    leave_key, leave = order_pen(scenario, "cancelled elsewhere")
    chat = spawn_smith(redis_url, prefix, "chat")
    try:
        chat.expect_exact("you> ")
        chat.sendline(f"{accept} order a pen")
        chat.expect_exact('[input requested] mcp_elicit__order_pen({"purpose":"notes"}): Which pen for notes?')
        chat.expect_exact(QUESTION)
        chat.sendline("maybe")  # none of them: asked again
        chat.expect_exact(QUESTION)
        chat.sendintr()  # Ctrl-C at the question does not cancel the turn
        chat.expect_exact("(answer the question; Ctrl-D leaves the request open)")
        chat.sendline("a")
        chat.expect_exact("  colour (one of red|green|blue, required: the ink)> ")
        chat.sendline("purple")  # not one of them: asked again
        chat.expect_exact("  (colour takes one of red|green|blue)")
        chat.expect_exact("  colour (one of red|green|blue, required: the ink)> ")
        chat.sendline("blue")
        chat.expect_exact("  width (integer, required: millimetres)> ")
        chat.sendline("wide")
        chat.expect_exact("  (width takes an integer)")
        chat.sendline("2")
        chat.expect_exact("  bold (y/n, default n: Bold)> ")
        chat.sendline("")  # its default
        chat.expect_exact("  note (string: Note)> ")
        chat.sendline("fine tip")
        chat.expect(r"\[input \S+ answered: accept\]")
        chat.expect_exact("pen ordered")
        chat.expect_exact("you> ")

        chat.sendline("/reset")  # each scenario is routed by a conversation's first message
        chat.sendline(f"{decline} order a pen")
        chat.expect_exact(QUESTION)
        chat.sendline("d")
        chat.expect(r"\[input \S+ answered: decline\]")
        chat.expect_exact("no pen then")
        chat.expect_exact("you> ")

        chat.sendline("/reset")
        chat.sendline(f"{leave} order a pen")
        chat.expect_exact(QUESTION)
        chat.sendeof()  # Ctrl-D at the question: the request stays open, its commands are printed, the turn goes on
        chat.expect(rf"  smith respond --prefix {prefix} --redis-url {redis_url} (\S+) (\S+) accept --content JSON")
        turn, request = chat.match.group(1), chat.match.group(2)
        answered = smith(redis_url, prefix, "respond", turn, request, "cancel")
        assert answered.returncode == 0, answered.stderr
        chat.expect_exact(f"[input {request} answered: cancel]")
        chat.expect_exact("cancelled elsewhere")
        chat.expect_exact("you> ")
        chat.sendline("/exit")
        chat.expect(pexpect.EOF)
    finally:
        chat.close(force=True)
    assert chat.exitstatus == 0, chat.before
    accepted = 'accepted {"colour":"blue","width":2,"bold":false,"note":"fine tip"}'
    assert tool_result(scripted_llm, accept_key) == accepted
    assert tool_result(scripted_llm, decline_key) == "declined"
    assert tool_result(scripted_llm, leave_key) == "cancelled"
