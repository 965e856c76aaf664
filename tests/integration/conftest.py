"""Fixtures of the integration tests that several modules use."""

from __future__ import annotations

import pytest

from smith_worker.local.processes import start_redis_cluster
from tests.conftest import LOGS


@pytest.fixture(scope="module")
def cluster():
    """A real Redis Cluster of 3 masters and 3 replicas on loopback, one per test module (modules kill masters and
    move slots)."""
    LOGS.mkdir(parents=True, exist_ok=True)
    with start_redis_cluster(3, log_dir=LOGS) as rig:
        yield rig
