"""``smith-worker`` serving every shard of a sharded deployment (docs/cluster.md, Shards).

A worker process serves one shard (``SMITH_SHARD``): its queues, its Redis connections and, on Redis Cluster, its
slot's master. With ``SMITH_SHARDS`` > 1 and no ``SMITH_SHARD``, ``smith-worker`` runs the same command once per
shard, each child with ``SMITH_SHARD=k``, and stands for them as one worker: a Procfile keeps one line per queue,
scaled as before (each replica then serves every shard).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from types import FrameType

from smith_worker.config import Settings

logger = logging.getLogger("agent_smith.worker")

#: The signals passed on to every child: a stop (each child stops as a worker does on it).
FORWARDED = (signal.SIGTERM, signal.SIGINT)


def exit_code(status: int) -> int:
    """A child's ``os.wait`` status as a process exit code: its own, or 128 + the signal that killed it (a shell's
    convention)."""
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


class ShardProcesses:
    """One child worker per shard of ``shards`` (:meth:`Settings.each_shard`), started by :meth:`run` with this
    process's command, ``SMITH_SHARD=k`` and the shard's ``SMITH_HEARTBEAT_FILE`` when one is set."""

    def __init__(self, shards: list[Settings]) -> None:
        self.shards = shards
        self.children: dict[int, subprocess.Popen[bytes]] = {}  # pid → child
        self.stopping = False
        #: The signal :meth:`_stop_all` sent, and the children it reached (a stop may come while the set starts).
        self.stop_signal: int = signal.SIGTERM
        self.signalled: set[int] = set()

    def run(self) -> int:
        """Start the children and wait for every one to end; returns the exit code of this process.

        A forwarded signal reaches every child still running, also one that arrives while the children start (no
        more are started then). When a child ends by itself (a crash, a worker id
        taken by another process), the others are stopped with SIGTERM and this process exits with that child's
        code, so a supervisor restarts the set as it would one worker. After a stop that was asked for, the code is
        the first non-zero one of the children, else 0.
        """
        for signum in FORWARDED:
            signal.signal(signum, self._forward)
        argv = [sys.executable, *sys.orig_argv[1:]]
        for shard in self.shards:
            if self.stopping:  # a stop came while the set was starting: start no more
                break
            env = {**os.environ, "SMITH_SHARD": str(shard.shard)}
            if shard.heartbeat_file:
                env["SMITH_HEARTBEAT_FILE"] = shard.heartbeat_file
            child = subprocess.Popen(argv, env=env)
            self.children[child.pid] = child
            if self.stopping and child.pid not in self.signalled:  # the stop came before the child was listed
                self._signal(child.pid, self.stop_signal)
        logger.info("serving %d shards with worker processes %s", len(self.shards), sorted(self.children))
        return self._wait()

    def _wait(self) -> int:
        code = 0
        while self.children:
            pid, status = os.wait()  # retried after a signal's handler ran (PEP 475)
            child = self.children.pop(pid, None)
            if child is None:
                continue
            child.returncode = exit_code(status)
            if not self.stopping:
                logger.warning(
                    "the worker of a shard (pid %d) ended with code %d: stopping the others", pid, child.returncode
                )
                self._stop_all(signal.SIGTERM)
                code = child.returncode
            code = code or child.returncode
        return code

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self._stop_all(signum)

    def _stop_all(self, signum: int) -> None:
        """Send ``signum`` to every child not reaped yet (never ``Popen.poll``: in a signal handler it could reap a
        child :meth:`_wait` then waits for forever)."""
        self.stopping = True
        self.stop_signal = signum
        for pid in list(self.children):
            self._signal(pid, signum)

    def _signal(self, pid: int, signum: int) -> None:
        """Send ``signum`` to child ``pid`` (gone already: nothing to do) and note that it was reached."""
        self.signalled.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
