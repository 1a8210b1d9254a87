"""The read-only pages: Usage (a chart a day over a date range, totals by day, key, model
or tag, CSV; the refused calls by day, key and code), Requests (the records, newest
first, filtered by date, key, model, status and tag, in keyset pages; one record's
detail) and Credits (balance, reserved, the ledger).

They read through the same functions as ``/v1/usage``, ``/v1/requests/{id}`` and
``/v1/credits``, over every key of the signed-in user's organisation.
"""

from __future__ import annotations

import csv
import io
from typing import Any
from urllib.parse import urlencode

from quart import Response, request
from werkzeug.datastructures import MultiDict

from gateway.accounts.catalog import nanos_to_usd
from gateway.accounts.tag_rules import TAG_KEY
from gateway.edge.dashboard import paging, time_range
from gateway.edge.dashboard.chart import bar_chart
from gateway.edge.dashboard.format import decimal
from gateway.edge.dashboard.keys_pages import org_keys
from gateway.edge.dashboard.web import User, bp, page, page_user
from gateway.edge.http import runtime
from gateway.edge.routes.usage import EMPTY, GROUPS, credits_view, request_view, usage_totals
from gateway.errors import GatewayError
from gateway.store import cache_entries, records
from gateway.store import dashboard as ops
from gateway.store.refusal_counts import refusal_rows

PAGE_SIZE = 50
LEDGER_ROWS = 100
STATUSES = ("succeeded", "failed", "cancelled")
METRICS = {"settled": "settled", "billed": "billed"}
GROUP_BY = ("day", "key", "model", "tag")


def _group() -> tuple[str, str, str | None]:
    """(group_by as the page names it, the store's group, the tag name if any)."""
    by = request.args.get("group_by", "key")
    tag = request.args.get("tag", "").strip()
    if by == "tag":
        if not TAG_KEY.fullmatch(tag):
            raise GatewayError("invalid_request", "Name a tag key to group by.", "tag")
        return by, f"tag:{tag}", tag
    if by not in GROUP_BY:
        by = "key"
    return by, GROUPS[by], None


async def _usage(user: User, span: time_range.TimeRange) -> dict[str, Any]:
    """The organisation's usage over ``span``: the very query and totals of ``/v1/usage``
    (``records.usage_rows``, ``usage_totals``), over every key of the organisation."""
    rt = runtime()
    by, group, tag = _group()
    names = {r.id: f"{r.name} ({r.prefix})" for r in await org_keys(user.org_id)}
    key_ids = list(names) or [""]
    args = (key_ids, span.start.isoformat(), span.end.isoformat())
    total_rows = await rt.store.read(records.usage_rows, *args, None)
    group_rows = await rt.store.read(records.usage_rows, *args, group)
    series = None if by == "day" else group  # by day: one series, a bar a day
    daily = await rt.store.read(records.usage_rows, *args, series, True)
    metric = METRICS.get(request.args.get("metric", ""), "settled")

    def label(value: Any) -> str:
        if by == "day":
            return str(value) if value is not None else "all calls"
        if value is None:
            return "(no tag)" if tag else "(none)"
        return names.get(value, str(value)) if by == "key" else str(value)

    # what the response cache saved, by key: the original cost of each hit
    saved = await rt.store.read(cache_entries.saved_by_key, user.org_id, *span.bounds)
    refused = await rt.store.read(refusal_rows, key_ids, None, *args[1:])
    points = {(row["day"], label(row["grp"])): nanos_to_usd(row[metric] or 0) for row in daily}
    title = f"Daily spend by {by}, {span.start} to {span.end}"
    chart, legend = bar_chart(span.days, points, title)
    return {
        "span": span,
        "group_by": by,
        "tag": tag or "",
        "metric": metric,
        "chart": chart,
        "legend": legend,
        "totals": usage_totals(total_rows[0] if total_rows else EMPTY),
        "groups": [{"group": label(r["grp"]), **usage_totals(r)} for r in group_rows],
        "daily": [{"day": r["day"], "group": label(r["grp"]), **usage_totals(r)} for r in daily],
        "cache_saved": [
            {"key": names.get(key_id, key_id), "saved_usd": nanos_to_usd(nanos)}
            for key_id, nanos in sorted(saved.items())
            if key_id in names
        ],
        "refusals": [{**r, "key": names.get(r["key_id"], r["key_id"])} for r in refused],
    }


def _span() -> time_range.TimeRange:
    return time_range.read(request.args, runtime().clock.now())


def _range_context() -> dict[str, Any]:
    return {"presets": time_range.PRESETS, "group_bys": GROUP_BY}


@bp.get("/usage")
async def usage() -> Response:
    user = await page_user()
    try:
        data = await _usage(user, _span())
    except GatewayError as error:
        fallback = time_range.read(MultiDict(), runtime().clock.now())
        errors = {error.param or "form": error.message or ""}
        return await page(
            "usage.html", 400, nav="usage", errors=errors, span=fallback,
            group_by=request.args.get("group_by", "key"), tag=request.args.get("tag", ""),
            values=request.args, **_range_context(),
        )  # fmt: skip
    return await page(
        "usage.html", nav="usage", errors={}, values=request.args, **data, **_range_context()
    )


@bp.get("/usage.csv")
async def usage_csv() -> Response:
    user = await page_user()
    data = await _usage(user, _span())
    out = io.StringIO()
    columns = ["day", "group", "requests", "input_tokens", "output_tokens"]
    writer = csv.writer(out)
    writer.writerow([*columns, "cost_usd", "settled_usd"])
    for row in data["daily"]:
        amounts = (decimal(row["cost_usd"]), decimal(row["settled_usd"]))
        writer.writerow([*(row[c] for c in columns), *amounts])
    span = data["span"]
    name = f"usage-{data['group_by']}-{span.start}-{span.end}.csv"
    return Response(
        out.getvalue(),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@bp.get("/requests")
async def requests_page() -> Response:
    user = await page_user()
    rt = runtime()
    keys = await org_keys(user.org_id)
    filters = {
        name: request.args.get(name, "").strip() for name in ("key_id", "model", "status", "tag")
    }
    errors: dict[str, str] = {}
    tag_name = filters["tag"].partition("=")[0]
    if filters["tag"] and not TAG_KEY.fullmatch(tag_name):
        errors["tag"] = "A tag filter is key or key=value (letters, digits, _.:-)."
        filters["tag"] = ""
    span = None
    if request.args.get("range"):  # no range: every record, newest first
        try:
            span = _span()
        except GatewayError as error:
            errors[error.param or "form"] = error.message or ""
    bounds = span.bounds if span is not None else None
    before = paging.cursor(request.args.get("before", ""))
    rows = await rt.store.read(
        ops.org_requests, user.org_id, filters, PAGE_SIZE + 1, before, bounds
    )
    views = [request_view(row) for row in rows[:PAGE_SIZE]]
    last = rows[PAGE_SIZE - 1] if len(rows) > PAGE_SIZE else None
    query = {k: v for k, v in filters.items() if v} | (span.query() if span else {})
    if last is not None:
        query["before"] = paging.after(last, "created")
    return await page(
        "requests.html",
        400 if errors else 200,
        nav="requests",
        rows=views,
        names={r.id: r.name for r in keys},
        keys=keys,
        models=[m.id for m in rt.catalog.every()],
        statuses=STATUSES,
        filters=filters,
        errors=errors,
        span=span,
        values=request.args,
        older=urlencode(query) if last is not None else None,
        presets=time_range.PRESETS,
    )


@bp.get("/requests/<request_id>")
async def request_detail(request_id: str) -> Response:
    user = await page_user()
    row = await runtime().store.read(ops.org_request, user.org_id, request_id)
    if row is None:
        raise GatewayError("not_found", f"No request {request_id} in your organisation.")
    view = request_view(row)
    key = runtime().keyring.get(row["key_id"])
    return await page("request.html", nav="requests", record=view, key=key)


@bp.get("/credits")
async def credits_page() -> Response:
    user = await page_user()
    rt = runtime()
    credits = await credits_view(rt, user.org_id)
    ledger = await rt.store.read(ops.ledger_rows, user.org_id, LEDGER_ROWS)
    rows = [{**row, "amount_usd": nanos_to_usd(row["amount_nanos"])} for row in ledger]
    org = rt.orgs.get(user.org_id)
    return await page("credits.html", nav="credits", credits=credits, ledger=rows, org=org)
