"""One model call's lifecycle: explicit states, and the one place a call is settled.

    ADMITTED ─reserved()─► RESERVED ─start_provider_call()─► CALLED ─hand_off()─► HANDED_OFF
        │                     │                                   │                  │
        └─────────────────────┴──────────── finish() ─────────────┴──────────────────┴─► SETTLED

- ADMITTED: counted in the key's request window, holding an in-flight slot (step 3).
- RESERVED: the model is resolved and priced, the worst case reserved (steps 6-8); the
  :class:`Hold` says what is held.
- CALLED: the provider may be asked (step 9): the request row exists in the store with
  status ``pending`` and the reserved amount (and the Idempotency-Key claim), committed
  before the move. From here an abandoned call is not "not called", and a crash leaves
  a row that start-up recovery settles (:func:`gateway.store.records.recover_pending`).
- HANDED_OFF: a stream pump owns the call and settles it; the handler no longer may.
- SETTLED: :meth:`Call.finish` turned the pending row into the call's final record
  (with its ledger row and the claim's outcome, one transaction), then posted or voided
  the reservation and released the slot, exactly once.

The settlement row of every ending is decided by :meth:`Call.ending` (over
:func:`gateway.calls.settlement.ending_for`); a call that ended without its own row (a fault of
ours, a cancellation) settles by :meth:`Call.unfinished_ending`. A graceful stop cuts a
call still running at its deadline through :meth:`Call.cut` (see :mod:`gateway.calls.inflight`).
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import orjson
import trio

from gateway.accounts.catalog import Model
from gateway.accounts.key_record import KeyRecord
from gateway.calls import admission
from gateway.calls.guardrails.rules import Guardrail, Guardrails
from gateway.calls.inflight import STOPPING_MESSAGE, InFlight
from gateway.calls.keepalive import KeepaliveClock
from gateway.calls.policy import PolicySource
from gateway.calls.routing import Route, Router
from gateway.calls.settlement import Ending, Settlement, ending_for, settle_amounts
from gateway.errors import GatewayError
from gateway.observe.logs import event
from gateway.observe.tracing import AttemptLabels, AttemptSpan, Spans, TraceContext
from gateway.providers.base import Provider, Usage
from gateway.store import StoreError, cache_entries, records
from gateway.store.claims import ClaimHeld
from shards import Admission, Reservation, posted
from shards.clock import Clock

if TYPE_CHECKING:
    from gateway.store import Store
    from gateway.store.claims import Claim

log = logging.getLogger("gateway.calls")


class CallState(enum.Enum):
    ADMITTED = "admitted"
    RESERVED = "reserved"
    CALLED = "called"
    HANDED_OFF = "handed_off"
    SETTLED = "settled"


#: the states from which a call has reached the provider
_CALLED = frozenset({CallState.CALLED, CallState.HANDED_OFF})
#: every transition a call may make (the diagram above); each goes through Call._move
_NEXT = {
    CallState.ADMITTED: frozenset({CallState.RESERVED, CallState.SETTLED}),
    CallState.RESERVED: frozenset({CallState.CALLED, CallState.SETTLED}),
    CallState.CALLED: frozenset({CallState.HANDED_OFF, CallState.SETTLED}),
    CallState.HANDED_OFF: frozenset({CallState.SETTLED}),
    CallState.SETTLED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class SettledCall:
    """What a settled call tells its report: the request's log line and series."""

    model: str | None
    provider: str | None
    mode: str
    stream: bool
    #: seconds since the provider was asked (None: it was not)
    upstream_s: float | None
    #: the reported usage (None: none was reported)
    input_tokens: int | None
    output_tokens: int | None
    settled_nanos: int
    billed_nanos: int
    #: the call's error code (a stream that failed in band was answered 200)
    code: str | None
    #: the call has a request record (it reached the model); else it was refused before
    recorded: bool = False


def finish_reasons(answer: dict[str, Any]) -> list[str]:
    """The finish reasons of a chat completion or chunk (for its attempt's span)."""
    choices = answer.get("choices")
    if not isinstance(choices, list):
        return []
    return [
        reason
        for choice in choices
        if isinstance(choice, dict) and isinstance(reason := choice.get("finish_reason"), str)
    ]


class CacheTicket(Protocol):
    """What the response cache did with a call (:class:`gateway.calls.cache.Ticket`)."""

    @property
    def result(self) -> str: ...
    def to_store(
        self, call: Call, settlement: Settlement, usage: Usage | None, ok: bool
    ) -> tuple[Any, ...] | None: ...
    async def settled(self, call: Call) -> None: ...


class ResponseCaching(Protocol):
    """The response cache as the walk asks it (:class:`gateway.calls.cache.ResponseCache`)."""

    async def look(
        self, call: Call, body: dict[str, Any], model: Model, ceiling: int, control: str | None
    ) -> CacheTicket: ...


class CallReport(Protocol):
    """Who hears of a call's opening and settlement (the request it answers)."""

    @property
    def trace(self) -> TraceContext | None: ...
    def opened(self) -> None: ...
    def settled(self, call: SettledCall) -> None: ...


@dataclass(frozen=True, slots=True)
class CallParts:
    """The parts of the server a call uses: built once by the server, shared by every
    call (the walk, the call's own transitions, its settlement)."""

    store: Store
    clock: Clock
    #: the key shards, as admission asks them
    shards: admission.Admitting
    #: the catalog, organisations and keys, as the model checks read them
    policy: PolicySource
    inflight: InFlight
    #: a settled amount, for the spend alerts
    notice_spend: Callable[[KeyRecord, int], None]
    #: a credit-ledger row: organisation, nano-USD, kind
    ledger_row: Callable[[str, int, str], dict[str, Any]]
    provider_for: Callable[[KeyRecord, Model], Provider]
    #: the provider credential of a call (the organisation's own under BYOK)
    provider_key: Callable[[KeyRecord, Model], str | None]
    #: this node's id when several nodes share the database, else None
    node_id: str | None
    request_timeout_s: float
    keepalive_s: float
    #: when a stream's body has waited ``keepalive_s`` (run by the server)
    keepalives: KeepaliveClock
    #: the server's root nursery, where stream pumps and idempotent calls outlive requests
    nursery: Callable[[], trio.Nursery | None]
    #: which deployment an attempt goes to, and their health on this node
    router: Router = field(default_factory=Router)
    #: where a provider attempt's span goes (None: traces are off, nothing is done)
    spans: Spans | None = None
    #: the ``[[guardrails]]`` of the config (gateway/calls/guardrails)
    guardrails: Guardrails = field(default_factory=Guardrails)
    #: the response cache (None: off)
    cache: ResponseCaching | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """What a reserved call holds: the model as priced (on the deployment of the attempt
    under way), its provider, the reservation (and its top-up, after a fallback to a
    dearer model: ``reserved_nanos`` is then the sum of both)."""

    model: Model
    provider: Provider
    reservation: Reservation
    prompt_estimate: int
    reserved_nanos: int
    topups: tuple[Reservation, ...] = ()

    def parts(self, cap: int, billed: int) -> list[tuple[Reservation, int, int]]:
        """Each reservation held with what a settlement of ``cap`` and ``billed`` posts
        out of it: the first reservation first, then each top-up, each within itself."""
        found = []
        for reservation in (self.reservation, *self.topups):
            cap_part = min(cap, reservation.key_nanos)
            billed_part = min(billed, reservation.org_nanos)
            found.append((reservation, cap_part, billed_part))
            cap, billed = cap - cap_part, billed - billed_part
        return found


@dataclass(eq=False)  # a call is itself: held in sets by identity
class Call:
    parts: CallParts
    record: KeyRecord
    request_id: str
    endpoint: str
    admission: Admission
    started: float
    deadline: float
    #: False on embeddings: every failure after the provider was asked counts nothing
    failures_count: bool = True
    stream: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    client_gone: bool = False
    #: the Idempotency-Key this call holds, written with its pending row
    claim: Claim | None = None
    state: CallState = CallState.ADMITTED
    hold: Hold | None = None
    settlement: Settlement | None = None
    #: a graceful stop's deadline cut this call short (it ends as service_unavailable)
    cut_short: bool = False
    #: the cancel scope of the provider call, which :meth:`cut` cancels
    scope: trio.CancelScope | None = None
    #: when the provider was asked (perf_counter; None before), for the upstream duration
    called_at: float | None = None
    #: the request the call answers hears of it (its log line, its series, its trace)
    report: CallReport | None = None
    #: the span of the provider attempt, from CALLED to SETTLED (traces on only)
    attempt: AttemptSpan | None = None
    #: the provider attempts so far, as the record lists them (routing)
    attempts: list[dict[str, Any]] = field(default_factory=list)
    #: when the attempt under way started (perf_counter)
    attempt_started: float | None = None
    #: the model the client asked for, when a fallback model serves the call
    fallback_from: str | None = None
    #: the guardrails that apply to this call, and what they did (the record's
    #: ``guardrails``: name, direction, verdict; never the text they matched)
    guards: tuple[Guardrail, ...] = ()
    verdicts: list[dict[str, str]] = field(default_factory=list)
    #: what the response cache did with the call (None: it did not look)
    cache: CacheTicket | None = None

    @property
    def live(self) -> bool:
        return self.record.mode == "live"

    @property
    def held(self) -> Hold:
        """The hold of a call past RESERVED."""
        assert self.hold is not None, f"a call in state {self.state.value} holds nothing"
        return self.hold

    def _provider_of(self, model: Model) -> str:
        """The provider that serves this call: the model's, or the mock for a sandbox key."""
        return model.config.provider if self.live else "mock"

    def remaining(self) -> float:
        """Seconds left before the call's deadline."""
        return max(0.0, self.deadline - trio.current_time())

    # -- transitions -----------------------------------------------------------------------

    def _move(self, to: CallState) -> None:
        """The one place the state changes: only along the diagram's arrows."""
        if to not in _NEXT[self.state]:
            raise RuntimeError(f"call {self.request_id}: {self.state.value} → {to.value}")
        self.state = to

    def reserved(self, hold: Hold) -> None:
        """ADMITTED → RESERVED."""
        self._move(CallState.RESERVED)
        self.hold = hold

    async def start_provider_call(self) -> None:
        """RESERVED → CALLED: the provider is about to be asked (the one place this happens).

        First the pending row (and the Idempotency-Key claim) is committed: only a call
        that reaches this point waits for a write. A store that cannot take it refuses
        the call (503 admission_unavailable, Retry-After) before the provider is asked.
        An Idempotency-Key claimed by another attempt raises :class:`ClaimHeld` (the
        call stays RESERVED: it settles as not called).
        """
        if self.cut_short:
            raise GatewayError("service_unavailable", STOPPING_MESSAGE)
        hold = self.held
        claim = self.claim
        claim_row = (
            claim.running_row(self.record.id, self.stream, self.parts.clock.now())
            if claim is not None
            else None
        )
        try:
            held = await self.parts.store.write(
                records.open_call, self._pending_row(hold), claim_row
            )
        except StoreError:
            raise GatewayError(
                "admission_unavailable", "The call could not be recorded; retry shortly."
            ) from None
        if held is not None:
            raise ClaimHeld(held)  # another attempt (maybe on another node) holds the key
        self._move(CallState.CALLED)
        self.called_at = time.perf_counter()
        self._open_span()

    async def start_attempt(self, route: Route) -> None:
        """An attempt on ``route`` (a deployment, of the model or of a fallback already
        reserved for) is about to ask its provider: the first moves the call to CALLED
        (:meth:`start_provider_call`); a later one, a retry before any byte reached the
        client, keeps the pending row and the reservation and opens its own span."""
        hold = self.held
        provider = self.parts.provider_for(self.record, route.model)
        if route.model is not hold.model or provider is not hold.provider:
            self.hold = replace(hold, model=route.model, provider=provider)
        if self.state is CallState.RESERVED:
            await self.start_provider_call()
        elif self.attempts:
            self._open_span()  # a stream's first attempt has the span its call opened
        self.attempts.append(
            {
                "model": route.model.id,
                "provider": self._provider_of(route.model),
                "upstream_id": route.model.config.upstream_id,
                "deployment": route.index,
                "status": None,
                "code": None,
                "ttfb_ms": None,
            }
        )
        self.attempt_started = time.perf_counter()

    async def top_up(self, model: Model, cost: int) -> None:
        """Before an attempt on a fallback ``model`` whose worst case is ``cost``: hold
        it. What the reservation lacks is reserved in one step of the owning shard (with
        leases on several nodes), or refused (its GatewayError, nothing held)."""
        hold = self.held
        extra = cost - hold.reserved_nanos
        if extra <= 0:
            return
        more = await admission.reserve(
            self.parts.shards, self.record, tokens=0, cost=extra, org_cost=extra if self.live else 0
        )
        self.hold = replace(
            hold, reserved_nanos=hold.reserved_nanos + extra, topups=(*hold.topups, more)
        )
        # the pending row says it too: recovery after a crash counts what the row holds
        try:
            await self.parts.store.write(
                records.raise_reservation, self.request_id, self.hold.reserved_nanos
            )
        except StoreError:
            # held in memory (the settlement releases it), but no fallback on it
            raise GatewayError(
                "admission_unavailable", "The call could not be recorded; retry shortly."
            ) from None

    def first_byte(self) -> float:
        """The attempt under way had its first byte: the seconds it took."""
        started = self.attempt_started
        seconds = time.perf_counter() - started if started is not None else 0.0
        if self.attempts:
            self.attempts[-1]["ttfb_ms"] = round(seconds * 1000, 3)
        return seconds

    def note_failure(self, status: int | None, code: str) -> None:
        """The attempt under way failed: the upstream's status (None: no answer) and the
        error code its failure maps to, in its entry."""
        if self.attempts:
            self.attempts[-1].update(status=status, code=code)

    def attempt_failed(self, status: int | None, code: str) -> None:
        """The attempt under way failed before its first byte and another follows: its
        entry says how, its span ends."""
        self.note_failure(status, code)
        if self.attempt is not None:
            self.attempt.end(input_tokens=None, output_tokens=None, error=code)
            self.attempt = None

    def _open_span(self) -> None:
        """The span of the attempt under way (traces on only), child of the request's."""
        hold = self.held
        spans, trace = self.parts.spans, self.trace
        if spans is not None and trace is not None:
            labels = AttemptLabels(
                provider=self._provider_of(hold.model),
                endpoint=self.endpoint,
                model=hold.model.id,
                upstream_model=hold.model.config.upstream_id,
                request_id=self.request_id,
                key_prefix=self.record.prefix,
                org_id=self.record.org_id,
            )
            self.attempt = spans.attempt(trace, labels)

    def hand_off(self) -> None:
        """CALLED → HANDED_OFF: a stream pump owns the call from now on."""
        self._move(CallState.HANDED_OFF)

    def watch(self, scope: trio.CancelScope) -> trio.CancelScope:
        """Make ``scope`` the provider call's: :meth:`cut` cancels it."""
        self.scope = scope
        if self.cut_short:
            scope.cancel()
        return scope

    def client_left(self) -> None:
        """The client went away: the call's record says ``cancelled``."""
        self.client_gone = True

    def cut(self) -> None:
        """A graceful stop's deadline: end the provider call now, as service_unavailable."""
        self.cut_short = True
        if self.scope is not None:
            self.scope.cancel()

    # -- endings ---------------------------------------------------------------------------

    def ending(
        self,
        *,
        answered: bool = False,
        usage: Usage | None = None,
        failure: Ending | None = None,
        produced: bool = False,
    ) -> Ending:
        """The settlement row of this call as it ends (see :func:`ending_for`)."""
        return ending_for(
            called=self.state in _CALLED,
            answered=answered,
            usage=usage is not None,
            failure=failure,
            produced=produced,
            failures_count=self.failures_count,
        )

    def unfinished_ending(self) -> Ending:
        """How a call that ended without its own settlement row settles: not called, or
        called and then abandoned (a fault of ours, a cancellation)."""
        return self.ending()

    async def end(self, *, http_status: int = 200, error_code: str | None = None) -> None:
        """Settle a call its handler still owns by :meth:`unfinished_ending`; a call
        handed to a stream pump is the pump's to settle, a settled one is left alone."""
        if self.state not in (CallState.HANDED_OFF, CallState.SETTLED):
            await self.finish(
                self.unfinished_ending(), http_status=http_status, error_code=error_code
            )

    async def finish(
        self,
        ending: Ending,
        *,
        usage: Usage | None = None,
        http_status: int = 200,
        error_code: str | None = None,
        answer: dict[str, Any] | None = None,
    ) -> Settlement:
        """Record and settle, exactly once; later calls return the first settlement.

        The one place a settlement is written: a call that reached the model has its
        pending row turned into its record, its ledger row appended and its
        Idempotency-Key outcome written (``answer``: the body a retry may replay), in
        one transaction committed before the shard posts the amount, so a settled
        amount is durable before any answer reports it.
        """
        if self.settlement is not None:
            return self.settlement
        if self.attempts and self.attempts[-1]["code"] is None:
            # the last attempt served the call, or our deadline, the client or a fault of
            # ours ended it (a provider's failure was noted already)
            self.attempts[-1]["code"] = error_code
            if error_code is None:
                self.attempts[-1]["status"] = 200
        if self.attempt is not None:
            # the provider's part ends here, before the settlement is written
            self.attempt.end(
                input_tokens=usage.prompt_tokens if usage else None,
                output_tokens=usage.completion_tokens if usage else None,
                error=error_code,
            )
        hold = self.hold
        recorded = self.state in _CALLED  # the pending row exists
        if hold is None:
            ending = Ending.NOT_CALLED
        settlement = (
            settle_amounts(
                ending,
                model=hold.model,
                reserved_nanos=hold.reserved_nanos,
                prompt_estimate=hold.prompt_estimate,
                usage=usage,
                live=self.live,
            )
            if hold is not None
            else Settlement(Ending.NOT_CALLED, 0, 0)
        )
        self.settlement = settlement
        self._move(CallState.SETTLED)
        # a response cache's miss that completed stores its answer with its settlement
        ok = recorded and error_code is None and not self.client_gone
        entry = self.cache.to_store(self, settlement, usage, ok) if self.cache else None
        with trio.CancelScope(shield=True):
            try:
                if recorded:
                    await self._write_settlement(
                        settlement, usage, http_status, error_code, answer, entry
                    )
            finally:
                # memory settles whatever the store said: nothing stays reserved or in flight
                held: list[tuple[Reservation | None, int, int]] = [(None, 0, 0)]
                if hold is not None:
                    held = [*hold.parts(settlement.cap_nanos, settlement.billed_nanos)]
                slot_taken = self.admission.slot_taken
                for reservation, cap, billed in held:
                    await admission.settle(
                        self.parts.shards,
                        self.record,
                        slot_taken=slot_taken,
                        reservation=reservation,
                        cap_amount=cap,
                        billed_amount=billed,
                    )
                    slot_taken = False
            if self.cache is not None:
                await self.cache.settled(self)
        self.parts.inflight.discard(self)
        self.parts.notice_spend(self.record, settlement.cap_nanos)
        if self.report is not None:
            self.report.settled(self._settled_call(settlement, usage, error_code, recorded))
        return settlement

    @property
    def trace(self) -> TraceContext | None:
        """The call's trace: once the provider is asked, with its attempt as the parent
        (when traces are exported), else the request's."""
        if self.attempt is not None:
            return self.attempt.context
        return self.report.trace if self.report is not None else None

    def _settled_call(
        self, settlement: Settlement, usage: Usage | None, code: str | None, recorded: bool
    ) -> SettledCall:
        model = self.hold.model if self.hold is not None else None
        return SettledCall(
            model=model.id if model else None,
            provider=self._provider_of(model) if model else None,
            mode=self.record.mode,
            stream=self.stream,
            upstream_s=time.perf_counter() - self.called_at if self.called_at is not None else None,
            input_tokens=usage.prompt_tokens if usage else None,
            output_tokens=usage.completion_tokens if usage else None,
            settled_nanos=settlement.cap_nanos,
            billed_nanos=settlement.billed_nanos,
            code=code,
            recorded=recorded,
        )

    async def _write_settlement(
        self,
        settlement: Settlement,
        usage: Usage | None,
        http_status: int,
        error_code: str | None,
        answer: dict[str, Any] | None,
        cache_entry: tuple[Any, ...] | None = None,
    ) -> None:
        """The pending row becomes the record, with its ledger row and claim outcome
        (and the response cache's entry of a miss, :mod:`gateway.calls.cache`).

        ``must_land``: a database that went away, or a write that keeps losing
        conflicts, keeps it queued in this node until it commits. The call waits for
        that up to the store's bound (``MUST_LAND_WAIT_S``); past it the call goes on
        (its answer is the provider's) while the write stays queued, and readiness
        says so.
        """
        claim = self.claim
        op, first = (
            (records.settle_call, ())
            if cache_entry is None
            else (cache_entries.settle_and_store, (cache_entry,))
        )
        try:
            await self.parts.store.write(
                op,
                *first,
                self.request_id,
                self._settled_values(settlement, usage, http_status, error_code),
                self._ledger_row(settlement),
                (self.record.id, claim.idem_key) if claim is not None else None,
                self._claim_outcome(http_status, error_code, answer),
                self._lease_use(settlement),
                must_land=True,
            )
        except StoreError:
            log.error(
                "the settlement of %s is not committed yet; it stays queued",
                self.request_id,
                extra=event("store_error", error="settlement queued"),
            )

    def _lease_use(self, settlement: Settlement) -> tuple[str, list[tuple[str, int]]] | None:
        """Several nodes: this node's id and what the settlement posts out of its leases."""
        node_id = self.parts.node_id
        if node_id is None:
            return None
        hold = self.hold
        if hold is None:
            return node_id, []
        held = hold.parts(settlement.cap_nanos, settlement.billed_nanos)
        return node_id, [use for r, cap, billed in held for use in posted(r.leases, cap, billed)]

    def _pending_row(self, hold: Hold) -> dict[str, Any]:
        """The request row of a call about to be asked: what it holds, nothing settled."""
        created = datetime.fromtimestamp(self.started, UTC)
        return {
            "id": self.request_id,
            "key_id": self.record.id,
            "parent_id": self.record.parent_id,
            "org_id": self.record.org_id,
            "created": self.started,
            "day": created.strftime("%Y-%m-%d"),
            "month": created.strftime("%Y-%m"),
            "endpoint": self.endpoint,
            "model": hold.model.id,
            "provider": self._provider_of(hold.model),
            "status": records.PENDING,
            "http_status": None,
            "stream": int(self.stream),
            "tags": self.tags,
            "usage": None,
            "estimated_usd_nanos": hold.reserved_nanos,
            "reserved_usd_nanos": hold.reserved_nanos,
            "settled_usd_nanos": 0,
            "billed_usd_nanos": 0,
            "latency_ms": None,
            "error_code": None,
            "mode": self.record.mode,
            "trace_id": self.trace.trace_id if self.trace else None,
            "node_id": self.parts.node_id,
            "cache": self.cache.result if self.cache is not None else None,
        }

    def _settled_values(
        self, settlement: Settlement, usage: Usage | None, http_status: int, error: str | None
    ) -> dict[str, Any]:
        """What settlement writes over the pending row."""
        hold = self.held
        return {
            # the model and provider that served the call (or failed last)
            "model": hold.model.id,
            "provider": self._provider_of(hold.model),
            "attempts": self.attempts or None,
            "guardrails": self.verdicts or None,
            # a fallback to a dearer model topped the reservation up
            "reserved_usd_nanos": hold.reserved_nanos,
            "status": self._status(error),
            "http_status": http_status,
            "usage": _usage_row(usage) if usage else None,
            "settled_usd_nanos": settlement.cap_nanos,
            "billed_usd_nanos": settlement.billed_nanos,
            "latency_ms": round((self.parts.clock.now() - self.started) * 1000, 3),
            "error_code": error,
        }

    def _claim_outcome(
        self, http_status: int, error: str | None, answer: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The Idempotency-Key's outcome: kept for a call the client was answered 200
        (a stream, or a non-streamed answer), dropped (None) for a refusal or a failure,
        so that the retry is a new attempt."""
        if self.claim is None or http_status != 200 or not (self.stream or answer is not None):
            return None
        return self.claim.outcome(
            stream=self.stream,
            answer=orjson.dumps(answer) if answer is not None else None,
            keep=self.record.data_mode != "zero_retention",
        )

    def _status(self, error: str | None) -> str:
        """cancelled (the client went away), failed (with an error code), or succeeded."""
        if self.client_gone:
            return "cancelled"
        return "failed" if error is not None else "succeeded"

    def _ledger_row(self, settlement: Settlement) -> dict[str, Any] | None:
        if not settlement.billed_nanos:
            return None
        row = self.parts.ledger_row(self.record.org_id, -settlement.billed_nanos, "usage")
        row["request_id"] = self.request_id
        return row


def _usage_row(usage: Usage) -> dict[str, int]:
    """The record's stored usage of a reported ``usage``."""
    return records.usage_row(
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.total_tokens,
        usage.cached_tokens,
        usage.cache_write_tokens,
    )
