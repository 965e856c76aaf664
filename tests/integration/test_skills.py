"""Skills end to end: real turn and tool workers serving tests/support/skills_app.py, a real Redis,
the scripted chat-completions server recording every request.

The module runs its own workers under its own prefix, because one test needs the next turn to run on a
second turn worker: turn worker A runs the first turn, then stops; turn worker B runs the next ones.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from types import SimpleNamespace

import orjson
import pytest

from smith_client import SmithClient
from smith_client.errors import InvalidRequestError, UnknownSkillError
from smith_client.hygiene import conversation_keys
from smith_client.keys import DEFAULT_HISTORY_TTL
from smith_worker.testing import RecordedRequest, Reply, Script, start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]

APP = "tests.support.skills_app:app"
RESEARCH = ("# Skill: research\nCite every source you use.\nPrefer primary sources.\n\n"
            '# Skill Context: research\n{"sources":["arxiv","acl"],"max_results":3}')
PDF = "# Skill: pdf-tools\n# PDF tools\n\nAlways say which page a quote comes from."
NOTES = "# Skill: notes\nKeep notes short."


@pytest.fixture(scope="module")
async def skill_workers(redis_url, scripted_llm):
    """Turn worker A and a tool worker for the skills app, under a prefix of their own."""
    prefix = f"sk{uuid.uuid4().hex[:6]}"
    env = worker_env(redis_url, prefix, scripted_llm.base_url)
    procs = start_workers(APP, env, ["turns", "tools"], prefix, log_dir=LOGS)
    ns = SimpleNamespace(prefix=prefix, env=env, procs=procs)
    try:
        await wait_for_workers(redis_url, prefix, 2)
        yield ns
    finally:
        for proc in ns.procs:
            proc.stop()


@pytest.fixture
async def sclient(redis_url, skill_workers):
    async with SmithClient.from_url(redis_url, prefix=skill_workers.prefix) as c:
        yield c


def per_turn(**scripts: Script):
    """A scenario handler answering each turn of one conversation with its own script, chosen by
    the last word of the turn's user message."""

    def handler(request: RecordedRequest) -> Reply:
        text = [m for m in request.messages if m.get("role") == "user"][-1]["content"]
        return scripts[text.split()[-1]](request)

    return handler


def system_of(request: RecordedRequest) -> str:
    first = request.messages[0]
    assert first["role"] == "system"
    return first["content"]


def tools_of(request: RecordedRequest) -> dict[str, str]:
    return {t["function"]["name"]: t["function"]["description"] for t in request.body.get("tools", [])}


def results_of(events) -> dict[str, dict]:
    return {e.data["name"]: e.data for e in events if e.type == "tool.result"}


async def test_skills_shape_requests_run_tools_and_follow_the_conversation_to_another_worker(
        sclient, skill_workers, scenario, scripted_llm, redis_url):
    conv = f"skills-{uuid.uuid4().hex[:8]}"
    for name in ("research", "pdf-tools", "notes", "research"):  # activating an active skill keeps its place
        await sclient.activate_skill(conv, name)
    assert await sclient.active_skills(conv) == ["research", "pdf-tools", "notes"]
    key, marker = scenario(per_turn(
        t1=Script(Reply.tool_calls([("notes__lookup", {"key": "k1"}), ("mcp_lab__echo", {"text": "from a skill"})]),
                  Reply.text("noted")),
        t2=Script(Reply.text("still here")),
        t3=Script(Reply.tool_calls([("notes__lookup", {"key": "k3"})]), Reply.text("looked up")),
    ))
    expected = f"You are a test agent.\n\n{RESEARCH}\n\n{PDF}\n\n{NOTES}"

    # turn 1, on turn worker A: the composed prompt, the prefixed tools, the skill's tools run on the tool worker
    events = [e async for e in sclient.stream(f"{marker} t1", conversation_id=conv, timeout=60)]
    assert events[-1].type == "turn.completed", events[-1]
    first = scripted_llm.requests_for(key)[0]
    assert system_of(first) == expected
    offered = list(tools_of(first))
    assert tools_of(first)["notes__lookup"] == "Look a note up in the notes skill."  # shadows the app's own
    assert offered.count("notes__lookup") == 1 and offered[-1].startswith("mcp_lab__")  # MCP tools of skills last
    results = results_of(events)
    note = orjson.loads(results["notes__lookup"]["content"])
    assert note["note"] == "skill note for k1" and ":tools:" in note["worker"]
    assert note["budget"] == 7.0  # a plain callable skill tool gets the agent's default_tool_timeout
    assert results["mcp_lab__echo"]["content"] == "from a skill" and ":tools:" in results["mcp_lab__echo"]["worker"]

    # turn 2, on turn worker B only (started before A stops, so a turn worker is always alive): the same skills
    (worker_b,) = start_workers(APP, skill_workers.env, ["turns"], f"{skill_workers.prefix}-b", log_dir=LOGS)
    skill_workers.procs.append(worker_b)
    await wait_for_workers(redis_url, skill_workers.prefix, 3)
    skill_workers.procs[0].stop()
    events = [e async for e in sclient.stream(f"{marker} t2", conversation_id=conv, timeout=60)]
    assert events[-1].final_message().content == "still here"
    ran_on = (await sclient.redis.hget(sclient.keys.turn_state(events[-1].turn_id), "worker")).decode()
    assert ran_on.split(":")[1] == str(worker_b.pid)
    second = scripted_llm.requests_for(key)[2]
    assert system_of(second) == expected and list(tools_of(second)) == offered

    # deactivation removes the skill's section and tools and restores the app tool it shadowed
    await sclient.deactivate_skill(conv, "notes")
    await sclient.deactivate_skill(conv, "notes")  # inactive: nothing happens
    assert await sclient.active_skills(conv) == ["research", "pdf-tools"]
    events = [e async for e in sclient.stream(f"{marker} t3", conversation_id=conv, timeout=60)]
    assert events[-1].type == "turn.completed"
    third = scripted_llm.requests_for(key)[3]
    assert system_of(third) == f"You are a test agent.\n\n{RESEARCH}\n\n{PDF}"
    assert tools_of(third) == {"notes__lookup": "The app's own lookup (shadowed while skill notes is active)."}
    assert results_of(events)["notes__lookup"]["content"] == "app lookup: k3"

    # the activation record lives as long as the history and is listed with the conversation's keys
    info = {k.key: k.ttl for k in await conversation_keys(sclient.redis, sclient.keys, conv)}
    assert 0 < info[sclient.keys.conversation_skills(conv)] <= DEFAULT_HISTORY_TTL
    assert info[sclient.keys.conversation_skills(conv)] > DEFAULT_HISTORY_TTL - 120


async def test_an_activation_during_a_turn_takes_effect_at_its_next_step(sclient, scenario, scripted_llm):
    conv = f"skills-mid-{uuid.uuid4().hex[:8]}"
    loop = asyncio.get_running_loop()

    def step0_then_activate(request: RecordedRequest) -> Reply:
        if request.step == 0:  # while the turn runs: activate through the public client, from the server's thread
            asyncio.run_coroutine_threadsafe(sclient.activate_skill(conv, "pdf-tools"), loop).result(10)
            return Reply.tool_calls([("notes__lookup", {"key": "x"})])
        return Reply.text("done")

    key, marker = scenario(step0_then_activate)
    await sclient.activate_skill(conv, "research")  # also a default of the agent: it counts once, first
    reply = await sclient.send(f"{marker} go", conversation_id=conv, agent="researcher", timeout=60)
    assert reply.content == "done"
    step0, step1 = scripted_llm.requests_for(key)
    assert system_of(step0) == f"You research.\n\n{RESEARCH}"  # the agent's default skill
    assert system_of(step1) == f"You research.\n\n{RESEARCH}\n\n{PDF}"
    assert await sclient.active_skills(conv) == ["research", "pdf-tools"]  # the conversation's own only


async def test_unknown_and_invalid_skill_names_change_nothing(sclient):
    conv = f"skills-bad-{uuid.uuid4().hex[:8]}"
    await sclient.activate_skill(conv, "pdf-tools")
    with pytest.raises(UnknownSkillError) as caught:
        await sclient.activate_skill(conv, "pdf_tools")  # the normalized form is not a name
    assert caught.value.skill_name == "pdf_tools"
    assert caught.value.known == ["notes", "pdf-tools", "research"]
    for bad in ("", "two\nlines", 3, "x" * 201):
        with pytest.raises(InvalidRequestError):
            await sclient.activate_skill(conv, bad)
    with pytest.raises(InvalidRequestError):
        await sclient.active_skills("bad id!")
    assert await sclient.active_skills(conv) == ["pdf-tools"]


async def test_with_no_worker_registered_an_activation_warns_and_is_accepted(redis_url, caplog):
    async with SmithClient.from_url(redis_url, prefix=f"noworkers{uuid.uuid4().hex[:6]}") as lonely:
        with caplog.at_level(logging.WARNING, logger="agent_smith"):
            await lonely.activate_skill("c1", "anything")
        assert "no turn worker is registered" in caplog.text and "'anything'" in caplog.text
        assert await lonely.active_skills("c1") == ["anything"]
        await lonely.deactivate_skill("c1", "anything")
        assert await lonely.active_skills("c1") == []
        assert await lonely.redis.exists(lonely.keys.conversation_skills("c1")) == 0  # the last one deletes the key


def test_the_blocking_client_manages_skills_like_the_async_one(redis_url, skill_workers):
    from smith_client import SyncSmithClient

    conv = f"conv-sync-{uuid.uuid4().hex[:8]}"
    with SyncSmithClient.from_url(redis_url, prefix=skill_workers.prefix) as client:
        client.activate_skill(conv, "notes")
        client.activate_skill(conv, "pdf-tools")
        client.activate_skill(conv, "notes")  # already active: keeps its place
        assert client.active_skills(conv) == ["notes", "pdf-tools"]
        client.deactivate_skill(conv, "notes")
        assert client.active_skills(conv) == ["pdf-tools"]
        with pytest.raises(UnknownSkillError):
            client.activate_skill(conv, "no-such-skill")
        with pytest.raises(InvalidRequestError):
            client.active_skills("bad id")
