"""A real OTLP/HTTP trace receiver on 127.0.0.1, as an OpenTelemetry collector is one.

``POST /v1/traces`` with an ``application/x-protobuf`` body: an
``ExportTraceServiceRequest`` (decoded with the classes ``opentelemetry-proto`` ships),
answered 200 with an empty ``ExportTraceServiceResponse``, as the OTLP/HTTP
specification has a collector answer a batch it took whole. Runs on a thread of its own
(the gateway's exporter posts from its own thread too); each received body is kept as
sent, and its spans decoded into :class:`ReceivedSpan` values.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

PATH = "/v1/traces"
#: OTLP's span kinds (opentelemetry/proto/trace/v1/trace.proto, Span.SpanKind)
KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
#: Status.StatusCode
STATUS = {0: "unset", 1: "ok", 2: "error"}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    #: "" for a root span
    parent_span_id: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: str
    #: Unix time in nanoseconds
    start_ns: int
    end_ns: int


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, which) if which else None


def _decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=span.name,
                        kind=KINDS[span.kind],
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        resource=resource,
                        status=STATUS[span.status.code],
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                    )
                )
    return spans


class FakeCollector:
    """What the receiver got: every body as sent, every span decoded, the request headers."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[ReceivedSpan] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.url = ""

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)

    def span_of(self, kind: str, request_id: str) -> ReceivedSpan | None:
        """The span of ``kind`` (server, client) of the request ``request_id``, if here."""
        for span in self.received():
            if span.kind == kind and span.attributes.get("svc.request_id") == request_id:
                return span
        return None

    def _take(self, body: bytes, headers: dict[str, str]) -> None:
        spans = _decode(body)
        with self.lock:
            self.bodies.append(body)
            self.headers.append(headers)
            self.spans.extend(spans)


def _handler(collector: FakeCollector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != PATH:
                self.send_error(404)
                return
            if self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_error(415)
                return
            collector._take(body, {k.lower(): v for k, v in self.headers.items()})
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the test's output stays the test's

    return Handler


@contextmanager
def running_collector() -> Iterator[FakeCollector]:
    """A receiver listening on a loopback port the OS picked, until the block ends."""
    collector = FakeCollector()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(collector))
    collector.url = f"http://127.0.0.1:{server.server_address[1]}"
    # shutdown() waits for serve_forever's next poll: 0.5 s by default, at every test's end
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield collector
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed): a collector that is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
