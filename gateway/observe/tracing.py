"""W3C Trace Context: the ``traceparent`` a call carries from the client to the provider.

    traceparent: 00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags: 2 hex>

A valid header's trace id (and flags, and ``tracestate``) is kept; the gateway is a
participant in the trace, so the header it sends upstream names its own span as the
parent (a new parent id per request). An absent or malformed header starts a new trace
(not sampled: flags ``00``). The trace id is in the request's log line and its record.

When traces are exported (``[observability] otlp_endpoint``, :mod:`gateway.observe.otel`)
the request's span id is its SERVER span's, the flags say whether it is recorded, and
each provider attempt is a CLIENT span whose id is the parent the provider is sent. The
edge and the calls see only the protocols below (:class:`Spans`), never the SDK; with
traces off they hold None and do nothing more.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

# lower-case hex only; version ff is invalid; a future version may carry more fields
_TRACEPARENT = re.compile(
    r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?", re.ASCII
)
_ZERO_TRACE = "0" * 32
_ZERO_PARENT = "0" * 16
#: new trace and span ids: unique, not secret (W3C asks for random, not unguessable), so
#: a seeded PRNG instead of ``secrets`` (a getrandom system call per id on the hot path)
_ids = random.Random()
# a forked worker must not repeat its parent's (and its siblings') sequence
os.register_at_fork(after_in_child=_ids.seed)
#: the W3C limit on tracestate: 32 members of at most 256 characters, so 512 is generous
MAX_TRACESTATE = 512


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str
    span_id: str
    flags: str = "00"
    tracestate: str | None = None
    #: the caller's span (a valid incoming traceparent's parent id), else None
    parent_id: str | None = None

    def traceparent(self) -> str:
        """The header sent upstream: this trace, with the gateway's span as parent."""
        return f"00-{self.trace_id}-{self.span_id}-{self.flags}"

    def headers(self) -> dict[str, str]:
        headers = {"traceparent": self.traceparent()}
        if self.tracestate:
            headers["tracestate"] = self.tracestate
        return headers


def from_headers(traceparent: str | None, tracestate: str | None = None) -> TraceContext:
    """The trace of a request: its own when ``traceparent`` is valid, else a new one."""
    span = f"{_ids.getrandbits(64):016x}"
    match = _TRACEPARENT.fullmatch(traceparent.strip()) if traceparent else None
    if match is not None:
        version, trace_id, parent_id, flags, rest = match.groups()
        valid = (
            version != "ff"
            and (version != "00" or rest is None)
            and trace_id != _ZERO_TRACE
            and parent_id != _ZERO_PARENT
        )
        if valid:
            state = tracestate if tracestate and len(tracestate) <= MAX_TRACESTATE else None
            return TraceContext(trace_id, span, flags, state, parent_id)
    return TraceContext(f"{_ids.getrandbits(128):032x}", span)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """How an HTTP request ended, as its span says: the status, the error code (``ok``
    when it succeeded), and the call's labels known by then (None before they are)."""

    status: int
    code: str
    request_id: str | None
    key_prefix: str | None
    org_id: str | None


class ServerSpan(Protocol):
    """The span of one HTTP request, as the edge opens and ends it."""

    @property
    def context(self) -> TraceContext:
        """The request's trace as forwarded: this span's id, its sampled flag."""
        ...

    def end(self, outcome: RequestOutcome) -> None: ...


class AttemptSpan(Protocol):
    """The span of one provider attempt, as a model call opens and ends it."""

    @property
    def context(self) -> TraceContext:
        """The trace sent to the provider: this span as the parent."""
        ...

    def answered(self, model: object, finish_reasons: Sequence[str]) -> None:
        """What the provider said of its answer (never the answer itself): the model it
        named (kept when a string), the finish reasons."""

    def end(
        self, *, input_tokens: int | None, output_tokens: int | None, error: str | None
    ) -> None:
        """``error``: the call's error code, None when it succeeded."""


@dataclass(frozen=True, slots=True)
class AttemptLabels:
    """What a provider attempt's span says of the call (never its prompt or answer)."""

    provider: str
    endpoint: str
    model: str
    upstream_model: str
    request_id: str
    key_prefix: str
    org_id: str


class Spans(Protocol):
    """Where spans go (:class:`gateway.observe.otel.OtlpSpans`)."""

    def server(self, trace: TraceContext, method: str, endpoint: str) -> ServerSpan: ...

    def attempt(self, parent: TraceContext, labels: AttemptLabels) -> AttemptSpan: ...
