"""Checks of a client request, shared by :class:`SmithClient` and :class:`SyncSmithClient`.

Pure functions: each returns the checked value or raises
:class:`~smith_client.errors.InvalidRequestError` naming the field, before
anything reaches Redis (ids per
:data:`~smith_client.keys.ID_PATTERN`).
"""

from __future__ import annotations

import math
import re
import reprlib
import time
import uuid
from typing import Any, Required, TypedDict

import orjson
from pydantic import BaseModel, SecretBytes, SecretStr, ValidationError
from pydantic_core import PydanticSerializationError, to_jsonable_python

from smith_client.errors import InvalidRequestError, UnknownAgentError
from smith_client.jobs import Sampling, TurnJob
from smith_client.keys import ID_PATTERN
from smith_client.messages import UserMessage
from smith_client.overrides import check_overrides

#: Largest user message accepted, in UTF-8 bytes.
MAX_MESSAGE_BYTES = 1_000_000
#: Default cap on a turn's caller context (``SMITH_CONTEXT_MAX_BYTES``), in bytes of compact JSON: 64 KiB.
DEFAULT_CONTEXT_MAX_BYTES = 64 * 1024
#: The multitask policies of a turn request (see :mod:`smith_client.turns`).
MULTITASK_POLICIES = ("enqueue", "reject", "interrupt", "merge")


class TurnOptions(TypedDict, total=False):
    """Options of one turn request (see :meth:`SmithClient.send`); ``instructions`` … ``model`` are the
    turn's overrides (:mod:`smith_client.overrides`)."""

    conversation_id: Required[str]
    agent: str
    turn_id: str | None
    tenant: str | None
    multitask: str
    sampling: dict[str, Any] | None
    stream: bool | None
    context: dict[str, Any] | BaseModel | None
    instructions: str
    tool_choice: str
    max_iterations: int
    max_tokens: int
    tools: list[str]
    model: str


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 80


def shown(value: Any) -> str:
    """``repr(value)`` cut to about 80 characters: an error message quotes a caller's bad value, not all of it."""
    return _SHOWN.repr(value)


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """Turn options: only the names of :class:`TurnOptions` (a misspelt option must not be silently ignored)."""
    unknown = sorted(set(options) - set(TurnOptions.__annotations__))
    if unknown:
        raise InvalidRequestError(
            f"unknown option {unknown[0]!r} (options: {', '.join(TurnOptions.__annotations__)})", field=unknown[0]
        )
    return options


def check_id(value: Any, field: str) -> str:
    """A caller-chosen id (turn, conversation, agent): 1-200 characters from ``[A-Za-z0-9_.:@-]``."""
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise InvalidRequestError(
            f"{field} must be a string of 1-200 characters from [A-Za-z0-9_.:@-], got {shown(value)}",
            field=field,
        )
    return value


def check_tenant(value: Any) -> str | None:
    """A turn's tenant (docs/architecture.md, Tenants): None (none), or an id as :func:`check_id` without ``:``
    (1-200 characters from ``[A-Za-z0-9_.@-]``: it prefixes ``<tenant>/<agent>:<kind>`` usage fields)."""
    if value is None:
        return None
    if not isinstance(value, str) or not ID_PATTERN.match(value) or ":" in value:
        raise InvalidRequestError(
            f"tenant must be None or a string of 1-200 characters from [A-Za-z0-9_.@-], got {shown(value)}",
            field="tenant",
        )
    return value


def check_text(text: Any) -> str:
    """A user message: a non-blank, valid Unicode string of at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes."""
    if not isinstance(text, str):
        raise InvalidRequestError(f"text must be a string, got {type(text).__name__}", field="text")
    if not text.strip():
        raise InvalidRequestError("text must not be empty", field="text")
    return check_size(text, "text")


def check_size(text: str, field: str) -> str:
    """``text`` (the value of ``field``) when it is valid Unicode of at most :data:`MAX_MESSAGE_BYTES` UTF-8 bytes."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidRequestError(f"{field} is not valid Unicode (lone surrogate at {exc.start})", field=field) from exc
    if size > MAX_MESSAGE_BYTES:
        raise InvalidRequestError(f"{field} is larger than {MAX_MESSAGE_BYTES} bytes (UTF-8)", field=field)
    return text


def check_json(value: Any, field: str) -> str:
    """``value`` (the value of ``field``) as compact JSON text of at most :data:`MAX_MESSAGE_BYTES` bytes.
    Raises :class:`InvalidRequestError` for a value that is not JSON-able (e.g. a key that is not a string)."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError as exc:
        raise InvalidRequestError(f"{field} is not JSON-able: {exc}", field=field) from exc
    check_finite(value, field)
    return check_size(text, field)


def check_finite(value: Any, field: str) -> None:
    """Raise :class:`InvalidRequestError` for a NaN or infinite float anywhere in ``value`` (JSON has no such
    number: https://www.rfc-editor.org/rfc/rfc8259#section-6, and orjson would write ``null`` silently)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidRequestError(f"{field} holds {item!r}, which JSON cannot represent", field=field)
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


#: Longest reason quoted from a schema error (its message may quote the whole value).
_REASON_CHARS = 200


def check_fits_schema(schema: dict[str, Any], value: Any, field: str, subject: str) -> None:
    """Raise :class:`InvalidRequestError` when ``value`` (the value of request field ``field``, size-checked
    already: :func:`check_json`) is not valid under the JSON Schema ``schema``.

    The validator is the one of the schema's ``$schema`` dialect, Draft 2020-12 when it names none or one the
    ``jsonschema`` library does not know (https://json-schema.org/draft/2020-12/json-schema-core#section-8.1.1);
    ``format`` is an annotation, as that draft has it. The error is the most relevant one
    (``jsonschema.exceptions.best_match``, which looks inside ``oneOf``/``anyOf``): its message is
    ``"<subject>: <path>: <reason>"`` and its ``field`` the path to the offending value, ``field`` first
    (``arguments.items[0].name``). A schema that is itself invalid, or whose ``$ref`` cannot be resolved without
    the network, checks nothing (the tool still validates what it gets when it runs)."""
    # Imported here: jsonschema takes a few hundred ms to import, and only a decision with a value needs it.
    from jsonschema import exceptions, validators
    from referencing.exceptions import Unresolvable

    cls = validators.validator_for(schema, default=validators.Draft202012Validator)
    try:
        cls.check_schema(schema)
        error = exceptions.best_match(cls(schema).iter_errors(value))
    except (exceptions.SchemaError, Unresolvable, re.error):
        return
    if error is None:
        return
    path = field + "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in error.absolute_path)
    reason = error.message if len(error.message) <= _REASON_CHARS else error.message[: _REASON_CHARS - 3] + "..."
    raise InvalidRequestError(f"{subject}: {path}: {reason}", field=path)


def _revealed(value: Any) -> Any:
    """orjson's fallback for a context model's values: a secret's own value (the context record keeps it,
    docs/architecture.md, Caller context), anything else as pydantic serializes it to JSON."""
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    if isinstance(value, SecretBytes):
        return value.get_secret_value().decode()
    return to_jsonable_python(value)


def check_context(context: Any, max_bytes: int = DEFAULT_CONTEXT_MAX_BYTES) -> str | None:
    """A turn's caller context as compact JSON text, or None for no context (docs/architecture.md, Caller context).

    ``context`` is a JSON object (a ``dict`` with string keys) or a pydantic model instance (dumped with its
    ``SecretStr`` values revealed: the workers validate it again into the app's ``context_type``); its JSON
    is at most ``max_bytes`` bytes (``SMITH_CONTEXT_MAX_BYTES``, 64 KiB by default). Raises
    :class:`InvalidRequestError` (``field="context"``) otherwise; the message never quotes the value.
    """
    if context is None:
        return None
    if isinstance(context, BaseModel):
        context = context.model_dump()
    if not isinstance(context, dict):
        raise InvalidRequestError(
            f"context must be a JSON object (a dict) or a pydantic model, got {type(context).__name__}",
            field="context",
        )
    try:
        check_finite(context, "context")
        # sorted keys: the same object in another key order is the same request (turns.fingerprint)
        text = orjson.dumps(context, default=_revealed, option=orjson.OPT_SORT_KEYS)
    except (TypeError, PydanticSerializationError) as exc:
        raise InvalidRequestError(f"context is not JSON-able: {exc}", field="context") from exc
    if len(text) > max_bytes:
        raise InvalidRequestError(
            f"context is {len(text)} bytes as JSON, larger than {max_bytes} (SMITH_CONTEXT_MAX_BYTES)", field="context"
        )
    return text.decode()


def check_sampling(sampling: Any) -> dict[str, Any] | None:
    """Validate per-turn sampling against the contract (:class:`Sampling`); returns its JSON form."""
    if sampling is None:
        return None
    if not isinstance(sampling, dict):
        raise InvalidRequestError("sampling must be a dict", field="sampling")
    try:
        checked = Sampling.model_validate(sampling)
        as_json = checked.model_dump(mode="json", exclude_defaults=True)
        orjson.dumps(as_json)
    except (ValidationError, PydanticSerializationError, TypeError) as exc:
        problems = (
            "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            if isinstance(exc, ValidationError)
            else str(exc)
        )
        raise InvalidRequestError(f"invalid sampling: {problems}", field="sampling") from exc
    if checked.reserved_keys():
        raise InvalidRequestError(f"sampling.extra may not set {checked.reserved_keys()}", field="sampling")
    return as_json


def check_timeout(timeout: Any) -> float | None:
    """A wait budget: a positive number of seconds, or None (wait forever)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidRequestError(
            f"timeout must be a positive number of seconds or None, got {shown(timeout)}", field="timeout"
        )
    return float(timeout)


#: Largest ``after_seq`` accepted: Redis stream ids and counters are signed 64-bit.
MAX_SEQ = 2**63 - 1


def check_seq(after_seq: Any) -> int:
    """A resume cursor: the ``seq`` of the last event seen, an integer in [0, :data:`MAX_SEQ`] (0: from the start)."""
    if isinstance(after_seq, bool) or not isinstance(after_seq, int) or not 0 <= after_seq <= MAX_SEQ:
        raise InvalidRequestError(
            f"after_seq must be an integer in [0, 2**63-1], got {shown(after_seq)}", field="after_seq"
        )
    return after_seq


def check_multitask(multitask: Any) -> str:
    """One of :data:`MULTITASK_POLICIES`."""
    if multitask not in MULTITASK_POLICIES:
        raise InvalidRequestError(
            f"multitask must be one of {MULTITASK_POLICIES}, got {shown(multitask)}", field="multitask"
        )
    return str(multitask)


def build_turn_job(
    text: Any,
    conversation_id: Any = None,
    agent: Any = None,
    turn_id: Any = None,
    tenant: Any = None,
    multitask: Any = "enqueue",
    sampling: Any = None,
    stream: Any = None,
    **overrides: Any,
) -> tuple[TurnJob, str]:
    """Check a turn request (``text`` and :class:`TurnOptions`) into its ``run_turn`` job and multitask policy.

    A missing ``turn_id`` gets a fresh uuid4 hex. Without ``agent`` the job is routed as ``"default"`` and
    says the caller named none (``agent_given``): its worker runs the conversation's current agent when a
    handoff set one (docs/architecture.md, Handoffs). ``tenant`` is :func:`check_tenant`'s. ``overrides`` are the
    per-turn overrides (:func:`~smith_client.overrides.check_overrides`). Raises :class:`InvalidRequestError`.
    """
    check_text(text)
    check_id(conversation_id, "conversation_id")
    agent_given = agent is not None
    agent = agent if agent_given else "default"
    check_id(agent, "agent")
    if turn_id is not None:
        check_id(turn_id, "turn_id")
    check_multitask(multitask)
    check_tenant(tenant)
    sampling = check_sampling(sampling)
    if stream is not None and not isinstance(stream, bool):
        raise InvalidRequestError("stream must be a bool or None", field="stream")
    job = TurnJob(
        turn_id=turn_id or uuid.uuid4().hex,
        conversation_id=conversation_id,
        agent=agent,
        message=UserMessage(content=text),
        sampling=sampling,
        stream=stream,
        submitted_at=time.time(),
        agent_given=agent_given,
        overrides=check_overrides(**overrides),
        tenant=tenant,
    )
    return job, multitask


def build_turn_request(
    text: Any, options: dict[str, Any], context_max_bytes: int = DEFAULT_CONTEXT_MAX_BYTES
) -> tuple[TurnJob, str, str | None]:
    """Check a turn request (``text`` and :class:`TurnOptions`) into its ``run_turn`` job, its multitask policy
    and its caller context's JSON (None: none; see :func:`check_context`, capped at ``context_max_bytes``).

    The context never enters the job, which Redis keeps in other values (the turn's state, arq's job record):
    the job only says it has one (``has_context``). Raises :class:`InvalidRequestError`.
    """
    options = dict(check_options(options))
    raw_context = options.pop("context", None)
    job, multitask = build_turn_job(text, **options)
    context = check_context(raw_context, context_max_bytes)
    if context is not None:
        job = job.model_copy(update={"has_context": True})
    return job, multitask, context


def check_served(agent: str, served: set[str] | None) -> bool:
    """Whether a turn for ``agent`` can run: False when no turn worker is registered (it waits in the queue).

    Raises :class:`UnknownAgentError` when live workers exist but none serves ``agent``.
    """
    if served is not None and agent not in served:
        raise UnknownAgentError(
            f"no live worker serves agent {agent!r} (served: {sorted(served)})", agent=agent, known=sorted(served)
        )
    return served is not None
