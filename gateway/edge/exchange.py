"""One HTTP exchange as an operator sees it: the ``request`` log line and the request series.

    ASGI wrapper (this module)          the app                       a model call
    --------------------------          -------                       ------------
    open an Exchange, its trace  ──►    request id, key, error code
    time first and last body byte       (app.py hooks)          ──►   model, usage, settled
    answer done: one part finished                                    settled: one part finished
                         └──────────── the last part reports ◄──────────────┘

An exchange is reported exactly once, when its last open part finishes: the answer (the
wrapper saw the app return) and, for a model call, its settlement (``Call.finish``). A
stream whose client left settles in its pump after the answer ended, so the report waits
for that instead of logging a call without its amounts.

A request whose client left before any answer is reported with status 499 and the code
``client_closed``. The access log of hypercorn is off: this ``request`` event replaces it.
"""

from __future__ import annotations

import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.accounts.catalog import nanos_to_usd
from gateway.edge.asgi import App, Message, Receive, Scope, Send
from gateway.observe.logs import event
from gateway.observe.metrics import CLIENT_CLOSED, CLIENT_CLOSED_STATUS, Metrics, endpoint_of
from gateway.observe.refused_calls import RefusalCounts
from gateway.observe.tracing import (
    RequestOutcome,
    ServerSpan,
    Spans,
    TraceContext,
    from_headers,
)

if TYPE_CHECKING:
    from gateway.accounts.key_record import KeyRecord
    from gateway.calls.lifecycle import SettledCall

log = logging.getLogger("gateway.request")
#: the exchange of the request its task serves: set in the request's task, where
#: hypercorn runs the app and Quart-Trio the handler (a context variable is one C call;
#: the request's scope, read through Quart's ``request`` proxy, was five function calls)
_CURRENT: ContextVar[Exchange | None] = ContextVar("svc_exchange", default=None)
#: probes and scrapes, every few seconds each: no span (they would bury the calls' traces)
UNTRACED = frozenset({"/healthz", "/readyz", "/metrics"})


@dataclass(slots=True, eq=False)
class Exchange:
    recorder: ExchangeRecorder
    method: str
    path: str
    started: float
    trace: TraceContext
    request_id: str | None = None
    status: int = 0
    code: str | None = None
    key_id: str | None = None
    key_prefix: str | None = None
    org_id: str | None = None
    model: str | None = None
    stream: bool = False
    event_stream: bool = False
    first_byte: float | None = None
    ended: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    settled_nanos: int | None = None
    #: the request's model call has a record (a refusal before the model has none)
    recorded: bool = False
    #: the answer, and the model call once one is opened
    open_parts: int = 1
    answer_open: bool = True
    #: the request's SERVER span (traces on only), ended as the exchange is reported
    span: ServerSpan | None = None

    def answer_done(self) -> None:
        if self.answer_open:
            self.answer_open = False
            self.part_done()

    def part_done(self) -> None:
        self.open_parts -= 1
        if self.open_parts == 0:
            self.recorder.report(self)


def current() -> Exchange | None:
    """The exchange of the request being handled (None outside one)."""
    return _CURRENT.get()


def identified(request_id: str | None, key: KeyRecord | None = None) -> None:
    """Who asks, under which request id: noted as soon as each is known (a client that
    leaves before its answer still has its line name them), and again as answered (a
    replay answers under the original's id)."""
    exchange = current()
    if exchange is None:
        return
    exchange.request_id = request_id
    if key is not None:
        exchange.key_id, exchange.key_prefix, exchange.org_id = key.id, key.prefix, key.org_id


def refused(code: str) -> None:
    """The answer is the error ``code``."""
    exchange = current()
    if exchange is not None:
        exchange.code = code


class ExchangeReport:
    """What a model call tells the request it answers (:class:`gateway.calls.lifecycle.CallReport`):
    the call series, and its part of the exchange, whose line waits for the settlement."""

    __slots__ = ("exchange", "metrics")

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self.exchange = current()

    @property
    def trace(self) -> TraceContext | None:
        return self.exchange.trace if self.exchange is not None else None

    def opened(self) -> None:
        self.metrics.call_opened()
        if self.exchange is not None:
            self.exchange.open_parts += 1

    def settled(self, call: SettledCall) -> None:
        self.metrics.call_settled(
            model=call.model,
            mode=call.mode,
            provider=call.provider,
            upstream_seconds=call.upstream_s,
            input_tokens=call.input_tokens or 0,
            output_tokens=call.output_tokens or 0,
            settled_nanos=call.settled_nanos,
            billed_nanos=call.billed_nanos,
        )
        exchange = self.exchange
        if exchange is None:
            return
        exchange.model = call.model
        exchange.stream = call.stream
        if call.input_tokens is not None:
            exchange.input_tokens = call.input_tokens
            exchange.output_tokens = call.output_tokens
        exchange.settled_nanos = call.settled_nanos
        exchange.recorded = call.recorded
        if call.code is not None:
            # a stream that failed in band: answered 200, yet the call ended with an error
            exchange.code = call.code
        exchange.part_done()


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


class ExchangeRecorder:
    """The ASGI wrapper that opens, times and reports every HTTP exchange."""

    def __init__(
        self,
        app: App,
        metrics: Metrics,
        spans: Spans | None = None,
        refusals: RefusalCounts | None = None,
    ) -> None:
        self.app = app
        self.metrics = metrics
        #: where refused calls of known keys are counted (None: not counted)
        self.refusals = refusals
        #: where each request's span goes (None: traces are off)
        self.spans = spans

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        trace = from_headers(_header(scope, b"traceparent"), _header(scope, b"tracestate"))
        exchange = Exchange(
            recorder=self,
            method=scope["method"],
            path=scope["path"],
            started=time.perf_counter(),
            trace=trace,
        )
        if self.spans is not None and exchange.path not in UNTRACED:
            span = self.spans.server(trace, exchange.method, endpoint_of(exchange.path))
            exchange.span, exchange.trace = span, span.context
        _CURRENT.set(exchange)

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                for name, value in message["headers"]:
                    if name.lower() == b"content-type":
                        exchange.event_stream = value.startswith(b"text/event-stream")
            elif message["type"] == "http.response.body":
                now = time.perf_counter()
                if exchange.first_byte is None and message.get("body"):
                    exchange.first_byte = now
                if not message.get("more_body"):
                    # reported before the last byte leaves: a client that has the whole
                    # answer finds it counted
                    exchange.ended = now
                    exchange.answer_done()
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            exchange.answer_done()

    def report(self, exchange: Exchange) -> None:
        """The series and the log line of one finished exchange."""
        status, code = exchange.status, exchange.code
        if status == 0:
            status, code = CLIENT_CLOSED_STATUS, CLIENT_CLOSED
        elif code is None:
            code = "ok" if status < 400 else _fallback_code(status)
        ended = exchange.ended if exchange.ended is not None else time.perf_counter()
        seconds = ended - exchange.started
        first = exchange.first_byte - exchange.started if exchange.first_byte else None
        endpoint = endpoint_of(exchange.path)
        if (
            status >= 400
            and exchange.key_id is not None
            and not exchange.recorded
            and self.refusals is not None
        ):
            self.refusals.note(exchange.key_id, exchange.org_id or "", code)
        self.metrics.answered(
            endpoint, status, code, seconds, first if exchange.event_stream else None
        )
        if exchange.span is not None:
            exchange.span.end(
                RequestOutcome(
                    status, code, exchange.request_id, exchange.key_prefix, exchange.org_id
                )
            )
        if not log.isEnabledFor(logging.INFO):
            return
        settled = exchange.settled_nanos
        fields = {
            "request_id": exchange.request_id,
            "method": exchange.method,
            "path": exchange.path,
            "status": status,
            "code": code,
            "key_id": exchange.key_id,
            "org_id": exchange.org_id,
            "model": exchange.model,
            "stream": exchange.stream or exchange.event_stream,
            "latency_ms": round(seconds * 1000, 3),
            "ttfb_ms": round(first * 1000, 3) if first is not None else None,
            "input_tokens": exchange.input_tokens,
            "output_tokens": exchange.output_tokens,
            "settled_usd": nanos_to_usd(settled) if settled is not None else None,
            "trace_id": exchange.trace.trace_id,
        }
        log.info(
            "%s %s %d %s",
            exchange.method,
            exchange.path,
            status,
            code,
            extra=event("request", **fields),
        )


def _fallback_code(status: int) -> str:
    """The code of an error answered without one (the public catalog's plain-text 429)."""
    if status == 429:
        return "rate_limited"
    return "internal_error" if status >= 500 else "invalid_request"
