"""The caller context's checks (docs/architecture.md, Caller context): the client's validation and size cap, the
worker's typed parsing, hooks, and the redaction of its secrets."""

from __future__ import annotations

import logging

import pytest
from pydantic import BaseModel, SecretStr

from smith_client.errors import ContextValidationError, InvalidRequestError, error_from_payload
from smith_client.settings import ClientSettings
from smith_client.turns import fingerprint
from smith_client.validation import DEFAULT_CONTEXT_MAX_BYTES, build_turn_request, check_context
from smith_worker.hooks import HookContext, current_turn, invoke_hook
from smith_worker.ops.redaction import RedactingFilter, redact_literals, redact_text, secrets_scope
from smith_worker.tool_worker.job import stored_outcome
from smith_worker.tools.caller import NO_CONTEXT, parse_context, secret_values
from smith_worker.tools.function import ToolResult


class Account(BaseModel):
    number: str
    pin: SecretStr


class Caller(BaseModel):
    user_id: str
    api_token: SecretStr
    accounts: list[Account] = []


def test_a_context_is_a_json_object_as_compact_json():
    assert check_context(None) is None
    assert check_context({"user_id": "u1", "n": [1, 2]}) == '{"n":[1,2],"user_id":"u1"}'  # keys sorted


@pytest.mark.parametrize("bad", ["text", ["a"], 3, {1: "int key"}, {"x": object()}])
def test_a_context_that_is_not_a_json_object_is_refused_naming_the_field(bad):
    with pytest.raises(InvalidRequestError) as refused:
        check_context(bad)
    assert refused.value.field == "context"


def test_a_model_instance_is_sent_with_its_secrets_revealed_for_the_record():
    text = check_context(Caller(user_id="u1", api_token=SecretStr("tok-123456")))
    assert '"api_token":"tok-123456"' in text  # the record keeps the value; the worker validates it again


def test_the_size_cap_is_64_kib_by_default_and_a_setting():
    assert DEFAULT_CONTEXT_MAX_BYTES == 64 * 1024 == ClientSettings().context_max_bytes
    assert ClientSettings.from_env({"SMITH_CONTEXT_MAX_BYTES": "100"}).context_max_bytes == 100
    assert check_context({"x": "y" * 1000}, max_bytes=1009) is not None  # {"x":"…"} is 1008 bytes
    with pytest.raises(InvalidRequestError) as refused:
        check_context({"x": "y" * 1000}, max_bytes=1000)
    assert refused.value.field == "context" and "y" * 20 not in refused.value.message
    with pytest.raises(InvalidRequestError):
        check_context({"x": "y" * DEFAULT_CONTEXT_MAX_BYTES})


def test_the_context_stays_out_of_the_job_and_counts_in_the_fingerprint():
    job, multitask, context = build_turn_request("hi", {"conversation_id": "c1", "context": {"token": "s3cr3t-v"}})
    assert multitask == "enqueue" and context == '{"token":"s3cr3t-v"}'
    assert job.has_context and "s3cr3t-v" not in job.model_dump_json()
    other = fingerprint(job, '{"token":"other"}')
    assert fingerprint(job, context) != other and "s3cr3t-v" not in fingerprint(job, context)
    plain, _, none = build_turn_request("hi", {"conversation_id": "c1"})
    assert none is None and not plain.has_context


def test_a_typed_context_is_validated_into_the_model_with_its_secrets_found():
    raw = b'{"user_id":"u1","api_token":"tok-abcdef","accounts":[{"number":"1","pin":"pin-9876"}]}'
    caller = parse_context(raw, Caller)
    assert isinstance(caller.value, Caller) and caller.value.user_id == "u1"
    assert caller.secrets == {"tok-abcdef", "pin-9876"}
    assert "tok-abcdef" not in repr(caller.value)


def test_an_untyped_context_is_the_json_object_and_none_is_none():
    assert parse_context(b'{"a":1}', None).value == {"a": 1}
    assert parse_context(None, None) is NO_CONTEXT


def test_a_context_that_does_not_fit_names_the_field_and_never_quotes_a_value():
    with pytest.raises(ContextValidationError) as failed:
        parse_context(b'{"user_id":"u1","api_token":"tok-abcdef","accounts":[{"number":"1"}]}', Caller)
    assert failed.value.field == "accounts.0.pin"
    assert failed.value.problems == ["accounts.0.pin: Field required"]
    with pytest.raises(ContextValidationError) as failed:
        parse_context(b'{"user_id":{"x":"hidden-value"},"api_token":"tok-abcdef"}', Caller)
    assert failed.value.field == "user_id"
    assert "hidden-value" not in repr(failed.value) and "tok-abcdef" not in repr(failed.value)
    rebuilt = error_from_payload(failed.value.to_payload())  # crosses Redis as itself
    assert isinstance(rebuilt, ContextValidationError) and rebuilt.field == "user_id"


def test_a_missing_record_of_a_turn_sent_with_a_context_is_an_error():
    with pytest.raises(ContextValidationError):
        parse_context(None, None, expected=True)
    with pytest.raises(ContextValidationError) as failed:  # a type with required fields and no context
        parse_context(None, Caller)
    assert failed.value.field in ("user_id", "api_token")


def test_secret_values_walk_models_dicts_and_lists():
    value = {"a": [SecretStr("one-1"), {"b": SecretStr("two-2")}], "c": "plain"}
    assert secret_values(value) == {"one-1", "two-2"}


def test_a_secrets_scope_redacts_log_lines_while_it_is_open():
    record = logging.LogRecord("agent_smith.tool", logging.INFO, __file__, 1, "token=%s", ("scoped-secret-1",), None)
    with secrets_scope({"scoped-secret-1"}):
        assert redact_text("x scoped-secret-1 y") == "x <redacted> y"
        with secrets_scope({"scoped-secret-1"}):  # two turns with one secret
            pass
        RedactingFilter().filter(record)
        assert record.getMessage() == "token=<redacted>"
    assert redact_text("x scoped-secret-1 y") == "x scoped-secret-1 y"
    assert redact_literals("ab-secret-cd", {"secret", ""}) == "ab-<redacted>-cd"


def test_a_tool_outcome_never_carries_the_contexts_secrets():
    result = ToolResult(content='{"t":"tok-abcdef"}', structured={"t": "tok-abcdef", "n": 1})
    outcome = stored_outcome(result, 1000, "w1", frozenset({"tok-abcdef"}))
    assert outcome.content == '{"t":"<redacted>"}' and outcome.structured == {"t": "<redacted>", "n": 1}
    assert stored_outcome(result, 1000, "w1").content == result.content  # no secrets: unchanged


async def test_a_two_parameter_hook_gets_the_turns_context():
    seen: list[object] = []
    token = current_turn.set(HookContext("t1", "c1", "default", {"user": "u1"}))
    try:
        await invoke_hook(lambda message, ctx: seen.append((message, ctx.context)), "m")
        await invoke_hook(seen.append, "one-parameter hook")
    finally:
        current_turn.reset(token)
    await invoke_hook(lambda message, ctx: seen.append(ctx), "outside a turn")
    assert seen == [("m", {"user": "u1"}), "one-parameter hook", None]
