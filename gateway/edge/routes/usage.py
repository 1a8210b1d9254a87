"""Reads with usage:read: GET /v1/usage, GET /v1/credits, GET /v1/requests/{id}.

Answered from the store (usage, records, and ``refusals``: the key's and its sub-keys'
refused calls counted by day and code, :mod:`gateway.observe.refused_calls`) and the
organisation's account in the shards (credits). Costs: ``cost_usd`` is what was billed;
``settled_usd`` is what counted against spend caps (they differ when a provider reported
no usage, and for sandbox keys, which are never billed).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

from quart import Quart, Response, request

from gateway.accounts.catalog import nanos_to_usd
from gateway.accounts.key_record import KeyRecord, iso
from gateway.accounts.tag_rules import TAG_KEY
from gateway.edge.auth import admit_reader
from gateway.edge.http import json_response, runtime
from gateway.errors import GatewayError
from gateway.store import records
from gateway.store.refusal_counts import refusal_rows

if TYPE_CHECKING:
    from gateway.serving.runtime import Runtime

GROUPS = {"day": "day", "model": "model", "key": "key_id"}
EMPTY = {
    "requests": 0,
    "input_tokens": 0,
    "output_tokens": 0,
    **dict.fromkeys(records.CACHE_USAGE, 0),
    "billed": 0,
    "settled": 0,
}


async def _reader() -> KeyRecord:
    return await admit_reader(runtime(), "usage:read")


def request_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "object": "request",
        "id": row["id"],
        "created": iso(row["created"]),
        "endpoint": row["endpoint"],
        "model": row["model"],
        "provider": row["provider"],
        "key_id": row["key_id"],
        "mode": row["mode"],
        "status": row["status"],
        "http_status": row["http_status"],
        "stream": bool(row["stream"]),
        "tags": row["tags"] or {},
        "usage": records.usage_view(row["usage"]),
        "cost": {
            "estimated_usd": nanos_to_usd(row["estimated_usd_nanos"]),
            "reserved_usd": nanos_to_usd(row["reserved_usd_nanos"]),
            "settled_usd": nanos_to_usd(row["settled_usd_nanos"]),
            "billed_usd": nanos_to_usd(row["billed_usd_nanos"]),
        },
        "latency_ms": row["latency_ms"],
        "error": {"code": row["error_code"]} if row["error_code"] else None,
        "trace_id": row["trace_id"],
        # the provider attempts (routing); rows written before migration 10 list none
        "attempts": row.get("attempts") or [],
        # the guardrails that denied, redacted or flagged (migration 11 on)
        "guardrails": row.get("guardrails") or [],
        # the response cache: hit, miss or bypass (None: rows before it), the original a
        # hit was served from and what it saved
        "cache": row.get("cache"),
        "cache_of": row.get("cache_of"),
        "saved_usd": nanos_to_usd(row.get("saved_usd_nanos") or 0),
    }


async def get_request(request_id: str) -> Response:
    record = await _reader()
    rt = runtime()
    # the key's own calls and its sub-keys' (GET /v1/usage counts those too)
    children = (child.id for child in rt.keyring.children(record.id))
    row = await rt.store.read(records.get_request, request_id, record.id, *children)
    if row is None:
        raise GatewayError(
            "not_found", f"No request {request_id} for this key or its sub-keys.", "request_id"
        )
    return json_response(request_view(row))


async def credits_view(rt: Runtime, org_id: str) -> dict[str, Any]:
    """The organisation's credits: its account in the shards, its ledger's totals. With
    several nodes the balance is the ledger's (every node's debits), the reserved amount
    this node's."""
    account = rt.pool.org_snapshot(org_id)
    ledger = (await rt.store.read(records.org_balances)).get(org_id, {})
    balance = account.balance
    if rt.cluster is not None:
        balance = ledger.get("purchased", 0) - ledger.get("used", 0)
    return {
        "object": "credits",
        "org_id": org_id,
        "balance_usd": nanos_to_usd(balance),
        "reserved_usd": nanos_to_usd(account.reserved),
        "available_usd": nanos_to_usd(balance - account.reserved),
        "purchased_usd": nanos_to_usd(ledger.get("purchased", 0)),
        "used_usd": nanos_to_usd(ledger.get("used", 0)),
    }


async def get_credits() -> Response:
    record = await _reader()
    return json_response(await credits_view(runtime(), record.org_id))


def _day(name: str) -> date | None:
    value = request.args.get(name)
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise GatewayError(
            "invalid_request", f"{name} must be a date (YYYY-MM-DD).", param=name
        ) from None


def _group() -> str | None:
    group = request.args.get("group_by")
    if group is None:
        return None
    if group in GROUPS:
        return GROUPS[group]
    if group.startswith("tag:") and TAG_KEY.fullmatch(group[4:]):
        return group
    raise GatewayError(
        "invalid_request",
        "group_by must be day, model, key or tag:<name> (a tag key).",
        "group_by",
    )


def _month_end(day: date) -> date:
    """The last day of ``day``'s month (December 9999 included)."""
    if day.month == 12:
        return day.replace(day=31)
    return day.replace(month=day.month + 1, day=1) - timedelta(days=1)


def usage_totals(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": row["requests"],
        "input_tokens": row["input_tokens"] or 0,
        "output_tokens": row["output_tokens"] or 0,
        # parts of input_tokens: read from, and written to, the provider's prompt cache
        **{name: row[name] or 0 for name in records.CACHE_USAGE},
        "cost_usd": nanos_to_usd(row["billed"] or 0),
        "settled_usd": nanos_to_usd(row["settled"] or 0),
    }


async def get_usage() -> Response:
    record = await _reader()
    rt = runtime()
    today = datetime.fromtimestamp(rt.clock.now(), UTC).date()
    start, end = _day("start"), _day("end")
    # defaults: the current month, stretched to the month of the end that was sent
    # (start: the first of the current month, or of end's month if earlier; end: the
    # last of the current month, or of start's month if later). An end before start
    # is a window of no day: zeros and no groups, not a refusal.
    start = start or min(end or today, today).replace(day=1)
    end = end or _month_end(max(start, today))
    group = _group()
    key_ids = [record.id, *(child.id for child in rt.keyring.children(record.id))]
    args = (key_ids, start.isoformat(), end.isoformat())
    total_rows = await rt.store.read(records.usage_rows, *args, None)
    total = usage_totals(total_rows[0] if total_rows else EMPTY)
    body: dict[str, Any] = {
        "object": "usage",
        "start": start.isoformat(),
        "end": end.isoformat(),
        "group_by": request.args.get("group_by"),
        "totals": total,
        "data": [],
    }
    if group is not None:
        rows = await rt.store.read(records.usage_rows, *args, group)
        body["data"] = [{"group": row["grp"], **usage_totals(row)} for row in rows]
    body["refusals"] = await rt.store.read(refusal_rows, key_ids, None, *args[1:])
    return json_response(body)


def register(app: Quart) -> None:
    app.add_url_rule("/v1/usage", "usage", get_usage, methods=["GET"])
    app.add_url_rule("/v1/credits", "credits", get_credits, methods=["GET"])
    app.add_url_rule("/v1/requests/<request_id>", "request", get_request, methods=["GET"])
