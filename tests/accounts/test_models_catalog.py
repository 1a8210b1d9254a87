"""GET /v1/models: the public catalog (limited per IP) and the keyed organisation catalog."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import openai
import trio

from gateway.accounts.catalog import Catalog
from gateway.config.settings import ModelConfig, ProviderConfig
from shards import FakeClock
from tests.conftest import Gateway, make_config

FLAGS = ("tools", "structured_output", "vision", "web_search")


async def test_public_catalog_headers_and_the_61st_request(
    clocked_gateway: Gateway, clock: FakeClock
) -> None:
    async with clocked_gateway.client() as client:
        for n in range(1, 61):
            response = await client.get("/v1/models")
            assert response.status_code == 200
            assert response.headers["X-RateLimit-Limit"] == "60"
            assert response.headers["X-RateLimit-Remaining"] == str(60 - n)
            assert "X-RateLimit-Limit-Requests" not in response.headers
        refused = await client.get("/v1/models")
        assert refused.status_code == 429
        assert refused.headers["content-type"].startswith("text/plain")
        assert refused.text == "rate limit exceeded"
        # clock at hh:mm:30 -> 30 s to the next minute
        assert refused.headers["Retry-After"] == "30"
        assert refused.headers["X-RateLimit-Remaining"] == "0"
        clock.advance(30)
        assert (await client.get("/v1/models")).status_code == 200


async def test_public_catalog_shape(gateway: Gateway) -> None:
    async with gateway.client() as client:
        response = await client.get("/v1/models")
    assert response.status_code == 200
    assert "max-age=300" in response.headers["Cache-Control"]
    body = response.json()
    assert body["object"] == "list"
    ids = {model["id"] for model in body["data"]}
    assert ids == set(gateway.runtime.catalog.models)
    for model in body["data"]:
        assert model["object"] == "model"
        for flag in (*FLAGS, "zero_retention_available", "byok_available"):
            assert isinstance(model[flag], bool), (model["id"], flag)
        assert "input_usd_per_mtok" in model["pricing"]
    mini = next(m for m in body["data"] if m["id"] == "gpt-4o-mini")
    assert all(mini[flag] for flag in FLAGS)
    basic = next(m for m in body["data"] if m["id"] == "mock-basic")
    assert not any(basic[flag] for flag in FLAGS)


async def test_keyed_catalog_counts_against_the_key(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as client:
        response = await client.get("/v1/models")
    assert response.status_code == 200
    assert response.headers["X-RateLimit-Limit-Requests"] == "60"
    assert response.headers["X-RateLimit-Remaining-Requests"] == "59"
    assert "X-RateLimit-Limit" not in response.headers


async def test_openai_client_lists_models(gateway: Gateway) -> None:
    def list_ids() -> list[str]:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.token) as client:
            return [model.id for model in client.models.list()]

    ids = await trio.to_thread.run_sync(list_ids)
    assert "gpt-4o-mini" in ids and "text-embedding-3-small" in ids


async def test_openai_client_reads_401_as_authentication_error(gateway: Gateway) -> None:
    def call() -> openai.AuthenticationError:
        with openai.OpenAI(
            base_url=f"{gateway.url}/v1", api_key="svc_test_zzzzzzzzzzzz_" + "Z" * 32
        ) as client:
            try:
                client.models.list()
            except openai.AuthenticationError as exc:
                return exc
        raise AssertionError("expected a 401")

    error = await trio.to_thread.run_sync(call)
    assert error.code == "invalid_api_key"
    assert error.status_code == 401


def test_zero_retention_needs_the_providers_agreement_too(tmp_path: Path) -> None:
    base = make_config(tmp_path)
    keeps = ProviderConfig(name="keeps", kind="openai", base_url="http://127.0.0.1:9/v1")
    agreed = replace(keeps, name="agreed", zero_retention=True)
    models = (
        ModelConfig("leaky", "keeps", "up", zero_retention_available=True),
        ModelConfig("sealed", "agreed", "up", zero_retention_available=True),
    )
    catalog = Catalog(replace(base, providers=(*base.providers, keeps, agreed), models=models))
    offered = {m.id: m.config.zero_retention_available for m in catalog.every()}
    assert offered == {"leaky": False, "sealed": True}
    leaky = catalog.get("leaky")
    assert leaky is not None and leaky.public()["zero_retention_available"] is False
