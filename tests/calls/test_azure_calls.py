"""The ``azure`` kind end to end: the official ``openai`` client, a live key, a real
gateway and a fake Azure OpenAI resource (gateway/fakes/fake_azure.py) that accepts only
what Azure accepts, on both surfaces: deployments (``api_version`` set) and v1.

Each call checks what the client got, and that the fake refused nothing (the key in
``api-key``, never a Bearer header; the deployment path and api-version, or the v1 path
with ``model`` = the deployment).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.estimate import estimate_prompt_tokens
from gateway.calls.provider_errors import REFUSED_PHRASE
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.fakes.fake_azure import JSON_ANSWER, TOOL_CALL, FakeAzure
from gateway.providers.azure import CONTENT_FILTER_PHRASE
from tests.conftest import Gateway, make_config, start_gateway

AZURE_KEY = "4f1e2d3c4b5a69788796a5b4c3d2e1f0"  # Azure's keys: 32 hex digits
ORG_AZURE_KEY = "acme0azure0resource0key0000000042"
API_VERSION = "2024-10-21"
DEPLOYMENT, EMBED_DEPLOYMENT = "gpt-4o-prod", "embed-small"
IN_PRICE, OUT_PRICE = 2.5, 10.0
MAX_TOKENS = 30
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
    "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@pytest.fixture(params=["deployments", "v1"])
async def azure(request: pytest.FixtureRequest, nursery: trio.Nursery) -> FakeAzure:
    version = API_VERSION if request.param == "deployments" else None
    fake = FakeAzure(
        keys=frozenset({AZURE_KEY, ORG_AZURE_KEY}),
        api_version=version,
        deployments=frozenset({DEPLOYMENT, EMBED_DEPLOYMENT}),
    )
    return await nursery.start(fake.serve)


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, azure: FakeAzure, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("AZURE_OPENAI_KEY", AZURE_KEY)
    monkeypatch.setenv("ACME_AZURE_KEY", ORG_AZURE_KEY)
    base = make_config(tmp_path, request_timeout_s=5.0)
    provider = ProviderConfig(
        name="azure",
        kind="azure",
        base_url=azure.endpoint,
        api_key_env="AZURE_OPENAI_KEY",
        api_version=azure.api_version,
    )
    chat = ModelConfig(
        "azure-chat",
        "azure",
        DEPLOYMENT,
        capabilities=("tools", "structured_output", "vision"),
        byok_available=True,
        input_usd_per_mtok=IN_PRICE,
        output_usd_per_mtok=OUT_PRICE,
    )
    embed = ModelConfig(
        "azure-embed",
        "azure",
        EMBED_DEPLOYMENT,
        "embedding",
        input_usd_per_mtok=0.02,
        output_usd_per_mtok=0.0,
    )
    config = replace(base, providers=(*base.providers, provider), models=(chat, embed))
    gw = await start_gateway(nursery, config)
    key = await gw.create_key(name="azure", mode="live", caps={"usd_day": 10})
    yield gw, key["token"]
    assert azure.refused == [], "the gateway sent a request Azure would refuse"
    gw.stop.set()


def client_of(gw: Gateway, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=token, max_retries=0, timeout=10.0)


async def with_client(gw: Gateway, token: str, make: Callable[[openai.OpenAI], Any]) -> Any:
    """``make(client)`` on a thread with the official sync client; streams read whole."""

    def run() -> Any:
        with client_of(gw, token) as client:
            result = make(client)
            return list(result) if isinstance(result, openai.Stream) else result

    return await trio.to_thread.run_sync(run)


async def chat(gw: Gateway, token: str, messages: list[dict[str, Any]], **extra: Any) -> Any:
    """A chat completion of azure-chat through the official client."""
    return await with_client(
        gw,
        token,
        lambda c: c.chat.completions.create(
            model="azure-chat", messages=messages, max_tokens=MAX_TOKENS, **extra
        ),
    )


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def check_addressing(azure: FakeAzure, deployment: str = DEPLOYMENT) -> None:
    headers = azure.headers[-1]
    assert headers["api-key"] == AZURE_KEY and "authorization" not in headers
    assert azure.addressed[-1] == deployment
    assert azure.bodies[-1]["model"] == deployment


async def record(gw: Gateway, token: str, request_id: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        response = await client.get(f"/v1/requests/{request_id}")
    assert response.status_code == 200, response.text
    return dict(response.json())


def nanos(usd: float) -> int:
    return round(usd * NANOS_PER_USD)


# -- the calls ---------------------------------------------------------------------------


async def test_plain_chat(live: tuple[Gateway, str], azure: FakeAzure) -> None:
    gw, token = live
    raw = await with_client(
        gw,
        token,
        lambda c: c.chat.completions.with_raw_response.create(
            model="azure-chat", messages=user("hello azure"), max_tokens=MAX_TOKENS
        ),
    )
    answer = raw.parse()
    assert answer.choices[0].message.content.startswith("alpha")
    assert answer.model == "azure-chat"
    body = orjson.loads(raw.content)
    assert "prompt_filter_results" not in body  # Azure's additions left out
    assert "content_filter_results" not in body["choices"][0]
    check_addressing(azure)
    row = await record(gw, token, raw.headers["x-request-id"])
    usage = answer.usage
    want = math.ceil((usage.prompt_tokens * IN_PRICE + usage.completion_tokens * OUT_PRICE) * 1000)
    assert nanos(row["cost"]["billed_usd"]) == nanos(row["cost"]["settled_usd"]) == want
    assert row["provider"] == "azure"


async def test_stream_with_usage(live: tuple[Gateway, str], azure: FakeAzure) -> None:
    gw, token = live
    chunks = await chat(
        gw, token, user("stream please"), stream=True, stream_options={"include_usage": True}
    )
    assert all(chunk.id and chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert all("prompt_filter_results" not in (chunk.model_extra or {}) for chunk in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("alpha")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert azure.bodies[-1]["stream_options"] == {"include_usage": True}
    check_addressing(azure)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses(live: tuple[Gateway, str], azure: FakeAzure, stream: bool) -> None:
    gw, token = live
    result = await with_client(
        gw,
        token,
        lambda c: c.responses.create(
            model="azure-chat", input="answer me", max_output_tokens=MAX_TOKENS, stream=stream
        ),
    )
    if stream:
        completed = [event for event in result if event.type == "response.completed"]
        assert len(completed) == 1
        result = completed[0].response
    assert result.output_text.startswith("alpha")
    assert result.usage is not None and result.usage.output_tokens > 0
    check_addressing(azure)


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_round_trip(live: tuple[Gateway, str], azure: FakeAzure, stream: bool) -> None:
    gw, token = live
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages: list[dict[str, Any]] = user("weather in Paris?")

    result = await chat(gw, token, messages, tools=tools, stream=stream)
    if stream:
        calls = [c.choices[0].delta.tool_calls for c in result if c.choices]
        call = next(tc for tc in calls if tc)[0]
        reasons = [c.choices[0].finish_reason for c in result if c.choices]
        assert "tool_calls" in reasons
    else:
        assert result.choices[0].finish_reason == "tool_calls"
        call = result.choices[0].message.tool_calls[0]
    assert call.id == TOOL_CALL["id"] and call.function.name == "get_weather"
    messages += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21}'},
    ]
    answer = await chat(gw, token, messages, tools=tools)
    assert answer.choices[0].message.content.startswith("alpha")
    sent = azure.bodies[-1]["messages"]
    assert sent[-1] == {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21}'}
    assert sent[-2]["tool_calls"][0]["id"] == call.id  # the id kept across turns
    check_addressing(azure)


async def test_json_schema(live: tuple[Gateway, str], azure: FakeAzure) -> None:
    gw, token = live
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "temperature_c": {"type": "integer"}},
        "required": ["city", "temperature_c"],
        "additionalProperties": False,
    }
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "weather", "schema": schema, "strict": True},
    }
    answer = await chat(gw, token, user("weather as JSON"), response_format=response_format)
    assert orjson.loads(answer.choices[0].message.content) == JSON_ANSWER
    assert azure.bodies[-1]["response_format"] == response_format
    check_addressing(azure)


async def test_image_input(live: tuple[Gateway, str], azure: FakeAzure) -> None:
    gw, token = live
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]
    answer = await chat(gw, token, [{"role": "user", "content": content}])
    assert answer.choices[0].message.content
    assert azure.bodies[-1]["messages"][0]["content"][1] == content[1]
    check_addressing(azure)


async def test_embeddings(live: tuple[Gateway, str], azure: FakeAzure) -> None:
    gw, token = live
    result = await with_client(
        gw,
        token,
        lambda c: c.embeddings.create(model="azure-embed", input=["one two", "three"]),
    )
    assert [item.index for item in result.data] == [0, 1]
    assert azure.bodies[-1]["input"] == ["one two", "three"]
    assert result.usage.prompt_tokens == 3
    check_addressing(azure, EMBED_DEPLOYMENT)


# -- faults ------------------------------------------------------------------------------


async def post(gw: Gateway, token: str, text: str, **extra: Any) -> httpx.Response:
    body = {"model": "azure-chat", "messages": user(text), "max_tokens": MAX_TOKENS, **extra}
    async with gw.client(token) as client:
        return await client.post("/v1/chat/completions", json=body)


def estimate_nanos(text: str) -> tuple[int, int]:
    """The reservation of a call of ``text``, and its input share."""
    prompt = estimate_prompt_tokens({"messages": user(text)})
    full = math.ceil((prompt * IN_PRICE + MAX_TOKENS * OUT_PRICE) * 1000)
    return full, math.ceil(prompt * IN_PRICE * 1000)


@pytest.mark.parametrize(
    ("directive", "status", "code", "settled"),
    [
        ("[[fault status=400]]", 400, "invalid_request", "nothing"),
        ("[[fault status=401]]", 400, "invalid_request", "nothing"),
        ("[[fault content_filter]]", 400, "invalid_request", "nothing"),
        ("[[fault status=429]]", 429, "rate_limited", "nothing"),
        ("[[fault status=500]]", 503, "service_unavailable", "input share"),
        ("[[fault reset]]", 503, "service_unavailable", "input share"),
        ("[[fault delay=8]]", 504, "request_timeout", "full"),  # past request_timeout_s
    ],
)
async def test_faults(
    live: tuple[Gateway, str], directive: str, status: int, code: str, settled: str
) -> None:
    gw, token = live
    text = f"{directive} hello"
    response = await post(gw, token, text)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code
    if status == 429:
        assert response.headers["Retry-After"] == "30"  # the spec's, not Azure's 6
    if code == "invalid_request":
        assert error["message"].startswith(REFUSED_PHRASE)
    if "content_filter" in directive:
        assert CONTENT_FILTER_PHRASE in error["message"]
    row = await record(gw, token, response.headers["X-Request-Id"])
    full, share = estimate_nanos(text)
    want = {"nothing": 0, "input share": share, "full": full}[settled]
    assert nanos(row["cost"]["settled_usd"]) == want
    assert row["cost"]["billed_usd"] == 0


async def test_a_stream_dropped_after_its_first_chunk(live: tuple[Gateway, str]) -> None:
    gw, token = live
    text = "[[fault drop_after=2]] go on"
    async with gw.client(token) as client:
        body = {"model": "azure-chat", "messages": user(text), "max_tokens": MAX_TOKENS}
        async with client.stream(
            "POST", "/v1/chat/completions", json={**body, "stream": True}
        ) as response:
            assert response.status_code == 200
            data = [
                line[5:].strip()
                async for line in response.aiter_lines()
                if line.startswith("data:")
            ]
            request_id = response.headers["X-Request-Id"]
    assert orjson.loads(data[-2])["error"]["code"] == "service_unavailable"
    row = await record(gw, token, request_id)
    assert nanos(row["cost"]["settled_usd"]) == estimate_nanos(text)[0]  # full reservation


async def test_a_stream_dropped_after_only_the_prompt_filter_chunk(
    live: tuple[Gateway, str],
) -> None:
    """Azure's first chunk is no output: a loss right after it settles the input share."""
    gw, token = live
    text = "[[fault drop_after=0]] go on"
    async with gw.client(token) as client:
        body = {"model": "azure-chat", "messages": user(text), "max_tokens": MAX_TOKENS}
        response = await client.post("/v1/chat/completions", json={**body, "stream": True})
    assert response.status_code == 503, response.text
    row = await record(gw, token, response.headers["X-Request-Id"])
    assert nanos(row["cost"]["settled_usd"]) == estimate_nanos(text)[1]


async def test_the_key_echoed_in_an_error_reaches_no_client_and_no_log(
    live: tuple[Gateway, str], caplog: pytest.LogCaptureFixture
) -> None:
    gw, token = live
    caplog.set_level(logging.DEBUG)
    response = await post(gw, token, "[[fault status=401 echo=auth]] hi")
    assert response.status_code == 400
    assert REFUSED_PHRASE in response.json()["error"]["message"]
    assert AZURE_KEY not in response.text
    assert AZURE_KEY not in caplog.text
    assert AZURE_KEY not in str([r.__dict__ for r in caplog.records])


async def test_a_byok_call_sends_the_organisations_azure_key_and_bills_its_cache_price(
    live: tuple[Gateway, str], azure: FakeAzure
) -> None:
    gw, _ = live
    org_id = (await gw.admin("POST", "/admin/orgs", {"name": "acme", "credits_usd": 10})).json()
    org_id = org_id["id"]
    credential = {"provider": "azure", "api_key_env": "ACME_AZURE_KEY"}
    assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/byok", credential)).status_code == 200
    price = {"input_usd_per_mtok": 1, "output_usd_per_mtok": 2, "cache_read_usd_per_mtok": 0.25}
    policy = {"byok_pricing": {"*": price}}
    assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", policy)).status_code == 200
    key = await gw.create_key(org_id=org_id, mode="live", byok=True)
    response = await post(gw, key["token"], "[[fault cached=3]] one two three four five six")
    assert response.status_code == 200, response.text
    assert azure.headers[-1]["api-key"] == ORG_AZURE_KEY
    usage = response.json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 3
    want = (usage["prompt_tokens"] - 3) * 1000 + 3 * 250 + usage["completion_tokens"] * 2000
    row = await record(gw, key["token"], response.headers["X-Request-Id"])
    assert row["usage"]["cached_input_tokens"] == 3
    assert nanos(row["cost"]["billed_usd"]) == nanos(row["cost"]["settled_usd"]) == want
