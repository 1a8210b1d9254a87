"""Live keys through a ``gemini`` provider: a real gateway, the official ``openai`` client,
and the fake Gemini API (gateway/fakes/fake_gemini.py), which refuses every request the
real API would refuse, so a translation bug fails here.

The happy paths (chat, streams, responses, tools, json_schema, images, embeddings) and
the failure table mirror tests/calls/test_live_settlement.py for the openai kind: same
statuses, codes, Retry-After and settled amounts.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.estimate import estimate_prompt_tokens
from gateway.calls.provider_errors import REFUSED_PHRASE
from gateway.config.settings import Config, ModelConfig, ProviderConfig
from gateway.fakes.fake_gemini import PIXEL, SIGNATURE, WEATHER, FakeGemini
from tests.calls.test_live_settlement import call, settled, state
from tests.conftest import Gateway, make_config, start_gateway

IN_PRICE, OUT_PRICE = 3.0, 15.0
MAX_TOKENS = 50
# a credential of no known shape: only the exact-value rule can cut it out
GEMINI_KEY = "gemini.own.credential~42"
ORG_KEY = "acme.gemini.credential~77"


def gemini_config(
    tmp_path: Path, fake: FakeGemini, timeout_s: float = 300.0, **server: Any
) -> Config:
    base = make_config(tmp_path, **server)
    provider = ProviderConfig(
        name="google", kind="gemini", base_url=fake.url, api_key_env="FAKE_GEMINI_KEY"
    )
    provider = replace(provider, timeout_s=timeout_s)
    chat = ModelConfig(
        "gem-chat",
        "google",
        "gemini-2.5-flash",
        capabilities=("tools", "structured_output", "vision"),
        byok_available=True,
        input_usd_per_mtok=IN_PRICE,
        output_usd_per_mtok=OUT_PRICE,
    )
    embed = ModelConfig("gem-embed", "google", "text-embedding-004", "embedding", dimensions=8)
    embed = replace(embed, input_usd_per_mtok=0.5, output_usd_per_mtok=0.0)
    return replace(base, providers=(*base.providers, provider), models=(chat, embed))


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeGemini:
    return await nursery.start(FakeGemini(GEMINI_KEY).serve)


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("FAKE_GEMINI_KEY", GEMINI_KEY)
    gw = await start_gateway(nursery, gemini_config(tmp_path, fake, request_timeout_s=2.0))
    key = await gw.create_key(name="live", mode="live", caps={"usd_day": 10})
    yield gw, key["token"]
    gw.stop.set()
    assert fake.refusals == [], "every request the gateway sent is one Gemini accepts"


def body_for(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "gem-chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def cost(prompt: int, completion: int) -> int:
    return math.ceil((prompt * IN_PRICE + completion * OUT_PRICE) * 1000)


def estimate_of(body: dict[str, Any]) -> int:
    return estimate_prompt_tokens({"messages": body["messages"], "max_tokens": MAX_TOKENS})


async def in_thread(gw: Gateway, token: str, work: Any) -> Any:
    """Run ``work(client)`` with the official client in a thread (it blocks)."""

    def run() -> Any:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0) as client:
            return work(client)

    with trio.fail_after(20):
        return await trio.to_thread.run_sync(run)


# -- what works ------------------------------------------------------------------------------


async def test_plain_chat_bills_geminis_usage(live: tuple[Gateway, str], fake: FakeGemini) -> None:
    gw, token = live

    def work(client: openai.OpenAI) -> Any:
        raw = client.chat.completions.with_raw_response.create(
            **body_for("hello there [[fault cached=4]]"), temperature=0.3, stop=["x"]
        )
        return raw.parse(), raw.headers["X-Request-Id"]

    answer, request_id = await in_thread(gw, token, work)
    assert answer.choices[0].message.content == "alpha bravo charlie delta echo foxtrot"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.prompt_tokens_details.cached_tokens == 4
    assert fake.paths[-1] == "/v1beta/models/gemini-2.5-flash:generateContent"
    assert fake.keys[-1] == GEMINI_KEY
    sent = fake.bodies[-1]["generationConfig"]
    assert sent == {"maxOutputTokens": MAX_TOKENS, "temperature": 0.3, "stopSequences": ["x"]}
    after = await state(gw, token, request_id)
    usage = after["record"]["usage"]
    assert usage["prompt_tokens"] == answer.usage.prompt_tokens
    assert usage["completion_tokens"] == 6
    assert usage["cached_input_tokens"] == 4
    assert settled(after) == cost(usage["prompt_tokens"], 6) == after["spent"]
    async with gw.client(token) as client:
        totals = (await client.get("/v1/usage")).json()["totals"]
    assert (totals["requests"], totals["output_tokens"]) == (1, 6)
    assert totals["input_tokens"] == usage["prompt_tokens"]
    assert round(totals["settled_usd"] * NANOS_PER_USD) == settled(after)


async def test_streamed_chat_with_include_usage(live: tuple[Gateway, str]) -> None:
    gw, token = live

    def work(client: openai.OpenAI) -> Any:
        with client.chat.completions.with_streaming_response.create(
            **body_for("stream me [[fault cached=2 thoughts=3]]"),
            stream=True,
            stream_options={"include_usage": True},
        ) as response:
            return list(response.parse()), response.headers["X-Request-Id"]

    chunks, request_id = await in_thread(gw, token, work)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage.completion_tokens == 6 + 3, "thinking tokens are output"
    assert usage.prompt_tokens_details.cached_tokens == 2
    after = await state(gw, token, request_id)
    assert after["record"]["usage"]["completion_tokens"] == 9
    assert settled(after) == cost(usage.prompt_tokens, 9)


@pytest.mark.parametrize("stream", [False, True])
async def test_responses(live: tuple[Gateway, str], stream: bool) -> None:
    gw, token = live

    def work(client: openai.OpenAI) -> Any:
        if not stream:
            return client.responses.create(
                model="gem-chat", input="hi", instructions="be brief", max_output_tokens=20
            ).output_text
        events = list(
            client.responses.create(model="gem-chat", input="hi", max_output_tokens=20, stream=True)
        )
        assert events[-1].type == "response.completed"
        return events[-1].response.output_text

    assert await in_thread(gw, token, work) == "alpha bravo charlie delta echo foxtrot"


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_round_trip(
    live: tuple[Gateway, str], fake: FakeGemini, stream: bool
) -> None:
    gw, token = live
    messages: list[dict[str, Any]] = [{"role": "user", "content": "weather in Oslo?"}]

    def first(client: openai.OpenAI) -> Any:
        if not stream:
            message = client.chat.completions.create(
                model="gem-chat", messages=messages, tools=[WEATHER], max_tokens=40
            ).choices[0]
            return message.finish_reason, message.message.tool_calls
        chunks = list(
            client.chat.completions.create(
                model="gem-chat", messages=messages, tools=[WEATHER], max_tokens=40, stream=True
            )
        )
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
        return finish, deltas

    finish, calls = await in_thread(gw, token, first)
    assert finish == "tool_calls"
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "alpha", "unit": "c"}
    assert calls[0].id.startswith("call_")
    assert calls[0].id.endswith("__thought__" + SIGNATURE), "the signature rides in the id"
    declared = fake.bodies[-1]["tools"][0]["functionDeclarations"][0]
    assert "additionalProperties" not in declared["parameters"]
    messages.append(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": calls[0].id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": calls[0].function.arguments},
                }
            ],
        }
    )
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp_c": 4}'})

    def second(client: openai.OpenAI) -> Any:
        return client.chat.completions.create(
            model="gem-chat", messages=messages, tools=[WEATHER], max_tokens=40
        ).choices[0]

    answer = await in_thread(gw, token, second)
    assert answer.message.content.startswith("done")
    contents = fake.bodies[-1]["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    assert contents[2]["parts"] == [
        {"functionResponse": {"name": "get_weather", "response": {"temp_c": 4}}}
    ]


async def test_a_json_schema_answer(live: tuple[Gateway, str], fake: FakeGemini) -> None:
    gw, token = live
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }

    def work(client: openai.OpenAI) -> Any:
        return client.chat.completions.create(
            **body_for("a person"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema, "strict": True},
            },
        )

    answer = await in_thread(gw, token, work)
    assert json.loads(answer.choices[0].message.content) == {"name": "alpha", "age": 1}
    config = fake.bodies[-1]["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseSchema"]["propertyOrdering"] == ["name", "age"]


async def test_an_image_input(live: tuple[Gateway, str], fake: FakeGemini) -> None:
    gw, token = live
    content = [
        {"type": "text", "text": "what is it?"},
        {"type": "image_url", "image_url": {"url": PIXEL}},
    ]

    def work(client: openai.OpenAI) -> Any:
        return client.chat.completions.create(
            model="gem-chat", messages=[{"role": "user", "content": content}], max_tokens=20
        )

    answer = await in_thread(gw, token, work)
    assert answer.choices[0].message.content
    part = fake.bodies[-1]["contents"][0]["parts"][1]
    assert part["inlineData"]["mimeType"] == "image/png"


async def test_embeddings(live: tuple[Gateway, str], fake: FakeGemini) -> None:
    gw, token = live

    def work(client: openai.OpenAI) -> Any:
        return client.embeddings.create(model="gem-embed", input=["one two", "three"], dimensions=8)

    answer = await in_thread(gw, token, work)
    assert [len(row.embedding) for row in answer.data] == [8, 8]
    assert fake.paths[-1] == "/v1beta/models/text-embedding-004:batchEmbedContents"
    assert fake.bodies[-1]["requests"][0]["outputDimensionality"] == 8


# -- the failure table -------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_a_refusal_costs_nothing(live: tuple[Gateway, str], status: int) -> None:
    gw, token = live
    response = await call(gw, token, body_for(f"[[fault status={status}]]"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(REFUSED_PHRASE + "Gemini says no")
    for leak in ("internal.example", "AIzaSy", GEMINI_KEY):
        assert leak not in response.text
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 and after["spent"] == 0 and after["in_flight"] == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_429_is_rate_limited_with_retry_after_30(
    live: tuple[Gateway, str], stream: bool
) -> None:
    gw, token = live
    response = await call(gw, token, body_for("[[fault status=429]]", stream=stream))
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert response.headers["Retry-After"] == "30", "the spec's value, not Gemini's 7s"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0


@pytest.mark.parametrize("fault", ["status=500", "status=503", "status=504", "reset"])
@pytest.mark.parametrize("stream", [False, True])
async def test_a_server_error_counts_the_input_share(
    live: tuple[Gateway, str], fault: str, stream: bool
) -> None:
    gw, token = live
    body = body_for(f"[[fault {fault}]]", stream=stream)
    response = await call(gw, token, body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "Retry-After" in response.headers
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), 0) == after["spent"]
    assert after["record"]["cost"]["billed_usd"] == 0


async def test_a_stream_dropped_before_its_first_chunk(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = body_for("[[fault drop_after=0]]", stream=True)
    response = await call(gw, token, body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), 0)


@pytest.mark.parametrize("fault", ["drop_after=3", "error_after=3"])
async def test_a_stream_dropped_after_output_counts_the_full_estimate(
    live: tuple[Gateway, str], fault: str
) -> None:
    gw, token = live
    body = body_for(f"[[fault {fault}]]", stream=True)
    async with (
        gw.client(token) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        data = [
            line[5:].strip() async for line in response.aiter_lines() if line.startswith("data:")
        ]
        request_id = response.headers["X-Request-Id"]
    assert orjson.loads(data[-2])["error"]["code"] == "service_unavailable"
    assert data[-1] == "[DONE]"
    assert "internal.example" not in "".join(data)
    after = await state(gw, token, request_id)
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]
    assert after["in_flight"] == 0


async def assert_late(gw: Gateway, token: str, delay: float) -> None:
    """Gemini answers only after ``delay`` s: 504 request_timeout, the full estimate."""
    body = body_for(f"[[fault delay={delay}]]")
    with trio.fail_after(10):
        response = await call(gw, token, body)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]


async def test_the_gateways_deadline_is_504_and_counts_the_full_estimate(
    live: tuple[Gateway, str],
) -> None:
    await assert_late(*live, delay=5)


async def test_the_providers_timeout_is_504_and_counts_the_full_estimate(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeGemini, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GEMINI_KEY", GEMINI_KEY)
    config = gemini_config(tmp_path, fake, timeout_s=0.5, request_timeout_s=10.0)
    gw = await start_gateway(nursery, config)
    token = (await gw.create_key(name="slow", mode="live", caps={"usd_day": 10}))["token"]
    await assert_late(gw, token, delay=2)
    gw.stop.set()


async def test_an_unreadable_200_counts_the_full_estimate(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = body_for("[[fault malformed]]")
    response = await call(gw, token, body)
    assert response.status_code == 503
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS)


@pytest.mark.parametrize("stream", [False, True])
async def test_the_key_echoed_by_gemini_reaches_neither_client_nor_logs(
    live: tuple[Gateway, str], caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    gw, token = live
    with caplog.at_level(logging.DEBUG):
        response = await call(gw, token, body_for("[[fault status=400 echo=key]]", stream=stream))
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(REFUSED_PHRASE + "API key not valid")
    assert GEMINI_KEY not in response.text and "[key]" in response.text
    assert GEMINI_KEY not in caplog.text


# -- BYOK ------------------------------------------------------------------------------------


async def byok_token(gw: Gateway) -> str:
    org_id = (await gw.admin("POST", "/admin/orgs", {"name": "acme", "credits_usd": 10})).json()[
        "id"
    ]
    body = {"provider": "google", "api_key_env": "ACME_GEMINI_KEY"}
    assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/byok", body)).status_code == 200
    pricing = {"byok_pricing": {"*": {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 1.0}}}
    assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", pricing)).status_code == 200
    key = await gw.create_key(
        org_id=org_id, mode="live", byok=True, scopes=["inference", "usage:read"]
    )
    return str(key["token"])


async def test_byok_sends_the_organisations_gemini_key(
    nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_GEMINI_KEY", GEMINI_KEY)
    monkeypatch.setenv("ACME_GEMINI_KEY", ORG_KEY)
    fake = await nursery.start(FakeGemini(ORG_KEY).serve)
    gw = await start_gateway(nursery, gemini_config(tmp_path, fake))
    token = await byok_token(gw)
    response = await call(gw, token, body_for("hello"))
    assert response.status_code == 200, response.text
    assert fake.keys == [ORG_KEY]
    usage = response.json()["usage"]
    after = await state(gw, token, response.headers["X-Request-Id"])
    expected = math.ceil((usage["prompt_tokens"] * 0.5 + usage["completion_tokens"] * 1.0) * 1000)
    assert settled(after) == expected
    # Gemini refusing the organisation's key: byok_credential_rejected, nothing settled
    response = await call(gw, token, body_for("[[fault status=403 echo=key]]"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "byok_credential_rejected"
    assert ORG_KEY not in response.text
    gw.stop.set()
