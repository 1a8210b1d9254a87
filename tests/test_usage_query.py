"""GET /v1/usage query checks: group_by follows the tag key format of DESIGN.md."""

from __future__ import annotations

import pytest

from tests.conftest import Gateway


@pytest.mark.parametrize("group_by", ['tag:a"b', "tag:", "tag:" + "x" * 65, "week"])
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
