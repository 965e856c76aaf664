"""`make chat` driven through a pseudo-terminal: tokens, tool status, /reset, Ctrl-C cancelling a turn, Ctrl-D,
the model choosing read_local_file or the bundled MCP example server's tool itself, and the y/n question before
its approval-gated write_local_file."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import uuid

import pexpect
import pytest

from smith_client.approvals import REJECTED
from smith_worker.testing import Reply, Script
from tests.conftest import ROOT
from tests.integration.test_client_contract import tenant_of_its_turn
from tests.integration.test_demo_run import demo_processes

pytestmark = pytest.mark.integration


def spawn_chat(redis_url, scripted_llm, cwd, **extra_env) -> pexpect.spawn:
    """`make chat`'s command (`python -m smith_worker.demo.chat`) in a pseudo-terminal, on the scripted model."""
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_LLM_BASE_URL=scripted_llm.base_url, PYTHONPATH=str(ROOT),
               **extra_env)
    return pexpect.spawn(sys.executable, ["-m", "smith_worker.demo.chat"], cwd=str(cwd), env=env, encoding="utf-8",
                         timeout=60)


def chat_one_turn(child: pexpect.spawn, prompt: str, *expected: str) -> None:
    """Send one line at the prompt, see each of ``expected`` in order, then leave with Ctrl-D (exit status 0)."""
    try:
        child.expect_exact("you> ")
        child.sendline(prompt)
        for text in expected:
            child.expect_exact(text)
        child.expect_exact("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before


def assert_model_chose_and_saw(requests, tool: str, result: str) -> None:
    """The chat agent's first model call let the model choose (tool_choice "auto", ``tool`` offered, so no forced
    calculator) and the next call carried ``tool``'s ``result`` back as the tool message."""
    first, after_tool = requests
    assert first.body["tool_choice"] == "auto"
    assert tool in [t["function"]["name"] for t in first.body["tools"]]
    assert [(m["role"], m["content"]) for m in after_tool.messages if m["role"] == "tool"] == [("tool", result)]


def test_chat_repl_through_a_pty(redis_url, scripted_llm, scenario, tmp_path):
    _, calc = scenario(Script(Reply.tool_calls([("calculator", {"expression": "17*23"})]), Reply.text("It is 391.")))
    slow_key, slow = scenario(Reply.text("tick " * 200, chunk_size=5, delay=0.2))
    fresh_key, fresh = scenario(Reply.text("hi again"))
    child = spawn_chat(redis_url, scripted_llm, tmp_path)
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


def test_chat_model_reads_a_sandbox_file(redis_url, scripted_llm, scenario, tmp_path):
    """The model calls read_local_file by itself; the tool worker reads the file from SMITH_DEMO_FS."""
    sandbox = tmp_path / "demo_fs"
    sandbox.mkdir()
    content = f"notes {uuid.uuid4().hex}"
    (sandbox / "notes.txt").write_text(content)
    key, marker = scenario(Script(Reply.tool_calls([("read_local_file", {"path": "notes.txt"})]),
                                  Reply.text("The notes are read.")))
    chat_one_turn(spawn_chat(redis_url, scripted_llm, tmp_path, SMITH_DEMO_FS=str(sandbox)),
                  f"{marker} Read notes.txt", f"[tool result] read_local_file -> {content} (worker ",
                  "The notes are read.")
    assert_model_chose_and_saw(scripted_llm.requests_for(key), "read_local_file", content)
    assert demo_processes(redis_url) == []


def test_chat_asks_y_n_before_the_model_writes_a_file(redis_url, scripted_llm, scenario, tmp_path):
    """write_local_file needs approval: the REPL asks y/n; ``y`` writes the file inside SMITH_DEMO_FS, ``n``
    writes nothing and the model gets the rejection as the tool's error message."""
    sandbox = tmp_path / "demo_fs"
    sandbox.mkdir()
    text = f"kept {uuid.uuid4().hex}"
    yes_key, yes = scenario(Script(Reply.tool_calls([("write_local_file", {"path": "kept.txt", "content": text})]),
                                   Reply.text("Written.")))  # fmt: skip
    no_key, no = scenario(Script(Reply.tool_calls([("write_local_file", {"path": "refused.txt", "content": "x"})]),
                                 Reply.text("Not written.")))  # fmt: skip
    child = spawn_chat(redis_url, scripted_llm, tmp_path, SMITH_DEMO_FS=str(sandbox))
    try:
        child.expect_exact("you> ")
        child.sendline(f"{yes} Write kept.txt")
        child.expect_exact("[turn paused] 1 call(s) wait for a person")
        child.expect_exact(f'approve write_local_file({{"path":"kept.txt","content":"{text}"}})? [y/n] ')
        child.sendline("y")
        child.expect_exact(f"[tool result] write_local_file -> wrote {len(text)} bytes to kept.txt (worker ")
        child.expect_exact("Written.")
        child.expect_exact("you> ")

        child.sendline("/reset")  # each scenario is routed by a conversation's first message
        child.sendline(f"{no} Write refused.txt")
        child.expect_exact('approve write_local_file({"path":"refused.txt","content":"x"})? [y/n] ')
        child.sendline("n")
        child.expect_exact(f"[tool call rejected] write_local_file: {REJECTED}")
        child.expect_exact("Not written.")
        child.expect_exact("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before
    assert (sandbox / "kept.txt").read_text() == text
    assert not (sandbox / "refused.txt").exists()
    assert_model_chose_and_saw(scripted_llm.requests_for(yes_key), "write_local_file",
                               f"wrote {len(text)} bytes to kept.txt")  # fmt: skip
    rejected = scripted_llm.requests_for(no_key)[-1]
    assert [m["content"] for m in rejected.messages if m["role"] == "tool"] == [
        f'{{"error":true,"message":"{REJECTED}"}}'
    ]  # fmt: skip
    assert demo_processes(redis_url) == []


def test_chat_model_calls_the_mcp_example_tool(redis_url, scripted_llm, scenario, tmp_path):
    """The model calls mcp_example__echo by itself; the bundled MCP example server echoes the text."""
    text = f"echo {uuid.uuid4().hex}"
    key, marker = scenario(Script(Reply.tool_calls([("mcp_example__echo", {"text": text})]), Reply.text("Echoed.")))
    chat_one_turn(spawn_chat(redis_url, scripted_llm, tmp_path), f"{marker} Echo it",
                  f"[tool result] mcp_example__echo -> {text} (worker ", "Echoed.")
    assert_model_chose_and_saw(scripted_llm.requests_for(key), "mcp_example__echo", text)
    assert demo_processes(redis_url) == []


def test_smith_chat_leaves_on_exit(redis_url, prefix, workers):
    """`smith chat` is the same REPL (it starts only where a worker serves its agent); /exit leaves it with
    status 0."""
    child = pexpect.spawn(sys.executable, ["-c", "from smith_client.cli import smith_main; smith_main()",
                                           "--redis-url", redis_url, "--prefix", prefix, "chat"],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), encoding="utf-8", timeout=30)
    try:
        child.expect(r"\[conversation cli-\d+\]")
        child.expect_exact("you> ")
        child.sendline("/bogus")  # not sent as a turn
        child.expect_exact("[unknown command /bogus: /reset starts a new conversation, /exit leaves]")
        child.expect_exact("you> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0, child.before


async def test_smith_chat_sends_its_turns_for_the_tenant_given(redis_url, prefix, workers, client, scenario):
    """``smith chat --tenant NAME``: each line's turn is sent as ``send(..., tenant=NAME)`` sends it."""
    held = threading.Event()
    _, marker = scenario(Reply.text("chatted for acme", gate=held))
    conversation = f"chat-tenant-{uuid.uuid4().hex[:8]}"
    child = pexpect.spawn(sys.executable, ["-c", "from smith_client.cli import smith_main; smith_main()", "chat",
                                           "--redis-url", redis_url, "--prefix", prefix, "--tenant", "acme-chat",
                                           "--conversation", conversation],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), encoding="utf-8", timeout=60)
    chatting = asyncio.create_task(asyncio.to_thread(chat_one_turn, child, f"{marker} hi", "chatted for acme"))
    assert await tenant_of_its_turn(client, conversation, held) == "acme-chat"
    await chatting
