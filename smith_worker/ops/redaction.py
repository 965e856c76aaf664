"""Redaction of secrets before anything is logged (docs/architecture.md, Hooks and logs).

* :func:`redact_headers` — values of ``Authorization``, ``X-Api-Key``,
  ``Api-Key``, ``Cookie``, ``Set-Cookie`` (any case) become ``"<redacted>"``.
* :func:`redact_json` — in a decoded JSON value, the value of any object key
  matching ``/api[-_]?key/i``, ``/access[-_]?token/i``, ``/bearer/i`` or
  ``/password/i`` (anywhere in the key) becomes ``"<redacted>"``, whatever
  its type; nested objects and arrays are walked.
* :func:`redact_json_deep` — :func:`redact_json`, and a string value that is itself a JSON object or array
  (a tool call's ``arguments``, a tool message's ``content`` in the chat wire format) is decoded, redacted
  and re-encoded.
* :func:`redact_text` — every occurrence of a known secret string is replaced:
  those given, and those registered for the process with
  :func:`register_secrets` (API keys, bearer tokens, the Redis password,
  credentials from a URL); ``Bearer``/``Basic`` credentials and a URL's
  ``user:password@`` are replaced whatever their value.
* :func:`secrets_scope` — secrets known for a while (the ``SecretStr`` values of the caller context of a
  turn or tool call running in the process, docs/architecture.md, Caller context): :func:`redact_text`
  removes them too until the scope ends; :func:`redact_literals` removes only the secrets given.
* :func:`redact_error` — a :class:`~smith_client.errors.SmithError` with its
  message and text fields redacted, before it reaches an event, a turn's
  state or a log.
* :class:`RedactingFilter` / :func:`install_log_redaction` — a logging filter
  on the root handlers applying :func:`redact_text` to every record (message
  and traceback), and dropping the job arguments from arq's job-start lines.
* :func:`redact_body` — a body about to be logged: JSON is redacted with
  :func:`redact_json`, anything else is kept as text; known secrets are
  removed from the result either way.

All functions return new values and never modify their input.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

import orjson

from smith_client.errors import SmithError

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


def redact_json_deep(value: Any) -> Any:
    """A copy of a decoded JSON value redacted as :func:`redact_json` does, strings holding a JSON object or
    array included (decoded, redacted, re-encoded compactly when anything in them was redacted; kept as they are
    otherwise): message content captured in spans (docs/architecture.md, Tracing)."""
    if isinstance(value, Mapping):
        return {
            key: REDACTED if isinstance(key, str) and SENSITIVE_KEY.search(key) else redact_json_deep(item)
            for key, item in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [redact_json_deep(item) for item in value]
    if isinstance(value, str) and value.lstrip()[:1] in ("{", "["):
        try:
            decoded = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        redacted = redact_json_deep(decoded)
        return value if redacted == decoded else orjson.dumps(redacted).decode()
    return value


#: Credentials after an HTTP auth scheme, and the userinfo of a URL.
_AUTH_VALUE = re.compile(r"\b(Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{6,}", re.IGNORECASE)
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)[^/\s@]+@", re.IGNORECASE)
#: Shorter strings are not registered: replacing them would mangle ordinary text.
MIN_SECRET_LENGTH = 4

_registered: set[str] = set()
#: Secrets of the scopes open in the process (:func:`secrets_scope`), counted: two turns may share one.
_scoped: Counter[str] = Counter()
_lock = threading.Lock()


def register_secrets(*secrets: str | None) -> None:
    """Add literal secrets (API keys, tokens, passwords) that :func:`redact_text` removes everywhere in this process."""
    with _lock:
        _registered.update(s for s in secrets if s and len(s) >= MIN_SECRET_LENGTH)


def registered_secrets() -> frozenset[str]:
    """The secrets registered with :func:`register_secrets`."""
    return frozenset(_registered)


@contextmanager
def secrets_scope(secrets: Iterable[str]) -> Iterator[None]:
    """While the ``with`` block runs, :func:`redact_text` (so every log line, through :class:`RedactingFilter`)
    removes ``secrets`` too, whichever thread or task logs: the secrets of a caller context, known only
    while its turn or tool call runs here. Secrets shorter than :data:`MIN_SECRET_LENGTH` are not added
    (:func:`redact_literals` removes any)."""
    added = [s for s in set(secrets) if s and len(s) >= MIN_SECRET_LENGTH]
    with _lock:
        _scoped.update(added)
    try:
        yield
    finally:
        with _lock:
            _scoped.subtract(added)
            for secret in added:
                if _scoped[secret] <= 0:
                    del _scoped[secret]


def redact_literals(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each non-empty secret in ``secrets`` (longest first) replaced by
    ``"<redacted>"``; nothing else changed (a tool's successful outcome, docs/architecture.md, Caller context)."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def url_credentials(url: str) -> tuple[str, str | None, str | None]:
    """Split ``scheme://user:password@host/...`` into the URL without userinfo, the user and the password
    (percent-decoded; ``None`` when absent). A URL without userinfo is returned unchanged."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url, None, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    return parts._replace(netloc=host).geturl(), unquote(user), unquote(password) if colon else None


def redact_text(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every occurrence of each non-empty secret (given or registered) replaced by ``"<redacted>"``,
    and every ``Bearer``/``Basic`` credential and URL userinfo replaced too.

    Longer secrets are replaced first so a secret containing another is
    removed whole.
    """
    with _lock:
        known = _registered | _scoped.keys()
    for secret in sorted({s for s in secrets if s} | known, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _AUTH_VALUE.sub(lambda m: f"{m.group(1)} {REDACTED}", text)
    return _URL_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)


def redact_error(error: SmithError) -> SmithError:
    """``error`` with its message and every text field passed through :func:`redact_text` (changed in place)."""
    error.message = redact_text(error.message)
    error.args = (error.message,)
    for name, value in error.fields.items():  # a fresh dict of the field attributes
        if isinstance(value, str):
            setattr(error, name, redact_text(value))
    return error


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


_ARQ_JOB_START = "%6.2fs → %s(%s)%s"


class RedactingFilter(logging.Filter):
    """Passes every record, with :func:`redact_text` applied to its message and traceback; arq's job-start
    line (``→ run_tool(<arguments>)``) loses its arguments, which hold user text and tool arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _ARQ_JOB_START and isinstance(record.args, tuple) and len(record.args) == 4:
            record.args = (record.args[0], record.args[1], "…", record.args[3])
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Add one :class:`RedactingFilter` to each handler of ``logger`` (default: the root logger).

    Handler filters see the records of every logger that propagates there
    (httpx, httpcore, mcp, arq included); calling this again adds nothing.
    """
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


__all__ = [
    "REDACTED",
    "SENSITIVE_HEADERS",
    "SENSITIVE_KEY",
    "RedactingFilter",
    "install_log_redaction",
    "redact_body",
    "redact_error",
    "redact_literals",
    "secrets_scope",
    "register_secrets",
    "registered_secrets",
    "url_credentials",
    "redact_headers",
    "redact_json",
    "redact_json_deep",
    "redact_text",
]
