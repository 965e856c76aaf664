"""The anchors' own virtualenv (``.bench-venv``): the OpenAI Agents SDK, the openai SDK and httpx-sse.

Benchmarks run the anchor side of a comparison with this interpreter, in a
subprocess, on the same machine and in the same run as the project's side
(so both sides see the same machine load). The venv is made once from ``bench/anchors-requirements.txt``
and re-made when that file changes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "bench" / "anchors-requirements.txt"
VENV = ROOT / ".bench-venv"


def anchor_python() -> Path:
    """The anchors' interpreter, creating or refreshing ``.bench-venv`` first (seconds when up to date).

    Raises ``subprocess.CalledProcessError`` when pip cannot install the pinned anchors.
    """
    python = VENV / "bin" / "python"
    stamp = VENV / ".requirements-sha256"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(digest)
    return python


if __name__ == "__main__":
    print(anchor_python())
