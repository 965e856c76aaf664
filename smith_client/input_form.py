"""The fields of an MCP elicitation's ``requestedSchema``, for asking a person at a terminal (docs/architecture.md,
Pausing for a person: MCP elicitation).

MCP restricts a form's schema to a flat object of primitive properties: ``string`` (optionally an ``enum``),
``number``, ``integer`` and ``boolean`` (MCP 2025-06-18, elicitation, requested schema:
https://modelcontextprotocol.io/specification/2025-06-18/client/elicitation#requested-schema).
:func:`form_fields` lists them, :func:`describe` says what a field takes and :func:`field_value` reads what a
person typed as the field's JSON value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: What a person types for a boolean field.
_TRUE, _FALSE = ("y", "yes", "true"), ("n", "no", "false")
#: The property types a form field may have; others are read as strings.
_TYPES = ("string", "number", "integer", "boolean")


@dataclass(frozen=True)
class FormField:
    """One property of a requested schema: its ``name``, JSON ``type`` (one of ``string``, ``number``,
    ``integer``, ``boolean``), whether it is ``required``, its allowed values (``enum``, empty: any), its
    ``default`` (None: none) and the ``description`` (else the ``title``) the server gave it."""

    name: str
    type: str
    required: bool
    enum: tuple[Any, ...] = ()
    default: Any = None
    description: str = ""


def form_fields(schema: dict[str, Any]) -> list[FormField]:
    """The fields of ``schema`` (an object schema's ``properties``, in order); ``[]`` for a schema without any."""
    required = set(schema.get("required") or [])
    fields = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, dict) else {}
        kind = str(prop.get("type")) if prop.get("type") in _TYPES else "string"
        text = str(prop.get("description") or prop.get("title") or "")
        fields.append(FormField(name, kind, name in required, tuple(prop.get("enum") or ()), prop.get("default"), text))
    return fields


def describe(field: FormField) -> str:
    """What ``field`` takes, for a person: ``colour (one of red|green|blue, required: the ink)``."""
    kind = "y/n" if field.type == "boolean" else field.type
    takes = f"one of {'|'.join(map(str, field.enum))}" if field.enum else kind
    notes = [takes]
    if field.required:
        notes.append("required")
    if field.default is not None:
        notes.append(f"default {('n', 'y')[field.default] if field.type == 'boolean' else field.default}")
    about = f": {field.description}" if field.description else ""
    return f"{field.name} ({', '.join(notes)}{about})"


def field_value(field: FormField, text: str) -> Any:
    """The JSON value a person means by ``text`` (stripped) for ``field``: a number for ``number`` and
    ``integer``, True/False for ``boolean`` (``y``/``yes``/``true``, ``n``/``no``/``false``), else the text.
    Empty text is the field's default (None: leave the field out). Raises :class:`ValueError` saying what the
    field takes when ``text`` is not such a value, is not one of its ``enum``, or is empty for a required field
    without a default."""
    text = text.strip()
    if not text:
        if field.required and field.default is None:
            raise ValueError(f"{field.name} is required")
        return field.default
    value: Any = text
    try:
        if field.type == "integer":
            value = int(text)
        elif field.type == "number":
            value = float(text) if any(c in text for c in ".eE") else int(text)
            if not math.isfinite(value):
                raise ValueError(text)
    except ValueError:
        raise ValueError(f"{field.name} takes a{'n' if field.type == 'integer' else ''} {field.type}") from None
    if field.type == "boolean":
        if text.lower() not in (*_TRUE, *_FALSE):
            raise ValueError(f"{field.name} takes y or n")
        value = text.lower() in _TRUE
    if field.enum and value not in field.enum:
        raise ValueError(f"{field.name} takes one of {'|'.join(map(str, field.enum))}")
    return value


__all__ = ["FormField", "describe", "field_value", "form_fields"]
