"""Workers on a Redis Cluster that stops answering (every node killed) still stop promptly on SIGTERM.

A slot-pinned connection rides out a failover by retrying for ~15 s (``SLOT_RETRIES``), so each Redis step of a
shutdown (handing the running turn off, arq's health key, the registration) used to wait that long in turn: a turn
worker took 62 s to stop, past a 30 s grace period (deploy/README.md, Shutdown). The shutdown's Redis work now ends
within ``SHUTDOWN_REDIS_SECONDS``; a turn not handed off is run again once its lease ends.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid

import pytest

from smith_client import SmithClient
from smith_worker.local.processes import start_redis_cluster
from smith_worker.testing import Reply, Script
from smith_worker.testing.workers import start_workers, wait_for_workers, worker_env
from tests.conftest import LOGS

pytestmark = [pytest.mark.integration]

#: A Kubernetes pod's default grace period, seconds: the workers must be gone well before it.
GRACE = 30.0


async def test_workers_stop_within_the_grace_period_when_no_cluster_node_answers(scripted_llm):
    LOGS.mkdir(parents=True, exist_ok=True)
    prefix = f"down{uuid.uuid4().hex[:6]}"
    gate = threading.Event()
    key = uuid.uuid4().hex[:12]
    scripted_llm.add_scenario(key, Script(Reply.text("never sent", gate=gate)))
    with start_redis_cluster(1, log_dir=LOGS) as rig:
        env = worker_env(rig.urls[0], prefix, scripted_llm.base_url, SMITH_REDIS_CLUSTER="1")
        procs = start_workers("tests.support.cluster_app:app", env, ["turns", "tools"], prefix, log_dir=LOGS)
        try:
            await wait_for_workers(rig.urls[0], prefix, 2, cluster=True)
            async with SmithClient.from_url(rig.urls[0], prefix=prefix, cluster=True) as client:
                turn = await client.submit(f"[[scenario:{key}]] hi", conversation_id=f"c-{key}")
                async with asyncio.timeout(30):
                    while await turn.status() != "running":
                        await asyncio.sleep(0.05)
            for node in rig.nodes.values():
                node.signal(signal.SIGKILL)
            await asyncio.sleep(1.0)  # the workers' next commands fail
            stopping = time.monotonic()
            for proc in procs:
                proc.signal(signal.SIGTERM)
            async with asyncio.timeout(3 * GRACE):
                while any(proc.alive() for proc in procs):
                    await asyncio.sleep(0.1)
            took = time.monotonic() - stopping
            assert took < GRACE, f"stopped after {took:.1f} s"  # ~SHUTDOWN_REDIS_SECONDS; 62 s without the bound
            assert [proc.proc.returncode for proc in procs if proc.proc is not None] == [0, 0]  # a clean stop
        finally:
            gate.set()
            for proc in procs:
                proc.stop()
