"""Admission: ask the owning shard, turn its verdict into an admission or an error.

Step 3 (:func:`admit`) counts the request and takes an in-flight slot for model calls;
step 8 (:func:`reserve`) reserves the worst case; step 10 (:func:`settle`) resolves it.
A shard that cannot answer in time is a 503 admission_unavailable: nothing is ever
admitted unchecked. Every function takes the parts it asks (:class:`Admitting`): a
stream pump settles outside any request. The rate-limit headers of an admitted request
(:func:`rate_headers`) are the route's to set from the admission returned; a refusal by
a limit above the key's carries them in its error. With several nodes the shard admits
against leased headroom and a step it cannot cover is refilled first (:func:`_ask`,
:mod:`gateway.serving.node`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from gateway.accounts.catalog import nanos_to_usd, usd_to_nanos
from gateway.accounts.key_record import KeyRecord, key_ref
from gateway.accounts.usd_json import plain_usd
from gateway.calls.estimate import LOWER_IT
from gateway.errors import GatewayError
from gateway.store import StoreError
from shards import (
    Admission,
    AdmitRequest,
    LeaseShort,
    Reservation,
    ReserveRequest,
    SettleRequest,
    ShardPool,
    ShardUnavailable,
)

if TYPE_CHECKING:
    from gateway.accounts.orgs import Org

ADMISSION_RETRY_AFTER = 1
#: how many times a step is refilled and asked again before it is a 503
_REFILLS = 8
T = TypeVar("T")


class Refiller(Protocol):
    """This node of several (:class:`gateway.serving.node.Node`): its leases."""

    def admitting(self) -> bool: ...
    async def refill(self, short: LeaseShort, again: Callable[[], Awaitable[T]]) -> T | Any: ...


class Refusals(Protocol):
    def refused(self, code: str) -> None: ...


class Parents(Protocol):
    def get(self, key_id: str) -> KeyRecord | None: ...


class Admitting(Protocol):
    """What admission asks of the server (the runtime is one)."""

    @property
    def pool(self) -> ShardPool: ...
    @property
    def cluster(self) -> Refiller | None: ...
    @property
    def metrics(self) -> Refusals: ...
    @property
    def orgs(self) -> Mapping[str, Org]: ...
    @property
    def keyring(self) -> Parents: ...


def unavailable(rt: Admitting) -> GatewayError:
    rt.metrics.refused("admission_unavailable")
    return GatewayError(
        "admission_unavailable",
        "An admission check could not complete; retry shortly.",
        retry_after=ADMISSION_RETRY_AFTER,
    )


def rate_headers(admission: Admission) -> dict[str, str]:
    return {
        "X-RateLimit-Limit-Requests": str(admission.limit_requests),
        "X-RateLimit-Remaining-Requests": str(admission.remaining_requests),
        "X-RateLimit-Reset-Requests": f"{admission.reset_requests_s}s",
    }


def _usd(value: float | None) -> int | None:
    return usd_to_nanos(value) if value is not None else None


async def count_request(rt: Admitting, record: KeyRecord) -> None:
    """Count a request refused before step 3 in the key's windows; nothing else.

    Its own refusal is the answer whatever the window says, so the admission's outcome
    (and a shard that cannot answer) is of no consequence here.
    """
    with suppress(ShardUnavailable):
        await rt.pool.admit(_admit_request(rt, record, take_slot=False))


def _admit_request(
    rt: Admitting, record: KeyRecord, *, take_slot: bool, leased: bool = False
) -> AdmitRequest:
    org = rt.orgs.get(record.org_id)
    ref = key_ref(record)
    return AdmitRequest.build(
        shard=ref.shard,
        key=ref.state,
        org_id=record.org_id,
        rpm=record.caps.rpm,
        max_in_flight=record.caps.max_in_flight,
        take_slot=take_slot,
        org_rpm=org.policy.get("org_rpm") if org else None,
        key_id=record.id if leased else None,
    )


async def _ask(rt: Admitting, ask: Callable[[T], Awaitable[Any]], request: T) -> Any:
    """The shard's verdict on ``request``. With leases (several nodes), a LeaseShort is
    refilled and asked again (under the refill's locks), or becomes the refusal of the
    limit that has no headroom left; a fenced node, or a database that cannot refill, is
    a 503."""
    node = rt.cluster
    if node is not None and not node.admitting():
        raise unavailable(rt)
    try:
        verdict = await ask(request)
        for _ in range(_REFILLS):
            if not isinstance(verdict, LeaseShort):
                break
            assert node is not None
            verdict = await node.refill(verdict, partial(ask, request))
    except (ShardUnavailable, StoreError):
        raise unavailable(rt) from None
    if isinstance(verdict, LeaseShort):
        raise unavailable(rt)  # other calls of this node took every refill first
    return verdict


async def admit(rt: Admitting, record: KeyRecord, *, take_slot: bool) -> Admission:
    """Step 3: the admission, whose :func:`rate_headers` every later answer carries."""
    request = _admit_request(rt, record, take_slot=take_slot, leased=rt.cluster is not None)
    admission: Admission = await _ask(rt, rt.pool.admit, request)
    if not admission.ok:
        assert admission.code is not None
        rt.metrics.refused(admission.code)
        raise GatewayError(
            admission.code,
            _admit_message(admission),
            retry_after=admission.retry_after,
            # a limit above the key's: the key was admitted, so its headers apply
            headers=rate_headers(admission) if admission.scope in ("org", "platform") else {},
        )
    return admission


def _admit_message(admission: Admission) -> str:
    if admission.code == "too_many_in_flight":
        return "This key already has its maximum number of calls in flight."
    if admission.scope == "org":
        return "The organization's requests-per-minute limit is reached."
    if admission.scope == "platform":
        return "The platform's requests-per-minute limit is reached."
    return "This key's requests-per-minute limit is reached."


async def reserve(
    rt: Admitting, record: KeyRecord, *, tokens: int, cost: int, org_cost: int
) -> Reservation:
    """Step 8: tokens, key and parent spend caps, organisation credits and budget."""
    parent = rt.keyring.get(record.parent_id) if record.parent_id else None
    ref = key_ref(record)
    request = ReserveRequest.build(
        shard=ref.shard,
        key=ref.state,
        parent=key_ref(parent).state if parent else None,
        org_id=record.org_id,
        tokens=tokens,
        tpm=record.caps.tpm,
        cost=cost,
        key_usd_day=_usd(record.caps.usd_day),
        key_usd_month=_usd(record.caps.usd_month),
        parent_usd_day=_usd(parent.caps.usd_day) if parent else None,
        parent_usd_month=_usd(parent.caps.usd_month) if parent else None,
        org_cost=org_cost,
        check_credits=record.mode == "live",
        key_id=record.id if rt.cluster is not None else None,
        parent_id=parent.id if parent is not None else None,
    )
    verdict = await _ask(rt, rt.pool.reserve, request)
    if isinstance(verdict, Reservation):
        return verdict
    rt.metrics.refused(verdict.code)
    raise GatewayError(
        verdict.code, _reserve_message(verdict.code, cost), retry_after=verdict.retry_after
    )


def _reserve_message(code: str, cost: int) -> str:
    worst = f"The worst-case cost of this call, {plain_usd(nanos_to_usd(cost))} USD"
    return {
        "rate_limited": "This key's tokens-per-minute limit is reached.",
        "key_cap_exceeded": f"{worst}, would exceed a spend cap of this key or its parent;"
        f" {LOWER_IT}.",
        "insufficient_credits": f"{worst}, is more than the organization's credits left;"
        f" {LOWER_IT}.",
        "budget_exceeded": "The organization's budget for the period is exhausted.",
    }[code]


async def settle(
    rt: Admitting,
    record: KeyRecord,
    *,
    slot_taken: bool,
    reservation: Reservation | None,
    cap_amount: int = 0,
    billed_amount: int = 0,
) -> None:
    """Step 10: release the slot, post the settled amount (or void), exactly once."""
    ref = key_ref(record)
    await rt.pool.settle(
        SettleRequest.build(
            shard=ref.shard,
            key=ref.state,
            slot_taken=slot_taken,
            reservation=reservation,
            cap_amount=cap_amount,
            billed_amount=billed_amount,
            key_id=record.id if rt.cluster is not None else None,
        )
    )
