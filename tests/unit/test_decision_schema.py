"""A person's edited arguments (``approve(..., arguments=)``) and an elicitation's answer (``respond``) are
checked against their JSON Schema by the ``jsonschema`` library (smith_client/validation.py), under the schema's
``$schema`` dialect (Draft 2020-12 by default): the most relevant error becomes an InvalidRequestError whose
``field`` is the path to the offending value; nothing reaches the decisions hash or the answer list."""

from __future__ import annotations

import fakeredis
import pytest

from smith_client import InvalidRequestError, SmithClient
from smith_client import turn_record as record
from smith_client.events import PendingItem
from smith_client.keys import Keys
from smith_client.sync_client import SyncSmithClient
from smith_client.validation import check_fits_schema

SCHEMA = {
    "type": "object",
    "properties": {
        "target": {"type": "string", "pattern": "^repo-[a-z]+$"},
        "count": {"type": "integer", "minimum": 1, "maximum": 10},
        "mode": {"enum": ["fast", "safe"]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 2}, "uniqueItems": True},
        "where": {
            "oneOf": [
                {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                 "additionalProperties": False},
                {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}, "required": ["url"],
                 "additionalProperties": False},
            ]
        },
    },
    "required": ["target"],
    "additionalProperties": False,
}  # fmt: skip


def refused(value: dict, schema: dict = SCHEMA) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as err:
        check_fits_schema(schema, value, "arguments", "arguments for t do not fit its schema")
    return err.value


@pytest.mark.parametrize(
    ("value", "field", "reason"),
    [
        ({"target": 7}, "arguments.target", "7 is not of type 'string'"),
        ({}, "arguments", "'target' is a required property"),
        ({"target": "repo-a", "extra": 1}, "arguments", "Additional properties are not allowed"),
        ({"target": "repo-a", "mode": "slow"}, "arguments.mode", "'slow' is not one of ['fast', 'safe']"),
        ({"target": "repo-a", "tags": ["ok", 3]}, "arguments.tags[1]", "3 is not of type 'string'"),
        # what the hand-written subset did not check
        ({"target": "repo-a", "count": 0}, "arguments.count", "0 is less than the minimum of 1"),
        ({"target": "repo-a", "count": 11}, "arguments.count", "11 is greater than the maximum of 10"),
        ({"target": "../etc"}, "arguments.target", "'../etc' does not match '^repo-[a-z]+$'"),
        ({"target": "repo-a", "tags": ["ok", "x"]}, "arguments.tags[1]", "'x' is too short"),
        ({"target": "repo-a", "tags": ["ok", "ok"]}, "arguments.tags", "has non-unique elements"),
        ({"target": "repo-a", "where": {"path": 5}}, "arguments.where.path", "5 is not of type 'string'"),
        ({"target": "repo-a", "where": {"path": "a", "url": "b"}}, "arguments.where", "is not valid under any"),
        ({"target": "repo-a", "count": True}, "arguments.count", "True is not of type 'integer'"),
    ],
)
def test_the_most_relevant_error_names_its_path(value, field, reason):
    err = refused(value)
    assert err.fields["field"] == field
    assert err.message.startswith(f"arguments for t do not fit its schema: {field}: ")
    assert reason in err.message


def test_values_that_fit_pass_and_format_is_only_an_annotation():
    fits = {"target": "repo-a", "count": 10, "mode": "safe", "tags": ["ab", "cd"], "where": {"url": "not a uri"}}
    check_fits_schema(SCHEMA, fits, "arguments", "x")
    check_fits_schema({}, {"anything": [1, {"goes": None}]}, "arguments", "x")  # a tool without parameters


def test_the_schemas_own_dialect_is_used():
    """Draft 4's boolean exclusiveMaximum: under that dialect 5 is refused (under 2020-12 the schema would be
    invalid and check nothing)."""
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": True}}}  # fmt: skip
    err = refused({"n": 5}, draft4)
    assert err.fields["field"] == "arguments.n" and "greater than or equal to the maximum of 5" in err.message
    check_fits_schema(draft4, {"n": 4.5}, "arguments", "x")
    local_ref = {"$defs": {"small": {"type": "integer", "maximum": 3}}, "properties": {"n": {"$ref": "#/$defs/small"}}}
    assert refused({"n": 4}, local_ref).fields["field"] == "arguments.n"


def test_a_schema_that_cannot_be_checked_checks_nothing():
    check_fits_schema({"type": "no-such-type"}, {"n": 1}, "arguments", "x")  # invalid schema
    check_fits_schema({"properties": {"n": {"pattern": "("}}}, {"n": "a"}, "arguments", "x")  # invalid regex
    remote = {"properties": {"n": {"$ref": "https://example.invalid/schema.json"}}}
    check_fits_schema(remote, {"n": 1}, "arguments", "x")  # never fetched


def test_a_long_value_is_not_quoted_whole():
    err = refused({"target": "x" * 10_000})
    assert len(err.message) < 400


# ---- through both clients, on a paused turn and an open elicitation (fakeredis) ----

TURN, CALL, REQUEST = "t1", "call_1", "r1"


def seed(redis, keys: Keys) -> None:
    """A turn paused on CALL (a tool with SCHEMA) with an open elicitation REQUEST (its schema: a contact)."""
    redis.hset(keys.turn_state(TURN), mapping={record.STATUS: record.PAUSED, record.ATTEMPT: 1,
                                               record.CONVERSATION_ID: "c1"})  # fmt: skip
    item = PendingItem(call_id=CALL, tool="guarded", kind="approval", parameters=SCHEMA, step=1)
    redis.hset(keys.turn_pending(TURN), CALL, item.model_dump_json())
    contact = {"type": "object", "properties": {"email": {"type": "string", "pattern": "@"},
                                                "age": {"type": "integer", "minimum": 0}}, "required": ["email"]}  # fmt: skip
    ask = PendingItem(call_id=CALL, tool="t", kind="input", parameters=contact, request_id=REQUEST, message="who?")
    redis.hset(keys.turn_inputs(TURN), REQUEST, ask.model_dump_json())


def test_both_clients_refuse_unfit_arguments_and_content_naming_the_path():
    server = fakeredis.FakeServer()
    sync_redis = fakeredis.FakeRedis(server=server)
    keys = Keys("t")
    seed(sync_redis, keys)
    sync_client = SyncSmithClient(sync_redis, prefix="t")
    for call, field in [
        (lambda: sync_client.approve(TURN, CALL, {"target": "repo-a", "count": 0}), "arguments.count"),
        (lambda: sync_client.approve(TURN, CALL, {"target": "nope"}), "arguments.target"),
        (lambda: sync_client.respond(TURN, REQUEST, "accept", {"email": "no-at-sign"}), "content.email"),
        (lambda: sync_client.respond(TURN, REQUEST, "accept", {"email": "a@b", "age": -1}), "content.age"),
    ]:
        with pytest.raises(InvalidRequestError) as err:
            call()
        assert err.value.fields["field"] == field, err.value
    assert sync_redis.hlen(keys.turn_decisions(TURN)) == 0  # nothing was decided
    assert sync_redis.hexists(keys.turn_inputs(TURN), REQUEST)  # nor answered


async def test_the_async_client_refuses_alike():
    server = fakeredis.FakeServer()
    seed(fakeredis.FakeRedis(server=server), Keys("t"))
    client = SmithClient(fakeredis.FakeAsyncRedis(server=server), prefix="t")
    with pytest.raises(InvalidRequestError) as err:
        await client.approve(TURN, CALL, {"target": "repo-a", "where": {"path": "a", "url": "b"}})
    assert err.value.fields["field"] == "arguments.where"
    with pytest.raises(InvalidRequestError) as err:
        await client.respond(TURN, REQUEST, "accept", {"age": 3})
    assert err.value.fields["field"] == "content" and "'email' is a required property" in err.value.message
