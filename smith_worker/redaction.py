"""Redaction of secrets before anything is logged (seed §16.4).

* :func:`redact_headers` — values of ``Authorization``, ``X-Api-Key``,
  ``Api-Key``, ``Cookie``, ``Set-Cookie`` (any case) become ``"<redacted>"``.
* :func:`redact_json` — in a decoded JSON value, the value of any object key
  matching ``/api[-_]?key/i``, ``/access[-_]?token/i``, ``/bearer/i`` or
  ``/password/i`` (anywhere in the key) becomes ``"<redacted>"``, whatever
  its type; nested objects and arrays are walked.
* :func:`redact_text` — every occurrence of a known secret string is replaced.
* :func:`redact_body` — a body about to be logged: JSON is redacted with
  :func:`redact_json`, anything else is kept as text; known secrets are
  removed from the result either way.

All functions return new values and never modify their input.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

REDACTED = "<redacted>"

SENSITIVE_HEADERS = frozenset({"authorization", "x-api-key", "api-key", "cookie", "set-cookie"})

SENSITIVE_KEY = re.compile(r"api[-_]?key|access[-_]?token|bearer|password", re.IGNORECASE)


def redact_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """A copy of ``headers`` (a mapping or ``(name, value)`` pairs) with sensitive values replaced.

    Names keep their original spelling; matching is case-insensitive.
    """
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {name: REDACTED if name.lower() in SENSITIVE_HEADERS else value for name, value in items}


def redact_json(value: Any) -> Any:
    """A copy of a decoded JSON value with the values of sensitive keys replaced (see module doc)."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if isinstance(key, str) and SENSITIVE_KEY.search(key) else redact_json(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_json(item) for item in value]
    return value


def redact_text(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every occurrence of each non-empty secret replaced by ``"<redacted>"``.

    Longer secrets are replaced first so a secret containing another is
    removed whole.
    """
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact_body(body: str | bytes, secrets: Iterable[str | None] = ()) -> str:
    """A loggable form of a request/response body: JSON via :func:`redact_json`, then :func:`redact_text`."""
    raw = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError:
        text = raw
    else:
        text = orjson.dumps(redact_json(decoded)).decode()
    return redact_text(text, secrets)


__all__ = [
    "REDACTED",
    "SENSITIVE_HEADERS",
    "SENSITIVE_KEY",
    "redact_body",
    "redact_headers",
    "redact_json",
    "redact_text",
]
