"""Typed errors shared by the client and the workers.

Each failure is an exception class under one base, :class:`SmithError`,
with a ``kind`` and typed fields (docs/architecture.md, Errors).

Errors cross Redis as ``{"kind": <class name>, "message": str, "fields": {...}}``
(see :meth:`SmithError.to_payload`) and are rebuilt as the same class on the
other side by :func:`error_from_payload`.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SmithError(Exception):
    """Base of every Agent Smith error.

    ``message`` is the human-readable text; subclasses add their typed fields
    as attributes, listed in ``field_names`` so they survive serialization.
    """

    field_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        for name in self.field_names:
            setattr(self, name, fields.pop(name, None))
        if fields:
            raise TypeError(f"{type(self).__name__} got unknown fields: {sorted(fields)}")

    @property
    def kind(self) -> str:
        """The wire name of this error: its class name."""
        return type(self).__name__

    @property
    def fields(self) -> dict[str, Any]:
        """The typed fields of this error as a dict (JSON-able values)."""
        return {name: getattr(self, name) for name in self.field_names}

    def to_payload(self) -> dict[str, Any]:
        """Serialize as ``{"kind", "message", "fields"}`` for events and Redis."""
        return {"kind": self.kind, "message": self.message, "fields": self.fields}

    def __repr__(self) -> str:
        extra = "".join(f", {k}={v!r}" for k, v in self.fields.items())
        return f"{self.kind}({self.message!r}{extra})"


class ParseError(SmithError):
    """Malformed JSON or an unexpected payload shape.

    Fields: ``offset`` (int, character offset into the parsed text, 0 when unknown).
    """

    field_names = ("offset",)

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message, offset=offset)


class ToolError(SmithError):
    """A tool failed. Fields: ``tool_name`` (str), ``retryable`` (bool).

    A Python tool raises it to report a failure to the model in its own words:
    the call's error result is ``{"error": true, "message": ..., "kind": "ToolError",
    "tool_name": ..., "retryable": ...}`` (``tool_name`` defaults to the tool's
    name; ``retryable`` tells the model whether calling again may succeed).
    Any other exception gives ``{"error": true, "message": "<type>: <text>"}``.
    """

    field_names = ("tool_name", "retryable")
    tool_name: str
    retryable: bool

    def __init__(self, message: str, tool_name: str = "", retryable: bool = False) -> None:
        super().__init__(message, tool_name=tool_name, retryable=retryable)


class McpError(SmithError):
    """An MCP server failed. Fields: ``server`` (alias), ``rpc_code`` (int | None)."""

    field_names = ("server", "rpc_code")

    def __init__(self, message: str, server: str = "", rpc_code: int | None = None) -> None:
        super().__init__(message, server=server, rpc_code=rpc_code)


class McpProtocolError(McpError):
    """A JSON-RPC error or an invalid MCP message flow."""


class TransportError(SmithError):
    """A network or pipe failure with context.

    Fields: ``operation`` (what was attempted), ``endpoint_or_server`` (URL or MCP alias).
    """

    field_names = ("operation", "endpoint_or_server")

    def __init__(self, message: str, operation: str = "", endpoint_or_server: str = "") -> None:
        super().__init__(message, operation=operation, endpoint_or_server=endpoint_or_server)


class LlmApiError(SmithError):
    """The chat-completions server answered with an error.

    Fields: ``http_status`` (int; the HTTP status, 200 for an error inside a
    successful stream), ``body_excerpt`` (str, at most 1,000 characters).
    """

    field_names = ("http_status", "body_excerpt")

    def __init__(self, message: str, http_status: int = 0, body_excerpt: str = "") -> None:
        super().__init__(message, http_status=http_status, body_excerpt=body_excerpt[:1000])


class SmithTimeoutError(SmithError):
    """An operation ran out of its time budget (docs/architecture.md, Limits and defaults).

    Fields: ``operation`` (str), ``budget`` (float, seconds).
    """

    field_names = ("operation", "budget")

    def __init__(self, message: str, operation: str = "", budget: float = 0.0) -> None:
        super().__init__(message, operation=operation, budget=budget)


class TurnCancelledError(SmithError):
    """A turn was stopped: by a cancel or by a stop condition (docs/architecture.md, Agent loop and stop conditions).

    Fields: ``operation`` (str): the limit or action that stopped it, e.g.
    ``"max_iterations"``, ``"deadline"``, ``"cancel"``.
    """

    field_names = ("operation",)

    def __init__(self, message: str, operation: str = "") -> None:
        super().__init__(message, operation=operation)


class SkillError(SmithError):
    """A skill failed to load or activate. Fields: ``skill_name``."""

    field_names = ("skill_name",)

    def __init__(self, message: str, skill_name: str = "") -> None:
        super().__init__(message, skill_name=skill_name)


class InvalidRequestError(SmithError):
    """The caller's request is malformed; nothing was enqueued. Fields: ``field`` (str)."""

    field_names = ("field",)

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message, field=field)


class ContextValidationError(SmithError):
    """A turn's caller context does not fit its app's ``context_type`` (docs/architecture.md, Caller context):
    the turn failed at its start. Fields: ``field`` (str, the dotted path of the first bad field, "" for the
    whole context), ``problems`` (list[str], each ``"<path>: <what is wrong>"``). The message and fields never
    quote a value of the context.
    """

    field_names = ("field", "problems")
    field: str
    problems: list[str]

    def __init__(self, message: str, field: str = "", problems: list[str] | None = None) -> None:
        super().__init__(message, field=field, problems=list(problems or []))


class ConfigurationError(SmithError):
    """The app, agent or environment configuration is invalid. Fields: ``setting`` (str)."""

    field_names = ("setting",)

    def __init__(self, message: str, setting: str = "") -> None:
        super().__init__(message, setting=setting)


class UnknownAgentError(SmithError):
    """No live worker serves the requested agent. Fields: ``agent``, ``known`` (list[str])."""

    field_names = ("agent", "known")

    def __init__(self, message: str, agent: str = "", known: list[str] | None = None) -> None:
        super().__init__(message, agent=agent, known=list(known or []))


class UnknownSkillError(SmithError):
    """No live worker serves the skill asked for (docs/architecture.md, Skills); nothing was changed.

    Fields: ``skill_name`` (the declared name asked for), ``known`` (list[str], the names served).
    """

    field_names = ("skill_name", "known")

    def __init__(self, message: str, skill_name: str = "", known: list[str] | None = None) -> None:
        super().__init__(message, skill_name=skill_name, known=list(known or []))


class ConflictError(SmithError):
    """The same turn id was sent with a different request. Fields: ``turn_id``."""

    field_names = ("turn_id",)

    def __init__(self, message: str, turn_id: str = "") -> None:
        super().__init__(message, turn_id=turn_id)


class ConversationBusyError(SmithError):
    """The conversation has an unfinished (queued or running) turn: ``multitask="reject"``
    refused a new one, or :meth:`SmithClient.clear` refused to clear it.

    Fields: ``conversation_id``, ``active_turn_id``.
    """

    field_names = ("conversation_id", "active_turn_id")

    def __init__(self, message: str, conversation_id: str = "", active_turn_id: str = "") -> None:
        super().__init__(message, conversation_id=conversation_id, active_turn_id=active_turn_id)


class ContextOverflowError(SmithError):
    """The current turn's messages alone exceed a memory limit of ``RollingWindowMemory``, or a
    history read for the model's view exceeds the worker's ``SMITH_VIEW_MAX_BYTES``.

    Fields: ``limit`` (``"max_messages"``, ``"max_chars"``, ``"max_tokens"`` or ``"SMITH_VIEW_MAX_BYTES"``),
    ``budget`` (the limit's value: messages, UTF-8 bytes or estimated tokens),
    ``size`` (the turn's size, or the read's bytes, in the same unit).
    """

    field_names = ("limit", "budget", "size")

    def __init__(self, message: str, limit: str = "", budget: int = 0, size: int = 0) -> None:
        super().__init__(message, limit=limit, budget=budget, size=size)


class EventsTrimmedError(SmithError):
    """Events asked for are no longer in the replay log (trimmed by its cap, or expired).

    Fields: ``turn_id``, ``after_seq`` (what was asked), ``first_seq`` (oldest kept, 0 if none).
    """

    field_names = ("turn_id", "after_seq", "first_seq")

    def __init__(self, message: str, turn_id: str = "", after_seq: int = 0, first_seq: int = 0) -> None:
        super().__init__(message, turn_id=turn_id, after_seq=after_seq, first_seq=first_seq)


class TurnNotFoundError(SmithError):
    """No turn has this id (never submitted here, or expired). Fields: ``turn_id``."""

    field_names = ("turn_id",)

    def __init__(self, message: str, turn_id: str = "") -> None:
        super().__init__(message, turn_id=turn_id)


class TurnPausedError(SmithError):
    """The turn paused: its step waits for a person's decisions (docs/architecture.md, Pausing for a person).

    Fields: ``turn_id``; ``pending``: a list of plain dicts (JSON-able, as every error's fields, so this module
    needs no event model), each the fields of a :class:`~smith_client.events.PendingItem` (``call_id``, ``tool``,
    ``arguments``, ``agent_path``, ``kind``, …): read ``item["call_id"]``, not ``item.call_id``. For typed items,
    ``PendingItem.model_validate(item)`` each, or ask ``client.pending(turn_id)`` (a list of ``PendingItem``, and
    only the calls still undecided). Decide them with the client's ``approve`` / ``reject`` /
    ``submit_tool_result``; ``follow`` the turn after that.
    """

    field_names = ("turn_id", "pending")
    turn_id: str
    pending: list[dict[str, Any]]

    def __init__(self, message: str, turn_id: str = "", pending: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message, turn_id=turn_id, pending=list(pending or []))


class NoPendingCallError(SmithError):
    """A decision named a call the turn is not waiting on. Fields: ``turn_id``, ``call_id`` (the one named),
    ``pending`` (list[str]: the ids of the calls still waiting, empty when the turn is not paused)."""

    field_names = ("turn_id", "call_id", "pending")
    turn_id: str
    call_id: str
    pending: list[str]

    def __init__(self, message: str, turn_id: str = "", call_id: str = "", pending: list[str] | None = None) -> None:
        super().__init__(message, turn_id=turn_id, call_id=call_id, pending=list(pending or []))


class OutputValidationError(SmithError):
    """A turn's final answer did not validate against its agent's ``output_type`` (docs/architecture.md,
    Structured output): the model was sent the validation errors ``output_retries`` times and its last answer
    still failed; or a client's ``send(..., output_type=...)`` could not parse the turn's output.

    Fields: ``errors`` (list[str], the last answer's validation errors, ``"<path>: <message>"``),
    ``retries`` (int, the retries the model was given).
    """

    field_names = ("errors", "retries")
    errors: list[str]
    retries: int

    def __init__(self, message: str, errors: list[str] | None = None, retries: int = 0) -> None:
        super().__init__(message, errors=list(errors or []), retries=retries)


class QuotaExceededError(SmithError):
    """A tenant's token quota for the current window is used up (docs/tenants.md): a send for the tenant is
    refused (nothing is written), a queued turn of the tenant fails at its start, and a running one fails after
    the model step that crossed the quota, before its next model call.

    Fields: ``tenant`` (str), ``used`` (int, tokens counted in the window: prompt + completion), ``quota`` (int,
    the tenant's ``token_quota``), ``reset_at`` (float, epoch seconds: when the window ends and the count starts
    again from 0).
    """

    field_names = ("tenant", "used", "quota", "reset_at")
    tenant: str
    used: int
    quota: int
    reset_at: float

    def __init__(self, message: str, tenant: str = "", used: int = 0, quota: int = 0, reset_at: float = 0.0) -> None:
        super().__init__(message, tenant=tenant, used=used, quota=quota, reset_at=reset_at)


class InternalError(SmithError):
    """An unexpected exception inside a worker. Fields: ``exception_type`` (str)."""

    field_names = ("exception_type",)

    def __init__(self, message: str, exception_type: str = "") -> None:
        super().__init__(message, exception_type=exception_type)


ERROR_CLASSES: dict[str, type[SmithError]] = {
    cls.__name__: cls
    for cls in (
        SmithError,
        ParseError,
        ToolError,
        McpError,
        McpProtocolError,
        TransportError,
        LlmApiError,
        SmithTimeoutError,
        TurnCancelledError,
        SkillError,
        InvalidRequestError,
        ContextValidationError,
        ConfigurationError,
        UnknownAgentError,
        UnknownSkillError,
        ConflictError,
        ConversationBusyError,
        ContextOverflowError,
        EventsTrimmedError,
        TurnNotFoundError,
        TurnPausedError,
        NoPendingCallError,
        OutputValidationError,
        QuotaExceededError,
        InternalError,
    )
}


def error_from_payload(payload: dict[str, Any]) -> SmithError:
    """Rebuild the typed error serialized by :meth:`SmithError.to_payload`.

    An unknown ``kind`` (a newer worker) becomes a plain :class:`SmithError`
    so the caller still gets the message. Never raises.
    """
    kind = str(payload.get("kind", "SmithError"))
    message = str(payload.get("message", ""))
    fields = payload.get("fields") or {}
    cls = ERROR_CLASSES.get(kind, SmithError)
    known = {k: v for k, v in fields.items() if k in cls.field_names}
    try:
        if cls is SmithError:
            return SmithError(message)
        return cls(message, **known)
    except TypeError:
        return SmithError(message)


def error_from_redis(exc: BaseException, endpoint: str = "") -> SmithError:
    """A Redis failure (connection refused, timeout, server error) as a typed :class:`TransportError`."""
    return TransportError(f"Redis: {type(exc).__name__}: {exc}", operation="redis", endpoint_or_server=endpoint)


def error_from_exception(exc: BaseException) -> SmithError:
    """Wrap any exception as a :class:`SmithError` (identity for ``SmithError``)."""
    if isinstance(exc, SmithError):
        return exc
    return InternalError(f"{type(exc).__name__}: {exc}", exception_type=type(exc).__name__)
