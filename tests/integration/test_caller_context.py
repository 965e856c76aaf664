"""The caller context end to end (docs/architecture.md, Caller context).

A fleet of its own (two turn workers for the kill -9 test, one tool worker, own prefix) serves
tests/support/context_app.py, whose ``context_type`` has a ``SecretStr`` field. The tools answer
digests of the context they saw, so the model's requests can be searched for the context's values.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import uuid

import pytest

from smith_client import (
    ConflictError,
    ContextValidationError,
    InvalidRequestError,
    SmithClient,
    SyncSmithClient,
    TurnPausedError,
)
from smith_worker.local.processes import ManagedProcess
from smith_worker.testing import Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS
from tests.integration.test_crash_recovery import worker_pid_running
from tests.integration.test_secrets import _all_values
from tests.support.context_app import digest

pytestmark = [pytest.mark.integration]

APP = "tests.support.context_app:app"


class ContextFleet:
    """Workers of one prefix serving the context app; ``ensure`` tops the turn workers up after a kill."""

    def __init__(self, redis_url: str, llm_url: str) -> None:
        self.redis_url = redis_url
        self.prefix = f"ctx{uuid.uuid4().hex[:6]}"
        self.env = worker_env(redis_url, self.prefix, llm_url)
        self.procs: dict[str, list[ManagedProcess]] = {"turns": [], "tools": []}
        self.ended: list[ManagedProcess] = []  # killed ones too: their logs are searched

    async def ensure(self, turns: int = 2, tools: int = 1) -> None:
        for queue, wanted in (("turns", turns), ("tools", tools)):
            self.ended += [p for p in self.procs[queue] if not p.alive()]
            self.procs[queue] = [p for p in self.procs[queue] if p.alive()]
            missing = wanted - len(self.procs[queue])
            if missing > 0:
                tag = f"{self.prefix}-{len(self.ended) + len(self.procs[queue])}"
                self.procs[queue] += start_workers(APP, self.env, [queue] * missing, tag, log_dir=LOGS)
        await wait_for_workers(self.redis_url, self.prefix, turns + tools)

    def logs(self) -> str:
        procs = self.ended + self.procs["turns"] + self.procs["tools"]
        return "\n".join(p.log_path.read_text(errors="replace") for p in procs if p.log_path and p.log_path.exists())

    def stop(self) -> None:
        for proc in self.procs["turns"] + self.procs["tools"]:
            proc.stop()


@pytest.fixture(scope="module")
async def fleet(redis_url, scripted_llm):
    fleet = ContextFleet(redis_url, scripted_llm.base_url)
    yield fleet
    fleet.stop()


@pytest.fixture
async def ctx_client(fleet):
    await fleet.ensure()
    async with SmithClient.from_url(fleet.redis_url, prefix=fleet.prefix) as client:
        yield client


def caller(tenant: str = "acme") -> tuple[dict[str, str], str, str]:
    """A caller context of fresh values: ``(context, user id, secret token)``."""
    user, token = f"user-{uuid.uuid4().hex}", f"tok-{uuid.uuid4().hex}"
    return {"user_id": user, "tenant": tenant, "api_token": token}, user, token


def seen(user: str, token: str, agent: str) -> dict[str, str]:
    """What a tool answers (as structured JSON) when it saw this caller's typed context."""
    return {"type": "Caller", "user": digest(user), "token": digest(token), "agent": agent}


def results(events: list, name: str) -> list[dict]:
    """The ``tool.result`` data of the calls of tool ``name``, with their content decoded as ``structured``."""
    found = [dict(e.data) for e in events if e.type == "tool.result" and e.data["name"] == name]
    for data in found:
        data["structured"] = None if data["is_error"] else _decoded(data["content"])
    return found


def _decoded(content: str):
    try:
        return json.loads(content)
    except ValueError:
        return content


def assert_not_sent(scripted_llm, key: str, *values: str) -> None:
    requests = scripted_llm.requests_for(key)
    assert requests
    for request in requests:
        assert not [value for value in values if value.encode() in request.raw_body]


async def assert_secret_kept_in_record_only(client: SmithClient, fleet: ContextFleet, turn_id: str, token: str,
                                            events: list) -> None:
    """The secret is in the turn's context record and in no other Redis value, event or log line."""
    record = client.keys.turn_context(turn_id)
    assert token.encode() in await client.redis.get(record)
    assert 0 < await client.redis.ttl(record) <= client.keys.turn_ttl
    lines = (await _all_values(client.redis)).splitlines()  # one line per key, its values repr'd
    stored = "\n".join(line for line in lines if not line.startswith(repr(record.encode())))
    assert len(stored) < len("\n".join(lines))  # the record was there, and only it is left out
    assert turn_id in stored and token not in stored
    assert not [e for e in events if token in e.model_dump_json()]
    assert token not in fleet.logs()


async def test_a_tool_on_a_tool_worker_gets_the_typed_context_the_model_never_sees(ctx_client, fleet, scripted_llm,
                                                                                   scenario):
    context, user, token = caller()
    key, marker = scenario(Script(Reply.tool_calls([("whose", {}), ("leaky", {})]), Reply.text("done")))
    events = [e async for e in ctx_client.stream(f"{marker} who?", conversation_id=f"conv-{key}", agent="ctx",
                                                 context=context)]
    assert events[-1].type == "turn.completed"
    (whose,), (leaky,) = results(events, "whose"), results(events, "leaky")
    assert whose["worker"] and ":tools:" in whose["worker"]  # ran on the tool worker
    assert whose["structured"] == seen(user, token, "ctx")
    assert leaky["content"] == "the token is <redacted>"  # a tool's outcome never carries the secret
    assert_not_sent(scripted_llm, key, user, token)
    logs = fleet.logs()
    assert "leaky tool: token=<redacted>" in logs  # the tool worker's log line, redacted
    assert f"hook saw user digest {digest(user)} token=<redacted>" in logs  # a two-parameter hook got it too
    await assert_secret_kept_in_record_only(ctx_client, fleet, events[0].turn_id, token, events)


async def test_a_skill_tool_and_a_needs_approval_callable_see_the_context(ctx_client, scenario):
    context, user, token = caller(tenant="trusted")
    conv = f"conv-{uuid.uuid4().hex[:8]}"
    await ctx_client.activate_skill(conv, "ctxskill")
    key, marker = scenario(Script(Reply.tool_calls([("ctxskill__skill_whose", {}), ("gated_whose", {})]),
                                  Reply.text("done")))
    events = [e async for e in ctx_client.stream(f"{marker} who?", conversation_id=conv, agent="ctx",
                                                 context=context)]
    assert events[-1].type == "turn.completed"  # trusted tenant: the callable let the call through
    assert results(events, "ctxskill__skill_whose")[0]["structured"] == seen(user, token, "ctx")
    assert results(events, "gated_whose")[0]["structured"] == seen(user, token, "ctx")
    other, other_user, other_token = caller(tenant="other")
    _, marker = scenario(Script(Reply.tool_calls([("gated_whose", {})]), Reply.text("done")))
    with pytest.raises(TurnPausedError) as paused:  # another tenant: the same callable asks for a person
        await ctx_client.send(f"{marker} who?", conversation_id=f"conv-{uuid.uuid4().hex[:8]}", agent="ctx",
                              context=other, timeout=60)
    record = ctx_client.keys.turn_context(paused.value.turn_id)  # kept for the pause's life, as the state
    assert await ctx_client.redis.ttl(record) > ctx_client.keys.turn_ttl
    handle = ctx_client.turn(paused.value.turn_id)
    await ctx_client.approve(handle.turn_id, paused.value.pending[0]["call_id"])
    assert (await handle.result(timeout=60)).content == "done"  # the resumed attempt's tool saw the context
    events = [e async for e in handle.events(timeout=60)]
    assert results(events, "gated_whose")[0]["structured"] == seen(other_user, other_token, "ctx")
    assert 0 < await ctx_client.redis.ttl(record) <= ctx_client.keys.turn_ttl  # the turn's end gave turn_ttl back


async def test_a_sub_agents_tools_see_the_context(ctx_client, fleet, scripted_llm, scenario):
    context, user, token = caller()
    child_key, child = scenario(Script(Reply.tool_calls([("whose", {})]), Reply.text("child done")))
    key, lead = scenario(Script(
        Reply.tool_calls([("whose", {}), ("ctx_helper", {"task": f"{child} find out"})]), Reply.text("lead done"),
    ))
    handle = await ctx_client.submit(f"{lead} plan", conversation_id=f"conv-{key}", agent="ctx_lead", context=context)
    assert (await handle.result(timeout=60)).content == "lead done"
    events = [e async for e in handle.events(timeout=60)]
    by_agent = {tuple(e.agent_path): json.loads(e.data["content"]) for e in events
                if e.type == "tool.result" and e.data["name"] == "whose"}
    assert by_agent[("ctx_lead",)] == seen(user, token, "ctx_lead")
    assert by_agent[("ctx_lead", "ctx_helper")] == seen(user, token, "ctx_helper")
    assert_not_sent(scripted_llm, key, user, token)
    assert_not_sent(scripted_llm, child_key, user, token)
    await assert_secret_kept_in_record_only(ctx_client, fleet, handle.turn_id, token, events)


async def test_kill_9_mid_turn_the_resumed_attempts_tools_see_the_same_context(ctx_client, fleet, scenario):
    context, user, token = caller()
    gate = threading.Event()
    key, marker = scenario(Script(
        Reply.tool_calls([("whose", {})]),
        Reply.tool_calls([("whose_slowly", {"seconds": 0})], gate=gate),  # the first attempt dies in this stream
        Reply.text("done"),
    ))
    handle = await ctx_client.submit(f"{marker} who?", conversation_id=f"conv-{key}", agent="ctx", context=context)
    pid = await worker_pid_running(ctx_client, handle.turn_id)
    async for event in handle.events(timeout=60):  # the first attempt's tool ran; its second model call streams
        if event.type == "tool.result":
            break
    os.kill(pid, signal.SIGKILL)
    gate.set()
    assert (await handle.result(timeout=90)).content == "done"
    events = [e async for e in handle.events(timeout=60)]
    resumed = [e.seq for e in events if e.type == "turn.resumed"]
    assert resumed
    (before,), (after,) = results(events, "whose"), results(events, "whose_slowly")
    after_seq = next(e.seq for e in events if e.type == "tool.result" and e.data["name"] == "whose_slowly")
    assert after_seq > resumed[0]  # run by the resumed attempt
    assert before["structured"] == after["structured"] == seen(user, token, "ctx")
    await fleet.ensure()
    await assert_secret_kept_in_record_only(ctx_client, fleet, handle.turn_id, token, events)


async def test_a_context_that_does_not_fit_the_type_fails_the_turn_naming_the_field(ctx_client, scripted_llm,
                                                                                    scenario):
    key, marker = scenario(Script(Reply.text("never")))
    with pytest.raises(ContextValidationError) as failed:
        await ctx_client.send(f"{marker} hi", conversation_id=f"conv-{key}", agent="ctx",
                              context={"user_id": "u1"}, timeout=60)
    assert failed.value.field == "api_token" and "api_token" in failed.value.message
    assert scripted_llm.attempts(key) == 0
    with pytest.raises(ContextValidationError) as failed:  # a type the field refuses; the value is not quoted
        await ctx_client.send(f"{marker} hi", conversation_id=f"conv-{key}", agent="ctx",
                              context={"user_id": ["not-a-string-42"], "api_token": "t0k3n-value"}, timeout=60)
    assert failed.value.field == "user_id"
    assert "not-a-string-42" not in repr(failed.value) and "t0k3n-value" not in repr(failed.value)


async def test_a_context_over_the_cap_is_refused_at_send(fleet, scenario):
    _, marker = scenario(Script(Reply.text("never")))
    async with SmithClient.from_url(fleet.redis_url, prefix=fleet.prefix, context_max_bytes=100) as client:
        with pytest.raises(InvalidRequestError) as refused:
            await client.send(f"{marker} hi", conversation_id="conv-big", agent="ctx",
                              context={"user_id": "u" * 100, "api_token": "t"})
        assert refused.value.field == "context"
        assert not await client.redis.exists(client.keys.conversation_turns("conv-big"))


async def test_the_same_turn_id_with_another_context_is_a_conflict(ctx_client, scenario):
    gate = threading.Event()
    key, marker = scenario(Script(Reply.text("ok", gate=gate)))
    context, _, _ = caller()
    turn_id = f"turn-{key}"
    handle = await ctx_client.submit(f"{marker} hi", conversation_id=f"conv-{key}", agent="ctx", context=context,
                                     turn_id=turn_id)
    try:
        again = await ctx_client.submit(f"{marker} hi", conversation_id=f"conv-{key}", agent="ctx", context=context,
                                        turn_id=turn_id)
        assert again.turn_id == turn_id  # the same request attaches
        with pytest.raises(ConflictError):
            await ctx_client.submit(f"{marker} hi", conversation_id=f"conv-{key}", agent="ctx",
                                    context={**context, "user_id": "someone-else"}, turn_id=turn_id)
    finally:
        gate.set()
    assert (await handle.result(timeout=60)).content == "ok"


async def test_the_blocking_client_sends_a_context_too(fleet, scenario):
    await fleet.ensure()
    context, user, token = caller()
    _, marker = scenario(Script(Reply.tool_calls([("whose", {})]), Reply.text("done")))

    def blocking() -> list:
        with SyncSmithClient.from_url(fleet.redis_url, prefix=fleet.prefix) as client:
            with pytest.raises(InvalidRequestError):  # refused before Redis, as by the async client
                client.submit("hi", conversation_id="conv-x", agent="ctx", context=["not", "an", "object"])
            handle = client.submit(f"{marker} who?", conversation_id=f"conv-{uuid.uuid4().hex[:8]}", agent="ctx",
                                   context=context)
            assert handle.result(timeout=60).content == "done"
            return list(handle.events(timeout=60))

    events = await asyncio.to_thread(blocking)
    assert results(events, "whose")[0]["structured"] == seen(user, token, "ctx")
