"""Tracing with OpenTelemetry on the worker side: setup, trace context in and out, spans (docs/architecture.md,
Tracing).

Off unless ``SMITH_OTEL=1`` (the worker's ``Settings.otel``) and the ``agent-smith[otel]`` extra is installed:
then :func:`setup` installs the SDK's tracer provider, configured the standard way (``OTEL_SERVICE_NAME``,
``OTEL_TRACES_SAMPLER``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_BSP_SCHEDULE_DELAY``…, read by the SDK), with
a batch processor exporting OTLP/HTTP. Off, nothing imports ``opentelemetry`` here and every function below is
a no-op costing one global read (:data:`NO_SPAN` is what :func:`span` returns then).

* :func:`span` — a span as a context manager, made current while it is open; its parent is the current span,
  or the trace context of ``carrier`` (a job's ``trace``: W3C ``traceparent``/``tracestate``). Attribute values
  go through the log redaction (:func:`~smith_worker.ops.redaction.redact_text`); an exception leaving the
  span sets its status and ``error.type`` (a :class:`~smith_client.errors.SmithError`'s ``kind``).
* :func:`inject` — the current trace context as a carrier for a job; :func:`trace_id` its trace id (hex).
* :func:`event` — an event on the current span (a retry, a resume).
* :func:`capture_content` — whether message content may enter spans
  (``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``).
* :func:`child_env` — the ``OTEL_*`` variables for a stdio MCP server (its own spans join the call's trace
  through the request's ``_meta``, which the MCP SDK fills in: SEP-414).

The span names and attributes follow the OpenTelemetry GenAI semantic conventions
(https://opentelemetry.io/docs/specs/semconv/gen-ai/).
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Literal

from smith_client.errors import SmithError
from smith_client.jobs import TurnJob
from smith_worker.ops.redaction import redact_json_deep, redact_text

logger = logging.getLogger("agent_smith.tracing")

#: The switch (environment): tracing in this worker process.
ENV_SWITCH = "SMITH_OTEL"
#: The GenAI conventions' switch for message content in spans.
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

SpanKindName = Literal["internal", "client", "server", "producer", "consumer"]
Attributes = Mapping[str, str | bool | int | float | list[str] | None]

#: Whether :func:`setup` turned tracing on in this process (read by every function below).
ENABLED = False
_tracer: Any = None
_provider: Any = None
_capture = False
#: The OpenTelemetry functions the spans use, bound once by :func:`setup` (no import on the hot path).
_otel: dict[str, Any] = {}


def setup(wanted: bool, service: str = "agent-smith-worker", **resource: str) -> bool:
    """Turn tracing on in this process when ``wanted`` (``SMITH_OTEL``); True when it is on (also when it was
    already).

    ``service`` is the ``service.name`` unless ``OTEL_SERVICE_NAME`` (or ``OTEL_RESOURCE_ATTRIBUTES``) sets one;
    ``resource`` adds resource attributes (e.g. ``smith.worker.id``). Logs a warning and stays off when the
    ``otel`` extra is not installed. Log lines written while a span is current get ``trace_id=<hex>``
    (:class:`TraceIdFilter` on the root handlers).
    """
    global _provider
    if ENABLED:
        return True
    if not wanted:
        return False
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        logger.warning(
            "SMITH_OTEL is set but OpenTelemetry is not installed (pip install 'agent-smith[otel]'): %s", exc
        )
        return False
    attributes: dict[str, str] = dict(resource)
    named = "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not os.environ.get("OTEL_SERVICE_NAME") and not named:
        attributes[SERVICE_NAME] = service
    _provider = TracerProvider(resource=Resource.create(attributes))  # sampler: OTEL_TRACES_SAMPLER
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # OTEL_EXPORTER_OTLP_*, OTEL_BSP_*
    trace.set_tracer_provider(_provider)  # the MCP SDK's spans use it too
    use_provider(_provider)
    return True


def use_provider(provider: Any) -> None:
    """Turn tracing on with ``provider`` (an OpenTelemetry ``TracerProvider``), as :func:`setup` does with its own:
    for tests, and for a process that configured OpenTelemetry itself."""
    global ENABLED, _tracer, _capture
    from opentelemetry import context, propagate, trace

    _tracer = provider.get_tracer("agent_smith")
    _otel.update(
        kinds={kind.name.lower(): kind for kind in trace.SpanKind},
        extract=propagate.extract,
        inject=propagate.inject,
        current=trace.get_current_span,
        in_context=trace.set_span_in_context,
        attach=context.attach,
        detach=context.detach,
        status=lambda message: trace.Status(trace.StatusCode.ERROR, message),
        unsampled=trace.NonRecordingSpan(
            trace.SpanContext(trace_id=1, span_id=1, is_remote=False, trace_flags=trace.TraceFlags(0))
        ),
    )
    _capture = os.environ.get(CAPTURE_ENV, "").strip().lower() == "true"
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, TraceIdFilter) for f in handler.filters):
            handler.addFilter(TraceIdFilter())
    ENABLED = True


#: Longest wait for the spans still buffered to be exported at shutdown, seconds (docs/architecture.md, Tracing).
SHUTDOWN_TIMEOUT_S = 3.0


def shutdown(timeout: float = SHUTDOWN_TIMEOUT_S) -> bool:
    """Export the spans still buffered and stop (a worker's shutdown), waiting ``timeout`` seconds at most; no-op
    (True) when off. False, with one warning logged, when the export did not end in time (a collector that hangs
    or is down: the SDK's retries alone take longer); what was not exported then is lost, as at a kill -9.

    The SDK's shutdown runs in a daemon thread, left behind when it overruns: it never holds the process."""
    global ENABLED
    if _provider is None or not ENABLED:
        return True
    ENABLED = False
    import threading

    stopper = threading.Thread(target=_provider.shutdown, name="otel-shutdown", daemon=True)
    stopper.start()
    stopper.join(timeout)
    if stopper.is_alive():
        logger.warning("tracing: spans not exported within %g s at shutdown were dropped", timeout)
        return False
    return True


def capture_content() -> bool:
    """Whether message content may enter spans (on, and ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
    is ``true``)."""
    return ENABLED and _capture


class NoSpan:
    """The span of tracing off: every method does nothing."""

    __slots__ = ()

    def __enter__(self) -> NoSpan:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None

    def set(self, key: str, value: Any) -> None:
        """Set attribute ``key`` (redacted; None values are skipped)."""

    def update(self, attributes: Attributes) -> None:
        """Set ``attributes`` (redacted; None values are skipped)."""

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        """Add event ``name`` with ``attributes`` (redacted)."""

    def error(self, error: BaseException) -> None:
        """Mark the span failed by ``error`` (``error.type`` its kind, the status message its redacted text)."""

    def fail(self, kind: str, message: str) -> None:
        """Mark the span failed: ``error.type`` ``kind``, status error with ``message`` (redacted), and an
        ``exception`` event (a failure that raised nothing here: a tool's error result)."""

    @property
    def trace_id(self) -> str:
        """The span's trace id, 32 hex digits ("" when off or the span is not sampled)."""
        return ""


#: What :func:`span` returns when tracing is off.
NO_SPAN = NoSpan()


class Span(NoSpan):
    """An open OpenTelemetry span (see :func:`span`)."""

    __slots__ = ("_span", "_token")

    def __init__(self, name: str, carrier: Mapping[str, str] | None, kind: SpanKindName, attributes: Attributes | None):
        self._span: Any = _tracer.start_span(
            name,
            context=_otel["extract"](carrier) if carrier else None,
            kind=_otel["kinds"][kind],
            attributes=_clean(attributes or {}),
            record_exception=False,
            set_status_on_exception=False,
        )
        self._token: Any = None

    def __enter__(self) -> Span:
        self._token = _otel["attach"](_otel["in_context"](self._span))  # current until __exit__
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, Exception):  # not a cancellation
            self.error(exc)
        try:
            _otel["detach"](self._token)
        finally:
            self._span.end()

    def set(self, key: str, value: Any) -> None:
        if value is not None:
            self._span.set_attribute(key, _value(value))

    def update(self, attributes: Attributes) -> None:
        self._span.set_attributes(_clean(attributes))

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self._span.add_event(name, _clean(attributes or {}))

    def error(self, error: BaseException) -> None:
        self.fail(error.kind if isinstance(error, SmithError) else type(error).__name__, str(error))

    def fail(self, kind: str, message: str) -> None:
        message = redact_text(message)
        self._span.set_attribute("error.type", kind)
        self._span.add_event("exception", {"exception.type": kind, "exception.message": message})
        self._span.set_status(_otel["status"](message))

    @property
    def trace_id(self) -> str:
        """The trace id when the span is sampled, "" otherwise (an unsampled span's trace reaches no backend:
        docs/architecture.md, Tracing)."""
        context = self._span.get_span_context()
        return format(context.trace_id, "032x") if context.trace_flags.sampled else ""


def span(
    name: str,
    *,
    carrier: Mapping[str, str] | None = None,
    kind: SpanKindName = "internal",
    attributes: Attributes | None = None,
) -> NoSpan:
    """A span named ``name`` to use as a context manager (``with span(...) as s:``): :data:`NO_SPAN` when off.

    Its parent is the trace context in ``carrier`` (W3C ``traceparent``/``tracestate``) when given, else the
    current span. ``attributes`` values are redacted (strings through :func:`redact_text`).
    """
    if not ENABLED:
        return NO_SPAN
    return Span(name, carrier, kind, attributes)


def attempt_span(job: TurnJob, attempt: int) -> NoSpan:
    """The ``invoke_agent <agent>`` span of attempt ``attempt`` of ``job``'s turn, a child of the job's trace
    context (the sender's span: every attempt of a turn is in one trace). ``smith.tenant`` is the turn's tenant,
    absent when it has none (docs/architecture.md, Tenants)."""
    if not ENABLED:
        return NO_SPAN
    attributes: dict[str, str | int] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": job.agent,
        "gen_ai.conversation.id": job.conversation_id,
        "smith.turn.id": job.turn_id,
        "smith.turn.attempt": attempt,
    }
    if job.tenant is not None:
        attributes["smith.tenant"] = job.tenant
    return Span(f"invoke_agent {job.agent}", job.trace, "internal", attributes)


def current() -> NoSpan:
    """The current span, to add to (:data:`NO_SPAN` when off or when no span is current)."""
    if not ENABLED:
        return NO_SPAN
    current_span = _otel["current"]()
    if not current_span.get_span_context().is_valid:
        return NO_SPAN
    wrapped = Span.__new__(Span)
    wrapped._span = current_span
    return wrapped


def background_context() -> contextvars.Context | None:
    """The context to start a long-lived background task in (an MCP connection's owner task), None when off
    (``create_task``'s default then: a copy of the current one). On, a copy of the current context whose
    current span is an unsampled placeholder: what runs there (the MCP SDK's handshakes and health pings) is not
    recorded (the default, parent-based samplers drop it) rather than joining the trace of whichever call
    happened to start the task."""
    if not ENABLED:
        return None
    ctx = contextvars.copy_context()
    ctx.run(_otel["attach"], _otel["in_context"](_otel["unsampled"]))
    return ctx


def event(name: str, attributes: Attributes | None = None) -> None:
    """Add event ``name`` to the current span (no-op when off or none is current)."""
    if ENABLED:
        current().event(name, attributes)


def inject() -> dict[str, str] | None:
    """The current trace context as a carrier (``{"traceparent": …, "tracestate": …}``), None when off or no
    span is current: what a job carries to the process that runs it."""
    if not ENABLED:
        return None
    carrier: dict[str, str] = {}
    _otel["inject"](carrier)
    return carrier or None


def trace_id() -> str:
    """The current span's trace id (32 hex digits), "" when off, none is current or it is not sampled."""
    return current().trace_id if ENABLED else ""


def child_env() -> dict[str, str]:
    """The environment a stdio MCP server gets on top of its own when tracing is on: this process's
    ``OTEL_*`` variables (not ``OTEL_SERVICE_NAME``: the server names itself) and ``SMITH_OTEL``; ``{}`` off."""
    if not ENABLED:
        return {}
    env = {k: v for k, v in os.environ.items() if k.startswith("OTEL_") and k != "OTEL_SERVICE_NAME"}
    env[ENV_SWITCH] = "1"
    return env


def content(value: Any) -> str:
    """``value`` (JSON-able: messages) as redacted JSON text, for a content attribute: sensitive keys redacted also
    inside strings holding JSON (a tool call's arguments, a tool result: :func:`redact_json_deep`)."""
    import orjson

    return redact_text(orjson.dumps(redact_json_deep(value)).decode())


class TraceIdFilter(logging.Filter):
    """Adds `` trace_id=<hex>`` to the message of a record written while a sampled span is current (once per
    record)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if ENABLED and not getattr(record, "trace_id", None):
            tid = trace_id()
            record.trace_id = tid or "-"
            if tid:
                record.msg, record.args = f"{record.getMessage()} trace_id={tid}", None
        return True


def _value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, (list, tuple)):
        return [redact_text(v) if isinstance(v, str) else v for v in value]
    return value


def _clean(attributes: Attributes) -> dict[str, Any]:
    """``attributes`` without None values, their strings redacted: one :func:`redact_text` for all the
    one-line strings (joined by newlines, which no secret, credential or URL pattern crosses), one for each
    other value."""
    clean: dict[str, Any] = {k: v for k, v in attributes.items() if v is not None}
    lines = [k for k, v in clean.items() if isinstance(v, str) and "\n" not in v]
    joined = "\n".join(clean[k] for k in lines)
    redacted = redact_text(joined) if joined else joined
    if redacted != joined:
        clean.update(zip(lines, redacted.split("\n"), strict=True))
    for key, value in clean.items():
        if key not in lines and not isinstance(value, bool | int | float):
            clean[key] = _value(value)
    return clean


__all__ = [
    "CAPTURE_ENV",
    "ENV_SWITCH",
    "NO_SPAN",
    "NoSpan",
    "Span",
    "attempt_span",
    "background_context",
    "TraceIdFilter",
    "capture_content",
    "child_env",
    "content",
    "current",
    "event",
    "inject",
    "setup",
    "shutdown",
    "span",
    "trace_id",
    "use_provider",
]
