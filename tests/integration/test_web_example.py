"""The web relay example (examples/web/) against real workers: SSE over curl, and a real Chromium,
also across Redis restarts (a rig of its own, below)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import redis

from smith_client.keys import Keys
from smith_worker.local.processes import ManagedProcess, free_port, start_redis_server, wait_until
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS, ROOT
from tests.support.web import serves

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]

APP = "tests.support.app:app"
CHROMIUM = "/usr/bin/chromium"
HEARTBEAT = 0.5  # seconds; the example's default is 15
T = TypeVar("T")


@contextlib.contextmanager
def relay(redis_url: str, prefix: str, log_path: Path) -> Iterator[str]:
    """The example app under uvicorn, a real HTTP server in its own process; yields its base URL."""
    port = free_port()
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_PREFIX=prefix, SMITH_WEB_HEARTBEAT=str(HEARTBEAT),
               PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "uvicorn", "examples.web.app:app", "--host", "127.0.0.1", "--port", str(port)]
    LOGS.mkdir(parents=True, exist_ok=True)
    proc = ManagedProcess(argv, env=env, log_path=log_path).start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: serves(base + "/"), 30.0, "the web example")
        yield base
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def web(redis_url, prefix):
    with relay(redis_url, prefix, LOGS / "web-example.log") as base:
        yield base


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
    bad_key = httpx.post(f"{web}/conversations/{conversation}/turns", json={"text": "hi"},
                         headers={"Idempotency-Key": "bad key!"})
    assert bad_key.status_code == 422 and bad_key.json()["error"]["fields"] == {"field": "Idempotency-Key"}
    assert bad_key.json()["error"]["message"].startswith("Idempotency-Key ")
    for bad in ("x", "-1"):
        refused = httpx.get(f"{web}/turns/{key}/events", headers={"Last-Event-ID": bad})
        assert refused.status_code == 422 and refused.json()["error"]["fields"] == {"field": "Last-Event-ID"}
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


def test_the_decision_routes_take_no_body_say_when_a_decision_was_ignored_and_404_an_unknown_turn(web, scenario):
    calls = [("guarded_delete", {"label": uuid.uuid4().hex[:8], "target": "a"}), ("guarded_delete", {"label": "x",
             "target": "b"}), ("pick_color", {"hint": "sky"})]  # fmt: skip
    _, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_a", "call_b", "call_ext"]), Reply.text("done")))
    reply = httpx.post(f"{web}/conversations/conv-{uuid.uuid4().hex[:8]}/turns",
                       json={"text": f"{marker} go", "agent": "guarded"})  # fmt: skip
    turn = f"{web}/turns/{reply.json()['turn_id']}"
    wait_until(lambda: len(httpx.get(f"{turn}/pending").json()) == 3, 30.0, "the turn's pause")
    approved = httpx.post(f"{turn}/calls/call_a/approve")  # no body: as the model asked
    assert approved.status_code == 200, approved.text
    assert approved.json() == {"action": "approve", "arguments": None, "message": "", "content": "",
                               "is_error": False, "ignored": False}  # fmt: skip
    again = httpx.post(f"{turn}/calls/call_a/reject", json={"message": "no"})
    assert again.status_code == 200 and again.json()["action"] == "approve" and again.json()["ignored"] is True
    assert httpx.post(f"{turn}/calls/call_a/approve").json()["ignored"] is False  # the same again: not ignored
    rejected = httpx.post(f"{turn}/calls/call_b/reject")
    assert (rejected.json()["message"], rejected.json()["ignored"]) == ("rejected by the user", False)
    for body, field in (({"result": "red", "is_error": "yes"}, "body.is_error"),
                        ({"result": "x" * 1_000_001}, "result")):  # fmt: skip
        refused = httpx.post(f"{turn}/calls/call_ext/result", json=body)
        assert refused.status_code == 422 and refused.json()["error"]["fields"] == {"field": field}, refused.text
    assert httpx.post(f"{turn}/calls/call_ext/result", json={"result": "red"}).json()["ignored"] is False
    finished = curl(f"{turn}/events")
    assert '"turn.completed"' in finished.stdout, finished.stdout
    for path in ("pending", "calls/call_a/approve"):
        unknown = (httpx.get if path == "pending" else httpx.post)(f"{web}/turns/nosuch-{uuid.uuid4().hex}/{path}")
        assert unknown.status_code == 404 and unknown.json()["error"]["kind"] == "TurnNotFoundError", unknown.text


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


def wait_for_status(page, status: str, timeout: float = 60_000) -> None:
    page.wait_for_function(f"document.getElementById('status').textContent === {status!r}", timeout=timeout)


def saved_turn(page) -> dict:
    return page.evaluate("JSON.parse(sessionStorage.turn)")


def store_turn(page, turn_id: str, last: int) -> None:
    """Put an unfinished turn in the page's sessionStorage, as a reload finds it, having rendered up to ``last``."""
    page.evaluate("""([turnId, last]) => { sessionStorage.turn = JSON.stringify({ turnId, last,
        seqs: Array.from({ length: last }, (_, i) => i + 1), answer: "partial", tools: [], done: null }); }""",
                  [turn_id, last])


def test_a_browser_decides_a_paused_turn_after_a_reload_and_the_turn_finishes(web, browser, scenario, redis_url, prefix):
    """Approve with edited arguments and answer an external tool's form from the page, after reloading it
    while the turn waits (docs/architecture.md, Pausing for a person)."""
    label = uuid.uuid4().hex[:8]
    calls = [("guarded_delete", {"label": label, "target": "repo-a"}), ("pick_color", {"hint": "sky"})]
    _, marker = scenario(Script(Reply.tool_calls(calls, ids=["call_gated", "call_color"]), Reply.text("all done")))
    page = browser.new_page()
    page.goto(web + "/?agent=guarded")
    page.fill("#text", f"{marker} tidy up")
    page.click("#send")
    wait_for_status(page, "paused: waiting for you")
    page.reload()  # the page finds its paused turn again: what is still undecided
    wait_for_status(page, "paused: waiting for you")
    assert page.locator(".pending").count() == 2
    gated = page.locator('.pending[data-call="call_gated"]')
    gated.locator("textarea").fill(f'{{"label": "{label}", "target": "repo-b"}}')
    gated.get_by_role("button", name="Approve").click()
    page.wait_for_function("document.querySelectorAll('.pending').length === 1")
    color = page.locator('.pending[data-call="call_color"]')
    color.locator('input[name="hint"]').fill("blue")
    color.get_by_role("button", name="Submit").click()
    wait_for_status(page, "completed")
    assert page.inner_text("#answer") == "all done"
    assert "after your decision" in page.inner_text("#tools")
    ran = redis.Redis.from_url(redis_url).lrange(f"{prefix}:test:counted:{label}", 0, -1)
    assert ran == [b"repo-b"]  # the approved call ran once, with the arguments edited in the page
    page.close()


def test_a_browser_answers_an_mcp_servers_request_for_input_after_a_reload(web, browser, scenario, scripted_llm):
    """An MCP tool asks for input while the turn runs (docs/architecture.md, Pausing for a person: MCP
    elicitation): the page shows a form built from the requested schema, again after a reload; what is typed
    there reaches the MCP server (tests/support/mcp_servers/elicit_server.py) and the turn completes."""
    key, marker = scenario(Script(Reply.tool_calls([("mcp_elicit__order_pen", {"purpose": "notes"})]),
                                  Reply.text("pen ordered")))  # fmt: skip
    page = browser.new_page()
    page.goto(web + "/?agent=elicit")
    page.fill("#text", f"{marker} order a pen")
    page.click("#send")
    wait_for_status(page, "input requested: waiting for you")
    page.reload()  # the page reads the open request again from the pending route
    wait_for_status(page, "input requested: waiting for you")
    form = page.locator(".pending[data-request]")
    assert form.count() == 1 and "Which pen for notes?" in form.inner_text()
    assert form.locator('select[name="colour"] option').all_inner_texts() == ["red", "green", "blue"]
    form.locator('select[name="colour"]').select_option("green")
    form.get_by_role("button", name="Accept").click()  # width is required: the relay refuses, the form stays
    page.wait_for_function("""document.getElementById('status').textContent.includes("'width' is a required property")""")
    form.locator('input[name="width"]').fill("4")
    form.locator('input[name="bold"]').check()
    form.locator('input[name="note"]').fill("felt tip")
    form.get_by_role("button", name="Accept").click()
    wait_for_status(page, "completed")
    assert page.locator(".pending").count() == 0 and page.inner_text("#answer") == "pen ordered"
    assert "input answered: accept" in page.inner_text("#tools")
    tool = [m for m in scripted_llm.requests_for(key)[-1].messages if m.get("role") == "tool"]
    assert tool[0]["content"] == 'accepted {"colour":"green","width":4,"bold":true,"note":"felt tip"}'
    turn = f"{web}/turns/{saved_turn(page)['turnId']}"
    late = httpx.post(f"{turn}/inputs/nosuch", json={"action": "decline"})
    assert late.status_code == 409 and late.json()["error"]["kind"] == "NoPendingCallError", late.text
    bad = httpx.post(f"{turn}/inputs/nosuch", json={"action": "maybe"})
    assert bad.status_code == 422 and bad.json()["error"]["fields"] == {"field": "action"}, bad.text
    page.close()


def test_a_reloaded_page_whose_turn_is_over_or_gone_says_so_and_can_send_again(
        web, browser, scenario, redis_url, prefix):
    """A stored turn the relay answers 204 for (over, nothing left) ends in ``ended``; one it answers 404 for
    (unknown) or 410 for (its events trimmed) in ``lost``, forgotten, and so across reloads; Send is enabled."""
    _, marker = scenario(Script(Reply.text("ok")))
    turn_id = start(web, f"{marker} hi")
    last = int(sse_messages(httpx.get(f"{web}/turns/{turn_id}/events?after=0", timeout=30).text)[0][-1]["id"])
    page = browser.new_page()
    page.goto(web + "/")
    store_turn(page, turn_id, last)  # its terminal event never rendered: EventSource gets a 204
    page.reload()
    wait_for_status(page, "ended", timeout=30_000)
    assert page.is_enabled("#send") and page.is_disabled("#cancel")
    redis.Redis.from_url(redis_url).delete(Keys(prefix).turn_log(turn_id))
    for lost, why in ((f"gone-{uuid.uuid4().hex}", "never submitted, or expired"), (turn_id, "no longer in the replay")):
        store_turn(page, lost, 1)
        page.reload()
        wait_for_status(page, "lost", timeout=30_000)
        for _ in range(2):
            assert page.is_enabled("#send") and page.is_disabled("#cancel")
            assert page.inner_text("#answer") == "partial"
            assert "turn lost" in page.inner_text("#tools") and why in page.inner_text("#tools")
            assert "turnId" not in saved_turn(page)
            page.reload()
            wait_for_status(page, "lost", timeout=30_000)
    page.close()


class RestartableRedis:
    """A private redis-server with an append-only file in a directory of its own, restarted on the same port."""

    def __init__(self, aof_dir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.aof_dir = aof_dir
        self.proc: ManagedProcess | None = None

    def start(self, persistent: bool = True) -> None:
        LOGS.mkdir(parents=True, exist_ok=True)
        self.proc, _ = start_redis_server(self.port, log_path=LOGS / f"web-outage-redis-{self.port}.log",
                                          aof_dir=self.aof_dir if persistent else None)

    def stop(self) -> None:
        """SIGTERM: Redis writes its append-only file out, then exits."""
        assert self.proc is not None
        self.proc.stop()

    def restart(self, *, persistent: bool, down: float) -> None:
        """Stop, stay down ``down`` seconds, start again: from the AOF (``persistent``, every key back), or
        empty, as a Redis without persistence comes back."""
        self.stop()
        time.sleep(down)
        self.start(persistent)


@dataclass
class OutageRig:
    redis: RestartableRedis
    prefix: str
    web: str
    relay_log: Path


def in_thread(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine in a thread of its own: the sync Playwright API keeps an event loop running in this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


@pytest.fixture(scope="module")
def outage_rig(scripted_llm, tmp_path_factory):
    """A Redis (AOF), a turn worker, a tool worker and a relay of their own: these tests restart that Redis."""
    server = RestartableRedis(tmp_path_factory.mktemp("web-aof"))
    server.start()
    prefix = f"webout{uuid.uuid4().hex[:6]}"
    relay_log = LOGS / f"web-outage-{prefix}.log"
    env = worker_env(server.url, prefix, scripted_llm.base_url)
    procs = start_workers(APP, env, ["turns", "tools"], prefix, log_dir=LOGS)
    try:
        in_thread(wait_for_workers(server.url, prefix, len(procs)))
        with relay(server.url, prefix, relay_log) as base:
            yield OutageRig(server, prefix, base, relay_log)
    finally:
        for proc in procs:
            proc.stop()
        server.stop()


def slow_answer(scenario, answer: str) -> str:
    """The prompt of a turn streaming ``answer`` two characters every 0.1 s."""
    _, marker = scenario(Script(Reply.text(answer, chunk_size=2, delay=0.1)))
    return f"{marker} talk"


def test_the_relay_ends_a_stream_cleanly_when_redis_stops_and_answers_503_until_it_is_back(outage_rig, scenario):
    answer = "an answer still streaming while Redis is down " * 3
    turn_id = start(outage_rig.web, slow_answer(scenario, answer))
    seqs = []
    with httpx.stream("GET", f"{outage_rig.web}/turns/{turn_id}/events?after=0", timeout=30) as stream:
        for message in sse_messages_of(stream):
            seqs.append(int(message["id"]))
            if len(seqs) == 5:
                outage_rig.redis.stop()
    # the loop ended without httpx.RemoteProtocolError: the relay closed the stream properly
    assert seqs == list(range(1, len(seqs) + 1)) and len(seqs) >= 5
    try:
        down = httpx.get(f"{outage_rig.web}/turns/{turn_id}/events", headers={"Last-Event-ID": str(seqs[-1])})
    finally:
        outage_rig.redis.start()  # from its AOF
    assert down.status_code == 503 and down.headers["retry-after"] == "1", down.text
    assert down.json()["error"]["kind"] == "TransportError"
    assert "127.0.0.1" not in down.text and "Redis" not in down.text, down.text  # no address for browsers
    rest = httpx.get(f"{outage_rig.web}/turns/{turn_id}/events", headers={"Last-Event-ID": str(seqs[-1])},
                     timeout=60)
    messages = sse_messages(rest.text)[0]
    assert [int(m["id"]) for m in messages] == list(range(seqs[-1] + 1, seqs[-1] + 1 + len(messages)))
    assert '"turn.completed"' in messages[-1]["data"]
    log = outage_rig.relay_log.read_text()
    assert f"turn {turn_id}: event stream ended after seq" in log and "response already started" not in log


def sse_messages_of(stream: httpx.Response) -> Iterator[dict[str, str]]:
    """The messages of a streamed SSE response, as they arrive."""
    block: list[str] = []
    for text in stream.iter_lines():
        if text:
            block.append(text)
            continue
        messages, _ = sse_messages("\n".join(block))
        block = []
        yield from messages


def test_a_browser_resumes_across_a_redis_restart_without_a_reload(outage_rig, browser, scenario):
    """Redis restarted mid-stream, from its AOF: the page reconnects (the relay answers 503 meanwhile, and
    EventSource gives up on it) and finishes the turn, every event once and in order."""
    answer = "an answer that keeps streaming while Redis restarts " * 3
    page = browser.new_page()
    page.goto(outage_rig.web + "/")
    page.fill("#text", slow_answer(scenario, answer))
    page.click("#send")
    page.wait_for_function("window.renderedSeqs.length >= 10")
    outage_rig.redis.restart(persistent=True, down=3.0)  # longer than EventSource's retry: it meets a 503
    wait_for_status(page, "completed")
    seqs = rendered(page)
    assert seqs == list(range(1, len(seqs) + 1))  # no gap, no duplicate across the outage
    assert page.inner_text("#answer") == answer and page.is_enabled("#send")
    refused = [line for line in outage_rig.relay_log.read_text().splitlines()
               if f"/turns/{saved_turn(page)['turnId']}/events" in line and " 503 " in line]
    assert refused  # the outage outlasted EventSource's own retry: the page's reconnection loop resumed it
    assert "response already started" not in outage_rig.relay_log.read_text()
    page.close()


def test_a_browser_says_a_turn_lost_to_an_empty_redis_and_sends_again(outage_rig, browser, scenario):
    """Redis restarted without its data mid-stream: the page says the turn was lost, forgets it and sends
    again, also after a reload. Runs last: it leaves the rig's Redis without persistence."""
    page = browser.new_page()
    page.goto(outage_rig.web + "/")
    page.fill("#text", slow_answer(scenario, "an answer Redis forgets " * 10))
    page.click("#send")
    page.wait_for_function("window.renderedSeqs.length >= 5")
    outage_rig.redis.restart(persistent=False, down=1.0)
    wait_for_status(page, "lost")
    assert "turn lost" in page.inner_text("#tools") and "turnId" not in saved_turn(page)
    page.reload()
    wait_for_status(page, "lost", timeout=10_000)
    assert page.is_enabled("#send") and page.is_disabled("#cancel")
    in_thread(wait_for_workers(outage_rig.redis.url, outage_rig.prefix, 2))  # registered again in the new Redis
    _, marker = scenario(Script(Reply.text("sent again")))
    page.fill("#text", f"{marker} again")
    page.click("#send")
    wait_for_status(page, "completed")
    assert page.inner_text("#answer") == "sent again"
    page.close()
