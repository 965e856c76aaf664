"""A worker's poll drops only the job tasks that finished, listed by their done callbacks
(smith_worker/queue/worker.py): it never walks every task in flight, thousands on a turn worker
(docs/capacity.md)."""

from __future__ import annotations

import asyncio
import functools

from smith_worker import SmithApp
from smith_worker.config import Settings
from smith_worker.queue.worker import build_worker


def _worker():
    app = SmithApp()
    app.agent("default")
    return build_worker(app, "turns", Settings(redis_url="redis://127.0.0.1:1/0", prefix="reap"))


async def _start(worker, job_id: str, work) -> asyncio.Task[None]:
    """A job task as the worker's claim starts one: a slot taken, the done callback set."""
    await worker.sem.acquire()
    worker.job_counter += 1
    task = asyncio.create_task(work)
    task.add_done_callback(functools.partial(worker._job_done, job_id))
    worker.tasks[job_id] = task
    return task


async def _fail() -> None:
    raise RuntimeError("its end was not recorded")


async def test_a_poll_drops_the_finished_tasks_and_keeps_the_running_ones(caplog):
    worker = _worker()
    try:
        running = await _start(worker, "running", asyncio.Event().wait())
        await _start(worker, "finished", asyncio.sleep(0))
        failed = await _start(worker, "failed", _fail())
        await asyncio.sleep(0.01)
        assert failed.done() and worker.job_counter == 1  # the callbacks freed the finished jobs' slots
        worker._reap_finished_jobs()
        assert worker.tasks == {"running": running}
        assert sorted(worker._ended) == ["failed", "finished"]
        assert "job failed could not record its end: RuntimeError" in caplog.text
        worker._reap_finished_jobs()  # nothing finished since: nothing visited, nothing listed twice
        assert sorted(worker._ended) == ["failed", "finished"]
        running.cancel()
    finally:
        await worker.pool.aclose()


async def test_a_job_claimed_again_before_the_poll_keeps_its_new_task():
    worker = _worker()
    try:
        await _start(worker, "job", asyncio.sleep(0))
        await asyncio.sleep(0.01)
        again = await _start(worker, "job", asyncio.Event().wait())  # the same job id, claimed again
        worker._reap_finished_jobs()
        assert worker.tasks == {"job": again}
        again.cancel()
    finally:
        await worker.pool.aclose()
