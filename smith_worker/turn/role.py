"""The turn worker's role: the ``turns`` queue, the ``run_turn`` job and what a turn worker adds to its runtime.

A turn worker serves the app's agents. It adds one ``httpx.AsyncClient`` per
process for the model (docs/architecture.md, Process roles), one pub/sub subscription for tool-job
replies and control messages (:class:`~smith_worker.tools.waiter.WorkerSubscription`),
the tool-job waiter, the turns running here, and the crash-recovery sweeper.
"""

from __future__ import annotations

import logging
from typing import Any

from smith_client.errors import InvalidRequestError
from smith_client.jobs import RUN_TURN, TurnJob
from smith_client.keys import Keys
from smith_worker.agent.context import TurnServices
from smith_worker.app import SmithApp
from smith_worker.config import Settings
from smith_worker.ops.redaction import redact_error
from smith_worker.routing import turn_capabilities
from smith_worker.runtime import Queue, RoleJob, WorkerRole, WorkerRuntime
from smith_worker.tools.waiter import ToolJobWaiter, WorkerSubscription
from smith_worker.turn.lifecycle import TurnExecution, fail_unreadable_turn
from smith_worker.turn.sweeper import sweep_forever

logger = logging.getLogger("agent_smith.worker")

#: Seconds arq's job timeout adds to ``SMITH_TURN_JOB_TIMEOUT``, so the turn's own bound fires first
#: and has time to write its terminal event.
TURN_TIMEOUT_GRACE = 30.0


class TurnRole(WorkerRole):
    """A turn worker (see the module docstring). ``services`` and ``subscription`` exist once :meth:`start` ran."""

    queue: Queue = "turns"

    def __init__(self) -> None:
        self.services: TurnServices | None = None
        self.subscription: WorkerSubscription | None = None

    def queue_name(self, keys: Keys) -> str:
        """The turns queue."""
        return keys.turns_queue

    def capabilities(self, app: SmithApp) -> list[str]:
        """The app's agents (:func:`~smith_worker.routing.turn_capabilities`)."""
        return turn_capabilities(app)

    def check(self, app: SmithApp, settings: Settings) -> None:
        """Warn when ``app`` declares no agents (clients asking for any agent get ``UnknownAgentError``);
        raise :class:`~smith_client.errors.ConfigurationError` for LLM settings invalid for any agent
        (``SMITH_LLM_TOOL_CALLING``, an agent's ``llm`` override), so the worker exits at start rather
        than failing every turn."""
        if not app.agents:
            logger.warning("the app declares no agents: this turn worker serves none (declare one with app.agent(...))")
        for spec in app.agents.values():
            settings.llm_config(spec.llm)

    def job(self, settings: Settings, keys: Keys) -> RoleJob:
        """``run_turn``: up to 3 tries; the turn bounds itself by ``turn_job_timeout`` (a typed failure), so
        arq's timeout, :data:`TURN_TIMEOUT_GRACE` s later, is only a backstop. Turns are cancelled through
        their own state, never aborted, and a stopping worker hands its turns off at once. A turn job due now
        waits for admission on its tenant's waiting list (docs/architecture.md, Fair pickup)."""
        return RoleJob(
            name=RUN_TURN,
            function=self.run_turn,
            timeout=settings.turn_job_timeout + TURN_TIMEOUT_GRACE,
            max_tries=3,
            keep_result=0,
            max_jobs=settings.turn_max_jobs,
            completion_wait=0,
            aborts_channel=None,
            admitted=True,
        )

    def registration(self, app: SmithApp) -> dict[str, Any]:
        """The app's agents."""
        return {"agents": sorted(app.agents), "tools": [], "overrunning_threads": 0}

    async def start(self, runtime: WorkerRuntime) -> None:
        """Open the model's HTTP client and subscribe to the worker's reply and control channels (waiting
        while Redis does not answer); start the crash-recovery sweeper."""
        from smith_worker.llm.http import model_http_client  # aiohttp: only a turn worker pays its import

        keys = runtime.keys
        subscription = WorkerSubscription(
            runtime.redis, keys.worker_replies_channel(runtime.worker_id), keys.control_channel, self.on_control,
            health=runtime.health,
        )  # fmt: skip
        await subscription.start()
        self.subscription = subscription
        waiter = ToolJobWaiter(runtime.redis, keys, subscription)
        http = model_http_client(runtime.settings.llm_max_connections)
        self.services = TurnServices(http, waiter, runtime.rate_limits)
        # crash recovery: re-enqueue turns whose worker stopped renewing their lease
        runtime.run_in_background(sweep_forever(runtime.redis, keys))

    def on_control(self, turn_id: str) -> None:
        """A control message: cancel ``turn_id`` if it runs here (its state says why)."""
        turn = self.services.running_turns.get(turn_id) if self.services else None
        if turn is not None:
            turn.request_cancel()

    def running(self) -> int:
        """Turns running in this process."""
        return len(self.services.running_turns) if self.services else 0

    def stop_now(self) -> None:
        """Make sure every running turn is handed off
        (:meth:`~smith_worker.turn.lifecycle.TurnExecution.hand_off_soon`)."""
        for turn in list(self.services.running_turns.values()) if self.services else []:
            turn.hand_off_soon()

    async def close(self) -> None:
        """Stop the subscription and close the HTTP client."""
        if self.subscription is not None:
            await self.subscription.stop()
        if self.services is not None:
            await self.services.http.aclose()

    async def run_turn(self, ctx: dict[str, Any], payload: dict[str, Any]) -> None:
        """arq job function: run one turn. A malformed payload fails the turn, never the worker."""
        rt: WorkerRuntime = ctx["runtime"]
        try:
            job = TurnJob.model_validate(payload)
        except ValueError as exc:
            turn_id = str(payload.get("turn_id", "")) if isinstance(payload, dict) else ""
            if turn_id:
                error = InvalidRequestError(f"malformed turn payload: {exc}", field="payload")
                await fail_unreadable_turn(rt, turn_id, redact_error(error))
            return
        assert self.services is not None  # arq runs jobs only after on_startup started the runtime
        await TurnExecution(rt, self.services, job, ctx["job_id"]).run()
