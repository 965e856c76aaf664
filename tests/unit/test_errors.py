"""Typed errors survive the trip through Redis (docs/architecture.md, Errors)."""

import pytest

from smith_client import errors as E


@pytest.mark.parametrize(
    "error",
    [
        E.ParseError("bad json", offset=7),
        E.ToolError("boom", tool_name="t", retryable=True),
        E.McpError("down", server="fs", rpc_code=-32000),
        E.McpProtocolError("bad frame", server="fs"),
        E.TransportError("refused", operation="connect", endpoint_or_server="http://x"),
        E.LlmApiError("429", http_status=429, body_excerpt="slow down"),
        E.SmithTimeoutError("late", operation="tool", budget=1.5),
        E.TurnCancelledError("stop", operation="max_iterations"),
        E.SkillError("no", skill_name="s"),
        E.InvalidRequestError("empty", field="text"),
        E.ConfigurationError("bad", setting="X"),
        E.UnknownAgentError("who", agent="a", known=["b"]),
        E.UnknownSkillError("which", skill_name="s", known=["t"]),
        E.ConflictError("dup", turn_id="t"),
        E.InternalError("oops", exception_type="KeyError"),
        E.ContextOverflowError("too big", limit="max_tokens", budget=50, size=130),
        E.ConversationBusyError("busy", conversation_id="c", active_turn_id="t"),
        E.OutputValidationError("invalid", errors=["age: not an int"], retries=2),
        E.QuotaExceededError("over", tenant="acme", used=120, quota=100, reset_at=1_800_003_600.0),
    ],
)
def test_payload_round_trip_keeps_class_and_fields(error):
    rebuilt = E.error_from_payload(error.to_payload())
    assert type(rebuilt) is type(error)
    assert rebuilt.message == error.message
    assert rebuilt.fields == error.fields
    assert isinstance(rebuilt, E.SmithError)


def test_unknown_kind_becomes_base_error():
    rebuilt = E.error_from_payload({"kind": "FutureError", "message": "m", "fields": {"x": 1}})
    assert type(rebuilt) is E.SmithError and rebuilt.message == "m"


def test_body_excerpt_is_capped():
    assert len(E.LlmApiError("x", 500, "b" * 5000).body_excerpt) == 1000


def test_error_from_exception_wraps_foreign_exceptions():
    wrapped = E.error_from_exception(KeyError("k"))
    assert isinstance(wrapped, E.InternalError) and wrapped.exception_type == "KeyError"
    same = E.ParseError("p")
    assert E.error_from_exception(same) is same


def test_unknown_field_is_a_programming_error():
    with pytest.raises(TypeError):
        E.SmithError.__init__(E.ParseError.__new__(E.ParseError), "m", offset=1, nope=2)


def _error_classes() -> list[type[E.SmithError]]:
    """Every SmithError class defined in smith_client.errors, found by walking the module."""
    return [
        value
        for value in vars(E).values()
        if isinstance(value, type) and issubclass(value, E.SmithError) and value.__module__ == E.__name__
    ]


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
def test_every_error_is_exported_from_the_package_root(cls):
    import smith_client

    assert getattr(smith_client, cls.__name__, None) is cls
    assert cls.__name__ in smith_client.__all__
    assert E.ERROR_CLASSES[cls.__name__] is cls  # and rebuilt as itself when it crosses Redis
