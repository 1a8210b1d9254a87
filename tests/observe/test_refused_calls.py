"""Refused calls an owner can see: counted by key, error code and UTC day (no request
record each), in ``GET /v1/usage``'s ``refusals``, on the dashboard's Usage page and on
the key's page. A real gateway in process, its mock provider, a sandbox key with a
model it may not call, and a second key whose refusals must not show under the first."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from tests.conftest import Gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, signed_in
from tests.support.waiting import until

CALL = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
ROOMY = {"rpm": 100_000}
OTHER_MODEL = {**CALL, "model": "gpt-4o"}


async def chat(client: httpx.AsyncClient, body: Any = CALL) -> int:
    return (await client.post("/v1/chat/completions", json=body)).status_code


async def usage(gw: Gateway, token: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        response = await client.get("/v1/usage")
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_refusals_are_counted_by_key_code_and_day_with_no_record(gateway: Gateway) -> None:
    scopes = ["inference", "usage:read"]
    key = await gateway.create_key(
        name="integration", scopes=scopes, allowed_models=["gpt-4o-mini"], caps=ROOMY
    )
    other = await gateway.create_key(name="other", scopes=scopes, caps=ROOMY)
    async with gateway.client(key["token"]) as client:
        assert await chat(client, {"model": "gpt-4o-mini"}) == 400  # no messages
        statuses = [await chat(client, body) for body in (CALL, OTHER_MODEL, CALL, OTHER_MODEL)]
        assert statuses[0::2] == [200, 200]
        (refused,) = set(statuses[1::2])
    assert refused in (403, 404)
    async with gateway.client(other["token"]) as client:
        assert await chat(client, {"model": "no-such-model", "messages": []}) in (400, 404)
    today = datetime.fromtimestamp(gateway.runtime.clock.now(), UTC).date().isoformat()
    expected = [
        {"day": today, "key_id": key["id"], "code": "invalid_messages", "count": 1},
        {"day": today, "key_id": key["id"], "code": "model_not_allowed", "count": 2},
    ]

    async def counted() -> bool:
        return (await usage(gateway, key["token"]))["refusals"] == expected

    await until(counted, within=10, every=0.2)
    answer = await usage(gateway, key["token"])
    assert answer["totals"]["requests"] == 2  # a refusal leaves no record
    assert [r["key_id"] for r in (await usage(gateway, other["token"]))["refusals"]] == [
        other["id"]
    ]

    await admin_user(gateway, email="owner@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "owner@example.com") as (client, _):
        page = (await client.get("/dashboard/usage")).text
        assert "Refused calls" in page
        assert "model_not_allowed" in page and "integration" in page and "other" in page
        key_page = (await client.get(f"/dashboard/keys/{key['id']}/caps")).text
        assert "Refused calls" in key_page and "model_not_allowed" in key_page
        assert "invalid_messages" in key_page
