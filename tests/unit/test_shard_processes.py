"""``smith-worker`` serving every shard (smith_worker/shard_processes.py): a stop that arrives while the set is still
starting its children reaches every child started, and no more are started, so the set ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from smith_worker import shard_processes
from smith_worker.config import Settings
from smith_worker.shard_processes import FORWARDED, ShardProcesses

#: Each child: a process that runs until a signal ends it (at most this long, seconds).
CHILD_LIFE = 30.0


def test_a_stop_while_the_children_start_reaches_each_started_and_starts_no_more(monkeypatch):
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-c", f"import time; time.sleep({CHILD_LIFE})"])
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        started.append(child)
        if len(started) == 2:  # SIGTERM comes as the second child starts, before the set has listed it
            os.kill(os.getpid(), signal.SIGTERM)
        return child

    monkeypatch.setattr(shard_processes.subprocess, "Popen", popen)
    handlers = {signum: signal.getsignal(signum) for signum in FORWARDED}
    begun = time.monotonic()
    try:
        code = ShardProcesses(Settings(redis_url="redis://127.0.0.1:1/0", shards=4).each_shard()).run()
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for child in started:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert time.monotonic() - begun < CHILD_LIFE / 2  # every child it started got the stop
    assert len(started) == 2  # none started after it
    assert code == 128 + signal.SIGTERM  # the children had no handler of their own
