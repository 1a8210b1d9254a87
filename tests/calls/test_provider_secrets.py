"""Provider secrets never reach a client through an upstream's error text.

An upstream that refuses a call often echoes the key it was sent ("Incorrect API key
provided: ..."). The refusal reaches the client as 400 invalid_request with the
provider's cleaned explanation: every credential this server holds (its providers' keys
and the organisations' BYOK keys, exact values) and every known key shape are cut out.
A real gateway, the fake upstream echoing what the directive says.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.calls.provider_errors import REFUSED_PHRASE
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.fakes.fake_upstream import FakeUpstream
from tests.conftest import Gateway, make_config, start_gateway

# credentials of no known shape: only the exact-value rule can catch them
OUR_KEY = "our.provider.credential~42"
OTHER_KEY = "other.provider.credential~7"
ORG_KEY = "acme.byok.credential~99"

# one of each key shape an upstream may echo
SHAPES = {
    "openai": "sk-proj-AbCdEf0123456789xyzAbCdEf",
    "openai masked": "sk-proj-****************************wxyz",
    "anthropic": "sk-ant-api03-AbCdEf0123456789_xyz",
    "azure 32-hex": "0123456789abcdef0123456789abcdef",
    "google": "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW",
    "groq": "gsk_AbCdEf0123456789AbCdEf0123456789",
    "hugging face": "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "replicate": "r8_AbCdEf0123456789AbCdEf0123456789",
    "xai": "xai-AbCdEf0123456789AbCdEf0123456789",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NSJ9.c2lnbmF0dXJlLXZhbHVl",
    "long mixed token": "Zx8Qw2Lm4Np6Rt8Vy0Bc3Df5Gh7Jk9Mn1Pq",
}


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("UPSTREAM_KEY", OUR_KEY)
    monkeypatch.setenv("OTHER_UPSTREAM_KEY", OTHER_KEY)
    monkeypatch.setenv("ACME_KEY", ORG_KEY)
    base = make_config(tmp_path)
    providers = (
        ProviderConfig("upstream", "openai", base_url=upstream.url, api_key_env="UPSTREAM_KEY"),
        ProviderConfig("other", "openai", base_url=upstream.url, api_key_env="OTHER_UPSTREAM_KEY"),
    )
    model = ModelConfig("live-chat", "upstream", "up-chat", byok_available=True)
    model = replace(model, input_usd_per_mtok=1.0, output_usd_per_mtok=2.0)
    gateway = await start_gateway(nursery, replace(base, providers=providers, models=(model,)))
    yield gateway
    gateway.stop.set()


async def live_key(gw: Gateway, byok: bool = False) -> str:
    response = await gw.admin("POST", "/admin/orgs", {"name": "acme", "credits_usd": 10})
    org_id = response.json()["id"]
    if byok:
        body = {"provider": "upstream", "api_key_env": "ACME_KEY"}
        assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/byok", body)).status_code == 200
        pricing = {"byok_pricing": {"*": {"input_usd_per_mtok": 1, "output_usd_per_mtok": 1}}}
        assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", pricing)).status_code == 200
    key = await gw.create_key(org_id=org_id, mode="live", byok=byok, scopes=["inference"])
    return key["token"]


async def refused_message(gw: Gateway, token: str, fault: str, **body: Any) -> str:
    call = {
        "model": "live-chat",
        "messages": [{"role": "user", "content": f"hi [[fault {fault}]]"}],
        "max_tokens": 5,
        **body,
    }
    async with gw.client(token) as client:
        response: httpx.Response = await client.post("/v1/chat/completions", json=call)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(REFUSED_PHRASE + "Incorrect API key provided: ")
    return error["message"]


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("status", [401, 400])
async def test_a_key_of_every_known_shape_is_redacted(gw: Gateway, status: int, shape: str) -> None:
    message = await refused_message(gw, await live_key(gw), f"status={status} echo={shape}")
    assert shape not in message
    assert shape[-12:] not in message
    assert "[key]" in message


@pytest.mark.parametrize("stream", [False, True])
async def test_the_gateways_own_key_is_redacted_by_value(gw: Gateway, stream: bool) -> None:
    """A key of no known shape: the upstream echoes the Authorization it received."""
    message = await refused_message(gw, await live_key(gw), "status=401 echo=auth", stream=stream)
    assert OUR_KEY not in message
    assert "[key]" in message


async def test_another_providers_key_is_redacted_by_value(gw: Gateway) -> None:
    message = await refused_message(gw, await live_key(gw), f"status=401 echo={OTHER_KEY}")
    assert OTHER_KEY not in message


async def test_an_organisations_byok_key_is_redacted_by_value(gw: Gateway) -> None:
    """A BYOK 401/403 is byok_credential_rejected (no upstream text); a 400 carries it."""
    token = await live_key(gw, byok=True)
    message = await refused_message(gw, token, "status=400 echo=auth")
    assert ORG_KEY not in message
    assert "[key]" in message
    # a non-BYOK key of another organisation: the BYOK key is still cut out by value
    message = await refused_message(gw, await live_key(gw), f"status=400 echo={ORG_KEY}")
    assert ORG_KEY not in message
