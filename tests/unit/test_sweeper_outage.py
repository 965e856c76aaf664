"""A Redis outage makes the crash-recovery sweep log one line per pass, not a traceback."""

from __future__ import annotations

import asyncio
import logging

import redis.asyncio as aioredis

from smith_client.keys import Keys
from smith_worker.local.processes import free_port
from smith_worker.turn.sweeper import sweep_forever


async def test_a_sweep_during_an_outage_logs_one_line_without_traceback(caplog):
    down = aioredis.Redis(port=free_port(), socket_connect_timeout=1)  # nothing listens there
    caplog.set_level(logging.WARNING, logger="agent_smith.worker")
    task = asyncio.create_task(sweep_forever(down, Keys("sw"), interval=0.05))
    await asyncio.sleep(0.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await down.aclose()
    records = [r for r in caplog.records if "sweep" in r.getMessage()]
    assert records and all(r.exc_info is None and "Redis unavailable" in r.getMessage() for r in records)
