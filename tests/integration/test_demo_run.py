"""`make demo`'s orchestration: it starts workers, runs one streamed turn, and leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import redis

from smith_client.errors import ConfigurationError
from smith_worker.local.processes import free_port, redis_answers, start_redis_server, wait_until
from smith_worker.testing import Reply, Script
from tests.conftest import ROOT
from tests.support.web import serves

pytestmark = pytest.mark.integration
#: The ``smith`` command of this interpreter (its hint names it by absolute path when it is outside the cwd).
SMITH = Path(sys.executable).parent / "smith"


def demo_processes(redis_url: str) -> list[psutil.Process]:
    """Processes started by a demo run against this test's Redis (other test sessions may run demos too)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            env = proc.environ()
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if env.get("SMITH_REDIS_URL") == redis_url and env.get("SMITH_PREFIX", "").startswith("smith-demo-"):
            found.append(proc)
    return found


def test_demo_run_streams_a_turn_and_stops_everything(redis_url, scripted_llm, scenario, tmp_path):
    _, marker = scenario(Script(Reply.tool_calls([("calculator", {"expression": "17*23"})]), Reply.text("391.")))
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_LLM_BASE_URL=scripted_llm.base_url,
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "smith_worker.demo.run", f"{marker} What is 17*23?"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "391."
    assert "[tool result] calculator -> 391 (worker " in proc.stderr
    # nothing left running: no worker process of this run survives it
    assert demo_processes(redis_url) == []
    # and its keys were removed from the Redis it borrowed (its prefix starts with smith-demo-)
    leftover = redis.Redis.from_url(redis_url)
    assert leftover.keys("smith-demo-*") == []
    assert leftover.keys("arq:*smith-demo-*") == []  # arq's job/result keys of its jobs too (their ids carry it)


def test_demo_starts_its_own_redis_where_none_answers(scripted_llm, scenario, tmp_path):
    """SMITH_REDIS_URL at a port where nothing listens: a private redis-server, the answer 391, the URL and prefix.

    TMPDIR is a fresh directory, so a redis-server working there cannot open a log path relative to the demo's
    cwd (``.demo-logs/redis.log``); the server's own working directory is removed at the end.
    """
    _, marker = scenario(Script(Reply.tool_calls([("calculator", {"expression": "17*23"})]), Reply.text("391.")))
    dead_url = f"redis://127.0.0.1:{free_port()}/0"
    clone, tmpdir = tmp_path / "clone", tmp_path / "tmp"
    clone.mkdir()
    tmpdir.mkdir()
    env = dict(os.environ, SMITH_REDIS_URL=dead_url, SMITH_LLM_BASE_URL=scripted_llm.base_url, TMPDIR=str(tmpdir),
               PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "smith_worker.demo.run", f"{marker} What is 17*23?"],
                          cwd=clone, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "391."
    assert f"[demo] no Redis at {dead_url}; starting a private redis-server" in proc.stderr
    url, prefix = announced(proc.stderr, "demo")
    assert url != dead_url and prefix.startswith("smith-demo-")
    assert not redis_answers(url)  # stopped
    assert list(tmpdir.glob("smith-redis-*")) == []  # its working directory removed
    assert (clone / ".demo-logs" / "redis.log").exists()


def announced(stderr: str, tag: str) -> tuple[str, str]:
    """The Redis URL and key prefix of a ``[demo]``/``[web]`` status line, checked against its ``smith status`` hint.
    """
    found = re.search(rf"^\[{tag}\] Redis (\S+), key prefix (\S+); from another terminal: (.+)$", stderr, re.M)
    assert found, stderr
    url, prefix, hint = found.groups()
    assert hint == f"SMITH_REDIS_URL={url} SMITH_PREFIX={prefix} {SMITH} status"
    return url, prefix


@pytest.mark.parametrize("log_name", ["redis.log", None], ids=["log_path", "default_log"])
def test_private_redis_that_exits_at_start_fails_at_once_quoting_its_log(log_name, tmp_path, monkeypatch):
    """redis-server cannot bind its port: ConfigurationError with its log's last lines, not a 10 s timeout;
    its working directory (and the default log in it) is removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigurationError, match="exited at start") as caught:
            start_redis_server(taken.getsockname()[1], log_path=tmp_path / log_name if log_name else None)
    assert "Address already in use" in caught.value.message
    assert caught.value.setting == "redis"
    assert list(tmp_path.glob("smith-redis-*")) == []


@contextlib.contextmanager
def make_web(redis_url: str, llm_base_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """`make web`'s command on the scripted model, serving: (its process, its base URL, its stderr file).
    Ctrl-C stops it at the end unless it has exited."""
    port = free_port()
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_LLM_BASE_URL=llm_base_url,
               SMITH_WEB_PORT=str(port), PYTHONPATH=str(ROOT))
    stderr_path = tmp_path / "stderr"
    base = f"http://127.0.0.1:{port}"
    with stderr_path.open("w") as stderr_file:
        proc = subprocess.Popen([sys.executable, "-m", "examples.web.run"], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=stderr_file, text=True)
        try:
            wait_until(lambda: serves(base + "/"), 60.0, "make web's page")
            yield proc, base, stderr_path
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # Ctrl-C
            proc.wait(timeout=60)


def test_make_web_serves_the_relay_with_workers_and_stops_everything(redis_url, scripted_llm, scenario, tmp_path):
    _, marker = scenario(Script(Reply.tool_calls([("calculator", {"expression": "6*7"})]), Reply.text("42.")))
    with make_web(redis_url, scripted_llm.base_url, tmp_path) as (proc, base, stderr_path):
        # the announced prefix is the one its workers serve: the pasted hint's `smith status` lists them
        url, prefix = announced(stderr_path.read_text(), "web")
        assert url == redis_url
        hint_env = dict(os.environ, SMITH_REDIS_URL=url, SMITH_PREFIX=prefix)
        status = subprocess.run([SMITH, "status"], env=hint_env, capture_output=True, text=True, timeout=60)
        listed = {int(pid) for pid in re.findall(r"^worker .* pid (\d+)\)$", status.stdout, re.M)}
        assert listed == {p.pid for p in demo_processes(redis_url)} and len(listed) == 2, status
        turn = httpx.post(f"{base}/conversations/web-demo/turns", json={"text": f"{marker} 6*7?"}).json()
        events = httpx.get(base + turn["events"], timeout=60).text
        assert '"type":"tool.result"' in events and '"content":"42"' in events and '"turn.completed"' in events
    stderr = stderr_path.read_text()
    assert proc.returncode == 0, stderr
    assert "stopped everything it started" in stderr
    assert demo_processes(redis_url) == []


def test_make_web_stops_everything_when_a_worker_it_started_dies(redis_url, scripted_llm, tmp_path):
    with make_web(redis_url, scripted_llm.base_url, tmp_path) as (proc, _, stderr_path):
        turn_worker = next(p for p in demo_processes(redis_url) if "turns" in p.cmdline())
        turn_worker.kill()  # kill -9: the page would otherwise accept turns nobody runs
        proc.wait(timeout=60)
    stderr = stderr_path.read_text()
    assert proc.returncode == 1, stderr
    assert "[web] the turn worker exited (code -9; its log: .demo-logs/turns.log): stopping everything" in stderr
    assert "stopped everything it started" in stderr
    assert demo_processes(redis_url) == []
