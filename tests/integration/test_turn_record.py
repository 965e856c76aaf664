"""The turn record's scripts against a real Redis and real workers."""

from __future__ import annotations

import time

import pytest

from smith_client import SmithClient
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.messages import UserMessage
from smith_client.turns import fingerprint
from smith_worker.testing import Reply, Script

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("workers")]


async def test_a_tool_turn_survives_a_flushed_script_cache(client: SmithClient, scenario):
    """SCRIPT FLUSH (as after a Redis restart) between turns: EVALSHA gets NOSCRIPT, scripts reload, turns run."""
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 1, "b": 2})]), Reply.text("3")))
    await client.redis.script_flush()
    answer = await client.send(f"{marker} add", conversation_id=f"conv-{key}", timeout=30)
    assert answer.content == "3"
    key, marker = scenario(Script(Reply.tool_calls([("add", {"a": 2, "b": 2})]), Reply.text("4")))
    handle = await client.submit(f"{marker} add", conversation_id=f"conv-{key}")
    await client.redis.script_flush()  # while the turn runs: its pipelines repair themselves
    assert (await handle.result(timeout=30)).content == "4"


async def test_the_conversation_statuses_hash_holds_unfinished_turns_only(client: SmithClient, scenario):
    key, marker = scenario(Script(Reply.text("slow", delay=0.5), Reply.text("next")))
    conv = f"conv-{key}"
    first = await client.submit(f"{marker} one", conversation_id=conv)
    second = await client.submit(f"{marker} two", conversation_id=conv)
    statuses = await client.redis.hgetall(client.keys.conversation_statuses(conv))
    assert set(statuses) == {first.turn_id.encode(), second.turn_id.encode()}
    assert set(statuses.values()) <= {b"queued", b"running"}
    assert 0 < await client.redis.ttl(client.keys.conversation_statuses(conv)) <= client.keys.history_ttl
    await first.result(timeout=30)
    await second.result(timeout=30)
    assert await client.redis.hgetall(client.keys.conversation_statuses(conv)) == {}
    assert await client.redis.lrange(client.keys.conversation_turns(conv), 0, -1) == []


async def test_a_turn_submitted_by_the_previous_client_version_still_runs(client: SmithClient, scenario):
    """The previous client wrote the state hash and the FIFO but no statuses hash, then enqueued run_turn."""
    key, marker = scenario(Script(Reply.text("old client ok")))
    job = TurnJob(turn_id=f"old-{key}", conversation_id=f"conv-{key}", agent="default",
                  message=UserMessage(content=f"{marker} hi"), submitted_at=time.time())
    keys = client.keys
    await client.redis.hset(keys.turn_state(job.turn_id), mapping={
        "status": "queued", "fingerprint": fingerprint(job), "conversation_id": job.conversation_id,
        "agent": job.agent, "created_at": time.time(), "attempt": 0, "job": job.model_dump_json()})
    await client.redis.rpush(keys.conversation_turns(job.conversation_id), job.turn_id)
    await client.redis.enqueue_job(RUN_TURN, job.model_dump(mode="json"), _job_id=keys.turn_job_id(job.turn_id),
                                   _queue_name=keys.turns_queue)
    assert (await client.turn(job.turn_id).result(timeout=30)).content == "old client ok"


async def test_the_client_writes_the_lifetimes_it_is_given(redis_url, prefix, scenario):
    """``turn_ttl``/``history_ttl`` (SMITH_TURN_TTL / SMITH_HISTORY_TTL) reach the keys the client writes.

    See docs/architecture.md, Keys.
    """
    key, marker = scenario(Script(Reply.text("ttl ok")))
    async with SmithClient.from_url(redis_url, prefix=prefix, turn_ttl=600, history_ttl=900) as client:
        handle = await client.submit(f"{marker} hi", conversation_id=f"conv-{key}")
        assert 0 < await client.redis.ttl(client.keys.turn_state(handle.turn_id)) <= 600
        assert 600 < await client.redis.ttl(client.keys.conversation_statuses(f"conv-{key}")) <= 900
        await handle.result(timeout=30)


def test_lifetimes_come_from_the_environment_and_bad_values_are_refused(monkeypatch):
    from smith_client import SmithClient
    from smith_client.errors import ConfigurationError
    from smith_client.keys import DEFAULT_HISTORY_TTL
    from smith_client.settings import ClientSettings

    def lifetimes(env):
        settings = ClientSettings.from_env(env)
        return settings.turn_ttl, settings.history_ttl

    assert lifetimes({}) == (24 * 3600, DEFAULT_HISTORY_TTL)
    assert lifetimes({"SMITH_TURN_TTL": "60", "SMITH_HISTORY_TTL": "120"}) == (60, 120)
    monkeypatch.setenv("SMITH_TURN_TTL", "90")
    assert SmithClient(None).keys.turn_ttl == 90 and SmithClient(None, turn_ttl=5).keys.turn_ttl == 5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ConfigurationError, match="SMITH_HISTORY_TTL"):
            lifetimes({"SMITH_HISTORY_TTL": bad})
