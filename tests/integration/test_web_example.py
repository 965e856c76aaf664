"""The web relay example (examples/web/) against real workers: SSE over curl, and a real Chromium (issue 16)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid

import httpx
import pytest
import redis

from smith_client.keys import Keys
from smith_worker.local.processes import ManagedProcess, free_port, wait_until
from tests.conftest import LOGS, ROOT
from tests.support.scripted_llm import Reply, Script
from tests.support.web import serves

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

CHROMIUM = "/usr/bin/chromium"
HEARTBEAT = 0.5  # seconds; the example's default is 15


@pytest.fixture(scope="module")
def web(redis_url, prefix):
    """The example app under uvicorn, a real HTTP server in its own process; yields its base URL."""
    port = free_port()
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_PREFIX=prefix, SMITH_WEB_HEARTBEAT=str(HEARTBEAT),
               PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "uvicorn", "examples.web.app:app", "--host", "127.0.0.1", "--port", str(port)]
    LOGS.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(argv, env=env, log_path=LOGS / "web-example.log").start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: serves(base + "/"), 30.0, "the web example")
        yield base
    finally:
        proc.stop()


def start(web: str, text: str, key: str | None = None) -> str:
    headers = {"Idempotency-Key": key} if key else {}
    reply = httpx.post(f"{web}/conversations/conv-{uuid.uuid4().hex[:8]}/turns", json={"text": text}, headers=headers)
    assert reply.status_code == 202, reply.text
    return reply.json()["turn_id"]


def sse_messages(raw: str) -> tuple[list[dict[str, str]], int]:
    """The messages of an SSE body (field → value) and the number of comment lines."""
    messages, comments = [], 0
    for block in raw.replace("\r\n", "\n").split("\n\n"):
        fields = {}
        for line in block.splitlines():
            if line.startswith(":"):
                comments += 1
            elif ":" in line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if "data" in fields:
            messages.append(fields)
    return messages, comments


def curl(url: str, *headers: str) -> subprocess.CompletedProcess[str]:
    args = ["curl", "-sS", "-N", "--max-time", "60", "-D", "-", url]
    for header in headers:
        args += ["-H", header]
    return subprocess.run(args, capture_output=True, text=True, timeout=90)


def test_curl_resumes_after_last_event_id_and_gets_204_once_finished(web, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]),
                                Reply.text("twenty tokens of answer, slowly", chunk_size=2, delay=0.1)))
    turn_id = start(web, f"{marker} add", key=f"idem-{uuid.uuid4().hex}")
    time.sleep(0.3)  # a few events are out; the rest stream live while curl reads
    done = curl(f"{web}/turns/{turn_id}/events", "Last-Event-ID: 5")
    assert done.returncode == 0, done.stderr  # the server closed the stream: curl did not time out
    head, _, body = done.stdout.partition("\n\n")  # text mode turned CRLF into \n
    assert head.startswith("HTTP/1.1 200") and "text/event-stream" in head and "x-accel-buffering: no" in head.lower()
    messages, comments = sse_messages(body)
    seqs = [int(m["id"]) for m in messages]
    assert seqs == list(range(6, seqs[-1] + 1))  # exactly the events after seq 5, in order
    assert '"turn.completed"' in messages[-1]["data"] and comments >= 2  # the open comment and heartbeats
    again = curl(f"{web}/turns/{turn_id}/events", f"Last-Event-ID: {seqs[-1]}")
    assert again.stdout.startswith("HTTP/1.1 204")


def test_the_api_answers_idempotently_and_with_typed_errors(web, scenario, redis_url, prefix):
    _, marker = scenario(Script(Reply.text("ok")))
    key = f"idem-{uuid.uuid4().hex}"
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    first = httpx.post(f"{web}/conversations/{conversation}/turns", json={"text": f"{marker} hi"},
                       headers={"Idempotency-Key": key})
    second = httpx.post(f"{web}/conversations/{conversation}/turns", json={"text": f"{marker} hi"},
                        headers={"Idempotency-Key": key})
    assert first.json()["turn_id"] == second.json()["turn_id"] == key
    other = httpx.post(f"{web}/conversations/{conversation}/turns", json={"text": "changed"},
                       headers={"Idempotency-Key": key})
    assert other.status_code == 409 and other.json()["error"]["kind"] == "ConflictError"
    assert httpx.post(f"{web}/conversations/{conversation}/turns", json={"text": " "}).status_code == 422
    assert httpx.get(f"{web}/turns/nope-{uuid.uuid4().hex}/events").status_code == 404
    assert httpx.post(f"{web}/turns/nope-{uuid.uuid4().hex}/cancel").status_code == 404
    assert httpx.get(f"{web}/turns/{key}/events", headers={"Last-Event-ID": "x"}).status_code == 422
    full = httpx.get(f"{web}/turns/{key}/events?after=0", timeout=30)  # ?after= for fetch clients
    assert [int(m["id"]) for m in sse_messages(full.text)[0]][0] == 1
    redis.Redis.from_url(redis_url).delete(Keys(prefix).turn_log(key))  # as if the log had expired
    gone = httpx.get(f"{web}/turns/{key}/events?after=0")
    assert gone.status_code == 410 and gone.json()["error"]["kind"] == "EventsTrimmedError"


def test_fastapis_own_validation_errors_have_the_apps_error_shape(web):
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    for body in ({}, {"text": 5}, {"text": "hi", "agent": ["x"]}):
        reply = httpx.post(f"{web}/conversations/{conversation}/turns", json=body)
        assert reply.status_code == 422, reply.text
        error = reply.json()["error"]
        assert error["kind"] == "InvalidRequestError" and error["fields"]["field"].startswith("body."), error
    not_json = httpx.post(f"{web}/conversations/{conversation}/turns", content=b"{", headers={
        "content-type": "application/json"})
    assert not_json.status_code == 422 and not_json.json()["error"]["kind"] == "InvalidRequestError"


@pytest.fixture(scope="module")
def browser():
    if not shutil.which(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is not installed and `make test` could not install Debian's chromium package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def rendered(page) -> list[int]:
    return page.evaluate("window.renderedSeqs")


def test_a_browser_streams_a_turn_resumes_after_a_reload_and_cancels(web, browser, scenario, redis_url, prefix):
    answer = "a long streamed answer that keeps coming while the page reloads " * 2
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 40, "b": 2})]),
                                Reply.text(answer, chunk_size=2, delay=0.1)))  # ~7 s of tokens
    page = browser.new_page()
    page.goto(web + "/")
    page.fill("#text", f"{marker} please add")
    page.click("#send")
    page.wait_for_function("window.renderedSeqs.length >= 12")  # tokens arrive live
    assert "result add -> 42" in page.inner_text("#tools")
    before, partial = rendered(page), page.inner_text("#answer")
    assert page.inner_text("#status") == "streaming" and 0 < len(partial) < len(answer)  # tokens shown live
    page.reload()  # mid-stream
    page.wait_for_function("document.getElementById('status').textContent === 'completed'", timeout=60_000)
    seqs = rendered(page)
    assert seqs[: len(before)] == before and len(seqs) > len(before)
    assert seqs == list(range(1, len(seqs) + 1))  # no gap, no duplicate across the reload
    assert page.inner_text("#answer") == answer

    _, marker = scenario(Script(Reply.text("an answer too slow to finish " * 20, chunk_size=1, delay=0.05)))
    page.fill("#text", f"{marker} stop me")
    page.click("#send")
    page.wait_for_function("window.renderedSeqs.length >= 5")
    page.click("#cancel")
    page.wait_for_function("document.getElementById('status').textContent === 'cancelled'", timeout=30_000)
    turn_id = page.evaluate("JSON.parse(sessionStorage.turn).turnId")
    assert httpx.get(f"{web}/turns/{turn_id}/events?after={rendered(page)[-1]}").status_code == 204
    page.close()


def test_the_page_drops_the_unfinished_reply_a_resumed_turn_streams_again(web, browser):
    """After ``turn.resumed`` the interrupted step's tokens come again from its start: the page keeps the
    completed steps' text and replaces the rest (the real page's renderer in a real Chromium, fed events)."""
    page = browser.new_page()
    page.goto(web + "/")
    page.evaluate("""() => {
        saved = { turnId: "t", last: 0, seqs: [], answer: "", tools: [], done: null };
        window.renderedSeqs = saved.seqs;
        const events = [
            ["token", { text: "Let me add. " }],
            ["message", { message: { role: "assistant", content: "Let me add. ", tool_calls: [] } }],
            ["token", { text: "It is 4" }],
            ["turn.resumed", { attempt: 2 }],
            ["token", { text: "It is 42." }],
        ];
        events.forEach(([type, data], i) => render({ turn_id: "t", seq: i + 1, type, data, agent_path: [] }));
    }""")
    assert page.inner_text("#answer") == "Let me add. It is 42."
    assert "resumed (attempt 2): the unfinished reply streams again" in page.inner_text("#tools")
    page.close()
