"""One model call from admission to settlement (steps 3 to 10 of the request walk).

    handler                         this module
    -------                         -----------
    authenticate, scope             open_call()      step 3: admit, take a slot
    read body, tags, validate       resolve()        step 6: catalog, policy, data mode,
                                                             capabilities, price
                                    reserve_call()   steps 7-8: estimate, reserve
    provider call (or stream pump)  finish()         step 10: record, settle (once)

A :class:`Call` owns the in-flight slot and the reservation from admission until
:meth:`Call.finish` resolves both, exactly once, on every path: success, refusal, provider
failure, timeout, client gone. ``finish`` writes the request record (for calls that
reached the model) before the shard posts the amount, so a settled amount is durable
before any answer reports it.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import trio

from gateway import admission
from gateway.catalog import Model
from gateway.exchange import Exchange, call_opened, call_settled
from gateway.keys import KeyRecord
from gateway.policy import check_model, check_spend_controls
from gateway.providers.base import Provider, ProviderRequest, Usage
from gateway.runtime import Runtime
from gateway.settlement import Ending, Settlement, settle_amounts
from gateway.store import records
from shards import Admission, Reservation

log = logging.getLogger("gateway.pipeline")


@dataclass
class Call:
    runtime: Runtime
    record: KeyRecord
    request_id: str
    endpoint: str
    admission: Admission
    stream: bool = False
    tags: dict[str, str] = field(default_factory=dict)
    model: Model | None = None
    provider: Provider | None = None
    reservation: Reservation | None = None
    prompt_estimate: int = 0
    reserved_nanos: int = 0
    started: float = 0.0
    deadline: float = 0.0
    settlement: Settlement | None = None
    #: set when ownership of the call passes to a stream pump
    handed_off: bool = False
    #: set once the provider was asked: from then on an abandoned call is not "not called"
    provider_called: bool = False
    #: when the provider was asked (perf_counter), for the upstream duration
    called_at: float = 0.0
    client_gone: bool = False
    #: the HTTP exchange the call answers (its log line, its trace)
    exchange: Exchange | None = None

    @property
    def live(self) -> bool:
        return self.record.mode == "live"

    def calling_provider(self) -> None:
        """From now on the provider is asked: an abandoned call is not "not called"."""
        self.provider_called = True
        self.called_at = time.perf_counter()

    async def finish(
        self,
        ending: Ending,
        *,
        usage: Usage | None = None,
        http_status: int = 200,
        error_code: str | None = None,
    ) -> Settlement:
        """Record and settle, exactly once; later calls return the first settlement."""
        if self.settlement is not None:
            return self.settlement
        if self.reservation is None or self.model is None:
            ending = Ending.NOT_CALLED
        settlement = (
            settle_amounts(
                ending,
                model=self.model,
                reserved_nanos=self.reserved_nanos,
                prompt_estimate=self.prompt_estimate,
                prompt_tokens=usage.prompt_tokens if usage else 0,
                completion_tokens=usage.completion_tokens if usage else 0,
                live=self.live,
            )
            if self.model is not None
            else Settlement(Ending.NOT_CALLED, 0, 0)
        )
        self.settlement = settlement
        with trio.CancelScope(shield=True):
            if ending is not Ending.NOT_CALLED:
                await self.runtime.store.write(
                    records.record_call,
                    self._record_row(settlement, usage, http_status, error_code),
                    self._ledger_row(settlement),
                )
            await admission.settle(
                self.runtime,
                self.record,
                slot_taken=self.admission.slot_taken,
                reservation=self.reservation,
                cap_amount=settlement.cap_nanos,
                billed_amount=settlement.billed_nanos,
            )
        self.runtime.alerts.notice(self.record, settlement.cap_nanos)
        call_settled(self, settlement, usage, error_code)
        return settlement

    def _record_row(
        self, settlement: Settlement, usage: Usage | None, http_status: int, error: str | None
    ) -> dict[str, Any]:
        assert self.model is not None
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
            "model": self.model.id,
            "provider": self.model.config.provider if self.live else "mock",
            "status": self._status(error),
            "http_status": http_status,
            "stream": int(self.stream),
            "tags": self.tags,
            "usage": usage.as_dict() if usage else None,
            "estimated_usd_nanos": self.reserved_nanos,
            "reserved_usd_nanos": self.reserved_nanos,
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


async def open_call(runtime: Runtime, record: KeyRecord, request_id: str, endpoint: str) -> Call:
    """Step 3 for a model call: count the request and take an in-flight slot."""
    admitted = await admission.admit(record, take_slot=True)
    now = runtime.clock.now()
    call = Call(
        runtime=runtime,
        record=record,
        request_id=request_id,
        endpoint=endpoint,
        admission=admitted,
        started=now,
        deadline=trio.current_time() + runtime.config.server.request_timeout_s,
    )
    call_opened(call)
    return call


def resolve(call: Call, model_id: str, kind: str) -> Model:
    """Step 6: the model the key may call, or the refusal that says why not."""
    model = check_model(call.runtime, call.record, model_id, kind)
    call.model = model
    call.provider = call.runtime.provider_for(call.record, model)
    return model


async def reserve_call(call: Call, prompt_estimate: int, max_output: int) -> None:
    """Steps 7-8: reserve the worst case (prompt estimate + full output ceiling)."""
    assert call.model is not None
    call.prompt_estimate = prompt_estimate
    cost = call.model.cost_nanos(prompt_estimate, max_output)
    check_spend_controls(call.runtime, call.record, cost)
    call.reservation = await admission.reserve(
        call.record,
        tokens=prompt_estimate + max_output,
        cost=cost,
        org_cost=cost if call.live else 0,
    )
    call.reserved_nanos = cost


def provider_request(call: Call, body: dict[str, Any]) -> ProviderRequest:
    assert call.model is not None
    return ProviderRequest(
        upstream_model=call.model.config.upstream_id,
        body={**body, "model": call.model.config.upstream_id},
        api_key=call.runtime.provider_key(call.record, call.model),
        trace=call.exchange.trace if call.exchange else None,
        request_id=call.request_id,
    )


def svc_block(call: Call, ignored: list[str]) -> dict[str, Any]:
    return {"request_id": call.request_id, "ignored_parameters": ignored}


def remaining(call: Call) -> float:
    return max(0.0, call.deadline - trio.current_time())
