"""A user's type checker sees the public client API's types (mypy --strict and pyright).

``tests/typing/user_example.py`` uses both clients as a user's code would; each
checker must reveal, on every ``# expect: T`` line, the type ``T`` (module names
left out), report an error on every ``# expect-error`` line and on no other line.
With a method typed ``Any`` the reveals say ``Any`` and the misuses pass unseen.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "typing" / "user_example.py"
EXPECT = re.compile(r"reveal_type\(.*#\s*expect:\s*(.+?)\s*$")
#: ``smith_client.Message``, as the checkers spell it (an ``Annotated`` union); ``Message`` in an expectation.
MESSAGE = "SystemMessage | UserMessage | AssistantMessage | ToolMessage"
#: The methods a user calls most, each revealed in the example for both clients.
REQUIRED = ("send", "stream", "submit", "history", "result")


def expectations() -> tuple[dict[int, str], set[int]]:
    """Line number (1-based) → expected revealed type, and the lines that must be reported as errors."""
    reveals: dict[int, str] = {}
    errors: set[int] = set()
    for number, line in enumerate(EXAMPLE.read_text().splitlines(), start=1):
        if line.rstrip().endswith("# expect-error"):
            errors.add(number)
        elif found := EXPECT.search(line):
            reveals[number] = re.sub(r"\bMessage\b", MESSAGE, found.group(1))
    return reveals, errors


def unqualified(type_text: str) -> str:
    """``typing.AsyncGenerator[smith_client.events.Event, None]`` → ``AsyncGenerator[Event, None]``."""
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", type_text)


def check(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240)


def mypy_report() -> tuple[dict[int, str], set[int]]:
    done = check([sys.executable, "-m", "mypy", "--strict", "--no-color-output", "--no-error-summary", str(EXAMPLE)])
    assert "Revealed type" in done.stdout, done.stdout + done.stderr
    reveals: dict[int, str] = {}
    errors: set[int] = set()
    for line in done.stdout.splitlines():
        if found := re.match(r".*user_example\.py:(\d+): note: Revealed type is \"(.*)\"$", line):
            reveals[int(found.group(1))] = unqualified(found.group(2))
        elif found := re.match(r".*user_example\.py:(\d+): error: ", line):
            errors.add(int(found.group(1)))
    return reveals, errors


def pyright_report() -> tuple[dict[int, str], set[int]]:
    done = check([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, str(EXAMPLE)])
    try:
        diagnostics = json.loads(done.stdout)["generalDiagnostics"]
    except (ValueError, KeyError):
        pytest.fail(f"pyright did not run: {done.stdout}{done.stderr}")
    reveals: dict[int, str] = {}
    errors: set[int] = set()
    for diagnostic in diagnostics:
        line = diagnostic["range"]["start"]["line"] + 1
        if diagnostic["severity"] == "information" and (
            found := re.match(r'Type of ".*" is "(.*)"$', diagnostic["message"], re.S)
        ):
            reveals[line] = unqualified(found.group(1))
        elif diagnostic["severity"] == "error":
            errors.add(line)
    return reveals, errors


def test_the_example_reveals_the_main_methods_of_both_clients():
    revealed: dict[str, str] = {}  # the example's function (use_async, use_sync) → its reveal_type lines
    function = ""
    for line in EXAMPLE.read_text().splitlines():
        if found := re.match(r"(?:async )?def (\w+)", line):
            function = found.group(1)
        elif EXPECT.search(line):
            revealed[function] = revealed.get(function, "") + line
    for function in ("use_async", "use_sync"):
        for method in REQUIRED:
            assert f".{method}(" in revealed.get(function, ""), f"{function} does not reveal {method}"


@pytest.mark.parametrize("report", [mypy_report, pyright_report], ids=["mypy", "pyright"])
def test_a_users_checker_sees_the_clients_types(report):
    expected_reveals, expected_errors = expectations()
    reveals, errors = report()
    assert reveals == expected_reveals
    assert errors == expected_errors
