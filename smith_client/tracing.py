"""The client's part of tracing: a turn's job carries the caller's trace context (docs/architecture.md, Tracing).

The client never turns OpenTelemetry on and never imports it: when the application already uses it (its
``opentelemetry.trace`` module is imported), :func:`submit_span` opens a ``submit_turn <agent>`` producer
span under the caller's current span, through whatever tracer provider the application installed, and puts
its W3C trace context (``traceparent``, ``tracestate``) in the job's ``trace``. The workers continue that
trace (``SMITH_OTEL=1``). Otherwise the job is sent as it is, for the cost of one dictionary lookup.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from smith_client.jobs import TurnJob

#: The module whose presence says the application uses OpenTelemetry.
_OTEL_TRACE = "opentelemetry.trace"


@contextmanager
def submit_span(job: TurnJob) -> Iterator[TurnJob]:
    """``job`` with the trace context of a new ``submit_turn <agent>`` span in its ``trace``, the span
    ended when the block ends (its status an error when the block raises); ``job`` unchanged when the
    application does not use OpenTelemetry, or when the job carries a trace context already.

    The span is never made current (the block may be a generator's, resumed in other contexts).
    """
    otel = sys.modules.get(_OTEL_TRACE)
    if otel is None or job.trace:
        yield job
        return
    from opentelemetry.propagate import inject

    tracer: Any = otel.get_tracer("agent_smith.client")
    span = tracer.start_span(
        f"submit_turn {job.agent}",
        kind=otel.SpanKind.PRODUCER,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": job.agent,
            "gen_ai.conversation.id": job.conversation_id,
            "smith.turn.id": job.turn_id,
        },
    )
    carrier: dict[str, str] = {}
    inject(carrier, context=otel.set_span_in_context(span))
    try:
        yield job.model_copy(update={"trace": carrier}) if carrier else job
    except BaseException as exc:
        if not isinstance(exc, GeneratorExit):
            span.set_attribute("error.type", getattr(exc, "kind", type(exc).__name__))
            span.set_status(otel.Status(otel.StatusCode.ERROR))
        raise
    finally:
        span.end()
