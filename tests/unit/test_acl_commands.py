"""The tenant ACL grants every command the code sends: each ``rt.call("<command>", …)`` of the Python code and
each ``redis.call('<COMMAND>', …)`` of its Lua scripts is in :data:`smith_client.acl.TENANT_COMMANDS` (a
command missing there answers NOPERM only for a tenant user, on whatever path first sends it)."""

from __future__ import annotations

import re
from pathlib import Path

from smith_client.acl import OPERATOR_COMMANDS, TENANT_COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PYTHON_CALL = re.compile(r"""\.call\(\s*["']([a-z]+)["']""")
LUA_CALL = re.compile(r"""redis\.p?call\(\s*'([A-Za-z]+)'""")
#: redis-py method names (what ``rt.call`` takes) that are not the command's own name.
METHOD_COMMANDS = {"delete": "del"}


def sent_commands() -> dict[str, str]:
    """Each command the product sends, to one file that sends it."""
    found: dict[str, str] = {}
    for package in ("smith_client", "smith_worker"):
        for path in (ROOT / package).rglob("*"):
            pattern = {".py": PYTHON_CALL, ".lua": LUA_CALL}.get(path.suffix)
            if pattern is not None:
                for command in pattern.findall(path.read_text()):
                    command = METHOD_COMMANDS.get(command, command.lower())
                    found.setdefault(command, str(path.relative_to(ROOT)))
    return found


def test_the_scan_finds_the_commands_of_both_forms():
    sent = sent_commands()
    assert {"hmget", "xadd", "publish", "time"} <= set(sent)  # Python's rt.call and Lua's redis.call forms


def test_every_command_sent_is_granted_to_a_tenant():
    granted = {command.split("|")[0] for command in TENANT_COMMANDS}
    missing = {command: path for command, path in sent_commands().items()
               if command not in granted and command not in OPERATOR_COMMANDS}  # fmt: skip
    assert missing == {}


def test_the_operators_commands_are_sent_by_an_operators_tool_only_and_never_granted():
    sent = sent_commands()
    assert {sent[command] for command in OPERATOR_COMMANDS} == {"smith_client/migration.py"}
    assert not set(OPERATOR_COMMANDS) & {command.split("|")[0] for command in TENANT_COMMANDS}
