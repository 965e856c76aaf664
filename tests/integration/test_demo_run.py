"""`make demo`'s orchestration: it starts workers, runs one streamed turn, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
import redis

from tests.conftest import ROOT
from tests.support.scripted_llm import Reply, Script

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
    assert redis.Redis.from_url(redis_url).keys("smith-demo-*") == []
