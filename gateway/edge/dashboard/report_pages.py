"""The read-only pages: Usage (a 30-day chart, totals, CSV), Requests (the records, newest
first, filtered; one record's detail) and Credits (balance, reserved, the ledger).

They read through the same functions as ``/v1/usage``, ``/v1/requests/{id}`` and
``/v1/credits``, over every key of the signed-in user's organisation.
"""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from typing import Any

from quart import Response, request

from gateway.accounts.catalog import nanos_to_usd
from gateway.accounts.tag_rules import TAG_KEY
from gateway.edge.dashboard.chart import bar_chart
from gateway.edge.dashboard.format import decimal
from gateway.edge.dashboard.keys_pages import org_keys
from gateway.edge.dashboard.web import User, bp, page, page_user
from gateway.edge.http import runtime
from gateway.edge.routes.usage import EMPTY, GROUPS, credits_view, request_view, usage_totals
from gateway.errors import GatewayError
from gateway.store import dashboard as ops
from gateway.store import records

DAYS = 30
PAGE_SIZE = 50
LEDGER_ROWS = 100
STATUSES = ("succeeded", "failed", "cancelled")
METRICS = {"settled": "settled", "billed": "billed"}


def _period() -> list[date]:
    today = datetime.fromtimestamp(runtime().clock.now(), UTC).date()
    return [today - timedelta(days=DAYS - 1 - i) for i in range(DAYS)]


def _group(user: User) -> tuple[str, str, str | None]:
    """(group_by as the page names it, the store's group, the tag name if any)."""
    by = request.args.get("group_by", "key")
    tag = request.args.get("tag", "").strip()
    if by == "tag":
        if not TAG_KEY.fullmatch(tag):
            raise GatewayError("invalid_request", "Name a tag key to group by.", "tag")
        return by, f"tag:{tag}", tag
    if by not in ("key", "model"):
        by = "key"
    return by, GROUPS[by], None


async def _usage(user: User) -> dict[str, Any]:
    rt = runtime()
    days = _period()
    by, group, tag = _group(user)
    names = {r.id: f"{r.name} ({r.prefix})" for r in org_keys(user.org_id)}
    key_ids = list(names) or [""]
    args = (key_ids, days[0].isoformat(), days[-1].isoformat())
    total_rows = await rt.store.read(records.usage_rows, *args, None)
    group_rows = await rt.store.read(records.usage_rows, *args, group)
    daily = await rt.store.read(records.usage_rows, *args, group, True)  # by day
    metric = METRICS.get(request.args.get("metric", ""), "settled")

    def label(value: Any) -> str:
        if value is None:
            return "(no tag)" if tag else "(none)"
        return names.get(value, str(value)) if by == "key" else str(value)

    points = {(row["day"], label(row["grp"])): nanos_to_usd(row[metric] or 0) for row in daily}
    chart, legend = bar_chart(days, points, f"Daily spend by {by}, last {DAYS} days")
    return {
        "days": days,
        "group_by": by,
        "tag": tag or "",
        "metric": metric,
        "chart": chart,
        "legend": legend,
        "totals": usage_totals(total_rows[0] if total_rows else EMPTY),
        "groups": [{"group": label(r["grp"]), **usage_totals(r)} for r in group_rows],
        "daily": [{"day": r["day"], "group": label(r["grp"]), **usage_totals(r)} for r in daily],
    }


@bp.get("/usage")
async def usage() -> Response:
    user = await page_user()
    try:
        data = await _usage(user)
    except GatewayError as error:
        return await page(
            "usage.html", 400, nav="usage", error=error.message, group_by="tag", tag=""
        )
    return await page("usage.html", nav="usage", error=None, **data)


@bp.get("/usage.csv")
async def usage_csv() -> Response:
    user = await page_user()
    data = await _usage(user)
    out = io.StringIO()
    columns = ["day", "group", "requests", "input_tokens", "output_tokens"]
    writer = csv.writer(out)
    writer.writerow([*columns, "cost_usd", "settled_usd"])
    for row in data["daily"]:
        amounts = (decimal(row["cost_usd"]), decimal(row["settled_usd"]))
        writer.writerow([*(row[c] for c in columns), *amounts])
    name = f"usage-{data['group_by']}-{data['days'][0]}-{data['days'][-1]}.csv"
    return Response(
        out.getvalue(),
        content_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


@bp.get("/requests")
async def requests_page() -> Response:
    user = await page_user()
    rt = runtime()
    keys = org_keys(user.org_id)
    filters = {
        name: request.args.get(name, "").strip() for name in ("key_id", "model", "status", "tag")
    }
    error = None
    tag_name = filters["tag"].partition("=")[0]
    if filters["tag"] and not TAG_KEY.fullmatch(tag_name):
        error, filters["tag"] = "A tag filter is key or key=value (letters, digits, _.:-).", ""
    before = _before()
    rows = await rt.store.read(ops.org_requests, user.org_id, filters, PAGE_SIZE + 1, before)
    views = [request_view(row) for row in rows[:PAGE_SIZE]]
    older = rows[PAGE_SIZE - 1]["created"] if len(rows) > PAGE_SIZE else None
    names = {r.id: r.name for r in keys}
    return await page(
        "requests.html",
        400 if error else 200,
        nav="requests",
        rows=views,
        names=names,
        keys=keys,
        models=[m.id for m in rt.catalog.every()],
        statuses=STATUSES,
        filters=filters,
        error=error,
        older=older,
    )


def _before() -> float | None:
    raw = request.args.get("before")
    try:
        return float(raw) if raw else None
    except ValueError:
        return None


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
