"""BYOK: live calls on the organisation's own provider key, against the fake upstream.

The organisation's credential is an environment variable name set through the admin
API (as `svc-gateway org byok` does); the upstream must receive that key, never ours,
and the call is costed at the organisation's BYOK price.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.fakes.fake_upstream import FakeUpstream
from tests.conftest import Gateway, make_config, start_gateway

OUR_KEY = "sk-gateway-own-key-0123456789"
ORG_KEY = "sk-acme-own-key-9876543210"
BYOK_PRICE = {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 1.0}


def priced(model_id: str, **settings: Any) -> ModelConfig:
    base = ModelConfig(model_id, "upstream", "up-" + model_id, input_usd_per_mtok=3.0)
    return replace(base, output_usd_per_mtok=15.0, **settings)


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", OUR_KEY)
    monkeypatch.setenv("ACME_UPSTREAM_KEY", ORG_KEY)
    base = make_config(tmp_path)
    provider = ProviderConfig(
        name="upstream", kind="openai", base_url=upstream.url, api_key_env="FAKE_UPSTREAM_KEY"
    )
    models = (
        priced("byok-chat", byok_available=True),
        priced("plain-chat"),
        priced("embed", kind="embedding"),
    )
    gateway = await start_gateway(
        nursery, replace(base, providers=(*base.providers, provider), models=models)
    )
    yield gateway
    gateway.stop.set()


async def byok_org(gw: Gateway, credential: bool = True, pricing: Any = None) -> tuple[str, str]:
    """An organisation with credits, optionally its credential and BYOK pricing; a live
    BYOK key of it. Returns (org id, token)."""
    response = await gw.admin("POST", "/admin/orgs", {"name": "acme", "credits_usd": 10})
    org_id = response.json()["id"]
    if credential:
        body = {"provider": "upstream", "api_key_env": "ACME_UPSTREAM_KEY"}
        response = await gw.admin("PUT", f"/admin/orgs/{org_id}/byok", body)
        assert response.status_code == 200, response.text
        assert ORG_KEY not in response.text
    if pricing is not None:
        response = await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", {"byok_pricing": pricing})
        assert response.status_code == 200, response.text
    key = await gw.create_key(
        org_id=org_id, mode="live", byok=True, scopes=["inference", "embeddings", "usage:read"]
    )
    return org_id, key["token"]


def chat(model: str = "byok-chat", text: str = "hello there") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 20}


async def post(
    gw: Gateway, token: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> httpx.Response:
    async with gw.client(token) as client:
        return await client.post(path, json=body)


def assert_error(response: httpx.Response, status: int, code: str, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)


async def test_the_upstream_receives_the_organisations_key_and_cost_is_at_byok_price(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    _, token = await byok_org(gw, pricing={"byok-chat": BYOK_PRICE})
    response = await post(gw, token, chat())
    assert response.status_code == 200, response.text
    assert upstream.auth[-1] == f"Bearer {ORG_KEY}"
    usage = response.json()["usage"]
    expected = math.ceil((usage["prompt_tokens"] * 0.5 + usage["completion_tokens"] * 1.0) * 1000)
    async with gw.client(token) as client:
        record = (await client.get(f"/v1/requests/{response.headers['X-Request-Id']}")).json()
        credits = (await client.get("/v1/credits")).json()
        key_view = (await client.get("/v1/key")).text
    assert round(record["cost"]["billed_usd"] * NANOS_PER_USD) == expected
    assert round(record["cost"]["settled_usd"] * NANOS_PER_USD) == expected
    assert round(credits["used_usd"] * NANOS_PER_USD) == expected
    reads = [key_view, record, credits]
    for path in ("/admin/orgs", "/admin/keys", "/admin/models"):
        reads.append((await gw.admin("GET", path)).text)
    assert all(ORG_KEY not in str(read) for read in reads)


async def test_a_default_byok_price_applies_to_every_model(gw: Gateway) -> None:
    _, token = await byok_org(gw, pricing={"*": BYOK_PRICE})
    assert (await post(gw, token, chat())).status_code == 200


async def test_a_non_byok_key_uses_the_gateways_key(gw: Gateway, upstream: FakeUpstream) -> None:
    response = await gw.admin("POST", "/admin/orgs", {"name": "plain", "credits_usd": 10})
    key = await gw.create_key(org_id=response.json()["id"], mode="live")
    assert (await post(gw, key["token"], chat())).status_code == 200
    assert upstream.auth[-1] == f"Bearer {OUR_KEY}"


async def test_provider_credential_missing(gw: Gateway, upstream: FakeUpstream) -> None:
    _, token = await byok_org(gw, credential=False, pricing={"*": BYOK_PRICE})
    assert_error(await post(gw, token, chat()), 409, "provider_credential_missing", "model")
    assert upstream.calls == 0


async def test_a_credential_naming_an_unset_variable_is_missing_too(
    gw: Gateway, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, token = await byok_org(gw, pricing={"*": BYOK_PRICE})
    monkeypatch.delenv("ACME_UPSTREAM_KEY")
    assert_error(await post(gw, token, chat()), 409, "provider_credential_missing", "model")
    assert upstream.calls == 0, "never called without the organisation's key"


async def test_byok_pricing_not_set_up_is_503_with_retry_after_60(gw: Gateway) -> None:
    _, token = await byok_org(gw)
    response = await post(gw, token, chat())
    assert_error(response, 503, "admission_unavailable", None)
    assert response.headers["Retry-After"] == "60"
    assert response.headers["x-should-retry"] == "false"  # the spec: retrying cannot succeed


async def test_no_byok_price_for_the_model_is_pricing_unavailable(gw: Gateway) -> None:
    _, token = await byok_org(gw, pricing={"plain-chat": BYOK_PRICE})
    response = await post(gw, token, chat())
    assert_error(response, 503, "pricing_unavailable", "model")
    assert "Retry-After" not in response.headers  # not retryable
    assert response.headers["x-should-retry"] == "false"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", chat("plain-chat")),
        ("/v1/embeddings", {"model": "embed", "input": "hello"}),
    ],
    ids=["chat", "embeddings"],
)
async def test_byok_unavailable(
    gw: Gateway, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    _, token = await byok_org(gw, pricing={"*": BYOK_PRICE})
    assert_error(await post(gw, token, body, path), 400, "byok_unavailable", "model")
    assert upstream.calls == 0


@pytest.mark.parametrize("status", [401, 403])
async def test_the_upstream_refusing_the_organisations_key(
    gw: Gateway, upstream: FakeUpstream, status: int
) -> None:
    _, token = await byok_org(gw, pricing={"*": BYOK_PRICE})
    response = await post(gw, token, chat(text=f"[[fault status={status}]]"))
    assert_error(response, 400, "byok_credential_rejected", None)
    assert upstream.calls == 1
    async with gw.client(token) as client:
        record = (await client.get(f"/v1/requests/{response.headers['X-Request-Id']}")).json()
        credits = (await client.get("/v1/credits")).json()
    assert record["error"] == {"code": "byok_credential_rejected"}
    assert record["cost"]["settled_usd"] == 0  # provider refused before any work
    assert credits["used_usd"] == 0
