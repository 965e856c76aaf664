"""The tool worker's role: the ``tools`` queue, the ``run_tool`` job and the pools its sync tools run on.

A tool worker serves the app's tools, tool sources and skills. Its sync tools
run on a thread pool, those declared ``isolation="process"`` on a process pool
(:class:`~smith_worker.tools.isolation.ToolExecutors`). When too many sync-tool
threads overran their timeouts, the worker stops taking jobs, drains and
re-executes itself (:meth:`~smith_worker.runtime.WorkerRuntime.request_restart`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from smith_client.jobs import RUN_TOOL
from smith_client.keys import Keys
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.routing import tool_capabilities
from smith_worker.runtime import Queue, RoleJob, WorkerRole, WorkerRuntime
from smith_worker.tool_worker.job import run_tool
from smith_worker.tools.isolation import ToolExecutors
from smith_worker.tools.source import SourceContext

#: Seconds a stopping tool worker waits for running tool calls (arq ``job_completion_wait``); deploy/
#: manifests give the process longer than this between SIGTERM and SIGKILL.
TOOL_JOB_COMPLETION_WAIT = 10

logger = logging.getLogger("agent_smith.worker")


class ToolRole(WorkerRole):
    """A tool worker (see the module docstring). ``executors`` exist once :meth:`open` ran."""

    queue: Queue = "tools"

    def __init__(self) -> None:
        self.executors: ToolExecutors | None = None
        self._runtime: WorkerRuntime | None = None

    def check(self, app: SmithApp, settings: Settings) -> None:
        """Warn when ``app`` declares no Python tool, tool source or skill: nothing to run. (A tools-only
        app is right for tool workers, so agents are not asked for.)"""
        if not (len(app.tools) or app.sources or app.skills.names()):
            logger.warning("the app declares no tools, tool sources or skills: this tool worker has nothing to run")

    def job(self, settings: Settings, keys: Keys) -> RoleJob:
        """``run_tool``: one try (a tool call is never silently re-run after a crash), bounded by
        ``tool_job_timeout``; abortable (timed-out or cancelled calls), announced on
        :attr:`~smith_client.keys.Keys.tool_aborts_channel`; a stopping worker waits
        :data:`TOOL_JOB_COMPLETION_WAIT` s for its running calls."""
        return RoleJob(
            name=RUN_TOOL,
            function=run_tool,
            timeout=settings.tool_job_timeout,
            max_tries=1,
            keep_result=60,
            max_jobs=settings.tool_max_jobs,
            completion_wait=TOOL_JOB_COMPLETION_WAIT,
            aborts_channel=keys.tool_aborts_channel,
        )

    def queue_name(self, keys: Keys) -> str:
        """The tools queue."""
        return keys.tools_queue

    def capabilities(self, app: SmithApp) -> list[str]:
        """What the app's tool routes can require (:func:`~smith_worker.routing.tool_capabilities`)."""
        return tool_capabilities(app)

    def registration(self, app: SmithApp) -> dict[str, Any]:
        """The app's Python tools and the sync-tool threads overrunning now."""
        return {"agents": [], "tools": app.tools.names(), "overrunning_threads": self.threads_left()}

    def open(self, runtime: WorkerRuntime) -> None:
        """Open the sync tools' thread pool, and their process pool when a tool asks for one."""
        self._runtime = runtime
        settings = runtime.settings
        self.executors = ToolExecutors(
            settings.tool_max_jobs, settings.tool_max_overruns, self._drain_to_restart, settings.tool_processes
        )
        if any(tool.isolation == "process" for tool in runtime.app.tools.all()):
            self.executors.start_processes()

    def source_context(self, shared: SourceContext) -> SourceContext:
        """``shared`` with the sync-tool pools."""
        return dataclasses.replace(shared, executors=self.executors)

    def threads_left(self) -> int:
        """Sync-tool threads overrunning their timeouts now."""
        return self.executors.overrunning if self.executors else 0

    async def close(self) -> None:
        """Close the pools (overrunning threads are abandoned)."""
        if self.executors is not None:
            self.executors.close()

    def _drain_to_restart(self) -> None:
        """Too many sync-tool threads overran: the worker drains, then re-executes itself."""
        if self._runtime is not None and self._runtime.request_restart():
            logger.error(
                "worker %s: %d sync-tool threads overran their timeouts; draining to restart",
                self._runtime.worker_id,
                self.threads_left(),
            )
