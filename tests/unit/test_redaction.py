"""Redaction rules (docs/architecture.md, Hooks and logs), pinned."""

from __future__ import annotations

import json

import pytest

from smith_worker.ops.redaction import REDACTED, redact_body, redact_headers, redact_json, redact_text


@pytest.mark.parametrize(
    "name",
    ["Authorization", "authorization", "AUTHORIZATION", "X-Api-Key", "x-api-key", "Api-Key", "Cookie", "set-cookie", "Set-Cookie"],
)
def test_sensitive_headers_are_redacted_case_insensitively(name):
    assert redact_headers({name: "secret", "Accept": "text/event-stream"}) == {
        name: REDACTED,
        "Accept": "text/event-stream",
    }


@pytest.mark.parametrize("name", ["X-Request-Id", "Content-Type", "Authorization-Hint", "X-Api-Key-Id", "Proxy-Authorization"])
def test_other_headers_are_kept(name):
    assert redact_headers({name: "value"}) == {name: "value"}


def test_redact_headers_accepts_pairs_and_does_not_modify_input():
    headers = {"Authorization": "Bearer sk-1"}
    assert redact_headers([("Cookie", "a=b"), ("Accept", "*/*")]) == {"Cookie": REDACTED, "Accept": "*/*"}
    redact_headers(headers)
    assert headers == {"Authorization": "Bearer sk-1"}


@pytest.mark.parametrize(
    "key",
    [
        "api_key", "apiKey", "api-key", "APIKEY", "openai_api_key", "x-api-key",
        "access_token", "accessToken", "access-token", "ACCESS_TOKEN",
        "bearer", "Bearer_token", "password", "db_password", "Password",
    ],
)
def test_sensitive_json_keys_are_redacted(key):
    assert redact_json({key: "s3cret", "model": "m"}) == {key: REDACTED, "model": "m"}


@pytest.mark.parametrize("key", ["api", "key", "token", "refresh_token", "pass", "apik", "secret"])
def test_other_json_keys_are_kept(key):
    assert redact_json({key: "v"}) == {key: "v"}


def test_redact_json_walks_nested_values_and_replaces_whole_values():
    value = {
        "messages": [{"role": "user", "content": "hi", "meta": {"password": {"nested": 1}}}],
        "tools": [[{"Api-Key": 3}]],
        "n": 1,
        "ok": None,
    }
    assert redact_json(value) == {
        "messages": [{"role": "user", "content": "hi", "meta": {"password": REDACTED}}],
        "tools": [[{"Api-Key": REDACTED}]],
        "n": 1,
        "ok": None,
    }
    assert value["messages"][0]["meta"]["password"] == {"nested": 1}


def test_redact_json_keeps_scalars():
    assert redact_json("password") == "password"
    assert redact_json(3) == 3


def test_redact_text_replaces_known_secrets_longest_first():
    text = "key=sk-abc123 again sk-abc123 prefix sk-abc"
    assert redact_text(text, ["sk-abc", "sk-abc123", "", None]) == f"key={REDACTED} again {REDACTED} prefix {REDACTED}"
    assert redact_text("nothing here", []) == "nothing here"


def test_redact_body_json_and_text():
    body = json.dumps({"model": "m", "api_key": "x", "messages": [{"content": "my sk-zz"}]}).encode()
    out = json.loads(redact_body(body, ["sk-zz"]))
    assert out == {"model": "m", "api_key": REDACTED, "messages": [{"content": f"my {REDACTED}"}]}
    assert redact_body("not json sk-zz", ["sk-zz"]) == f"not json {REDACTED}"
