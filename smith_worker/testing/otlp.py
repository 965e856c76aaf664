"""A tiny OTLP/HTTP trace receiver for tests and benches: collects the spans POSTed to ``/v1/traces``.

Decodes each ``ExportTraceServiceRequest`` (protobuf, gzip or not) with ``opentelemetry-proto`` and keeps one
:class:`ReceivedSpan` per span, with its resource's attributes.
"""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@dataclass
class ReceivedSpan:
    """One exported span: ids in hex (``parent_id`` "" for a root), attributes and events decoded."""

    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    status_code: int = 0
    status_message: str = ""

    @property
    def service(self) -> str:
        return str(self.resource.get("service.name", ""))

    def text(self) -> str:
        """Everything the span says, as one string (for "appears nowhere" checks)."""
        return repr((self.name, self.attributes, self.events, self.status_message, self.resource))


class OtlpReceiver:
    """An HTTP server on ``127.0.0.1`` (free port) collecting spans; ``endpoint`` is its base URL."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path.rstrip("/") == "/v1/traces":
                    receiver._take(body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        resource=resource,
                        events=[(e.name, {a.key: _value(a.value) for a in e.attributes}) for e in span.events],
                        status_code=span.status.code,
                        status_message=span.status.message,
                    ))  # fmt: skip
        with self._lock:
            self.spans.extend(spans)
            self.requests += 1

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        """The spans received so far of trace ``trace_id``."""
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for(self, trace_id: str, names: set[str], timeout: float = 30.0) -> list[ReceivedSpan]:
        """The spans of ``trace_id`` once every name of ``names`` is among them; ``AssertionError`` after
        ``timeout`` seconds, naming what arrived."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"missing spans {names - {s.name for s in spans}}; got {[s.name for s in spans]}")
            time.sleep(0.05)
