"""Every Prometheus series of the gateway, declared in one place (DESIGN.md, "Operations").

    series                                     labels              counted where
    -----------------------------------------  ------------------  ---------------------------
    svc_requests_total                         endpoint,status,    each answered request
                                               code                (gateway.edge.exchange)
    svc_request_duration_seconds (histogram)   endpoint            whole answer, last byte
    svc_time_to_first_byte_seconds (hist.)     endpoint            streams: first body byte
    svc_upstream_duration_seconds (histogram)  provider            a call's provider part
    svc_calls_in_flight (gauge)                                    model calls not yet settled
    svc_tokens_total                           model,direction     usage a provider reported
    svc_settled_usd_total                      model,mode          what counted against caps
    svc_billed_usd_total                       model               what was billed (live)
    svc_admission_refusals_total               code                the shards' refusals
    svc_store_commit_seconds (histogram)                           each batch the writer commits
    svc_shard_mailbox_depth (gauge)            shard               read at scrape time
    svc_deployment_attempts_total              model,provider,     each attempt of a call on
                                               deployment,outcome  one deployment (routing)
    svc_deployment_cooldowns_total             model,provider,     a deployment cooling down
                                               deployment          (this node)
    svc_deployment_ttfb_seconds (histogram)    model,provider,     an attempt's first byte
                                               deployment
    svc_build_info (gauge, 1)                  version
    svc_trace_spans_dropped_total              reason              spans not exported (traces
                                                                   on only; read at scrape time)

Label values are bounded by construction: ``endpoint`` is one of :data:`ENDPOINTS`;
``code`` is an error-catalog code, ``ok``, ``client_closed`` or ``unready`` (/readyz);
``model`` a model of the configured catalog (anything else is ``other``); ``provider`` a
configured provider or ``mock``; ``shard`` an index below the configured count; ``reason``
``queue_full`` or ``export_failed`` (:mod:`gateway.observe.otel`); ``deployment`` the
index of a model's deployment in its configuration (capped at
:data:`MAX_DEPLOYMENT_LABEL`), ``outcome`` one of :data:`ATTEMPT_OUTCOMES`. Never a key,
an organisation, a tag or a request id.

Each :class:`Metrics` has its own registry (two servers in one process, as in the tests,
share no series).

Under ``serve --workers N`` (N > 1) every series is the whole group's: the parent makes a
directory before it forks (:func:`shared_dir`, prometheus-client's multiprocess mode), each
worker writes its values into files of its own there (a memory-mapped write per change),
and a scrape, whichever worker answers it, sums every file. The parent keeps the
directory across worker restarts, so the files of a worker that ended (even by kill -9)
keep counting: no counter goes backwards. Gauges say how they combine:
``svc_calls_in_flight`` sums the live workers (the parent forgets a worker's part when it
reaps it), ``svc_build_info`` takes the highest. ``svc_shard_mailbox_depth`` is read at
scrape time from the answering worker's shards only, and the ``process_*`` series are
left out (each would describe one worker; a counter among them would jump between
workers). The recording methods are what the request path calls; with
``[server] metrics = false`` they return at once. Children of labelled series are cached
per label tuple: ``labels()`` costs several times an ``inc()``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.errors import CATALOG

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
ENDPOINTS = (
    "chat",
    "responses",
    "messages",
    "embeddings",
    "models",
    "key",
    "keys",
    "usage",
    "credits",
    "requests",
    "admin",
    "other",
    "mcp",
)
#: the code of a request whose client left before any answer (status 499, nginx's)
CLIENT_CLOSED = "client_closed"
#: the status logged (and recorded) for a request whose client left before its answer
CLIENT_CLOSED_STATUS = 499
#: the code of /readyz's 503 (a probe's answer while starting or stopping, not an error)
UNREADY = "unready"
CODES = frozenset(CATALOG) | {"ok", CLIENT_CLOSED, UNREADY}
#: how one attempt on a deployment ended (gateway.calls.provider_errors.retry_reason)
ATTEMPT_OUTCOMES = frozenset(
    {
        "ok",
        "connect",
        "first_byte_timeout",
        "rate_limited",
        "server_error",
        "overloaded",
        "credential",
        "other",
    }
)
#: deployment indexes above this are labelled with it (a bound on the label's values)
MAX_DEPLOYMENT_LABEL = 15
#: whole answers: up to the 300 s time limit of a call
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
COMMIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
NANOS_PER_USD = 1_000_000_000

_EXACT = {
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
    "/v1/embeddings": "embeddings",
    "/v1/models": "models",
    "/v1/key": "key",
    "/v1/keys": "keys",
    "/v1/usage": "usage",
    "/v1/credits": "credits",
    "/mcp": "mcp",
}

#: the directory of the group's metric files (set by the parent of ``serve --workers``)
SHARED_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

# series are only ever read through our registries; "_created" twins would double them
prometheus_client.disable_created_metrics()


def endpoint_of(path: str) -> str:
    """The ``endpoint`` label of a request path (one of :data:`ENDPOINTS`)."""
    name = _EXACT.get(path)
    if name is not None:
        return name
    if path.startswith("/v1/keys/"):
        return "keys"
    if path.startswith("/v1/models/"):
        return "models"
    if path.startswith("/v1/requests/"):
        return "requests"
    if path == "/admin" or path.startswith("/admin/"):
        return "admin"
    return "other"


def shared_dir() -> str | None:
    """The group's metric directory when this process is a worker of several, else None."""
    return os.environ.get(SHARED_DIR_ENV) or None


def forget_worker(pid: int) -> None:
    """The parent reaped worker ``pid``: its part of the live-summed gauges goes (its
    counters and histograms stay in the sums)."""
    path = shared_dir()
    if path is not None:
        multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


class _MailboxCollector(Collector):
    """``svc_shard_mailbox_depth``, read from the shard pool when scraped (no hot-path cost)."""

    def __init__(self, depths: Callable[[], Iterable[int]]) -> None:
        self.depths = depths

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "svc_shard_mailbox_depth", "Messages waiting in each shard's mailbox.", labels=["shard"]
        )
        for index, depth in enumerate(self.depths()):
            family.add_metric([str(index)], depth)
        yield family


class _DroppedSpansCollector(Collector):
    """``svc_trace_spans_dropped_total``, read from the span exporter's counts when scraped."""

    def __init__(self, dropped: Callable[[], Mapping[str, int]]) -> None:
        self.dropped = dropped

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "svc_trace_spans_dropped",
            "Spans not exported: the queue was full, or the collector did not take them.",
            labels=["reason"],
        )
        for reason, count in sorted(self.dropped().items()):
            family.add_metric([reason], count)
        yield family


class Metrics:
    """The registry of one server and every series in it (see the module docstring)."""

    def __init__(
        self,
        *,
        enabled: bool,
        version: str,
        models: Iterable[str],
        providers: Iterable[str],
        mailbox_depths: Callable[[], Iterable[int]],
        dropped_spans: Callable[[], Mapping[str, int]] | None = None,
        group_dir: str | None = None,
    ) -> None:
        """``group_dir``: the group's metric directory (:func:`shared_dir`) when this
        process is one of several workers, else None (the series live in this object)."""
        self.enabled = enabled
        self.models = frozenset(models)
        self.providers = frozenset(providers) | {"mock"}
        if group_dir is not None and not getattr(values.ValueClass, "_multiprocess", False):
            # every value made from now on is a memory-mapped file's (a worker's process)
            values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "svc_requests_total",
            "Answered requests by endpoint, HTTP status and error code (ok: none).",
            ["endpoint", "status", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "svc_request_duration_seconds",
            "Time from a request's arrival to the last byte of its answer.",
            ["endpoint"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.first_byte = Histogram(
            "svc_time_to_first_byte_seconds",
            "Streamed answers: time from a request's arrival to the first body byte.",
            ["endpoint"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.upstream = Histogram(
            "svc_upstream_duration_seconds",
            "Time a model call spent with its provider (a stream: until it ended).",
            ["provider"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "svc_calls_in_flight",
            "Model calls admitted and not yet settled.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.tokens = Counter(
            "svc_tokens_total",
            "Tokens the providers reported, by model and direction (input|output).",
            ["model", "direction"],
            registry=registry,
        )
        self.settled = Counter(
            "svc_settled_usd_total",
            "USD settled against spend caps, by model and key mode (live|sandbox).",
            ["model", "mode"],
            registry=registry,
        )
        self.billed = Counter(
            "svc_billed_usd_total",
            "USD billed to organisations, by model.",
            ["model"],
            registry=registry,
        )
        self.guardrail_verdicts = Counter(
            "svc_guardrail_verdicts_total",
            "What guardrails decided of calls' texts (allow, deny, redact, flag), by"
            " guardrail and direction (input, output).",
            ["guardrail", "direction", "verdict"],
            registry=registry,
        )
        self.refusals = Counter(
            "svc_admission_refusals_total",
            "Requests the admission shards refused, by error code.",
            ["code"],
            registry=registry,
        )
        self.store_commit = Histogram(
            "svc_store_commit_seconds",
            "Time to commit one batch of store writes.",
            buckets=COMMIT_BUCKETS,
            registry=registry,
        )
        deployment = ["model", "provider", "deployment"]
        self.attempts = Counter(
            "svc_deployment_attempts_total",
            "Attempts of calls on each deployment of a model, by outcome.",
            [*deployment, "outcome"],
            registry=registry,
        )
        self.cooldowns = Counter(
            "svc_deployment_cooldowns_total",
            "Times a deployment was put to cool down on this node.",
            deployment,
            registry=registry,
        )
        self.deployment_ttfb = Histogram(
            "svc_deployment_ttfb_seconds",
            "Time from an attempt's start to its deployment's first byte.",
            deployment,
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        Gauge(
            "svc_build_info",
            "The running version (value 1).",
            ["version"],
            registry=registry,
            multiprocess_mode="max",
        ).labels(version).set(1)
        self.cache_requests = Counter(
            "svc_cache_requests_total",
            "Model calls by what the response cache did: hit, miss, bypass.",
            ["result"],
            registry=registry,
        )
        self.cache_saved = Counter(
            "svc_cache_saved_usd_total",
            "What the calls served from the response cache would have cost (USD).",
            registry=registry,
        )
        self.tool_calls = Counter(
            "svc_tool_calls_total",
            "MCP tools/call requests by server, tool and outcome code (ok: answered).",
            ["server", "tool", "code"],
            registry=registry,
        )
        self._children: dict[tuple[Any, ...], Any] = {}
        if group_dir is not None:
            # the series above write into the group's files; a scrape reads all of them
            registry = self.registry = CollectorRegistry(auto_describe=True)
            multiprocess.MultiProcessCollector(registry, path=group_dir)  # type: ignore[no-untyped-call]
        else:
            ProcessCollector(registry=registry)
        registry.register(_MailboxCollector(mailbox_depths))
        if dropped_spans is not None and group_dir is None:
            registry.register(_DroppedSpansCollector(dropped_spans))
        #: the group's ``svc_trace_spans_dropped_total``, fed by :meth:`spans_dropped`
        self.group_dropped = (
            Counter(
                "svc_trace_spans_dropped",
                "Spans not exported: the queue was full, or the collector did not take them.",
                ["reason"],
                registry=None,
            )
            if group_dir is not None
            else None
        )

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def model_label(self, model: str | None) -> str:
        return model if model in self.models else "other"

    # -- what the request path calls --------------------------------------------------

    def answered(
        self, endpoint: str, status: int, code: str, seconds: float, first_byte: float | None
    ) -> None:
        """One answered request (``first_byte`` only for streams)."""
        if not self.enabled:
            return
        if code not in CODES:
            code = "internal_error" if status >= 500 else "invalid_request"
        self._child(self.requests, endpoint, str(status), code).inc()
        self._child(self.duration, endpoint).observe(seconds)
        if first_byte is not None:
            self._child(self.first_byte, endpoint).observe(first_byte)

    def cache_result(self, result: str, saved_nanos: int) -> None:
        """A model call the response cache looked at; a hit saved ``saved_nanos``."""
        if not self.enabled:
            return
        self._child(self.cache_requests, result).inc()
        if saved_nanos:
            self.cache_saved.inc(saved_nanos / NANOS_PER_USD)

    def call_opened(self) -> None:
        if self.enabled:
            self.in_flight.inc()

    def call_settled(
        self,
        *,
        model: str | None,
        mode: str,
        provider: str | None,
        upstream_seconds: float | None,
        input_tokens: int,
        output_tokens: int,
        settled_nanos: int,
        billed_nanos: int,
    ) -> None:
        """A model call settled (exactly once per :meth:`call_opened`)."""
        if not self.enabled:
            return
        self.in_flight.dec()
        if upstream_seconds is not None and provider is not None:
            label = provider if provider in self.providers else "other"
            self._child(self.upstream, label).observe(upstream_seconds)
        if model is None:
            return
        model = self.model_label(model)
        if input_tokens:
            self._child(self.tokens, model, "input").inc(input_tokens)
        if output_tokens:
            self._child(self.tokens, model, "output").inc(output_tokens)
        if settled_nanos:
            self._child(self.settled, model, mode).inc(settled_nanos / NANOS_PER_USD)
        if billed_nanos:
            self._child(self.billed, model).inc(billed_nanos / NANOS_PER_USD)

    def _deployment(self, model: str, provider: str, index: int) -> tuple[str, str, str]:
        return (
            self.model_label(model),
            provider if provider in self.providers else "other",
            str(min(index, MAX_DEPLOYMENT_LABEL)),
        )

    def deployment_attempt(self, model: str, provider: str, index: int, outcome: str) -> None:
        """An attempt on a deployment ended (``outcome``: ok or why it failed)."""
        if self.enabled:
            outcome = outcome if outcome in ATTEMPT_OUTCOMES else "other"
            labels = self._deployment(model, provider, index)
            self._child(self.attempts, *labels, outcome).inc()

    def deployment_cooldown(self, model: str, provider: str, index: int) -> None:
        if self.enabled:
            self._child(self.cooldowns, *self._deployment(model, provider, index)).inc()

    def deployment_first_byte(self, model: str, provider: str, index: int, seconds: float) -> None:
        if self.enabled:
            labels = self._deployment(model, provider, index)
            self._child(self.deployment_ttfb, *labels).observe(seconds)

    def tool_called(self, server: str, tool: str, code: str) -> None:
        """One MCP tools/call that named a server this key reaches (refused ones too)."""
        if self.enabled:
            self._child(self.tool_calls, server, tool, code).inc()

    def refused(self, code: str) -> None:
        """An admission refusal (rate, in-flight, caps, credits, budget, unavailable)."""
        if self.enabled:
            self._child(self.refusals, code).inc()

    def guardrail_verdict(self, guardrail: str, direction: str, verdict: str) -> None:
        """A guardrail's verdict on one direction of one call (never what it matched)."""
        if self.enabled:
            self._child(self.guardrail_verdicts, guardrail, direction, verdict).inc()

    def spans_dropped(self, reason: str, count: int) -> None:
        """Spans dropped by this worker (only under ``--workers``: one process reads its
        own exporter's counts at scrape time instead)."""
        if self.group_dropped is not None:
            self.group_dropped.labels(reason).inc(count)

    def store_committed(self, seconds: float) -> None:
        """Called from the store's writer thread (prometheus-client is thread-safe)."""
        if self.enabled:
            self.store_commit.observe(seconds)

    def exposition(self) -> bytes:
        """The text exposition of every series (prometheus-client's own writer)."""
        return generate_latest(self.registry)
