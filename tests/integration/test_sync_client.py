"""SyncSmithClient: the blocking twin, in a WSGI (Flask) view and shared by threads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest
from flask import Flask, Response, request

from smith_client import ConflictError, InvalidRequestError, SyncSmithClient, TurnCancelledError, TurnPausedError
from smith_worker.testing import Reply, Script
from tests.conftest import ROOT
from tests.support.queues import turn_queue_keys, waiting_key

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


@pytest.fixture
def sync_client(redis_url, prefix):
    with SyncSmithClient.from_url(redis_url, prefix=prefix) as client:
        yield client


def flask_app(client: SyncSmithClient) -> Flask:
    """A WSGI app as a user writes one: a JSON endpoint on send(), an NDJSON stream on stream()."""
    app = Flask(__name__)

    @app.post("/ask/<conversation>")
    def ask(conversation: str):
        message = client.send(request.json["text"], conversation_id=conversation, timeout=60)
        return {"answer": message.content}

    @app.post("/stream/<conversation>")
    def stream(conversation: str):
        events = client.stream(request.json["text"], conversation_id=conversation, timeout=60)
        return Response((e.model_dump_json() + "\n" for e in events), mimetype="application/x-ndjson")

    return app


def tool_script(answer: str) -> Script:
    return Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]), Reply.text(answer))


def test_a_flask_view_runs_a_tool_turn_with_send_and_stream(sync_client, scenario):
    web = flask_app(sync_client).test_client()
    _, marker = scenario(tool_script("It is 5."))
    reply = web.post(f"/ask/conv-{uuid.uuid4().hex[:8]}", json={"text": f"{marker} 2+3?"})
    assert reply.status_code == 200 and reply.json == {"answer": "It is 5."}

    _, marker = scenario(tool_script("Five."))
    streamed = web.post(f"/stream/conv-{uuid.uuid4().hex[:8]}", json={"text": f"{marker} 2+3?"})
    events = [orjson.loads(line) for line in streamed.data.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "turn.started" and types[-1] == "turn.completed"
    result = next(e for e in events if e["type"] == "tool.result")
    assert result["data"]["content"] == "5" and result["data"]["worker"]  # ran on the tool worker
    assert "".join(e["data"]["text"] for e in events if e["type"] == "token") == "Five."
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))


def test_eight_threads_share_one_client_for_forty_turns(sync_client, scenario):
    turns = []
    for i in range(40):
        key, marker = scenario(Script(Reply.tool_calls([("add", {"a": i, "b": 1000})]), Reply.text(f"answer-{i}")))
        turns.append((i, f"{marker} turn {i}"))
    threads_seen = set()

    def run(turn):
        i, text = turn
        threads_seen.add(threading.get_ident())
        return i, list(sync_client.stream(text, conversation_id=f"conv-threads-{i}-{uuid.uuid4().hex[:6]}", timeout=120))

    with ThreadPoolExecutor(max_workers=8) as pool:
        outcomes = list(pool.map(run, turns))
    assert len(threads_seen) > 1
    for i, events in outcomes:
        assert len({e.turn_id for e in events}) == 1  # no event of another turn mixed in
        assert [e.seq for e in events] == list(range(1, len(events) + 1))  # none missing or repeated
        assert events[-1].type == "turn.completed" and events[-1].final_message().content == f"answer-{i}"
        assert next(e for e in events if e.type == "tool.result").data["content"] == str(i + 1000)


def test_handles_history_and_errors_match_the_async_client(sync_client, scenario):
    _, marker = scenario(Script(Reply.text("background answer")))
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    handle = sync_client.submit(f"{marker} hi", conversation_id=conversation, agent="plain", turn_id=f"t-{uuid.uuid4().hex}")
    assert handle.result(timeout=60).content == "background answer"
    assert handle.status() == "completed"
    replay = list(handle.events(after_seq=1))
    assert replay[0].seq == 2 and replay[-1].type == "turn.completed"
    assert [m.role for m in sync_client.history(conversation)] == ["user", "assistant"]
    with pytest.raises(ConflictError):  # same turn id, different request
        sync_client.submit("other text", conversation_id=conversation, agent="plain", turn_id=handle.turn_id)
    with pytest.raises(InvalidRequestError):
        sync_client.send("", conversation_id=conversation)


def test_cancel_from_a_sync_handle(sync_client, scenario):
    _, marker = scenario(Script(Reply.text("a slow answer, cancelled before it ends " * 3, chunk_size=1, delay=0.1)))
    handle = sync_client.submit(f"{marker} hi", conversation_id=f"conv-{uuid.uuid4().hex[:8]}", agent="plain")
    events = handle.events(timeout=60)
    first = next(e for e in events if e.type == "token")
    assert handle.cancel() == "cancelling"
    rest = list(events)  # the same iterator, resumed after the cancel
    assert rest[-1].type == "turn.cancelled" and [e.seq for e in rest] == list(range(first.seq + 1, rest[-1].seq + 1))
    with pytest.raises(TurnCancelledError):
        handle.result(timeout=60)


def test_the_blocking_submit_enqueues_the_turn_job_in_its_script_once_per_turn_id(sync_client):
    from arq.jobs import deserialize_job

    from smith_client.jobs import TurnJob
    from smith_client.keys import Keys
    from smith_client.messages import UserMessage
    from smith_client.serialization import job_deserializer
    from smith_client.turns import submit_turn

    keys = Keys(f"unserved{uuid.uuid4().hex[:8]}")  # a prefix no worker serves: the job stays queued
    job = TurnJob(turn_id=uuid.uuid4().hex, conversation_id="c1", agent="default", message=UserMessage(content="hi"))
    job_id = keys.turn_job_id(job.turn_id)
    try:
        assert sync_client.runner.run(submit_turn(keys, job, "enqueue")).outcome == "new"
        record = sync_client.redis.get(Keys.arq_job(job_id))
        again = sync_client.runner.run(submit_turn(keys, job, "enqueue"))  # attaches; the enqueue is a no-op
        assert (again.outcome, again.status) == ("attach", "queued")
        assert sync_client.redis.get(Keys.arq_job(job_id)) == record  # like arq: one job per id
        queued = deserialize_job(record, deserializer=job_deserializer)
        assert (queued.function, list(queued.args), queued.kwargs) == ("run_turn", [job.model_dump(mode="json")], {})
        assert sync_client.redis.zscore(waiting_key(keys), job_id) is not None
        assert sync_client.redis.llen(Keys.wake_list(keys.turns_queue)) >= 1  # the workers were woken
        assert 0 < sync_client.redis.pttl(Keys.arq_job(job_id)) <= 86_400_000
    finally:
        stale = [Keys.arq_job(job_id), Keys.wake_list(keys.turns_queue), keys.turn_state(job.turn_id)]
        sync_client.redis.delete(*stale, *turn_queue_keys(keys), keys.conversation_turns("c1"),
                                 keys.conversation_statuses("c1"))


def test_redis_down_is_a_typed_transport_error_for_the_blocking_client_too():
    from smith_client.errors import TransportError
    from smith_worker.local.processes import free_port

    with SyncSmithClient.from_url(f"redis://127.0.0.1:{free_port()}/0") as down:
        with pytest.raises(TransportError) as err:
            down.send("hi", conversation_id="c")
        assert err.value.operation == "redis"
        with pytest.raises(TransportError):
            list(down.follow("t"))


# A process that leaves a stream unfinished: argv is the Redis URL, the question, the mode and the prefix.
LEFT_STREAM = '''
import asyncio, gc, sys, threading
import redis
from smith_client import SmithClient, SyncSmithClient

url, text, mode = sys.argv[1:4]
prefix = sys.argv[4]
if mode.startswith("async"):
    async def main():
        client = SmithClient.from_url(url, prefix=prefix)
        events = client.stream(text, conversation_id="conv-left-" + mode, agent="plain", timeout=60)
        async for event in events:
            if event.type == "token":
                break
        await client.aclose()  # the iterator is let go after its client is closed
    asyncio.run(main())
    sys.exit()
client = SyncSmithClient(redis.Redis.from_url(url, client_name="left-stream"), prefix=prefix, owns_redis=True)
events = client.stream(text, conversation_id="conv-left-" + mode, agent="plain", timeout=60)
next(e for e in events if e.type == "token")
if mode == "client-closed-first":
    client.close()  # the iterator goes at interpreter exit, after its client
elif mode == "lock-held-at-exit":  # the pub/sub reader, a daemon thread, stopped by the exit while routing a message
    held = threading.Event()
    threading.Thread(target=lambda: (client.runner.fanout._lock.acquire(), held.set()), daemon=True).start()
    held.wait()
elif mode == "collected-after-close":
    client.close()
    del events
    gc.collect()
    named = [c for c in redis.Redis.from_url(url).client_list() if c["name"] == "left-stream"]
    print(len(named))  # connections the closed client still holds
'''


@pytest.mark.parametrize(
    "mode", ["left-at-exit", "lock-held-at-exit", "client-closed-first", "collected-after-close", "async-closed-first"]
)
def test_a_stream_left_unfinished_prints_nothing_and_keeps_no_connection(redis_url, prefix, scenario, mode):
    _, marker = scenario(Script(Reply.text("a slow answer that is still streaming " * 2, chunk_size=2, delay=0.05)))
    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    left = subprocess.run([sys.executable, "-c", LEFT_STREAM, redis_url, f"{marker} hi", mode, prefix],
                          env=environ, capture_output=True, text=True, timeout=60)  # a hang at exit fails
    assert left.returncode == 0 and left.stderr == "", left.stderr  # no "Exception ignored in: <generator ..."
    assert left.stdout == ("0\n" if mode == "collected-after-close" else "")


def test_an_external_tools_result_posted_to_a_flask_view_resumes_the_turn(sync_client, scenario, redis_url):
    """docs/architecture.md, Pausing for a person: the browser answers an external tool's call through a
    WSGI view calling SyncSmithClient.submit_tool_result; the paused turn resumes and completes."""
    app = Flask(__name__)

    @app.post("/turns/<turn_id>/calls/<call_id>/result")
    def result(turn_id: str, call_id: str):
        decision = sync_client.submit_tool_result(turn_id, call_id, request.json["result"])
        return decision.model_dump()

    key, marker = scenario(Script(Reply.tool_calls([("pick_color", {"hint": "sea"})], ids=["call_pick"]),
                                  Reply.text("teal it is")))
    with pytest.raises(TurnPausedError) as paused:
        sync_client.send(f"{marker} pick", conversation_id=f"conv-{key}", agent="guarded", timeout=60)
    assert [item["call_id"] for item in paused.value.pending] == ["call_pick"]
    reply = app.test_client().post(f"/turns/{paused.value.turn_id}/calls/call_pick/result", json={"result": "teal"})
    assert reply.status_code == 200 and reply.json["action"] == "result"
    assert sync_client.turn(paused.value.turn_id).result(timeout=60).content == "teal it is"
    history = sync_client.history(f"conv-{key}")
    assert [m.content for m in history if m.role == "tool"] == ["teal"]
