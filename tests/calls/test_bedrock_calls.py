"""Live keys through a real gateway to the fake Bedrock Runtime (gateway/fakes/fake_bedrock.py).

The official ``openai`` client on both endpoints, streamed and not; usage and settlement
on the request record; each Bedrock fault → the spec's status, code, Retry-After and
settled amount, as tests/calls/test_live_settlement.py has them for the ``openai`` kind
(its helpers and prices are reused: the same table must hold for every kind).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import openai
import orjson
import pydantic
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.provider_errors import REFUSED_PHRASE
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.fakes.fake_bedrock import BAD_SIGNATURE, FakeBedrock
from tests.calls.test_live_settlement import (
    IN_PRICE,
    MAX_TOKENS,
    OUT_PRICE,
    body_for,
    call,
    cost,
    estimate_of,
    settled,
    state,
    stream_data,
)
from tests.conftest import Gateway, make_config, start_gateway

KEY_ID = "AKIAGATEWAYBEDROCK01"
SECRET = "gw/Secret+Access/Key0123456789abcdefghijK"
TOKEN = "IQoJb3JpZ2luX2VjEGateway/Session+Token=="
ORG_ID, ORG_SECRET = "AKIAACMEORGBEDROCK01", "acme/Own+Secret/0123456789abcdefghijklmn"
SECRETS = (KEY_ID, SECRET, TOKEN, ORG_ID, ORG_SECRET)
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)
T = TypeVar("T")


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeBedrock:
    credentials = {KEY_ID: (SECRET, TOKEN), ORG_ID: (ORG_SECRET, None)}
    return await nursery.start(FakeBedrock(credentials=credentials, region="eu-west-1").serve)


async def bedrock_gateway(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeBedrock, timeout_s: float = 300.0
) -> Gateway:
    base = make_config(tmp_path, request_timeout_s=3.0)
    provider = ProviderConfig(
        name="aws", kind="bedrock", base_url=fake.url, region="eu-west-1", timeout_s=timeout_s
    )
    provider = replace(provider, session_token_env="GW_AWS_SESSION_TOKEN")
    chat = ModelConfig("live-chat", "aws", "anthropic.claude-3-5-sonnet-20240620-v1:0")
    chat = replace(
        chat,
        input_usd_per_mtok=IN_PRICE,
        output_usd_per_mtok=OUT_PRICE,
        capabilities=("tools", "structured_output", "vision"),
        byok_available=True,
    )
    return await start_gateway(nursery, replace(base, providers=(provider,), models=(chat,)))


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("GW_AWS_SESSION_TOKEN", TOKEN)
    gw = await bedrock_gateway(nursery, tmp_path, fake)
    key = await gw.create_key(name="live", mode="live", caps={"usd_day": 10})
    yield gw, key["token"]
    gw.stop.set()


async def with_client(gw: Gateway, token: str, use: Callable[[openai.OpenAI], T]) -> T:
    """``use`` the official client (in a thread: it is synchronous), no retries."""

    def run() -> T:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0) as client:
            return use(client)

    with trio.fail_after(20):
        return await trio.to_thread.run_sync(run)


async def record_of(gw: Gateway, token: str, request_id: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        response = await client.get(f"/v1/requests/{request_id}")
    assert response.status_code == 200, response.text
    record: dict[str, Any] = response.json()
    return record


async def test_a_plain_chat(live: tuple[Gateway, str], fake: FakeBedrock) -> None:
    gw, token = live

    def chat(client: openai.OpenAI) -> Any:
        return client.chat.completions.with_raw_response.create(
            **body_for("hello there", temperature=0.2, seed=7)
        )

    raw = await with_client(gw, token, chat)
    completion = raw.parse()
    assert completion.choices[0].message.content == "alpha bravo charlie delta echo foxtrot"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "live-chat"
    assert orjson.loads(raw.http_response.text)["svc"]["ignored_parameters"] == ["seed"]
    assert fake.rejections == [] and fake.paths[-1].endswith("v1%3A0/converse")
    assert fake.bodies[-1]["inferenceConfig"] == {"maxTokens": MAX_TOKENS, "temperature": 0.2}
    usage = completion.usage
    assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (2, 6)
    after = await state(gw, token, raw.http_response.headers["X-Request-Id"])
    assert settled(after) == cost(2, 6) == after["spent"] == after["used"]


async def test_a_streamed_chat_with_usage(live: tuple[Gateway, str], fake: FakeBedrock) -> None:
    gw, token = live

    def chat(client: openai.OpenAI) -> list[Any]:
        body = body_for("stream me", stream=True, stream_options={"include_usage": True})
        return list(client.chat.completions.create(**body))

    chunks = await with_client(gw, token, chat)
    assert fake.paths[-1].endswith("/converse-stream")
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (2, 6)
    after = await state(gw, token, chunks[-1].svc["request_id"])  # type: ignore[attr-defined]
    assert settled(after) == cost(2, 6) == after["used"]


async def test_cached_tokens_reach_the_record(live: tuple[Gateway, str]) -> None:
    gw, token = live
    text = "one two three four five six seven eight nine ten [[fault cache_read=4 cache_write=3]]"
    response = await call(gw, token, body_for(text))
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    # 13 words; AWS reports inputTokens 6, cacheRead 4 and cacheWrite 3 apart: all input
    assert usage["prompt_tokens"] == 13
    assert usage["prompt_tokens_details"]["cached_tokens"] == 4
    record = await record_of(gw, token, response.headers["X-Request-Id"])
    assert record["usage"]["prompt_tokens"] == 13
    assert (record["usage"]["cached_input_tokens"], record["usage"]["cache_write_tokens"]) == (4, 3)
    after = await state(gw, token, response.headers["X-Request-Id"])
    # no cache prices configured: cached tokens are priced as input
    assert settled(after) == cost(13, 6) == after["used"]
    async with gw.client(token) as client:
        totals = (await client.get("/v1/usage")).json()["totals"]
    assert (totals["requests"], totals["input_tokens"], totals["output_tokens"]) == (1, 13, 6)
    assert round(totals["cost_usd"] * NANOS_PER_USD) == cost(13, 6)
    data, request_id = await stream_data(
        gw, token, body_for(text, stream=True, stream_options={"include_usage": True})
    )
    assert orjson.loads(data[-2])["usage"]["prompt_tokens_details"]["cached_tokens"] == 4
    assert (await record_of(gw, token, request_id))["usage"]["prompt_tokens"] == 13


@pytest.mark.parametrize("stream", [False, True])
async def test_responses(live: tuple[Gateway, str], stream: bool) -> None:
    gw, token = live
    body = {"model": "live-chat", "input": "say something", "max_output_tokens": 20}

    def respond(client: openai.OpenAI) -> Any:
        if not stream:
            return client.responses.create(**body)
        events = list(client.responses.create(**body, stream=True))
        assert events[-1].type == "response.completed"
        return events[-1].response

    response = await with_client(gw, token, respond)
    assert response.output_text == "alpha bravo charlie delta echo foxtrot"
    assert response.usage.input_tokens == 2 and response.usage.output_tokens == 6


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_round_trip(
    live: tuple[Gateway, str], fake: FakeBedrock, stream: bool
) -> None:
    gw, token = live
    question = [{"role": "user", "content": "weather in Paris?"}]

    def round_trip(client: openai.OpenAI) -> tuple[Any, str]:
        first = {"model": "live-chat", "messages": question, "tools": [WEATHER]}
        if stream:
            chunks = list(client.chat.completions.create(**first, stream=True))
            calls = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices
                     and c.choices[0].delta.tool_calls]  # fmt: skip
            tool_call = {
                "id": calls[0].id,
                "type": "function",
                "function": {
                    "name": calls[0].function.name,
                    "arguments": "".join(c.function.arguments or "" for c in calls),
                },
            }
        else:
            message = client.chat.completions.create(**first).choices[0].message
            assert message.tool_calls is not None
            tool_call = message.tool_calls[0].model_dump()
        history = [
            *question,
            {"role": "assistant", "content": None, "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": tool_call["id"], "content": "sunny, 21 C"},
        ]
        second = client.chat.completions.create(
            model="live-chat", messages=history, tools=[WEATHER]
        )
        return tool_call, second.choices[0].message.content or ""

    tool_call, answer = await with_client(gw, token, round_trip)
    assert tool_call["function"] == {"name": "get_weather", "arguments": '{"city":"alpha"}'}
    assert tool_call["id"].startswith("tooluse_")
    assert answer == "the tool said so"
    assert fake.rejections == []
    result = fake.bodies[-1]["messages"][-1]["content"][0]["toolResult"]
    assert result["toolUseId"] == tool_call["id"]


async def test_a_json_schema_answer(live: tuple[Gateway, str]) -> None:
    gw, token = live
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "celsius": {"type": "integer"}},
        "required": ["city", "celsius"],
        "additionalProperties": False,
    }

    def structured(client: openai.OpenAI) -> Any:
        return client.chat.completions.create(
            **body_for("weather as JSON"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "weather", "schema": schema, "strict": True},
            },
        )

    completion = await with_client(gw, token, structured)
    assert orjson.loads(completion.choices[0].message.content) == {"city": "alpha", "celsius": 1}
    assert completion.choices[0].finish_reason == "stop"


async def test_an_image_input(live: tuple[Gateway, str], fake: FakeBedrock) -> None:
    gw, token = live
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
    ]

    def look(client: openai.OpenAI) -> Any:
        return client.chat.completions.create(
            model="live-chat", messages=[{"role": "user", "content": parts}], max_tokens=9
        )

    assert (await with_client(gw, token, look)).choices[0].message.content
    image = fake.bodies[-1]["messages"][0]["content"][1]["image"]
    assert image == {"format": "png", "source": {"bytes": PIXEL}}


async def test_an_image_by_web_address_is_refused_saying_what_works(
    live: tuple[Gateway, str], fake: FakeBedrock
) -> None:
    gw, token = live
    parts = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    body = {"model": "live-chat", "messages": [{"role": "user", "content": parts}]}
    response = await call(gw, token, body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_request"
    assert "data URL" in response.json()["error"]["message"]
    assert fake.calls == 0
    assert settled(await state(gw, token, response.headers["X-Request-Id"])) == 0


@pytest.mark.parametrize("status", [400, 403, 404])
async def test_a_refusal_costs_nothing(live: tuple[Gateway, str], status: int) -> None:
    gw, token = live
    response = await call(gw, token, body_for(f"[[fault status={status}]]"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(REFUSED_PHRASE)
    assert "Bedrock says no" in error["message"] and "internal.example" not in response.text
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 == after["spent"] == after["used"]


async def test_a_bad_signature_is_a_refusal(
    live: tuple[Gateway, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, token = live
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET[:-1] + "Q")  # read at each call
    response = await call(gw, token, body_for("hello"))
    assert response.status_code == 400
    assert BAD_SIGNATURE[:40] in response.json()["error"]["message"]


THROTTLED = [
    ("status=429", False),
    ("status=429", True),
    ("status=400 type=ServiceQuotaExceededException", False),
    ("exception=throttlingException", True),
]


@pytest.mark.parametrize(("fault", "stream"), THROTTLED)
async def test_throttling_is_rate_limited_with_retry_after_30(
    live: tuple[Gateway, str], fault: str, stream: bool
) -> None:
    gw, token = live
    response = await call(gw, token, body_for(f"[[fault {fault}]]", stream=stream))
    assert response.status_code == 429, response.text
    assert response.json()["error"]["code"] == "rate_limited"
    assert response.headers["Retry-After"] == "30"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 == after["spent"]


@pytest.mark.parametrize(
    "fault",
    ["status=500", "status=503", "status=429 type=ModelNotReadyException", "reset"],
)
async def test_server_errors_count_the_input_share(live: tuple[Gateway, str], fault: str) -> None:
    gw, token = live
    body = body_for(f"[[fault {fault}]]")
    response = await call(gw, token, body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "Retry-After" in response.headers
    after = await state(gw, token, response.headers["X-Request-Id"])
    share = cost(estimate_of(body), 0)
    assert settled(after) == share == after["spent"]
    assert after["used"] == 0


async def test_a_stream_cut_before_its_first_frame_counts_the_input_share(
    live: tuple[Gateway, str],
) -> None:
    gw, token = live
    body = body_for("[[fault drop_after=0]]", stream=True)
    response = await call(gw, token, body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), 0) == after["spent"]


@pytest.mark.parametrize(
    "fault", ["drop_after=3", "exception=modelStreamErrorException exception_after=3"]
)
async def test_a_stream_failing_after_output_counts_the_full_estimate(
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


async def test_the_providers_timeout_is_504_and_counts_the_full_estimate(
    nursery: trio.Nursery, tmp_path: Path, fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("GW_AWS_SESSION_TOKEN", TOKEN)
    gw = await bedrock_gateway(nursery, tmp_path, fake, timeout_s=0.5)
    token = (await gw.create_key(name="slow", mode="live", caps={"usd_day": 10}))["token"]
    for fault in ("delay=2", "status=408"):
        body = body_for(f"[[fault {fault}]]")
        with trio.fail_after(10):
            response = await call(gw, token, body)
        assert response.status_code == 504, response.text
        assert response.json()["error"]["code"] == "request_timeout"
        after = await state(gw, token, response.headers["X-Request-Id"])
        assert settled(after) == cost(estimate_of(body), MAX_TOKENS)
    gw.stop.set()


@pytest.mark.parametrize("echo", ["auth", "token", SECRET, KEY_ID])
@pytest.mark.parametrize("stream", [False, True])
async def test_secrets_and_signatures_never_reach_the_client_nor_the_logs(
    live: tuple[Gateway, str],
    fake: FakeBedrock,
    caplog: pytest.LogCaptureFixture,
    echo: str,
    stream: bool,
) -> None:
    gw, token = live
    with caplog.at_level(logging.DEBUG):
        response = await call(
            gw, token, body_for(f"[[fault status=400 echo={echo}]]", stream=stream)
        )
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "security token included in the request is invalid" in message
    signature = fake.headers[-1]["authorization"].rsplit("Signature=", 1)[1]
    for secret in (*SECRETS, signature):
        assert secret not in response.text
        assert secret not in caplog.text
        assert secret not in str([r.__dict__ for r in caplog.records])


async def test_byok_with_the_organisations_key_pair(
    live: tuple[Gateway, str], fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, _ = live
    monkeypatch.setenv("ACME_AWS_KEYS", f"{ORG_ID}:{ORG_SECRET}")
    org = (await gw.admin("POST", "/admin/orgs", {"name": "acme", "credits_usd": 10})).json()
    credential = {"provider": "aws", "api_key_env": "ACME_AWS_KEYS"}
    assert (await gw.admin("PUT", f"/admin/orgs/{org['id']}/byok", credential)).status_code == 200
    price = {"input_usd_per_mtok": 0.5, "output_usd_per_mtok": 1.0}
    policy = {"byok_pricing": {"*": price}}
    assert (await gw.admin("PUT", f"/admin/orgs/{org['id']}/policy", policy)).status_code == 200
    key = await gw.create_key(org_id=org["id"], mode="live", byok=True, scopes=["inference"])
    response = await call(gw, key["token"], body_for("hello"))
    assert response.status_code == 200, response.text
    assert fake.headers[-1]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ORG_ID}/")
    assert "x-amz-security-token" not in fake.headers[-1], "the pair has no session token"
    # a key pair the fake does not know: the organisation's credential is rejected
    monkeypatch.setenv("ACME_AWS_KEYS", f"AKIAUNKNOWNKEY000001:{ORG_SECRET}")
    response = await call(gw, key["token"], body_for("hello"))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "byok_credential_rejected"
    assert ORG_SECRET not in response.text
    # not a pair at all: refused before any call
    calls = fake.calls
    monkeypatch.setenv("ACME_AWS_KEYS", "not-a-key-pair")
    response = await call(gw, key["token"], body_for("hello"))
    assert response.json()["error"]["code"] == "byok_credential_rejected"
    assert fake.calls == calls


async def test_the_servers_secrets_include_the_aws_credentials(live: tuple[Gateway, str]) -> None:
    """Every provider's error text is cut of them, a bedrock provider's or another's."""
    gw, _ = live
    assert {KEY_ID, SECRET, TOKEN} <= set(gw.runtime.provider_secrets())


async def test_messages_parse_through_bedrock(live: tuple[Gateway, str]) -> None:
    """The Anthropic SDK's messages.parse on a Bedrock deployment (translated: its
    output_config.format becomes the forced answer tool, its input the text)."""
    gw, token = live

    class Weather(pydantic.BaseModel):
        city: str
        celsius: int

    def parse() -> Any:
        with anthropic.Anthropic(
            base_url=gw.url, auth_token=token, max_retries=0, timeout=10.0
        ) as client:
            return client.messages.parse(
                model="live-chat",
                max_tokens=MAX_TOKENS,
                messages=[{"role": "user", "content": "weather as JSON"}],
                output_format=Weather,
            )

    message = await trio.to_thread.run_sync(parse)
    assert message.parsed_output == Weather(city="alpha", celsius=1)
    assert message.stop_reason == "end_turn"
