"""GET /v1/key: the calling key's public fields, spend windows and rate-limit state."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from quart import Quart, Response

from gateway.accounts.catalog import nanos_to_usd, usd_to_nanos
from gateway.accounts.key_record import KeyRecord, iso, key_ref
from gateway.calls.admission import unavailable
from gateway.edge.auth import admit_reader
from gateway.edge.http import json_response, runtime
from gateway.store import StoreError, records
from shards import ShardUnavailable, SpendWindow


def _usd(nanos: int | None) -> float | None:
    return nanos_to_usd(nanos) if nanos is not None else None


def _window(window: SpendWindow) -> dict[str, Any]:
    return {
        "spent_usd": nanos_to_usd(window.spent),
        "reserved_usd": nanos_to_usd(window.reserved),
        "limit_usd": _usd(window.limit),
        "remaining_usd": _usd(window.remaining),
        "resets_at": iso(window.resets_at),
    }


async def key_view(record: KeyRecord) -> dict[str, Any]:
    """Public fields plus usage and rate_limit, read from the owning shard."""
    rt = runtime()
    caps = record.caps
    try:
        status = await rt.pool.key_status(
            key_ref(record),
            rpm=caps.rpm,
            tpm=caps.tpm,
            max_in_flight=caps.max_in_flight,
            usd_day=usd_to_nanos(caps.usd_day) if caps.usd_day is not None else None,
            usd_month=usd_to_nanos(caps.usd_month) if caps.usd_month is not None else None,
        )
    except ShardUnavailable:
        raise unavailable(rt) from None
    day, month = status.day, status.month
    if rt.cluster is not None:  # every node's spend: the records'
        day, month = await _cluster_windows(record, day, month)
    view = record.public(rt.clock.now())
    view["usage"] = {"day": _window(day), "month": _window(month)}
    view["rate_limit"] = {
        "requests_per_minute": status.rpm,
        "requests_this_minute": status.requests_this_minute,
        "tokens_per_minute": status.tpm,
        "tokens_this_minute": status.tokens_this_minute,
        "max_in_flight": status.max_in_flight,
        "in_flight": status.in_flight,
    }
    view["sub_key_count"] = len(rt.keyring.children(record.id))
    return view


async def _cluster_windows(
    record: KeyRecord, day: SpendWindow, month: SpendWindow
) -> tuple[SpendWindow, SpendWindow]:
    """Several nodes: the spend windows as the records hold them (settled, and reserved
    by the calls in flight on every node), with the caps and resets the shard gave."""
    rt = runtime()
    now = datetime.fromtimestamp(rt.clock.now(), UTC)
    try:
        got = await rt.store.read(
            records.key_windows, record.id, now.strftime("%Y-%m-%d"), now.strftime("%Y-%m")
        )
    except StoreError:
        raise unavailable(rt) from None

    def window(shard: SpendWindow, spent: int, reserved: int) -> SpendWindow:
        left = None if shard.limit is None else max(0, shard.limit - spent - reserved)
        return shard._replace(spent=spent, reserved=reserved, remaining=left)

    return (
        window(day, got["day_spent"], got["day_reserved"]),
        window(month, got["month_spent"], got["month_reserved"]),
    )


async def get_key() -> Response:
    record = await admit_reader(runtime(), None)
    return json_response(await key_view(record))


def register(app: Quart) -> None:
    app.add_url_rule("/v1/key", "key", get_key, methods=["GET"])
