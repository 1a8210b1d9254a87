"""GET /v1/usage query checks: group_by follows the tag key format of DESIGN.md."""

from __future__ import annotations

import pytest

from tests.conftest import Gateway

pytestmark = pytest.mark.both_stores


@pytest.mark.parametrize("group_by", ['tag:a"b', "tag:", "tag:" + "x" * 65, "week", "tag:a\n"])
async def test_a_malformed_group_by_is_400(gateway: Gateway, group_by: str) -> None:
    async with gateway.client(gateway.token) as client:
        response = await client.get("/v1/usage", params={"group_by": group_by})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "group_by"


@pytest.mark.parametrize("group_by", ["tag:team", "tag:cost.center:1", "day", "model", "key"])
async def test_well_formed_group_by_is_served(gateway: Gateway, group_by: str) -> None:
    async with gateway.client(gateway.token) as client:
        response = await client.get("/v1/usage", params={"group_by": group_by})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    ("params", "window"),
    [
        ({}, ("2026-11-01", "2026-11-30")),
        ({"start": "2026-11-24"}, ("2026-11-24", "2026-11-30")),
        ({"start": "2026-12-05"}, ("2026-12-05", "2026-12-31")),
        ({"end": "2026-11-10"}, ("2026-11-01", "2026-11-10")),
        ({"end": "2026-09-10"}, ("2026-09-01", "2026-09-10")),  # end's month, not before it
        ({"end": "2027-03-10"}, ("2026-11-01", "2027-03-10")),
        ({"start": "2026-10-02", "end": "2026-10-03"}, ("2026-10-02", "2026-10-03")),
        ({"start": "9999-12-31"}, ("9999-12-31", "9999-12-31")),
        ({"start": "9999-12-01"}, ("9999-12-01", "9999-12-31")),
        ({"start": "2028-02-03"}, ("2028-02-03", "2028-02-29")),
    ],
)
async def test_the_default_window_is_the_current_month(
    clocked_gateway: Gateway, params: dict[str, str], window: tuple[str, str]
) -> None:
    """The clock reads 2026-11-22: without ``end`` the window runs to the end of the month
    (of ``start``, when that is later), without ``start`` from the first of the month (of
    ``end``, when that is earlier): a window given by one of its ends is never inverted."""
    async with clocked_gateway.client(clocked_gateway.token) as client:
        response = await client.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    assert (response.json()["start"], response.json()["end"]) == window


async def test_an_end_before_start_is_a_window_of_no_day(gateway: Gateway) -> None:
    """Both ends sent, inverted: no day lies between them, so zeros (not a refusal: the
    document cannot compare two parameters). The key's calls of today count otherwise."""
    async with gateway.client(gateway.token) as client:
        called = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        )
        assert called.status_code == 200, called.text
        window = {"start": "9999-12-31", "end": "0001-01-01", "group_by": "model"}
        inverted = await client.get("/v1/usage", params=window)
        current = await client.get("/v1/usage")
    assert inverted.status_code == 200, inverted.text
    body = inverted.json()
    assert (body["start"], body["end"]) == ("9999-12-31", "0001-01-01")
    assert body["totals"]["requests"] == 0 and body["data"] == [] and body["refusals"] == []
    assert current.json()["totals"]["requests"] == 1
