"""A worker id (``SMITH_WORKER_ID``) is held by one live process at a time (smith_worker/ops/registration.py).

Real tool-worker processes of a prefix of their own, the session's redis-server:
a second process started with a live worker's id exits with a one-line
``ConfigurationError``; a process restarted with the id of one killed with
SIGKILL starts once the dead one's registration lapses (within its 15 s TTL),
and at once after a graceful stop; a frozen worker whose id was taken
meanwhile drains and exits when it wakes.
"""

from __future__ import annotations

import signal
import time
import uuid

import orjson
import pytest
import redis

from smith_client.keys import REGISTRATION_TTL, Keys
from smith_worker.local.processes import ManagedProcess, wait_until
from smith_worker.testing import start_workers, worker_env
from tests.conftest import LOGS

pytestmark = pytest.mark.integration

APP = "tests.support.app:app"
#: A generous ceiling on anything that takes one registration lifetime (REGISTRATION_TTL, 15 s).
LAPSE_CEILING = 5 * REGISTRATION_TTL


class Fleet:
    """Tool workers of one prefix, all started with the same ``SMITH_WORKER_ID``."""

    def __init__(self, redis_url: str, llm_url: str) -> None:
        self.prefix = f"wid{uuid.uuid4().hex[:6]}"
        self.worker_id = f"tools-{uuid.uuid4().hex[:4]}"
        self.env = worker_env(redis_url, self.prefix, llm_url, SMITH_WORKER_ID=self.worker_id)
        self.redis = redis.Redis.from_url(redis_url)
        self.procs: list[ManagedProcess] = []

    def start(self) -> ManagedProcess:
        (proc,) = start_workers(APP, self.env, ["tools"], f"{self.prefix}-{len(self.procs)}", log_dir=LOGS)
        self.procs.append(proc)
        return proc

    def holder_pid(self) -> int | None:
        raw = self.redis.get(Keys(self.prefix).worker(self.worker_id))
        return orjson.loads(raw)["pid"] if raw else None

    def wait_registered(self, proc: ManagedProcess, timeout: float) -> float:
        """Seconds until ``proc`` holds the id."""
        started = time.monotonic()
        wait_until(lambda: self.holder_pid() == proc.pid, timeout, f"registration of pid {proc.pid}")
        return time.monotonic() - started

    def close(self) -> None:
        for proc in self.procs:
            proc.signal(signal.SIGCONT)
            proc.stop()
        self.redis.close()


@pytest.fixture
def fleet(redis_url, scripted_llm):
    fleet = Fleet(redis_url, scripted_llm.base_url)
    yield fleet
    fleet.close()


def _log(proc: ManagedProcess) -> str:
    assert proc.log_path is not None
    return proc.log_path.read_text()


def test_a_second_process_with_a_live_workers_id_is_refused_and_a_killed_ones_id_is_taken_over(fleet):
    first = fleet.start()
    fleet.wait_registered(first, 60)

    twin = fleet.start()
    wait_until(lambda: not twin.alive(), LAPSE_CEILING, "the twin's exit")
    assert twin.proc.returncode == 1
    (refusal,) = [line for line in _log(twin).splitlines() if "ConfigurationError" in line]  # one line
    assert refusal.startswith(
        f"smith-worker: ConfigurationError: worker id {fleet.worker_id!r} is held by a live worker (pid {first.pid} "
    )
    assert first.alive() and fleet.holder_pid() == first.pid

    first.signal(signal.SIGKILL)  # its registration lives on until its TTL
    restarted = fleet.start()
    fleet.wait_registered(restarted, LAPSE_CEILING)
    assert "waiting up to 15 s for that registration to lapse" in _log(restarted)
    assert restarted.alive()

    assert restarted.stop() == 0  # a graceful stop unregisters: the next start takes the id at once
    again = fleet.start()
    fleet.wait_registered(again, 60)
    assert "waiting up to" not in _log(again)


def test_a_frozen_worker_whose_id_was_taken_drains_and_exits_when_it_wakes(fleet):
    first = fleet.start()
    fleet.wait_registered(first, 60)
    first.signal(signal.SIGSTOP)  # no heartbeat: its registration lapses
    second = fleet.start()
    fleet.wait_registered(second, LAPSE_CEILING)

    first.signal(signal.SIGCONT)
    wait_until(lambda: not first.alive(), LAPSE_CEILING, "the woken worker's exit")
    assert first.proc.returncode == 1
    assert f"smith-worker: ConfigurationError: worker {fleet.worker_id!r} stopped: another process took its id" in _log(
        first
    )
    assert second.alive() and fleet.holder_pid() == second.pid
