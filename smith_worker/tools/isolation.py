"""Where a tool worker runs sync tools, and what it does about the ones that overrun.

Python cannot stop a thread. A sync tool (a plain ``def``) that overruns its
timeout has its call answered with a timeout error, but its thread runs on
until the function returns. So that such threads never take capacity from
other tools:

* sync tools run on a dedicated thread pool of ``job_slots + overrun_limit``
  threads: every job slot of the worker has a thread even while
  ``overrun_limit - 1`` overrunning threads linger (the event loop's default
  executor, ``min(32, cpus + 4)`` threads, would be starved by a few);
* a call whose task is cancelled (timeout or abort) while its thread still
  runs counts as *overrunning* until the thread ends;
* when ``overrun_limit`` threads overrun at once, ``on_limit`` is called once:
  the tool worker stops taking jobs, drains, and re-executes itself
  (:mod:`smith_worker.queue.worker`), which is the only way to get rid of them.

A tool declared with ``isolation="process"`` runs in a process of a
:class:`pebble.ProcessPool` instead, and its process is killed when the call
times out or is cancelled (pebble replaces it), so nothing lingers. Its
function and arguments must pickle (a module-level function), and so must
its result.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pebble

logger = logging.getLogger("agent_smith.tool")

#: Default number of overrunning sync-tool threads that makes a tool worker restart.
DEFAULT_OVERRUN_LIMIT = 10
#: Seconds pebble waits past a call's timeout before killing its process itself.
PROCESS_TIMEOUT_SLACK = 1.0
#: Default number of processes for ``isolation="process"`` tools.
DEFAULT_TOOL_PROCESSES = 4


class ToolExecutors:
    """The thread pool and the process pool of one tool-worker process (see the module docstring).

    ``job_slots`` is the worker's concurrent job limit; ``overrun_limit``
    (≥ 1) the number of overrunning threads at which ``on_limit()`` is called
    (once, from whichever thread notices); ``processes`` the size of the
    process pool, started on the first process-isolated call.
    """

    def __init__(
        self,
        job_slots: int,
        overrun_limit: int = DEFAULT_OVERRUN_LIMIT,
        on_limit: Callable[[], None] | None = None,
        processes: int = DEFAULT_TOOL_PROCESSES,
    ) -> None:
        self.overrun_limit = max(1, overrun_limit)
        self.threads = ThreadPoolExecutor(max_workers=job_slots + self.overrun_limit, thread_name_prefix="smith-tool")
        self._on_limit = on_limit
        self._processes = max(1, processes)
        self._process_pool: pebble.ProcessPool | None = None
        self._lock = threading.Lock()
        self.overrunning = 0
        self.limit_reached = False

    async def run_in_thread(self, fn: Callable[..., Any], kwargs: dict[str, Any], deadline: float | None = None) -> Any:
        """``fn(**kwargs)`` on the thread pool (with the caller's context variables).

        If the awaiting task is cancelled while the thread still runs, the
        thread is counted as overrunning until it ends. ``deadline`` (event loop
        time, ``loop.time()``) is when the call's timeout fires: a cancel from then
        on is logged as the timeout, one before it (an aborted job) as a cancel.
        """
        future = self.threads.submit(contextvars.copy_context().run, functools.partial(fn, **kwargs))
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if not future.done():
                timed_out = deadline is not None and asyncio.get_running_loop().time() >= deadline
                self._overran(fn, future, "overran its timeout" if timed_out else "was cancelled")
            raise

    async def run_in_process(self, fn: Callable[..., Any], kwargs: dict[str, Any], timeout: float) -> Any:
        """``fn(**kwargs)`` in a pool process, killed after ``timeout`` seconds or when the caller is cancelled.

        Raises ``TimeoutError`` when pebble killed it (``timeout`` + 1 s), and
        ``pebble.ProcessExpired`` when the process died (e.g. a crash).
        """
        # pebble's own timeout is a backstop: the caller's deadline normally fires first and cancels
        future = self._pool().schedule(fn, kwargs=kwargs, timeout=timeout + PROCESS_TIMEOUT_SLACK)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()  # a running pebble task is stopped by terminating its process
            raise

    def start_processes(self) -> None:
        """Start the process pool now (at worker start), so the first call does not wait for it."""
        self._pool().schedule(os.getpid)  # pebble starts its processes on the first task

    def _pool(self) -> pebble.ProcessPool:
        if self._process_pool is None:
            # forkserver: never fork a process that runs threads and an event loop
            context = multiprocessing.get_context("forkserver")
            self._process_pool = pebble.ProcessPool(max_workers=self._processes, context=context)
        return self._process_pool

    def _overran(self, fn: Callable[..., Any], future: Future[Any], what: str) -> None:
        with self._lock:
            self.overrunning += 1
            count = self.overrunning
            reached = count >= self.overrun_limit and not self.limit_reached
            self.limit_reached = self.limit_reached or reached
        future.add_done_callback(self._overrun_ended)
        logger.warning(
            "sync tool %s %s; its thread keeps running (%d of %d overrunning)",
            getattr(fn, "__name__", fn),
            what,
            count,
            self.overrun_limit,
        )
        if reached and self._on_limit is not None:
            self._on_limit()

    def _overrun_ended(self, _future: Future[Any]) -> None:
        with self._lock:
            self.overrunning -= 1

    def close(self) -> None:
        """Stop both pools without waiting for overrunning threads (they end with the process)."""
        self.threads.shutdown(wait=False, cancel_futures=True)
        if self._process_pool is not None:
            self._process_pool.stop()
            self._process_pool.join()


_fallback: ToolExecutors | None = None


def default_executors() -> ToolExecutors:
    """Executors for a tool invoked outside a tool worker (tests, scripts): created on first use."""
    global _fallback
    if _fallback is None:
        _fallback = ToolExecutors(job_slots=4)
    return _fallback
