"""arq workers for the two queues: ``turns`` (the agent loop) and ``tools`` (tool calls).

Turns and tools are separate queues served by separate processes, so a turn
waiting on its tools never holds the slots its tools need (arq-notes.md
§4.2). arq settings are chosen deliberately (arq-notes.md §4):

* ``poll_delay`` 0.02 s (turns) / 0.01 s (tools): arq only polls; its 0.5 s
  default adds half a second per hop;
* ``queue_read_limit`` well above the fleet's concurrency, so idle workers are
  not blinded by running jobs at the head of the queue;
* ``allow_abort_jobs`` so timed-out tool jobs can be aborted;
* ``health_check_interval`` 10 s instead of an hour;
* ``max_tries`` 1 for tools: a tool call is never silently re-run after a
  crash; 3 for turns.

A tool worker whose overrunning sync-tool threads reach their limit
(:mod:`smith_worker.isolation`) stops taking jobs and drains like at a
signal; ``smith-worker`` then re-executes itself.
"""

from __future__ import annotations

import functools
import signal
from typing import Any

from arq.worker import Worker, func

from smith_client.errors import InvalidRequestError
from smith_client.jobs import RUN_TOOL, RUN_TURN, TurnJob
from smith_client.serialization import job_deserializer, job_serializer
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.redaction import redact_error
from smith_worker.turn import TurnRunner, fail_unreadable_turn
from smith_client.connection import connect_redis
from smith_worker.runtime import Queue, TurnServices, WorkerRuntime
from smith_worker.tool_runner import run_tool

#: Minimum ``queue_read_limit`` (arq-notes.md §4.2: at least 2x the fleet's concurrency on the queue).
MIN_QUEUE_READ_LIMIT = 1000


async def run_turn(ctx: dict[str, Any], payload: dict[str, Any]) -> None:
    """arq job function: run one turn. A malformed payload fails the turn, never the worker."""
    rt: WorkerRuntime = ctx["runtime"]
    services: TurnServices = ctx["turn_services"]
    try:
        job = TurnJob.model_validate(payload)
    except ValueError as exc:
        turn_id = str(payload.get("turn_id", "")) if isinstance(payload, dict) else ""
        if turn_id:
            error = InvalidRequestError(f"malformed turn payload: {exc}", field="payload")
            await fail_unreadable_turn(rt, turn_id, redact_error(error))
        return
    await TurnRunner(rt, services, job).run()


def build_worker(app: SmithApp, queue: Queue, settings: Settings | None = None, **overrides: Any) -> Worker:
    """An arq :class:`Worker` serving ``queue`` for ``app``. ``overrides`` go to ``Worker(...)``.

    Raises :class:`~smith_client.errors.ConfigurationError` for an agent's bad ``subagents`` (seed §14.1).
    """
    app.resolve_subagents()
    settings = settings or app.settings
    redis = connect_redis(settings.redis_url)
    runtime = WorkerRuntime(app=app, queue=queue, settings=settings, redis=redis)

    async def on_startup(ctx: dict[str, Any]) -> None:
        ctx["runtime"] = runtime
        await runtime.start()
        ctx["turn_services"] = runtime.turn_services

    async def on_shutdown(ctx: dict[str, Any]) -> None:
        await runtime.stop()

    if queue == "turns":
        functions = [func(run_turn, name=RUN_TURN, timeout=settings.turn_job_timeout, max_tries=3, keep_result=0)]
        max_jobs, poll_delay, completion_wait = settings.turn_max_jobs, settings.turn_poll_delay, 0
    else:
        functions = [func(run_tool, name=RUN_TOOL, timeout=settings.tool_job_timeout, max_tries=1, keep_result=60)]
        max_jobs, poll_delay, completion_wait = settings.tool_max_jobs, settings.tool_poll_delay, 10
    options: dict[str, Any] = dict(
        functions=functions,
        queue_name=runtime.keys.turns_queue if queue == "turns" else runtime.keys.tools_queue,
        redis_pool=redis,
        on_startup=on_startup,
        on_shutdown=on_shutdown,
        max_jobs=max_jobs,
        poll_delay=poll_delay,
        queue_read_limit=max(MIN_QUEUE_READ_LIMIT, 4 * max_jobs),
        allow_abort_jobs=True,
        health_check_interval=10,
        job_completion_wait=completion_wait,
        job_serializer=job_serializer,
        job_deserializer=job_deserializer,
    )
    options.update(overrides)
    worker = Worker(ctx={"runtime": runtime}, **options)
    # stop polling, let running jobs finish (job_completion_wait), then end run(): the drain before a restart
    runtime.stop_taking_jobs = functools.partial(worker.handle_sig_wait_for_completion, signal.SIGUSR1)
    return worker
