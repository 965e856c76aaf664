"""Prometheus metrics of one worker process, served at ``/metrics`` on ``SMITH_METRICS_PORT``.

Names and labels (Prometheus conventions,
https://prometheus.io/docs/practices/naming/: counters end in
``_total``, durations in base units):

===================================  =========  =======================================================
metric                               type       meaning
===================================  =========  =======================================================
``smith_turns_total{agent,status,tenant}``  counter  turns ended here; ``status`` completed | failed | cancelled
``smith_turn_duration_seconds``      histogram  seconds from an attempt's start to the turn's end
``smith_tool_calls_total{tool,status}``  counter  tool calls run here; ``status`` ok | error
``smith_tool_duration_seconds``      histogram  seconds one tool call ran
``smith_queue_length{queue}``        gauge      jobs of this worker's arq queue (ready, running, deferred: its
                                                ZCARD, all KEDA's ``redis`` scaler reads) and the turn jobs
                                                waiting for admission to it (docs/architecture.md, Fair pickup)
``smith_queue_wait_seconds{queue}``  gauge      age of the oldest job not picked up: due on the queue without
                                                an in-progress key (among its oldest ``DUE_SCAN_LIMIT`` due
                                                jobs), or waiting for admission (0 when none); NaN when Redis
                                                does not answer
``smith_turns_running``              gauge      turns running in this process
``smith_turns_paused``               gauge      turns of the deployment paused for a person (ZCARD of
                                                ``{p}:paused``; the same on every worker: take the max, not
                                                the sum); NaN when Redis does not answer
``smith_worker_up``                  gauge      1 while the worker serves
``smith_llm_requests_total{agent,status,tenant}``  counter  model calls made for ``agent``; ``status`` ok | error
``smith_llm_tokens_total{agent,kind,tenant}``     counter  server-reported tokens of ``agent``'s model calls; ``kind``
                                                prompt | completion (OTel GenAI ``gen_ai.token.type`` input |
                                                output); their sum is the total
===================================  =========  =======================================================

``agent`` is the agent a model call was made for (its replies, its memory's summaries, the MCP sampling its tool
calls served: a tool worker counts those), one of the app's declared agents, so the label stays bounded. The
deployment (``SMITH_PREFIX``, a tenant's) is the worker's own: tell deployments apart by the scrape target's
labels (docs/architecture.md, Token usage).

``tenant`` is the turn's tenant (``send(..., tenant=)``, docs/architecture.md, Tenants): ``""`` for a turn with none;
the first ``SMITH_TENANT_LABELS_MAX`` distinct tenants this process counts keep their own value, later ones are
counted under :data:`OTHER_TENANTS` (``other``: :class:`TenantLabels`), so the label stays bounded. A query that
sums over the other labels (``sum by (agent) (...)``) reads what it read before the label.

The two queue gauges and ``smith_turns_paused`` are read from Redis at
scrape time by :class:`QueueCollector` (on the worker's event loop, so no
extra connection), in two round trips, so they exist from the first scrape; the queue's jobs are counted as
``smith status`` counts them (``smith_client.registry.read_queue_counts``). The turn and tool paths
call the narrow ``record_*`` hooks of :class:`WorkerMetrics`; every process
has one (counting is cheap), the HTTP server starts only when a port is set.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis.asyncio import Redis

from smith_client.keys import Keys, now_ms
from smith_client.registry import read_queue_counts
from smith_client.roundtrip import RoundTrip

logger = logging.getLogger("agent_smith.worker")


class _Usage(Protocol):
    @property
    def prompt(self) -> int: ...
    @property
    def completion(self) -> int: ...


class _Message(Protocol):
    @property
    def usage(self) -> _Usage | None: ...


class _Response(Protocol):
    """What :meth:`WorkerMetrics.count_llm_request` reads of a model response (``smith_worker.llm.LlmResponse``):
    the process services stay below the LLM client, which uses them (redaction, retry)."""

    @property
    def message(self) -> _Message: ...


Response = TypeVar("Response", bound=_Response)

#: Seconds a scrape waits for the queue gauges before reporting NaN.
SCRAPE_REDIS_TIMEOUT = 2.0


class QueueCollector(Collector):
    """``smith_queue_length`` and ``smith_queue_wait_seconds`` of one arq queue (its jobs and the turn jobs waiting
    for admission to it, :func:`~smith_client.registry.read_queue_counts`, as ``smith status`` counts them), and
    ``smith_turns_paused`` (the size of the ``paused`` ZSET, ``Keys.paused``), read at scrape time.

    ``collect`` runs in the HTTP server's thread and asks the worker's event
    loop for the figures, waiting at most :data:`SCRAPE_REDIS_TIMEOUT` seconds.
    """

    def __init__(self, redis: Redis, queue: str, paused: str, loop: asyncio.AbstractEventLoop) -> None:
        self.redis = redis
        self.queue = queue
        self.paused = paused
        self.loop = loop

    async def read(self) -> tuple[float, float, float]:
        """(length, wait seconds) of the queue (``QueueCounts.length``, ``QueueCounts.wait_seconds``), and
        the number of paused turns; in two round trips. Raises redis-py's errors."""
        now = now_ms()
        rt = RoundTrip()
        paused = rt.call("zcard", self.paused, parse=float)
        counts = (await read_queue_counts(self.redis, [self.queue], now, rt))[self.queue]
        return float(counts.length), counts.wait_seconds(now), paused.value

    def collect(self) -> Iterator[Metric]:
        """The three gauges for this scrape; NaN values when Redis did not answer in time."""
        future = None
        try:  # the loop may be closed already (worker shutting down): that is a failed read too
            future = asyncio.run_coroutine_threadsafe(self.read(), self.loop)
            length, wait, paused = future.result(SCRAPE_REDIS_TIMEOUT)
        except Exception:  # Redis down or slow: the series stay, with no value to give
            if future is not None:
                future.cancel()
            logger.warning("metrics: reading queue %s failed", self.queue, exc_info=True)
            length = wait = paused = math.nan
        yield self._gauge(
            "smith_queue_length", "Jobs of the arq queue (ready, running, deferred) and waiting for admission.", length
        )
        yield self._gauge(
            "smith_queue_wait_seconds", "Age of the oldest job not picked up (ready, or waiting for admission).", wait
        )
        yield GaugeMetricFamily("smith_turns_paused", "Turns paused for a person (the deployment's).", value=paused)

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=["queue"])
        family.add_metric([self.queue], value)
        return family


#: The ``tenant`` label value of the tenants past the first ``SMITH_TENANT_LABELS_MAX`` this process saw (a tenant
#: named ``other`` has that value too: name none so where the split matters).
OTHER_TENANTS = "other"
#: Default of ``SMITH_TENANT_LABELS_MAX``: distinct tenant label values one process keeps.
DEFAULT_TENANT_LABELS_MAX = 100


class TenantLabels:
    """The ``tenant`` label value of a turn's tenant, with bounded cardinality: ``""`` for none, the tenant itself
    for the first ``limit`` distinct tenants seen by this process, :data:`OTHER_TENANTS` for any later one
    (until the process restarts). Used from the worker's event loop only."""

    def __init__(self, limit: int = DEFAULT_TENANT_LABELS_MAX) -> None:
        self.limit = limit
        self._kept: set[str] = set()

    def __call__(self, tenant: str | None) -> str:
        """The label value for ``tenant`` (None: no tenant)."""
        if not tenant:
            return ""
        if tenant in self._kept:
            return tenant
        if len(self._kept) < self.limit:
            self._kept.add(tenant)
            return tenant
        return OTHER_TENANTS


class WorkerMetrics:
    """The metrics of one worker process, in a registry of their own (see the module docstring); ``tenant_labels``
    maps a turn's tenant to its label value (:class:`TenantLabels`, its ``limit`` set from
    ``SMITH_TENANT_LABELS_MAX`` by the runtime)."""

    def __init__(self, tenant_labels_max: int = DEFAULT_TENANT_LABELS_MAX) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.tenant_labels = TenantLabels(tenant_labels_max)
        self.turns = Counter("smith_turns", "Turns ended on this worker.", ["agent", "status", "tenant"], registry=r)
        self.turn_duration = Histogram(
            "smith_turn_duration_seconds",
            "Seconds from attempt start to turn end.",
            registry=r,
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
        )
        self.tool_calls = Counter("smith_tool_calls", "Tool calls run on this worker.", ["tool", "status"], registry=r)
        self.tool_duration = Histogram("smith_tool_duration_seconds", "Seconds one tool call ran.", registry=r)
        self.turns_running = Gauge("smith_turns_running", "Turns running in this process.", registry=r)
        self.worker_up = Gauge("smith_worker_up", "1 while this worker serves its queue.", registry=r)
        self.llm_requests = Counter(
            "smith_llm_requests", "Model calls per agent.", ["agent", "status", "tenant"], registry=r
        )
        self.llm_tokens = Counter(
            "smith_llm_tokens",
            "Server-reported tokens per agent (prompt, completion).",
            ["agent", "kind", "tenant"],
            registry=r,
        )
        self._server: Any = None

    def record_turn(self, agent: str, status: str, seconds: float, tenant: str | None = None) -> None:
        """A turn (of ``tenant``, None: none) ended with ``status`` (completed, failed, cancelled) after ``seconds``."""
        self.turns.labels(agent=agent, status=status, tenant=self.tenant_labels(tenant)).inc()
        self.turn_duration.observe(seconds)

    def record_tool_call(self, tool: str, is_error: bool, seconds: float) -> None:
        """A tool call ran for ``seconds``."""
        self.tool_calls.labels(tool=tool, status="error" if is_error else "ok").inc()
        self.tool_duration.observe(seconds)

    async def count_llm_request(self, call: Awaitable[Response], agent: str, tenant: str | None = None) -> Response:
        """Await one model call made for ``agent`` in a turn of ``tenant`` (None: none) and count it: ``ok`` with
        its server-reported tokens, or ``error`` when it raises (a cancelled call is not counted)."""
        label = self.tenant_labels(tenant)
        try:
            response = await call
        except Exception:
            self.llm_requests.labels(agent=agent, status="error", tenant=label).inc()
            raise
        self.llm_requests.labels(agent=agent, status="ok", tenant=label).inc()
        usage = response.message.usage
        if usage is not None:
            self.llm_tokens.labels(agent=agent, kind="prompt", tenant=label).inc(usage.prompt)
            self.llm_tokens.labels(agent=agent, kind="completion", tenant=label).inc(usage.completion)
        return response

    def serve(self, port: int, redis: Redis, keys: Keys, queue: str, running: Callable[[], int]) -> bool:
        """Start ``/metrics`` on ``port`` (all interfaces) from the running event loop: ``queue``'s gauges and
        the paused turns of the deployment of ``keys``.

        Returns False, with a warning, when the port cannot be bound: the
        worker goes on without metrics rather than failing to start.
        """
        self.registry.register(QueueCollector(redis, queue, keys.paused, asyncio.get_running_loop()))
        self.turns_running.set_function(running)
        self.worker_up.set(1)
        try:
            self._server, _ = start_http_server(port, registry=self.registry)
        except OSError as exc:
            logger.warning("metrics: cannot listen on port %d (%s); running without /metrics", port, exc)
            return False
        logger.info("metrics: serving /metrics on port %d", port)
        return True

    def close(self) -> None:
        """Stop the HTTP server (at worker shutdown)."""
        self.worker_up.set(0)
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
