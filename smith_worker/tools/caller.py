"""A turn's caller context as the worker sees it (docs/architecture.md, Caller context).

The client stores the context given to ``send(..., context=...)`` as JSON under
:meth:`~smith_client.keys.Keys.turn_context`; the turn worker reads it as an attempt begins, the tool
worker as a call starts. :func:`parse_context` turns that record into a :class:`CallerContext`: the
value tools receive as ``ctx.context`` (the decoded JSON object, or an instance of the app's
``context_type``) and the values of its ``SecretStr`` / ``SecretBytes`` fields, which the worker
redacts from logs and tool outcomes (:func:`smith_worker.ops.redaction.secrets_scope`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, SecretBytes, SecretStr, ValidationError

from smith_client.errors import ContextValidationError


@dataclass(frozen=True)
class CallerContext:
    """What a turn's tools get of its caller context: ``value`` (None without one, the decoded JSON object,
    or an instance of the app's ``context_type``) and ``secrets``, the values of its secret fields."""

    value: Any = None
    secrets: frozenset[str] = frozenset()


#: A turn without a caller context, in an app that declares no ``context_type``.
NO_CONTEXT = CallerContext()


def secret_values(value: Any) -> frozenset[str]:
    """The values of every ``SecretStr`` / ``SecretBytes`` (bytes decoded as UTF-8) in ``value``: a pydantic
    model's fields, dicts, lists, tuples and sets are walked."""
    found: set[str] = set()
    for item in _walk(value):
        if isinstance(item, SecretStr):
            found.add(item.get_secret_value())
        elif isinstance(item, SecretBytes):
            found.add(item.get_secret_value().decode("utf-8", "replace"))
    return frozenset(secret for secret in found if secret)


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _walk(getattr(value, name, None))
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _walk(item)


def parse_context(
    raw: bytes | str | None, context_type: type[BaseModel] | None, *, expected: bool = False
) -> CallerContext:
    """The caller context of record ``raw`` (None: the turn has none, or its record is gone).

    With ``context_type`` (``SmithApp(context_type=...)``) the record is validated into an instance
    (a turn without a context is validated as ``{}``, so a type whose fields all have defaults still gives
    its tools an instance); without it the tools get the decoded JSON object. ``expected``: the turn was
    sent with a context (``TurnJob.has_context``), so a missing record is an error, not "no context".

    Raises :class:`ContextValidationError` naming the first bad field (its dotted path; the message never
    quotes a value of the context).
    """
    if raw is None and expected:
        raise ContextValidationError(
            "the turn's caller context record is missing (expired, or deleted)", field="", problems=["missing"]
        )
    if context_type is None:
        return NO_CONTEXT if raw is None else CallerContext(_decoded(raw))
    try:
        model = context_type.model_validate_json(raw if raw is not None else b"{}")
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        paths = [".".join(str(part) for part in error["loc"]) for error in errors]
        problems = [f"{path or '(context)'}: {error['msg']}" for path, error in zip(paths, errors, strict=True)]
        raise ContextValidationError(
            f"caller context does not fit {context_type.__name__}: {'; '.join(problems)}",
            field=paths[0] if paths else "",
            problems=problems,
        ) from None  # the pydantic error quotes the input
    return CallerContext(model, secret_values(model))


def _decoded(raw: bytes | str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContextValidationError(
            f"the turn's caller context record is not JSON ({exc.msg})", field="", problems=["not JSON"]
        ) from None
