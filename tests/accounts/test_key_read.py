"""GET /v1/key: every public field of the spec, usage windows, rate-limit state; no token."""

from __future__ import annotations

import pytest

from shards import FakeClock
from tests.conftest import Gateway

pytestmark = pytest.mark.both_stores

PUBLIC_FIELDS = {
    "id",
    "name",
    "prefix",
    "status",
    "mode",
    "environment",
    "data_mode",
    "scopes",
    "allowed_model_keys",
    "caps",
    "required_tags",
    "default_tags",
    "expires_at",
    "last_used_at",
    "usage",
    "rate_limit",
    "sub_key_count",
}


async def test_every_field_of_the_key_read(clocked_gateway: Gateway, clock: FakeClock) -> None:
    gw = clocked_gateway
    key = await gw.create_key(
        name="reader",
        environment="staging",
        scopes=["inference", "usage:read"],
        caps={"usd_day": 5, "usd_month": 50, "rpm": 30, "tpm": 9000, "max_in_flight": 3},
        allowed_models=["gpt-4o-mini"],
        required_tags={"team": ""},
        default_tags={"app": "reader"},
        data_mode="zero_retention",
        expires_at="2027-01-01T00:00:00Z",
    )
    async with gw.client(key["token"]) as client:
        response = await client.get("/v1/key")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) >= PUBLIC_FIELDS
    assert key["token"] not in response.text
    assert "fingerprint" not in body and "token" not in body
    assert body["id"] == key["id"]
    assert body["prefix"] == key["token"].split("_")[2]
    assert (body["name"], body["status"], body["mode"]) == ("reader", "active", "sandbox")
    assert (body["environment"], body["data_mode"]) == ("staging", "zero_retention")
    assert body["scopes"] == ["inference", "usage:read"]
    assert body["allowed_model_keys"] == ["gpt-4o-mini"]
    assert body["caps"] == {
        "usd_day": 5,
        "usd_month": 50,
        "rpm": 30,
        "tpm": 9000,
        "max_in_flight": 3,
        "max_output_tokens": 4096,
    }
    assert body["required_tags"] == {"team": ""}
    assert body["default_tags"] == {"app": "reader"}
    assert body["expires_at"] == "2027-01-01T00:00:00Z"
    assert body["last_used_at"] == "2026-11-22T10:00:30Z"
    assert body["usage"]["day"] == {
        "spent_usd": 0.0,
        "reserved_usd": 0.0,
        "limit_usd": 5.0,
        "remaining_usd": 5.0,
        "resets_at": "2026-11-23T00:00:00Z",
    }
    assert body["usage"]["month"]["limit_usd"] == 50.0
    assert body["usage"]["month"]["resets_at"] == "2026-12-01T00:00:00Z"
    assert body["rate_limit"] == {
        "requests_per_minute": 30,
        "requests_this_minute": 1,
        "tokens_per_minute": 9000,
        "tokens_this_minute": 0,
        "max_in_flight": 3,
        "in_flight": 0,
    }
    assert body["sub_key_count"] == 0
    assert response.headers["X-RateLimit-Limit-Requests"] == "30"
    assert response.headers["X-RateLimit-Remaining-Requests"] == "29"
    assert response.headers["X-RateLimit-Reset-Requests"] == "30s"


async def test_defaults_of_a_key(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as client:
        body = (await client.get("/v1/key")).json()
    assert body["caps"] == {
        "usd_day": None,
        "usd_month": None,
        "rpm": 60,
        "tpm": None,
        "max_in_flight": 20,
        "max_output_tokens": 4096,
    }
    assert body["data_mode"] == "standard"
    assert body["usage"]["day"]["limit_usd"] is None
    assert body["usage"]["day"]["remaining_usd"] is None
