"""One model call's lifecycle: explicit states, and the one place a call is settled.

    ADMITTED ─reserved()─► RESERVED ─start_provider_call()─► CALLED ─hand_off()─► HANDED_OFF
        │                     │                                   │                  │
        └─────────────────────┴──────────── finish() ─────────────┴──────────────────┴─► SETTLED

- ADMITTED: counted in the key's request window, holding an in-flight slot (step 3).
- RESERVED: the model is resolved and priced, the worst case reserved (steps 6-8); the
  :class:`Hold` says what is held.
- CALLED: the provider was asked (step 9): from here an abandoned call is not "not called".
- HANDED_OFF: a stream pump owns the call and settles it; the handler no longer may.
- SETTLED: :meth:`Call.finish` wrote the request record (for calls that reached the
  model), then posted or voided the reservation and released the slot, exactly once.

The settlement row of every ending is decided by :meth:`Call.ending` (over
:func:`gateway.settlement.ending_for`); a call that ended without its own row (a fault of
ours, a cancellation) settles by :meth:`Call.unfinished_ending`.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import trio

from gateway import admission
from gateway.catalog import Model
from gateway.exchange import Exchange, call_settled
from gateway.keys import KeyRecord
from gateway.providers.base import Provider, Usage
from gateway.settlement import Ending, Settlement, ending_for, settle_amounts
from gateway.store import records
from shards import Admission, Reservation

if TYPE_CHECKING:
    from gateway.runtime import Runtime


class CallState(enum.Enum):
    ADMITTED = "admitted"
    RESERVED = "reserved"
    CALLED = "called"
    HANDED_OFF = "handed_off"
    SETTLED = "settled"


#: the states from which a call has reached the provider
_CALLED = frozenset({CallState.CALLED, CallState.HANDED_OFF})


@dataclass(frozen=True, slots=True)
class Hold:
    """What a reserved call holds: its provider, the reservation and what it reserved."""

    provider: Provider
    reservation: Reservation
    prompt_estimate: int
    reserved_nanos: int


@dataclass
class Call:
    runtime: Runtime
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
    state: CallState = CallState.ADMITTED
    #: the model step 6 resolved (priced), for the record and the logs
    model: Model | None = None
    hold: Hold | None = None
    settlement: Settlement | None = None
    #: when the provider was asked (perf_counter), for the upstream duration
    called_at: float | None = None
    #: the HTTP exchange the call answers (its log line, its trace)
    exchange: Exchange | None = None

    @property
    def live(self) -> bool:
        return self.record.mode == "live"

    @property
    def held(self) -> Hold:
        """The hold of a call past RESERVED."""
        assert self.hold is not None, f"a call in state {self.state.value} holds nothing"
        return self.hold

    def remaining(self) -> float:
        """Seconds left before the call's deadline."""
        return max(0.0, self.deadline - trio.current_time())

    # -- transitions -----------------------------------------------------------------------

    def _move(self, expected: CallState, to: CallState) -> None:
        if self.state is not expected:
            raise RuntimeError(f"call {self.request_id}: {self.state.value} → {to.value}")
        self.state = to

    def reserved(self, hold: Hold) -> None:
        """ADMITTED → RESERVED."""
        self._move(CallState.ADMITTED, CallState.RESERVED)
        self.hold = hold

    def start_provider_call(self) -> None:
        """RESERVED → CALLED: the provider is about to be asked (the one place this happens)."""
        self._move(CallState.RESERVED, CallState.CALLED)
        self.called_at = time.perf_counter()

    def hand_off(self) -> None:
        """CALLED → HANDED_OFF: a stream pump owns the call from now on."""
        self._move(CallState.CALLED, CallState.HANDED_OFF)

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
    ) -> Settlement:
        """Record and settle, exactly once; later calls return the first settlement.

        The one place a settlement is written: the request record and its ledger row
        (calls that reached the model) are committed before the shard posts the amount,
        so a settled amount is durable before any answer reports it.
        """
        if self.settlement is not None:
            return self.settlement
        hold, model = self.hold, self.model
        if hold is None or model is None:
            hold, ending = None, Ending.NOT_CALLED
        settlement = (
            settle_amounts(
                ending,
                model=model,
                reserved_nanos=hold.reserved_nanos,
                prompt_estimate=hold.prompt_estimate,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                live=self.live,
            )
            if hold is not None and model is not None
            else Settlement(Ending.NOT_CALLED, 0, 0)
        )
        self.settlement = settlement
        self.state = CallState.SETTLED
        with trio.CancelScope(shield=True):
            if hold is not None and model is not None and ending is not Ending.NOT_CALLED:
                await self.runtime.store.write(
                    records.record_call,
                    self._record_row(model, hold, settlement, usage, http_status, error_code),
                    self._ledger_row(settlement),
                )
            await admission.settle(
                self.runtime,
                self.record,
                slot_taken=self.admission.slot_taken,
                reservation=hold.reservation if hold is not None else None,
                cap_amount=settlement.cap_nanos,
                billed_amount=settlement.billed_nanos,
            )
        self.runtime.alerts.notice(self.record, settlement.cap_nanos)
        call_settled(self, settlement, usage, error_code)
        return settlement

    def _record_row(
        self,
        model: Model,
        hold: Hold,
        settlement: Settlement,
        usage: Usage | None,
        http_status: int,
        error: str | None,
    ) -> dict[str, Any]:
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
            "model": model.id,
            "provider": model.config.provider if self.live else "mock",
            "status": self._status(error),
            "http_status": http_status,
            "stream": int(self.stream),
            "tags": self.tags,
            "usage": usage.as_dict() if usage else None,
            "estimated_usd_nanos": hold.reserved_nanos,
            "reserved_usd_nanos": hold.reserved_nanos,
            "settled_usd_nanos": settlement.cap_nanos,
            "billed_usd_nanos": settlement.billed_nanos,
            "latency_ms": round((self.runtime.clock.now() - self.started) * 1000, 3),
            "error_code": error,
            "mode": self.record.mode,
            "trace_id": self.exchange.trace.trace_id if self.exchange else None,
        }

    def _status(self, error: str | None) -> str:
        """failed (with an error code), cancelled (the client went away), or succeeded."""
        if error is not None:
            return "failed"
        return "cancelled" if self.client_gone else "succeeded"

    def _ledger_row(self, settlement: Settlement) -> dict[str, Any] | None:
        if not settlement.billed_nanos:
            return None
        row = self.runtime.ledger_row(self.record.org_id, -settlement.billed_nanos, "usage")
        row["request_id"] = self.request_id
        return row
