"""One owner per concept: key names only in keys.py, Lua only in .lua files."""

from __future__ import annotations

import re
from pathlib import Path

import smith_worker.queue.worker  # noqa: F401  (declares every worker script)
from smith_client import scripts, turn_record

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [p for pkg in ("smith_client", "smith_worker") for p in (ROOT / pkg).rglob("*.py")]
# the shared scripts and lib.lua in smith_client/lua, the worker-only ones in smith_worker/<folder>/lua
LUA = sorted((ROOT / "smith_client" / "lua").glob("*.lua")) + sorted((ROOT / "smith_worker").glob("*/lua/*.lua"))


def test_no_lua_text_in_python_files():
    offenders = [p for p in SOURCES if "redis.call(" in p.read_text()]
    assert offenders == []


def test_no_script_builds_a_key_name():
    # a key name glued from a prefix in Lua looks like  x .. ':turn:' .. id
    glued = re.compile(r"\.\.\s*'[^']*:|':[^']*'\s*\.\.")
    assert LUA and [p.name for p in LUA if glued.search(p.read_text())] == []


def test_no_key_name_built_outside_keys_py():
    # f-strings starting from the prefix, or arq's own names
    built = re.compile(r"""f["'][^"']*\{[^}]*prefix\}:|(key_prefix|abort_jobs_ss)\b|["']arq:""")
    offenders = [str(p.relative_to(ROOT)) for p in SOURCES
                 if p.name != "keys.py" and built.search(p.read_text())]
    assert offenders == []


def test_every_script_file_is_loaded_and_uses_known_state_fields():
    loaded = [script.name for script in scripts._ALL]
    assert sorted(loaded) == sorted({p.stem for p in LUA} - {"lib"})  # every file once, no name twice
    fields = {value for name, value in vars(turn_record).items() if name.isupper() and isinstance(value, str)}
    for path in LUA:
        for field in re.findall(r"'(\w+)'", path.read_text()):
            if field.upper() == field or field in {"MAXLEN", "EX"}:
                continue  # Redis commands and options
            assert field in fields | {"e", "~", "1", "0"} or field in _NON_FIELD_WORDS, (path.name, field)


# words in single quotes in the scripts that are replies or values, not state fields
_NON_FIELD_WORDS = {"conflict", "unknown", "attach", "busy", "merge", "interrupt", "reject", "keys", "merged", "new",
                    "missing", "cancelled_queued", "quota", "cancelling", "done", "wait", "go", "queued", "running",
                    "completed", "failed", "cancelled",
                    "same", "decided", "stale", "decision",  # decide.lua's replies, its resumed_by value
                    "role", "tool", "tail", "text", "covers",  # stored messages, history reads, the summary hash
                    "instance", "table",  # a worker registration's holder (smith_worker/ops/registration.py), a Lua type
                    "token_quota", "quota_window_seconds",  # a tenant's limits hash (smith_client/tenants.py)
                    # rate_limit.lua's modes, its hash's fields and its reasons (smith_worker/llm/rate_limit.py)
                    "take", "pause", "requests", "tokens", "paused", "rate_limit", "retry_after"}
