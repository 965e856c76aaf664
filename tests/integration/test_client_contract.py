"""The client's side of the contract: validation before enqueue, agent registry, replay, the CLI."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from arq.constants import job_key_prefix

from smith_client import InvalidRequestError, SmithClient, UnknownAgentError
from smith_client.jobs import TurnJob
from smith_client.registry import live_agents, live_workers
from smith_worker.testing import Reply, Script
from tests.support.queues import queued_turn_jobs, turn_queue_keys

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def queued_turns(client: SmithClient) -> int:
    return await queued_turn_jobs(client.redis, client.keys)




async def test_smith_ask_stopped_by_sigterm_cancels_its_turn(client, redis_url, prefix, scenario):
    _, marker = scenario(Reply.stall())  # the model never answers: the turn runs until something ends it
    conversation = f"conv-sigterm-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()", "ask", "--redis-url", redis_url,
        "--prefix", prefix, "--conversation", conversation, f"{marker} hi",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    statuses = client.keys.conversation_statuses(conversation)
    async with asyncio.timeout(60):  # its turn is running
        while await client.redis.hget(statuses, await first_turn(client, conversation)) != b"running":
            await asyncio.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 143 and b"Traceback" not in err, err
    async with asyncio.timeout(30):  # the turn ends (cancelled) instead of running on with nobody waiting
        while await client.redis.hlen(statuses):
            await asyncio.sleep(0.1)


async def first_turn(client, conversation: str) -> str:
    """The id of the conversation's first turn ('' until it is submitted)."""
    ids = await client.redis.lrange(client.keys.conversation_turns(conversation), 0, 0)
    return ids[0].decode() if ids else ""


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"text": ""}, "text"),
        ({"text": "   \n"}, "text"),
        ({"text": 42}, "text"),
        ({"text": None}, "text"),
        ({"text": "x" * 1_000_001}, "text"),
        ({"conversation_id": ""}, "conversation_id"),
        ({"conversation_id": "has space"}, "conversation_id"),
        ({"conversation_id": 7}, "conversation_id"),
        ({"agent": ""}, "agent"),
        ({"turn_id": "bad/id"}, "turn_id"),
        ({"sampling": "hot"}, "sampling"),
    ],
)
async def test_malformed_requests_raise_before_enqueue(client, kwargs, field):
    args = {"conversation_id": "conv-valid"} | kwargs
    text = args.pop("text", "hello")
    before = await queued_turns(client)
    with pytest.raises(InvalidRequestError) as err:
        await client.send(text, **args)
    assert err.value.field == field
    with pytest.raises(InvalidRequestError):
        async for _ in client.stream(text, **args):
            pass
    assert await queued_turns(client) == before


async def test_unknown_agent_is_rejected_before_enqueue(client):
    before = await queued_turns(client)
    with pytest.raises(UnknownAgentError) as err:
        await client.send("hi", conversation_id="conv-unknown", agent="nobody", turn_id="turn-unknown-agent")
    assert err.value.agent == "nobody" and "default" in err.value.known
    assert not await client.redis.exists(job_key_prefix + client.keys.turn_job_id("turn-unknown-agent"))
    assert await queued_turns(client) == before


async def test_the_submit_script_refuses_an_unserved_agent_without_reading_the_registrations(client, redis_url):
    """A client that never sent reads no registration: the submit script refuses the agent (one EVALSHA)."""
    async with SmithClient.from_url(redis_url, prefix=client.keys.prefix) as fresh:
        seen: list[str] = []  # commands sent by clients (not run by scripts)
        async with fresh.redis.monitor() as monitor:

            async def collect() -> None:
                while "end-of-refusal" not in (command := await monitor.next_command())["command"]:
                    if command["client_type"] != "lua":
                        seen.append(command["command"])

            collecting = asyncio.create_task(collect())
            with pytest.raises(UnknownAgentError) as err:
                await fresh.submit("hi", conversation_id="conv-unserved", agent="nobody", turn_id="turn-unserved")
            await fresh.redis.echo("end-of-refusal")
            await asyncio.wait_for(collecting, 10)
    assert err.value.agent == "nobody" and "default" in err.value.known
    assert err.value.known == sorted(err.value.known)
    registry_reads = [c for c in seen if c.upper().startswith("MGET") or client.keys.workers + " " in c + " "]
    assert not registry_reads and sum("turn-unserved" in c for c in seen) == 1, seen  # the submit script only
    assert not await client.redis.exists(client.keys.turn_state("turn-unserved"))


async def test_with_no_turn_worker_live_a_turn_is_enqueued_with_a_warning(redis_url, caplog):
    async with SmithClient.from_url(redis_url, prefix=f"noworkers{uuid.uuid4().hex[:6]}") as lonely:
        with caplog.at_level(logging.WARNING, logger="agent_smith"):
            handle = await lonely.submit("hi", conversation_id="c1", agent="anyone")
            for i in range(3):  # a web app sending on while its workers are down: warned once, not per turn
                await lonely.submit(f"hi {i}", conversation_id=f"c{i + 2}", agent="anyone")
        assert caplog.text.count("no turn worker is registered") == 1
        assert (await handle.state())["status"] == "queued"
        assert await queued_turns(lonely) == 4


async def test_workers_register_agents_and_tools(client):
    from tests.support.app import app as served_app

    assert await live_agents(client.redis, client.keys) == set(served_app.agents)
    assert {"default", "plain", "limited"} <= set(served_app.agents)
    workers = await live_workers(client.redis, client.keys)
    assert {w["queue"] for w in workers} == {"turns", "tools"}
    tools = next(w for w in workers if w["queue"] == "tools")["tools"]
    assert {"add", "sleepy", "boom"} <= set(tools)
    for worker in workers:  # registrations expire unless refreshed
        assert 0 < await client.redis.ttl(client.keys.worker(worker["id"])) <= 15


async def test_without_any_worker_the_turn_is_enqueued_and_waits(redis_url):
    async with SmithClient.from_url(redis_url, prefix="nobody-serves-this") as lonely:
        assert await live_agents(lonely.redis, lonely.keys) is None
        from smith_client.errors import SmithTimeoutError

        with pytest.raises(SmithTimeoutError):
            await lonely.send("anyone?", conversation_id="conv-wait", agent="any", timeout=0.5)
        assert await queued_turns(lonely) == 1
        await lonely.redis.delete(*turn_queue_keys(lonely.keys))  # the test owns these keys


async def test_a_finished_turn_replays_from_the_log(client, scenario):
    _, marker = scenario(Script(Reply.text("replay me")))
    live = [e async for e in client.stream(f"{marker} hi", conversation_id="conv-replay", agent="plain")]
    replayed = await client.events.read(live[0].turn_id)
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in live]
    assert [e.seq for e in await client.events.read(live[0].turn_id, after_seq=3)] == [e.seq for e in live[3:]]
    assert 0 < await client.redis.ttl(client.keys.turn_log(live[0].turn_id)) <= 24 * 3600


def smith_ask(redis_url: str, prefix: str, question: str, agent: str = "default") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()",
         "--redis-url", redis_url, "--prefix", prefix, "--timeout", "60", "--agent", agent, "ask", question],
        capture_output=True, text=True, timeout=120,
    )


def test_smith_ask_cli_streams_tokens_and_tool_status(redis_url, prefix, scenario):
    _, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]), Reply.text("It is 5.")))
    proc = smith_ask(redis_url, prefix, f"{marker} 2+3?")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "It is 5."
    assert '[tool call] add({"a":2,"b":3})' in proc.stderr
    assert "[tool result] add -> 5 (worker " in proc.stderr and ":tools:" in proc.stderr


async def tenant_of_its_turn(client: SmithClient, conversation: str, held: threading.Event) -> str | None:
    """The tenant stored with the conversation's first turn (sent by a command), read while ``held`` (the scripted
    reply's gate) holds the turn running; then the reply goes on."""
    try:
        async with asyncio.timeout(60):
            while not (turn_id := await first_turn(client, conversation)):
                await asyncio.sleep(0.05)
        job = await client.redis.hget(client.keys.turn_state(turn_id), "job")
        return TurnJob.model_validate_json(job).tenant
    finally:
        held.set()


async def test_smith_ask_sends_its_turn_for_the_tenant_given(client, redis_url, prefix, scenario):
    """``smith ask --tenant NAME`` sends its turn as ``send(..., tenant=NAME)`` does (docs/architecture.md,
    Tenants)."""
    held = threading.Event()
    _, marker = scenario(Reply.text("For acme.", gate=held))
    conversation = f"conv-tenant-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()", "ask", "--redis-url", redis_url,
        "--prefix", prefix, "--conversation", conversation, "--tenant", "acme-cli", "--timeout", "60", f"{marker} hi",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    assert await tenant_of_its_turn(client, conversation, held) == "acme-cli"
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0 and out == b"For acme.\n", err


def test_smith_ask_prints_the_answer_of_an_agent_that_does_not_stream(redis_url, prefix, scenario, scripted_llm):
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 3})]), Reply.text("Five, unstreamed.")))
    proc = smith_ask(redis_url, prefix, f"{marker} 2+3?", agent="unstreamed")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "Five, unstreamed.\n"
    assert "[tool result] add -> 5" in proc.stderr
    assert not any(r.stream for r in scripted_llm.requests_for(key))  # the model was really called unstreamed



async def test_smith_ask_gives_up_at_its_timeout_in_one_line_and_cancels_the_turn(client, redis_url, prefix, scenario):
    _, marker = scenario(Reply.stall())  # the model never answers
    conversation = f"conv-stalled-{uuid.uuid4().hex[:8]}"
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-c", "from smith_client.cli import smith_main; smith_main()", "ask", "--redis-url", redis_url,
         "--prefix", prefix, "--conversation", conversation, "--timeout", "2", f"{marker} hi"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert re.fullmatch(r"smith: SmithTimeoutError: turn \S+ did not finish in 2 s; it was cancelled\n", proc.stderr)
    async with asyncio.timeout(30):  # the turn ends (cancelled) instead of running on with nobody waiting
        while await client.redis.hlen(client.keys.conversation_statuses(conversation)):
            await asyncio.sleep(0.1)

@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"text": "lone \ud800 surrogate"}, "text"),
        ({"sampling": {"temperature": "hot"}}, "sampling"),
        ({"sampling": {"temperature": -5}}, "sampling"),
        ({"sampling": {"temperature": float("nan")}}, "sampling"),
        ({"sampling": {"foo": 1}}, "sampling"),
        ({"sampling": {"extra": {"model": "other"}}}, "sampling"),
        ({"sampling": {"top_p": object()}}, "sampling"),
        ({"stream": "yes"}, "stream"),
        ({"timeout": "x"}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"multitask": "sometimes"}, "multitask"),
        ({"conversation_id": "abc\n"}, "conversation_id"),
    ],
)
async def test_more_bad_input_is_refused_before_enqueue(client, kwargs, field):
    args = {"conversation_id": "conv-valid2"} | kwargs
    text = args.pop("text", "hello")
    before = await queued_turns(client)
    with pytest.raises(InvalidRequestError) as err:
        await client.send(text, **args)
    assert err.value.field == field
    assert await queued_turns(client) == before
    assert await client.history("conv-valid2") == []  # nothing stored either


async def test_unknown_and_finished_turns_do_not_hang(client, scenario):
    from smith_client.errors import TurnNotFoundError

    with pytest.raises(TurnNotFoundError):
        async for _ in client.turn("never-submitted").events():
            pass
    with pytest.raises(TurnNotFoundError):
        await client.turn("never-submitted").result(timeout=30)
    _, marker = scenario(Script(Reply.text("done")))
    handle = await client.submit(f"{marker} x", conversation_id="conv-finished", agent="plain")
    await handle.result(timeout=30)
    last = (await client.events.read(handle.turn_id))[-1].seq
    assert [e async for e in handle.events(after_seq=last)] == []  # returns at once
    assert [e async for e in handle.events(after_seq=10**6)] == []
    for bad in (-5, 2.5, "2", True):
        with pytest.raises(InvalidRequestError):
            async for _ in handle.events(after_seq=bad):
                pass
    with pytest.raises(InvalidRequestError):
        await handle.cancel(reason=None)


async def test_redis_down_is_a_typed_transport_error():
    from smith_client.errors import TransportError
    from smith_worker.local.processes import free_port

    async with SmithClient.from_url(f"redis://127.0.0.1:{free_port()}/0") as down:
        with pytest.raises(TransportError) as err:
            await down.send("hi", conversation_id="c")
        assert err.value.operation == "redis"
        with pytest.raises(TransportError):
            await down.turn("t").status()
