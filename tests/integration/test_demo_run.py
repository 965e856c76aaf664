"""`make demo`'s orchestration: it starts workers, runs one streamed turn, and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
import psutil
import pytest
import redis

from smith_worker.local.processes import free_port, wait_until
from tests.conftest import ROOT
from tests.support.scripted_llm import Reply, Script
from tests.support.web import serves

pytestmark = pytest.mark.integration


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


def test_make_web_serves_the_relay_with_workers_and_stops_everything(redis_url, scripted_llm, scenario, tmp_path):
    _, marker = scenario(Script(Reply.tool_calls([("calculator", {"expression": "6*7"})]), Reply.text("42.")))
    port = free_port()
    env = dict(os.environ, SMITH_REDIS_URL=redis_url, SMITH_LLM_BASE_URL=scripted_llm.base_url,
               SMITH_WEB_PORT=str(port), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "examples.web.run"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: serves(base + "/"), 60.0, "make web's page")
        turn = httpx.post(f"{base}/conversations/web-demo/turns", json={"text": f"{marker} 6*7?"}).json()
        events = httpx.get(base + turn["events"], timeout=60).text
        assert '"type":"tool.result"' in events and '"content":"42"' in events and '"turn.completed"' in events
    finally:
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "stopped everything it started" in stderr
    assert demo_processes(redis_url) == []

