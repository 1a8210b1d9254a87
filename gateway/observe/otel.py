"""OpenTelemetry traces over OTLP/HTTP: the one module that imports the SDK.

    request ──► SERVER span "POST chat"          (edge/exchange.py opens it, ends it when
                │  its id: the request's span id,  the exchange is reported)
                │  its parent: the caller's traceparent
                └─► CLIENT span "chat up-chat"   (calls/lifecycle.py: opened as the provider
                       its id: the parent the       is asked, ended as the call settles;
                       provider is sent             a stream's when the stream ends)

Spans ended go to a :class:`BatchSpanProcessor` (a bounded queue, its own thread, which
posts a batch every ``batch_delay_s``): the request path only appends to a queue, never
waits for the collector. A span that finds the queue full is dropped, a batch the
collector did not take (down, refusing, past ``export_timeout_s`` with its retries) is
dropped, and both are counted: ``svc_trace_spans_dropped_total{reason}`` on /metrics.

Attributes: the GenAI semantic conventions of the client span (``gen_ai.*``: provider,
operation, request and response model, usage, finish reasons), the request id, the key's
prefix and the organisation (``svc.*``), the status. Never a prompt, a completion, a
token or a credential: only the values passed to :meth:`OtlpSpans.server` and
:meth:`OtlpSpans.attempt` and the ends' arguments reach a span.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import trio
from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import AttributeValue

from gateway import __version__
from gateway.config.settings import ObservabilityConfig
from gateway.observe.tracing import AttemptLabels, RequestOutcome, TraceContext

#: our provider kinds as ``gen_ai.provider.name``'s well-known values (the mock: "mock")
PROVIDER_NAMES = {
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
    "bedrock": "aws.bedrock",
    "azure": "azure.ai.openai",
}
#: the record's endpoint → ``gen_ai.operation.name`` (the Responses API is a chat)
OPERATIONS = {
    "chat": "chat",
    "responses": "chat",
    "messages": "chat",
    "embeddings": "embeddings",
    # an MCP tools/call (gateway/tools/): the span is "execute_tool server__tool"
    "mcp": "execute_tool",
}
#: how long a graceful stop waits, at most, for the last spans to leave
SHUTDOWN_S = 5.0
DROP_REASONS = ("queue_full", "export_failed")


def _ids(trace: TraceContext) -> tuple[int, int]:
    return int(trace.trace_id, 16), int(trace.span_id, 16)


def _parent(trace_id: str, span_id: str, flags: str, state: str | None, remote: bool) -> Context:
    """A context whose current span is the given one: the parent of the next span."""
    context = SpanContext(
        trace_id=int(trace_id, 16),
        span_id=int(span_id, 16),
        is_remote=remote,
        trace_flags=TraceFlags(int(flags, 16)),
        trace_state=TraceState.from_header([state]) if state else None,
    )
    return otel_trace.set_span_in_context(otel_trace.NonRecordingSpan(context))


def _forwarded(trace: TraceContext, span: otel_trace.Span) -> TraceContext:
    """``trace`` with ``span``'s id as the parent and its sampled flag (other flags kept)."""
    context = span.get_span_context()
    flags = (int(trace.flags, 16) & ~1) | int(context.trace_flags.sampled)
    return TraceContext(
        trace.trace_id,
        f"{context.span_id:016x}",
        f"{flags:02x}",
        trace.tracestate,
        trace.parent_id,
    )


class _RequestIds(IdGenerator):
    """The ids of a server span are the request's own (the ones in its log line, its
    record, and the traceparent it forwards): set just before the span starts (one
    thread, no await in between), random otherwise."""

    def __init__(self) -> None:
        self.random = RandomIdGenerator()
        self.next: tuple[int, int] | None = None

    def generate_span_id(self) -> int:
        if self.next is not None:
            return self.next[1]
        return self.random.generate_span_id()

    def generate_trace_id(self) -> int:
        if self.next is not None:
            return self.next[0]
        return self.random.generate_trace_id()


class _Counted(SpanExporter):
    """The OTLP exporter, counting what it hands over and what it could not deliver."""

    def __init__(self, exporter: SpanExporter, counts: DropCounts) -> None:
        self.exporter = exporter
        self.counts = counts

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.counts.handed_over(len(spans))
        try:
            result = self.exporter.export(spans)
        except Exception:
            self.counts.dropped("export_failed", len(spans))
            raise
        if result is not SpanExportResult.SUCCESS:
            self.counts.dropped("export_failed", len(spans))
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class DropCounts:
    """Spans queued, handed to the exporter, and dropped by reason.

    ``queued`` is written by the request path's thread, ``handed`` by the processor's:
    each counter has one writer. Their difference is the queue's length (a little more
    while a batch is being taken), which :class:`_Bounded` keeps at most ``limit``.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued = 0
        self.handed = 0
        self.by_reason = dict.fromkeys(DROP_REASONS, 0)
        self._lock = threading.Lock()
        #: told of each drop too (a worker of several: the group's counter)
        self.on_drop: Callable[[str, int], None] | None = None

    def handed_over(self, count: int) -> None:
        self.handed += count

    def dropped(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.by_reason[reason] += count
        if self.on_drop is not None:
            self.on_drop(reason, count)

    def snapshot(self) -> Mapping[str, int]:
        with self._lock:
            return dict(self.by_reason)


class _Bounded(SpanProcessor):
    """The batch processor behind a bound of our own, so that a dropped span is counted
    (the SDK's own queue drops the oldest span with a log line and nothing else)."""

    def __init__(self, batch: BatchSpanProcessor, counts: DropCounts) -> None:
        self.batch = batch
        self.counts = counts

    def on_end(self, span: ReadableSpan) -> None:
        counts = self.counts
        if counts.queued - counts.handed >= counts.limit:
            counts.dropped("queue_full")
            return
        counts.queued += 1
        self.batch.on_end(span)

    def shutdown(self) -> None:
        self.batch.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.batch.force_flush(timeout_millis)


class _Server:
    """A request's SERVER span (:class:`gateway.observe.tracing.ServerSpan`)."""

    __slots__ = ("context", "span")

    def __init__(self, span: otel_trace.Span, context: TraceContext) -> None:
        self.span = span
        self.context = context

    def end(self, outcome: RequestOutcome) -> None:
        status, code = outcome.status, outcome.code
        span = self.span
        if span.is_recording():
            attributes: dict[str, AttributeValue] = {"http.response.status_code": status}
            if outcome.request_id is not None:
                attributes["svc.request_id"] = outcome.request_id
            if outcome.key_prefix is not None:
                attributes["svc.key_prefix"] = outcome.key_prefix
            if outcome.org_id is not None:
                attributes["svc.org_id"] = outcome.org_id
            if code != "ok":
                attributes["svc.error_code"] = code
            if status >= 500:
                # HTTP conventions: a server span is an error for 5xx only, not for 4xx
                attributes["error.type"] = code
                span.set_status(Status(StatusCode.ERROR))
            span.set_attributes(attributes)
        span.end()


class _Attempt:
    """A provider attempt's CLIENT span (:class:`gateway.observe.tracing.AttemptSpan`)."""

    __slots__ = ("context", "span")

    def __init__(self, span: otel_trace.Span, context: TraceContext) -> None:
        self.span = span
        self.context = context

    def answered(self, model: object, finish_reasons: Sequence[str]) -> None:
        span = self.span
        if not span.is_recording():
            return
        if isinstance(model, str):
            span.set_attribute("gen_ai.response.model", model)
        if finish_reasons:
            span.set_attribute("gen_ai.response.finish_reasons", list(finish_reasons))

    def end(
        self, *, input_tokens: int | None, output_tokens: int | None, error: str | None
    ) -> None:
        span = self.span
        if span.is_recording():
            if input_tokens is not None:
                span.set_attribute("gen_ai.usage.input_tokens", input_tokens)
            if output_tokens is not None:
                span.set_attribute("gen_ai.usage.output_tokens", output_tokens)
            if error is not None:
                span.set_attribute("error.type", error)
                span.set_status(Status(StatusCode.ERROR))
        span.end()


class OtlpSpans:
    """The gateway's spans, exported over OTLP/HTTP (:class:`gateway.observe.tracing.Spans`).

    Its own tracer provider (never the process-wide one: two servers in one process, as
    in the tests, export apart). ``provider_kinds``: each configured provider's kind,
    by name (the mock is ``mock``).
    """

    def __init__(self, config: ObservabilityConfig, provider_kinds: Mapping[str, str]) -> None:
        url = config.traces_url()
        assert url is not None, "traces are off: no OtlpSpans"
        self.kinds = {**provider_kinds, "mock": "mock"}
        self.counts = DropCounts(config.queue_size)
        self.exporter = _Counted(
            OTLPSpanExporter(
                endpoint=url,
                headers=dict(config.otlp_headers) or None,
                timeout=config.export_timeout_s,
            ),
            self.counts,
        )
        batch = BatchSpanProcessor(
            self.exporter,
            max_queue_size=config.queue_size,
            schedule_delay_millis=config.batch_delay_s * 1000,
            max_export_batch_size=min(512, config.queue_size),
        )
        self.ids = _RequestIds()
        self.provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
            resource=Resource.create(
                {"service.name": config.service_name, "service.version": __version__}
            ),
            id_generator=self.ids,
            # a graceful stop flushes (aclose); any other exit must not wait for a collector
            shutdown_on_exit=False,
        )
        self.processor = _Bounded(batch, self.counts)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("gateway", __version__)

    def dropped(self) -> Mapping[str, int]:
        """Spans dropped so far, by reason (``svc_trace_spans_dropped_total``)."""
        return self.counts.snapshot()

    def server(self, trace: TraceContext, method: str, endpoint: str) -> _Server:
        parent = (
            _parent(trace.trace_id, trace.parent_id, trace.flags, trace.tracestate, remote=True)
            if trace.parent_id is not None
            else None
        )
        self.ids.next = _ids(trace)
        try:
            span = self.tracer.start_span(
                f"{method} {endpoint}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes={"http.request.method": method, "svc.endpoint": endpoint},
            )
        finally:
            self.ids.next = None
        return _Server(span, _forwarded(trace, span))

    def attempt(self, parent: TraceContext, labels: AttemptLabels) -> _Attempt:
        kind = self.kinds.get(labels.provider, labels.provider)
        operation = OPERATIONS.get(labels.endpoint, labels.endpoint)
        context = _parent(
            parent.trace_id, parent.span_id, parent.flags, parent.tracestate, remote=False
        )
        span = self.tracer.start_span(
            f"{operation} {labels.upstream_model}",
            context=context,
            kind=SpanKind.CLIENT,
            attributes={
                "gen_ai.operation.name": operation,
                "gen_ai.provider.name": PROVIDER_NAMES.get(kind, kind),
                # the attribute gen_ai.provider.name replaced (semantic conventions 1.37),
                # which peers and dashboards built on the earlier conventions still read
                "gen_ai.system": kind,
                "gen_ai.request.model": labels.upstream_model,
                "svc.model": labels.model,
                "svc.provider": labels.provider,
                "svc.request_id": labels.request_id,
                "svc.key_prefix": labels.key_prefix,
                "svc.org_id": labels.org_id,
            },
        )
        return _Attempt(span, _forwarded(parent, span))

    async def aclose(self, bound_s: float = SHUTDOWN_S) -> None:
        """Export what is queued, for at most ``bound_s`` (a graceful stop): then the
        exporter stops retrying, and what is left is dropped (and counted)."""
        with trio.move_on_after(bound_s):
            await trio.to_thread.run_sync(self.provider.shutdown, abandon_on_cancel=True)
            return
        # the processor's thread may be waiting out a retry: stop it, so that it ends
        self.exporter.shutdown()
