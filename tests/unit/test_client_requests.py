"""Both clients refuse unknown turn options, calls after ``close()``, decisions of the wrong type or size and
unknown turns with typed errors."""

from __future__ import annotations

import fakeredis
from pydantic import BaseModel
import pytest

from smith_client import InvalidRequestError, SmithClient, TransportError, TurnNotFoundError
from smith_client.sync_client import SyncSmithClient
from smith_client.validation import MAX_MESSAGE_BYTES


async def test_an_unknown_option_is_an_invalid_request_naming_it():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    for call in (lambda: client.send("hi", conversation_id="c1", bogus=1),
                 lambda: client.submit("hi", conversation_id="c1", bogus=1)):
        with pytest.raises(InvalidRequestError, match="bogus") as err:
            await call()
        assert err.value.fields["field"] == "bogus"
    with pytest.raises(InvalidRequestError, match="bogus"):
        async for _ in client.stream("hi", conversation_id="c1", bogus=1):
            pass


async def test_a_bad_id_is_quoted_cut_short_in_the_error():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    with pytest.raises(InvalidRequestError) as err:
        await client.send("hi", conversation_id="x" * 5000)
    assert err.value.fields["field"] == "conversation_id"
    assert "got 'xxxx" in err.value.message and len(err.value.message) < 200  # not the 5000 characters


def test_an_unknown_option_is_refused_by_the_sync_client_too():
    redis = fakeredis.FakeRedis()
    client = SyncSmithClient(redis, prefix="t")
    with pytest.raises(InvalidRequestError, match="bogus") as err:
        client.send("hi", conversation_id="c1", bogus=1)
    assert err.value.fields["field"] == "bogus"
    assert redis.keys("*") == []  # refused before anything was enqueued


def test_the_sync_client_refuses_calls_after_close():
    client = SyncSmithClient(fakeredis.FakeRedis(), prefix="t")
    assert client.history("c1") == []
    client.close()
    with pytest.raises(TransportError, match="closed"):
        client.history("c1")
    with pytest.raises(TransportError, match="closed"):
        client.send("hi", conversation_id="c1", timeout=1)


async def test_the_async_client_refuses_calls_after_close():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    assert await client.history("c1") == []
    await client.aclose()
    with pytest.raises(TransportError, match="closed"):
        await client.history("c1")
    with pytest.raises(TransportError, match="closed"):
        await client.send("hi", conversation_id="c1", timeout=1)


BIG = "x" * (MAX_MESSAGE_BYTES + 1)  # one byte over the cap on a user message


def decision_calls(client):
    """Decisions of the wrong type or size, each with the field its error names (none reaches Redis)."""
    return [
        (lambda: client.approve("t1", "c1", [1, 2]), "arguments"),
        (lambda: client.approve("t1", "c1", '{"name":"x"}'), "arguments"),
        (lambda: client.approve("t1", "c1", {1: "not a JSON object key"}), "arguments"),
        (lambda: client.approve("t1", "c1", {"name": BIG}), "arguments"),
        (lambda: client.reject("t1", "c1", message=None), "message"),
        (lambda: client.reject("t1", "c1", message=5), "message"),
        (lambda: client.reject("t1", "c1", message=BIG), "message"),
        (lambda: client.submit_tool_result("t1", "c1", "ok", is_error="yes"), "is_error"),
        (lambda: client.submit_tool_result("t1", "c1", BIG), "result"),
        (lambda: client.submit_tool_result("t1", "c1", {"text": BIG}), "result"),
        (lambda: client.respond("t1", "r1", "accept", {"text": BIG}), "content"),
    ]


async def test_a_decision_of_the_wrong_type_or_too_large_is_an_invalid_request_naming_the_field():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    for call, field in decision_calls(client):
        with pytest.raises(InvalidRequestError) as err:
            await call()
        assert err.value.fields["field"] == field, err.value


def test_the_sync_client_checks_decisions_alike():
    client = SyncSmithClient(fakeredis.FakeRedis(), prefix="t")
    for call, field in decision_calls(client):
        with pytest.raises(InvalidRequestError) as err:
            call()
        assert err.value.fields["field"] == field, err.value


async def test_an_unknown_turn_is_turn_not_found_for_pending_and_every_decision():
    client = SmithClient(fakeredis.FakeAsyncRedis(), prefix="t")
    calls = (
        client.pending("nosuchturn"),
        client.approve("nosuchturn", "c1"),
        client.reject("nosuchturn", "c1"),
        client.submit_tool_result("nosuchturn", "c1", "x"),
        client.respond("nosuchturn", "r1", "decline"),
    )
    for call in calls:
        with pytest.raises(TurnNotFoundError) as err:
            await call
        assert err.value.turn_id == "nosuchturn" and "no turn nosuchturn under prefix 't'" in err.value.message
    sync_client = SyncSmithClient(fakeredis.FakeRedis(), prefix="t")
    with pytest.raises(TurnNotFoundError):
        sync_client.pending("nosuchturn")


# ---- values a caller may get wrong in new ways: refused typed, before anything is enqueued ----


class _City(BaseModel):
    name: str


@pytest.mark.parametrize("bad", [dict, "City", _City(name="a"), 3])
async def test_a_bad_output_type_is_refused_before_the_turn_is_sent(bad):
    redis = fakeredis.FakeAsyncRedis()
    client = SmithClient(redis, prefix="t")
    with pytest.raises(InvalidRequestError) as err:
        await client.send("hi", conversation_id="c1", output_type=bad)
    assert err.value.fields["field"] == "output_type"
    assert await redis.keys("*") == []  # nothing was enqueued: no answer is lost
    with pytest.raises(InvalidRequestError):
        await client.turn("turn-1").result(timeout=1, output_type=bad)
    sync = SyncSmithClient(fakeredis.FakeRedis(), prefix="t")
    with pytest.raises(InvalidRequestError):
        sync.send("hi", conversation_id="c1", output_type=bad)


@pytest.mark.parametrize(("options", "field"), [
    ({"max_tokens": 10**30}, "max_tokens"),  # past a Redis integer: it would not even serialize into the job
    ({"context": {"score": float("nan")}}, "context"),
    ({"context": {"scores": [1.0, float("inf")]}}, "context"),
])
async def test_numbers_json_or_redis_cannot_hold_are_refused_naming_the_field(options, field):
    redis = fakeredis.FakeAsyncRedis()
    with pytest.raises(InvalidRequestError) as err:
        await SmithClient(redis, prefix="t").submit("hi", conversation_id="c1", **options)
    assert err.value.fields["field"] == field
    assert await redis.keys("*") == []


def test_a_context_in_another_key_order_is_the_same_request():
    from smith_client.validation import check_context

    # the record is written with sorted keys, so the turn's fingerprint does not depend on the caller's order
    assert check_context({"user_id": "a", "api": "s"}) == check_context({"api": "s", "user_id": "a"})


async def test_the_status_of_a_turn_redis_does_not_have_is_missing_as_cancel_says():
    redis = fakeredis.FakeAsyncRedis()
    assert await SmithClient(redis, prefix="t").turn("nosuch").status() == "missing"
    assert SyncSmithClient(fakeredis.FakeRedis(), prefix="t").turn("nosuch").status() == "missing"
