"""`make chat` driven through a pseudo-terminal: tokens, tool status, /reset, Ctrl-C cancelling a turn, Ctrl-D."""

from __future__ import annotations

import os
import sys

import pexpect
import pytest

from tests.conftest import ROOT
from tests.integration.test_demo_run import demo_processes
from tests.support.scripted_llm import Reply, Script

pytestmark = pytest.mark.integration


def test_chat_repl_through_a_pty(redis_url, scripted_llm, scenario, tmp_path):
    _, calc = scenario(Script(Reply.tool_calls([("calculator", {"expression": "17*23"})]), Reply.text("It is 391.")))
    slow_key, slow = scenario(Reply.text("tick " * 200, chunk_size=5, delay=0.2))
    fresh_key, fresh = scenario(Reply.text("hi again"))
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_LLM_BASE_URL=scripted_llm.base_url, PYTHONPATH=str(ROOT))
    child = pexpect.spawn(sys.executable, ["-m", "smith_worker.demo.chat"], cwd=str(tmp_path), env=env,
                          encoding="utf-8", timeout=60)
    try:
        child.expect_exact("you> ")
        child.sendline(f"{calc} What is 17*23?")
        child.expect_exact("[tool result] calculator -> 391 (worker ")
        child.expect_exact("It is 391.")
        child.expect_exact("you> ")

        child.sendline("/reset")
        child.expect(r"\[new conversation chat-[0-9a-f]+\]")
        child.sendline(f"{slow} talk slowly")
        child.expect_exact("tick")
        child.sendintr()  # Ctrl-C: cancels the turn, the REPL stays
        child.expect_exact("[turn cancelled]")
        child.expect_exact("you> ")
        assert scripted_llm.wait_until(lambda: scripted_llm.requests_for(slow_key)[0].closed_early, timeout=10)

        child.sendintr()  # at the prompt: only a reminder
        child.expect_exact("(type /exit or press Ctrl-D to leave)")
        child.sendline("/reset")
        child.sendline(f"{fresh} hello")  # routed by the first user message: only a new conversation reaches it
        child.expect_exact("hi again")
        child.expect_exact("you> ")
        assert [m["role"] for m in scripted_llm.requests_for(fresh_key)[0].messages if m["role"] == "user"] == ["user"]

        child.sendeof()  # Ctrl-D leaves
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert demo_processes(redis_url) == []


def test_smith_chat_leaves_on_exit(redis_url):
    """`smith chat` is the same REPL; /exit leaves it with status 0 (no worker needed: no turn is sent)."""
    child = pexpect.spawn(sys.executable, ["-c", "from smith_client.cli import smith_main; smith_main()",
                                           "--redis-url", redis_url, "chat"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), encoding="utf-8", timeout=30)
    try:
        child.expect(r"\[conversation cli-\d+\]")
        child.expect_exact("you> ")
        child.sendline("/bogus")  # not sent as a turn (none could run: no worker)
        child.expect_exact("[unknown command /bogus: /reset starts a new conversation, /exit leaves]")
        child.expect_exact("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
