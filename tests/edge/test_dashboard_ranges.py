"""Time ranges on the Usage and Requests pages (issue 33, point 3): the presets, usage over
a past month and a custom range against ``/v1/usage`` to the nano-dollar, the request list
filtered by tag and date against the records, keyset pages that neither skip nor repeat.

Calls are real (the sandbox mock) on a gateway whose clock the test moves across a month
boundary; both stores."""

from __future__ import annotations

import re
from datetime import date
from typing import Any

import httpx
import pytest
from werkzeug.datastructures import MultiDict

from gateway.edge.dashboard import time_range
from gateway.errors import GatewayError
from gateway.store import dashboard as ops
from shards import FakeClock
from tests.conftest import Gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, signed_in

pytestmark = pytest.mark.both_stores

NOW = FakeClock.at(2026, 11, 22, 10, 0, 30).now()


@pytest.mark.parametrize(
    ("args", "span"),
    [({}, ("30d", "2026-10-24", "2026-11-22")),
     ({"range": "today"}, ("today", "2026-11-22", "2026-11-22")),
     ({"range": "7d"}, ("7d", "2026-11-16", "2026-11-22")),
     ({"range": "this_month"}, ("this_month", "2026-11-01", "2026-11-22")),
     ({"range": "last_month"}, ("last_month", "2026-10-01", "2026-10-31")),
     ({"range": "custom", "start": "2026-02-27", "end": "2026-03-02"},
      ("custom", "2026-02-27", "2026-03-02")),
     ({"range": "nonsense"}, ("30d", "2026-10-24", "2026-11-22"))],
)  # fmt: skip
def test_presets(args: dict[str, str], span: tuple[str, str, str]) -> None:
    got = time_range.read(MultiDict(args), NOW)
    assert (got.preset, got.start.isoformat(), got.end.isoformat()) == span
    assert len(got.days) == (got.end - got.start).days + 1


def test_last_month_in_january_is_december() -> None:
    got = time_range.read(MultiDict({"range": "last_month"}), FakeClock.at(2027, 1, 3).now())
    assert (got.start, got.end) == (date(2026, 12, 1), date(2026, 12, 31))


@pytest.mark.parametrize(
    ("args", "param"),
    [({"start": "2026-13-01"}, "start"), ({"end": "yesterday"}, "end"),
     ({"start": "2026-11-02", "end": "2026-11-01"}, "end"),
     ({"start": "2025-01-01", "end": "2026-01-02"}, "end")],
)  # fmt: skip
def test_bad_custom_ranges_name_their_field(args: dict[str, str], param: str) -> None:
    with pytest.raises(GatewayError) as refused:
        time_range.read(MultiDict({"range": "custom", **args}), NOW)
    assert refused.value.param == param and refused.value.status == 400


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock.at(2026, 10, 5, 12)


async def call(client: httpx.AsyncClient, tags: str) -> str:
    answer = await client.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi " * 40}]},
        headers={"X-Svc-Tags": tags},
    )
    assert answer.status_code == 200, answer.text
    return str(answer.json()["svc"]["request_id"])


async def history(gw: Gateway, clock: FakeClock) -> dict[str, list[str]]:
    """Calls on Oct 5 (two search, one ads), Oct 31 late (search), Nov 1 (ads), Nov 22."""
    made: dict[str, list[str]] = {}
    async with gw.client(gw.token) as client:
        for when, tags in (
            ((2026, 10, 5, 12), ["team=search", "team=search", "team=ads"]),
            ((2026, 10, 31, 23, 59, 58), ["team=search"]),
            ((2026, 11, 1, 0, 0, 1), ["team=ads"]),
            ((2026, 11, 22, 10), ["team=search"]),
        ):
            clock.set(FakeClock.at(*when).now())
            for tag in tags:
                made.setdefault(f"{when[1]}-{when[2]}", []).append(await call(client, tag))
    return made


def exact_totals(page: str) -> list[str]:
    """The exact amounts of the usage page's total row (spend, billed)."""
    foot = page[page.index("<tfoot>") : page.index("</tfoot>")]
    return re.findall(r'title="(-?\$[\d.]+) exactly"', foot)


def exact_groups(page: str) -> dict[str, list[str]]:
    body = page[page.index("Totals by") :]
    body = body[body.index("<tbody>") : body.index("</tbody>")]
    rows = re.findall(r'<th scope="row">([^<]+)</th>(.*?)</tr>', body, re.S)
    return {name: re.findall(r'title="(-?\$[\d.]+) exactly"', cells) for name, cells in rows}


def dollars(value: float) -> str:
    return "$" + f"{value:.9f}".rstrip("0").rstrip(".")


async def test_usage_over_ranges_matches_v1_usage(
    clocked_gateway: Gateway, clock: FakeClock
) -> None:
    gw = clocked_gateway
    await history(gw, clock)
    await admin_user(gw, email="o@example.com", role="owner", password=PASSWORD)
    ranges = (
        ({"range": "last_month"}, ("2026-10-01", "2026-10-31")),
        ({"range": "custom", "start": "2026-10-31", "end": "2026-11-01"},
         ("2026-10-31", "2026-11-01")),
        ({"range": "today"}, ("2026-11-22", "2026-11-22")),
    )  # fmt: skip
    async with signed_in(gw, "o@example.com") as (client, _), gw.client(gw.token) as api:
        for args, (start, end) in ranges:
            page = await client.get(
                "/dashboard/usage", params={**args, "group_by": "tag", "tag": "team"}
            )
            assert page.status_code == 200, page.text
            usage = (
                await api.get(
                    "/v1/usage", params={"start": start, "end": end, "group_by": "tag:team"}
                )
            ).json()
            totals = usage["totals"]
            assert totals["requests"] > 0
            assert exact_totals(page.text) == [
                dollars(totals["settled_usd"]),
                dollars(totals["cost_usd"]),
            ]
            assert exact_groups(page.text) == {
                row["group"]: [dollars(row["settled_usd"]), dollars(row["cost_usd"])]
                for row in usage["data"]
            }, args
            assert (
                f"{start}" in page.text
                or date.fromisoformat(start).strftime("%b %d, %Y") in page.text
            )
        by_day = await client.get(
            "/dashboard/usage",
            params={
                "range": "custom",
                "start": "2026-10-01",
                "end": "2026-11-30",
                "group_by": "day",
            },
        )
        usage = (
            await api.get(
                "/v1/usage", params={"start": "2026-10-01", "end": "2026-11-30", "group_by": "day"}
            )
        ).json()
        assert exact_groups(by_day.text) == {
            row["group"]: [dollars(row["settled_usd"]), dollars(row["cost_usd"])]
            for row in usage["data"]
        }
        assert set(exact_groups(by_day.text)) == {
            "2026-10-05",
            "2026-10-31",
            "2026-11-01",
            "2026-11-22",
        }
        bad = await client.get(
            "/dashboard/usage",
            params={"range": "custom", "start": "2026-11-02", "end": "2026-11-01"},
        )
        assert bad.status_code == 400 and 'id="end-error"' in bad.text


def listed(page: str) -> list[str]:
    return re.findall(r'href="/dashboard/requests/(req_\w+)"', page)


async def test_the_request_list_filters_by_tag_and_date(
    clocked_gateway: Gateway, clock: FakeClock
) -> None:
    gw = clocked_gateway
    made = await history(gw, clock)
    await admin_user(gw, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gw, "o@example.com") as (client, _):
        everything = await client.get("/dashboard/requests")
        # newest first; calls of one instant (the fake clock stood still) by id, descending
        newest = [i for day in reversed(list(made.values())) for i in sorted(day, reverse=True)]
        assert listed(everything.text) == newest
        assert "team=search" in everything.text  # the tags column
        october_search = await client.get(
            "/dashboard/requests", params={"range": "last_month", "tag": "team=search"}
        )
        search = [made["10-31"][0], *sorted(made["10-5"][:2], reverse=True)]
        assert listed(october_search.text) == search
        window = await client.get(
            "/dashboard/requests",
            params={"range": "custom", "start": "2026-10-31", "end": "2026-11-01", "tag": "team"},
        )
        assert listed(window.text) == [made["11-1"][0], made["10-31"][0]]
        none = await client.get(
            "/dashboard/requests",
            params={"range": "custom", "start": "2026-10-06", "end": "2026-10-30"},
        )
        assert listed(none.text) == [] and "match these filters" in none.text
    # the records say the same: each listed id has the tag and a time in the range
    start, end = time_range.read(MultiDict({"range": "last_month"}), NOW).bounds
    rows = await gw.runtime.store.read(
        ops.org_requests, gw.org_id, {"tag": "team=search"}, 100, None, (start, end)
    )
    assert [r["id"] for r in rows] == listed(october_search.text)
    assert all(r["tags"]["team"] == "search" and start <= r["created"] < end for r in rows)


async def test_keyset_pages_neither_skip_nor_repeat(
    clocked_gateway: Gateway, clock: FakeClock
) -> None:
    gw = clocked_gateway
    await history(gw, clock)
    org = gw.org_id
    everything = await gw.runtime.store.read(ops.org_requests, org, {}, 100)
    seen: list[dict[str, Any]] = []
    before = None
    while True:
        page = await gw.runtime.store.read(ops.org_requests, org, {}, 2, before)
        if not page:
            break
        seen += page
        before = (page[-1]["created"], page[-1]["id"])
    assert [r["id"] for r in seen] == [r["id"] for r in everything] and len(seen) == 6
    keys = [(r["created"], r["id"]) for r in seen]
    assert keys == sorted(keys, reverse=True)
