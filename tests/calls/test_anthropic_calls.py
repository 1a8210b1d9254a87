"""Live calls through an ``anthropic`` provider: a real gateway, the fake Messages API
(gateway/fakes/fake_anthropic.py, which refuses what the real API refuses), the official
``openai`` client. Each answer has OpenAI's shape; the request record's usage is what the
fake reported; each fault maps to the spec's status, code, Retry-After and settlement row
as for the ``openai`` kind (tests/calls/test_live_settlement.py)."""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import openai
import orjson
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.provider_errors import REFUSED_PHRASE
from gateway.config.settings import Config, ModelConfig, ProviderConfig
from gateway.fakes.fake_anthropic import FakeAnthropic
from tests.calls.test_live_settlement import (
    MAX_TOKENS,
    assert_timeout_counts_the_full_estimate,
    body_for,
    call,
    cost,
    estimate_of,
    settled,
    state,
    stream_data,
)
from tests.conftest import Gateway, make_config, start_gateway

OUR_KEY = "sk-ant-gateway-own-key-0123456789"
ORG_KEY = "acme.anthropic.credential~99"
CACHE_READ, CACHE_WRITE = 0.3, 3.75
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
T = TypeVar("T")


def claude_config(tmp_path: Path, fake: FakeAnthropic, timeout_s: float, **server: Any) -> Config:
    base = make_config(tmp_path, **server)
    provider = ProviderConfig(
        "claude", "anthropic", base_url=fake.url, api_key_env="CLAUDE_KEY", timeout_s=timeout_s
    )
    chat = ModelConfig(
        "live-chat",
        "claude",
        "claude-up",
        capabilities=("tools", "structured_output", "vision"),
        byok_available=True,
        input_usd_per_mtok=3.0,
        output_usd_per_mtok=15.0,
        cache_read_usd_per_mtok=CACHE_READ,
        cache_write_usd_per_mtok=CACHE_WRITE,
    )
    return replace(base, providers=(*base.providers, provider), models=(chat,))


@pytest.fixture
async def fake(nursery: trio.Nursery) -> AsyncIterator[FakeAnthropic]:
    fake: FakeAnthropic = await nursery.start(FakeAnthropic(keys={OUR_KEY, ORG_KEY}).serve)
    yield fake
    assert fake.rejected == [], "the fake refused a translated request"


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("CLAUDE_KEY", OUR_KEY)
    monkeypatch.setenv("ACME_CLAUDE_KEY", ORG_KEY)
    gw = await start_gateway(nursery, claude_config(tmp_path, fake, 300.0, request_timeout_s=2.0))
    key = await gw.create_key(name="live", mode="live", caps={"usd_day": 10})
    yield gw, key["token"]
    gw.stop.set()


async def with_client(gw: Gateway, token: str, use: Callable[[openai.OpenAI], T]) -> T:
    """``use`` with the official client (in a thread: it is synchronous)."""

    def run() -> T:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0) as client:
            return use(client)

    with trio.fail_after(20):
        return await trio.to_thread.run_sync(run)


def reported(fake: FakeAnthropic) -> dict[str, int]:
    """The OpenAI usage of the fake's last answer, as its own report gives it."""
    body = fake.bodies[-1]
    return {"input": len(orjson.dumps(body["messages"]).decode().split())}


async def test_a_plain_chat_through_the_openai_client(
    live: tuple[Gateway, str], fake: FakeAnthropic
) -> None:
    gw, token = live

    def chat(client: openai.OpenAI) -> tuple[Any, str]:
        raw = client.chat.completions.with_raw_response.create(
            model="live-chat",
            messages=[
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hello there"},
            ],
            max_tokens=MAX_TOKENS,
            seed=3,
        )
        return raw.parse(), raw.headers["x-request-id"]

    answer, request_id = await with_client(gw, token, chat)
    assert answer.choices[0].message.content == "alpha bravo charlie delta echo foxtrot"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.model == "live-chat"
    assert answer.model_extra and answer.model_extra["svc"]["ignored_parameters"] == ["seed"]
    assert fake.headers[-1]["x-api-key"] == OUR_KEY
    assert fake.bodies[-1]["system"] == "be brief" and "seed" not in fake.bodies[-1]
    assert answer.usage is not None
    assert answer.usage.prompt_tokens == reported(fake)["input"]
    assert answer.usage.completion_tokens == 6
    after = await state(gw, token, request_id)
    assert after["record"]["usage"]["prompt_tokens"] == answer.usage.prompt_tokens
    assert settled(after) == cost(answer.usage.prompt_tokens, 6) == after["used"]
    async with gw.client(token) as client:
        totals = (await client.get("/v1/usage")).json()["totals"]
    assert (totals["input_tokens"], totals["output_tokens"]) == (answer.usage.prompt_tokens, 6)
    assert round(totals["cost_usd"] * NANOS_PER_USD) == settled(after)


async def test_a_streamed_chat_with_include_usage(
    live: tuple[Gateway, str], fake: FakeAnthropic
) -> None:
    gw, token = live

    def stream(client: openai.OpenAI) -> tuple[list[Any], str]:
        raw = client.chat.completions.with_raw_response.create(
            **body_for("stream me"), stream=True, stream_options={"include_usage": True}
        )
        return list(raw.parse()), raw.headers["x-request-id"]

    chunks, request_id = await with_client(gw, token, stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    usage = chunks[-1].usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (reported(fake)["input"], 6)
    after = await state(gw, token, request_id)
    assert after["record"]["usage"]["completion_tokens"] == 6
    assert settled(after) == cost(usage.prompt_tokens, 6) == after["used"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_responses_call(live: tuple[Gateway, str], stream: bool) -> None:
    gw, token = live

    def respond(client: openai.OpenAI) -> tuple[str, Any]:
        request = {"model": "live-chat", "input": "hello", "max_output_tokens": 9}
        if not stream:
            response = client.responses.create(**request)
            return response.output_text, response.usage
        events = list(client.responses.create(**request, stream=True))
        deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        completed = events[-1]
        assert completed.type == "response.completed"
        assert completed.response.output_text == deltas
        return deltas, completed.response.usage

    text, usage = await with_client(gw, token, respond)
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert usage.output_tokens == 6 and usage.input_tokens > 0


async def test_a_tool_call_round_trip_keeps_the_ids(
    live: tuple[Gateway, str], fake: FakeAnthropic
) -> None:
    gw, token = live

    def round_trip(client: openai.OpenAI) -> tuple[Any, Any]:
        messages: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
        first = client.chat.completions.create(
            model="live-chat", messages=messages, tools=[WEATHER], max_tokens=MAX_TOKENS
        )
        call = first.choices[0].message.tool_calls[0]
        messages += [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        second = client.chat.completions.create(
            model="live-chat", messages=messages, tools=[WEATHER], max_tokens=MAX_TOKENS
        )
        return first, second

    first, second = await with_client(gw, token, round_trip)
    assert first.choices[0].finish_reason == "tool_calls"
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"city": "alpha"}
    assert second.choices[0].message.content == "the tool said sunny"
    sent = fake.bodies[-1]["messages"]
    assert sent[1]["content"][-1]["id"] == call.id
    assert sent[2]["content"][0]["tool_use_id"] == call.id


async def test_a_json_schema_answer(live: tuple[Gateway, str]) -> None:
    gw, token = live
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "people": {"type": "integer"}},
        "required": ["name", "people"],
    }

    def structured(client: openai.OpenAI) -> str | None:
        answer = client.chat.completions.create(
            **body_for("a city"),
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        )
        return answer.choices[0].message.content

    content = await with_client(gw, token, structured)
    assert content is not None
    assert orjson.loads(content) == {"name": "alpha", "people": 7}


async def test_an_image_input(live: tuple[Gateway, str], fake: FakeAnthropic) -> None:
    gw, token = live
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": PNG}},
    ]

    def look(client: openai.OpenAI) -> str | None:
        answer = client.chat.completions.create(
            model="live-chat",
            messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]  # a typed part list
            max_tokens=MAX_TOKENS,
        )
        return answer.choices[0].message.content

    assert await with_client(gw, token, look)
    assert fake.bodies[-1]["messages"][0]["content"][1]["source"]["type"] == "base64"


@pytest.mark.parametrize("stream", [False, True])
async def test_cache_tokens_are_on_the_record(
    live: tuple[Gateway, str], fake: FakeAnthropic, stream: bool
) -> None:
    gw, token = live
    body = body_for("hello [[cache read=100 write=50]]")
    if stream:
        _, request_id = await stream_data(gw, token, {**body, "stream": True})
    else:
        response = await call(gw, token, body)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 100, "cache_write_tokens": 50}
        request_id = response.headers["X-Request-Id"]
    record = (await state(gw, token, request_id))["record"]
    assert record["usage"]["prompt_tokens"] == reported(fake)["input"] + 150
    assert (record["usage"]["cached_input_tokens"], record["usage"]["cache_write_tokens"]) == (
        100,
        50,
    )


async def test_cache_tokens_are_priced_at_the_cache_prices(
    live: tuple[Gateway, str], fake: FakeAnthropic
) -> None:
    gw, token = live
    response = await call(gw, token, body_for("hello [[cache read=100 write=50]]"))
    after = await state(gw, token, response.headers["X-Request-Id"])
    fresh = reported(fake)["input"]
    expected = math.ceil((fresh * 3.0 + 100 * CACHE_READ + 50 * CACHE_WRITE + 6 * 15.0) * 1000)
    assert settled(after) == expected


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413])
async def test_a_provider_refusal_costs_nothing(live: tuple[Gateway, str], status: int) -> None:
    gw, token = live
    response = await call(gw, token, body_for(f"[[fault status={status}]]"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(REFUSED_PHRASE + "anthropic says no")
    for leak in ("internal.example", "sk-ant-abcdefgh", OUR_KEY):
        assert leak not in response.text
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 and after["spent"] == 0 and after["used"] == 0


@pytest.mark.parametrize("stream", [False, True])
async def test_a_provider_429_is_rate_limited_with_retry_after_30(
    live: tuple[Gateway, str], stream: bool
) -> None:
    gw, token = live
    response = await call(gw, token, body_for("[[fault status=429]]", stream=stream))
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert response.headers["Retry-After"] == "30"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 and after["spent"] == 0


@pytest.mark.parametrize(
    ("fault", "stream"),
    [
        ("status=529", False),
        ("status=500", False),
        ("status=529", True),
        ("reset", False),
        ("reset", True),
        ("error_first", True),
    ],
)
async def test_overloads_and_server_errors_count_the_input_share(
    live: tuple[Gateway, str], fault: str, stream: bool
) -> None:
    gw, token = live
    body = body_for(f"[[fault {fault}]]")
    response = await call(gw, token, {**body, "stream": stream})
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "Retry-After" in response.headers
    after = await state(gw, token, response.headers["X-Request-Id"])
    share = cost(estimate_of(body), 0)
    assert settled(after) == share == after["spent"]
    assert after["used"] == 0 and after["record"]["cost"]["billed_usd"] == 0


@pytest.mark.parametrize("fault", ["drop_after=2", "drop_after=0", "error_after=1"])
async def test_a_stream_cut_after_its_first_chunk_counts_the_full_estimate(
    live: tuple[Gateway, str], fault: str
) -> None:
    gw, token = live
    body = body_for(f"[[fault {fault}]]", stream=True)
    data, request_id = await stream_data(gw, token, body)
    assert orjson.loads(data[-2])["error"]["code"] == "service_unavailable"
    assert data[-1] == "[DONE]"
    after = await state(gw, token, request_id)
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]
    assert after["used"] == 0 and after["in_flight"] == 0


async def test_the_calls_own_timeout_is_504_and_counts_the_full_estimate(
    live: tuple[Gateway, str],
) -> None:
    await assert_timeout_counts_the_full_estimate(*live, delay=5)


async def test_the_providers_timeout_is_504_and_counts_the_full_estimate(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeAnthropic, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLAUDE_KEY", OUR_KEY)
    config = claude_config(tmp_path, fake, 0.5, request_timeout_s=10.0)
    gw = await start_gateway(nursery, config)
    token = (await gw.create_key(name="slow", mode="live", caps={"usd_day": 10}))["token"]
    await assert_timeout_counts_the_full_estimate(gw, token, delay=2)
    gw.stop.set()


@pytest.mark.parametrize("stream", [False, True])
async def test_an_echoed_key_reaches_neither_the_client_nor_the_logs(
    live: tuple[Gateway, str], caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    gw, token = live
    caplog.set_level(logging.DEBUG)
    response = await call(gw, token, body_for("[[fault status=401 echo=auth]]", stream=stream))
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(REFUSED_PHRASE + "invalid x-api-key") and "[key]" in message
    assert OUR_KEY not in response.text
    request_id = response.headers["X-Request-Id"]
    assert any(request_id in record.getMessage() or request_id in str(record.__dict__)
               for record in caplog.records), "the call's log lines were captured"  # fmt: skip
    assert OUR_KEY not in caplog.text
    assert all(OUR_KEY not in str(record.__dict__) for record in caplog.records)


async def byok_token(gw: Gateway) -> str:
    response = await gw.admin("POST", "/admin/orgs", {"name": "acme", "credits_usd": 10})
    org_id = response.json()["id"]
    body = {"provider": "claude", "api_key_env": "ACME_CLAUDE_KEY"}
    assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/byok", body)).status_code == 200
    pricing = {"byok_pricing": {"*": {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 1.0}}}
    assert (await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", pricing)).status_code == 200
    key = await gw.create_key(org_id=org_id, mode="live", byok=True, scopes=["inference"])
    return str(key["token"])


@pytest.mark.parametrize("stream", [False, True])
async def test_byok_sends_the_organisations_key(
    live: tuple[Gateway, str], fake: FakeAnthropic, stream: bool
) -> None:
    gw, _ = live
    token = await byok_token(gw)
    if stream:
        await stream_data(gw, token, body_for("hello", stream=True))
    else:
        assert (await call(gw, token, body_for("hello"))).status_code == 200
    assert fake.headers[-1]["x-api-key"] == ORG_KEY


async def test_a_rejected_byok_key_is_byok_credential_rejected(
    live: tuple[Gateway, str], fake: FakeAnthropic
) -> None:
    gw, _ = live
    token = await byok_token(gw)
    response = await call(gw, token, body_for("[[fault status=401 echo=auth]]"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "byok_credential_rejected"
    assert ORG_KEY not in response.text
