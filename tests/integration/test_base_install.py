"""The base install (``pip install agent-smith``, no extras) gives a working client and ``smith``.

Builds a fresh venv and installs this checkout without extras, as a user
would; the worker extra's libraries (httpx, mcp) are then absent, and the
client package and the ``smith`` command must work without them, and
``smith-worker`` must say in one line which extra to install. The venv is
made once per session (about 30 s with the local package mirror).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def base_venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("base-install")
    source = work / "src"  # a copy, so the build leaves nothing (no stale build/) in the checkout
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("smith_client", "smith_worker"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(source)], check=True, timeout=600)
    return venv


def run(venv: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60,
                          cwd=venv)  # not the checkout: its packages must come from the install


def test_the_base_install_has_no_worker_libraries(base_venv):
    assert run(base_venv, "python", "-c", "import httpx").returncode != 0
    assert run(base_venv, "python", "-c", "import mcp").returncode != 0


def test_the_client_imports_and_smith_runs_on_the_base_install(base_venv):
    imported = run(base_venv, "python", "-c", "import smith_client; print(smith_client.SmithClient.__name__)")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "SmithClient"
    helped = run(base_venv, "smith", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "ask" in helped.stdout and "chat" in helped.stdout and "status" in helped.stdout
    scripts_found = run(base_venv, "python", "-c",
                        "from smith_client import scripts; print(len(scripts.SUBMIT.source) > 0)")
    assert scripts_found.stdout.strip() == "True", scripts_found.stderr  # the .lua files are in the wheel
    marker = "import pathlib, smith_client; print(pathlib.Path(smith_client.__file__).with_name('py.typed').is_file())"
    typed = run(base_venv, "python", "-c", marker)
    assert typed.stdout.strip() == "True", typed.stderr  # a user's mypy/pyright reads the package's own types


def test_smith_worker_on_the_base_install_names_the_extra_in_one_line(base_venv):
    for argv in (["--help"], ["tests.support.app:app", "--queue", "turns"], ["--check", "--queue", "turns"]):
        ran = run(base_venv, "smith-worker", *argv)
        assert ran.returncode == 1, (argv, ran.stdout, ran.stderr)
        assert ran.stdout == ""
        assert ran.stderr.strip().splitlines() == [ran.stderr.strip()], ran.stderr  # one line, no traceback
        assert "pip install 'agent-smith[worker]'" in ran.stderr and "pebble" in ran.stderr, ran.stderr
