"""``send(..., output_type=M)`` is typed for the caller's checker: ``mypy --strict`` on
``tests/typing/output_example.py`` reveals ``OutputMessage[M]`` and ``M`` for ``.output``, and reports the misuses
(docs/architecture.md, Structured output)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "tests" / "typing" / "output_example.py"
EXPECT = re.compile(r"reveal_type\(.*#\s*expect:\s*(.+?)\s*$")


def unqualified(type_text: str) -> str:
    """``smith_client.output.OutputMessage[output_example.City]`` → ``OutputMessage[City]``."""
    return re.sub(r"\b(?:\w+\.)+(\w+)", r"\1", type_text)


def test_mypy_reveals_the_callers_output_type():
    expected: dict[int, str] = {}
    expected_errors: set[int] = set()
    for number, line in enumerate(EXAMPLE.read_text().splitlines(), start=1):
        if line.rstrip().endswith("# expect-error"):
            expected_errors.add(number)
        elif found := EXPECT.search(line):
            expected[number] = found.group(1)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-color-output", "--no-error-summary", str(EXAMPLE)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    reveals: dict[int, str] = {}
    errors: set[int] = set()
    for line in done.stdout.splitlines():
        if found := re.match(r".*output_example\.py:(\d+): note: Revealed type is \"(.*)\"$", line):
            reveals[int(found.group(1))] = unqualified(found.group(2))
        elif found := re.match(r".*output_example\.py:(\d+): error: ", line):
            errors.add(int(found.group(1)))
    assert reveals == expected, done.stdout
    assert errors == expected_errors, done.stdout
