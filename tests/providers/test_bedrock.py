"""The bedrock provider against the fake Bedrock Runtime (a real server that checks every
request's SigV4 signature and Converse body, and answers in AWS's wire format)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai.types.chat as chat_types
import pytest
import trio

from gateway.config.settings import ProviderConfig
from gateway.fakes.fake_bedrock import FakeBedrock
from gateway.providers.base import (
    ProviderDropped,
    ProviderError,
    ProviderMalformed,
    ProviderRateLimited,
    ProviderRefused,
    ProviderRequest,
    ProviderServerError,
    ProviderTimedOut,
    ProviderUnreachable,
)
from gateway.providers.bedrock import BedrockProvider
from gateway.providers.bedrock.converse import converse_request, ignored_parameters

KEY_ID = "AKIAFAKEBEDROCK00001"
SECRET = "fake/Secret+Access/Key0123456789abcdefXYZ"
TOKEN = "FwoGZXIvYXdzEFakeSessionToken/with+slashes=="
ORG_ID, ORG_SECRET = "AKIAORGOWNKEYPAIR001", "org/Own+Secret/0123456789abcdefghijklmn"
MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAE"
    "hQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeBedrock:
    credentials = {KEY_ID: (SECRET, TOKEN), ORG_ID: (ORG_SECRET, None)}
    return await nursery.start(FakeBedrock(credentials=credentials).serve)


@pytest.fixture
async def provider(
    fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[BedrockProvider]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    config = ProviderConfig("bedrock", "bedrock", base_url=fake.url, region="us-east-1")
    bedrock = BedrockProvider(config)
    yield bedrock
    await bedrock.aclose()


def request(text: str = "hello there", api_key: str | None = None, **body: Any) -> ProviderRequest:
    messages = body.pop("messages", [{"role": "user", "content": text}])
    payload = {"model": MODEL, "messages": messages, "max_tokens": 20, **body}
    return ProviderRequest(MODEL, payload, api_key=api_key, request_id="req_0123abcd")


async def chunks_of(provider: BedrockProvider, call: ProviderRequest) -> list[dict[str, Any]]:
    return [chunk async for chunk in provider.stream(call)]


async def test_a_plain_answer_signed_and_read(provider: BedrockProvider, fake: FakeBedrock) -> None:
    result = await provider.complete(request(system_text := "be brief"))
    completion = chat_types.ChatCompletion.model_validate(result.completion)
    assert completion.choices[0].message.content == "alpha bravo charlie delta echo foxtrot"
    assert completion.choices[0].finish_reason == "stop"
    assert fake.rejections == []
    assert fake.paths[-1] == "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
    assert fake.headers[-1]["x-amz-security-token"] == TOKEN
    assert fake.bodies[-1]["messages"] == [{"role": "user", "content": [{"text": system_text}]}]
    assert fake.bodies[-1]["inferenceConfig"] == {"maxTokens": 20}
    assert result.usage is not None and result.usage.prompt_tokens == 2


async def test_cache_reads_and_writes_are_parts_of_the_prompt(provider: BedrockProvider) -> None:
    text = "one two three four five six seven eight nine ten [[fault cache_read=4 cache_write=3]]"
    result = await provider.complete(request(text))
    usage = result.usage
    assert usage is not None
    # 13 words; the fake reports inputTokens = 13 - 4 - 3: AWS counts cache tokens apart
    assert (usage.prompt_tokens, usage.cached_tokens, usage.cache_write_tokens) == (13, 4, 3)
    assert result.completion["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 4,
        "cache_write_tokens": 3,
    }
    chunks = await chunks_of(provider, request(text))
    assert chunks[-1]["usage"]["prompt_tokens"] == 13
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 4,
        "cache_write_tokens": 3,
    }


async def test_a_stream_is_openai_chunks(provider: BedrockProvider, fake: FakeBedrock) -> None:
    chunks = await chunks_of(provider, request())
    for chunk in chunks:
        chat_types.ChatCompletionChunk.model_validate(chunk)
    assert fake.paths[-1].endswith("/converse-stream")
    assert fake.headers[-1]["accept"] == "application/vnd.amazon.eventstream"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert len({c["id"] for c in chunks}) == 1


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_tool_call_round_trip_keeps_the_ids(
    provider: BedrockProvider, fake: FakeBedrock, stream: bool
) -> None:
    first = request("weather in Paris?", tools=[WEATHER], tool_choice="auto")
    if stream:
        chunks = await chunks_of(provider, first)
        calls = [c["choices"][0]["delta"]["tool_calls"][0] for c in chunks if c["choices"]
                 and c["choices"][0]["delta"].get("tool_calls")]  # fmt: skip
        call_id, name = calls[0]["id"], calls[0]["function"]["name"]
        arguments = "".join(c["function"]["arguments"] for c in calls)
        assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    else:
        message = (await provider.complete(first)).completion["choices"][0]
        assert message["finish_reason"] == "tool_calls"
        call = message["message"]["tool_calls"][0]
        call_id, name, arguments = (
            call["id"],
            call["function"]["name"],
            call["function"]["arguments"],
        )
    assert (name, arguments) == ("get_weather", '{"city":"alpha"}')
    assert call_id.startswith("tooluse_")
    assert fake.bodies[-1]["toolConfig"]["toolChoice"] == {"auto": {}}
    history = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        ]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny"},
    ]  # fmt: skip
    result = await provider.complete(request(messages=history, tools=[WEATHER]))
    assert result.completion["choices"][0]["message"]["content"] == "the tool said so"
    assert fake.rejections == []
    turns = fake.bodies[-1]["messages"]
    assert turns[1]["content"][0]["toolUse"]["toolUseId"] == call_id
    assert turns[2]["content"][0]["toolResult"] == {
        "toolUseId": call_id,
        "content": [{"text": "sunny"}],
    }


@pytest.mark.parametrize("stream", [False, True])
async def test_json_schema_goes_through_a_forced_tool(
    provider: BedrockProvider, fake: FakeBedrock, stream: bool
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    response_format = {"type": "json_schema", "json_schema": {"name": "result", "schema": schema}}
    call = request("two plus two", response_format=response_format)
    if stream:
        chunks = await chunks_of(provider, call)
        content = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        reason = chunks[-2]["choices"][0]["finish_reason"]
    else:
        choice = (await provider.complete(call)).completion["choices"][0]
        content, reason = choice["message"]["content"], choice["finish_reason"]
        assert "tool_calls" not in choice["message"]
    assert (content, reason) == ('{"answer":1}', "stop")
    assert fake.bodies[-1]["toolConfig"]["toolChoice"] == {"tool": {"name": "result"}}


async def test_an_image_data_url_goes_as_bytes(
    provider: BedrockProvider, fake: FakeBedrock
) -> None:
    parts = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}},
    ]
    await provider.complete(request(messages=[{"role": "user", "content": parts}]))
    assert fake.bodies[-1]["messages"][0]["content"][1] == {
        "image": {"format": "png", "source": {"bytes": PIXEL}}
    }


async def test_an_image_by_url_is_refused_before_any_call(
    provider: BedrockProvider, fake: FakeBedrock
) -> None:
    parts = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    with pytest.raises(ProviderRefused) as refused:
        await provider.complete(request(messages=[{"role": "user", "content": parts}]))
    assert refused.value.status == 400 and "data URL" in refused.value.message
    assert fake.calls == 0


def test_the_parameters_converse_lacks_are_named() -> None:
    body = {"messages": [], "seed": 7, "temperature": 0.5, "stop": "END", "top_p": 0.9}
    assert ignored_parameters(body) == ["seed"]
    converse = converse_request(body).body
    assert converse["inferenceConfig"] == {
        "temperature": 0.5,
        "topP": 0.9,
        "stopSequences": ["END"],
    }
    assert "seed" not in str(converse)


def test_system_messages_and_consecutive_turns() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "one"},
            {"role": "user", "content": [{"type": "text", "text": "two"}]},
            {"role": "assistant", "content": "three"},
            {"role": "user", "content": "four"},
        ]
    }
    converse = converse_request(body).body
    assert converse["system"] == [{"text": "be brief"}]
    assert [m["role"] for m in converse["messages"]] == ["user", "assistant", "user"]
    assert converse["messages"][0]["content"] == [{"text": "one"}, {"text": "two"}]


async def test_an_organisations_key_pair_signs_its_calls(
    provider: BedrockProvider, fake: FakeBedrock
) -> None:
    await provider.complete(request(api_key=f"{ORG_ID}:{ORG_SECRET}"))
    assert fake.rejections == []
    assert fake.headers[-1]["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ORG_ID}/")
    assert "x-amz-security-token" not in fake.headers[-1]


@pytest.mark.parametrize("pair", ["just-one-part", "a::b", "a:b:c:d"])
async def test_a_malformed_key_pair_is_refused_unsent(
    provider: BedrockProvider, fake: FakeBedrock, pair: str
) -> None:
    with pytest.raises(ProviderRefused) as refused:
        await provider.complete(request(api_key=pair))
    assert refused.value.status == 401 and "ACCESS_KEY_ID:SECRET_ACCESS_KEY" in str(refused.value)
    assert fake.calls == 0


async def test_missing_credentials_refuse_the_call_unsent(
    provider: BedrockProvider, fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ProviderRefused) as refused:
        await chunks_of(provider, request())
    assert "AWS_SECRET_ACCESS_KEY" in refused.value.message
    assert fake.calls == 0


async def test_a_wrong_secret_is_a_signature_the_fake_refuses(
    provider: BedrockProvider, fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET + "x")
    with pytest.raises(ProviderRefused) as refused:
        await provider.complete(request())
    assert refused.value.status == 403
    assert "signature we calculated does not match" in refused.value.message
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "another-token-entirely")
    with pytest.raises(ProviderRefused):
        await provider.complete(request())
    assert len(fake.rejections) == 2


@pytest.mark.parametrize("echo", ["auth", "token", SECRET])
async def test_echoed_secrets_and_signatures_are_cut(provider: BedrockProvider, echo: str) -> None:
    with pytest.raises(ProviderRefused) as refused:
        await provider.complete(request(f"[[fault status=403 echo={echo}]]"))
    message = refused.value.message
    assert "security token included in the request is invalid" in message
    for secret in (KEY_ID, SECRET, TOKEN, "Signature=0", "Signature=1"):
        assert secret not in message
    assert "[key]" in message
    assert message.startswith("AccessDeniedException: ")


FAULTS: list[tuple[str, type[ProviderError], bool]] = [
    ("status=400", ProviderRefused, False),
    ("status=404", ProviderRefused, False),
    ("status=429", ProviderRateLimited, False),
    ("status=400 type=ServiceQuotaExceededException", ProviderRateLimited, False),
    ("status=429 type=ModelNotReadyException", ProviderServerError, False),
    ("status=500", ProviderServerError, False),
    ("status=503", ProviderServerError, False),
    ("status=408", ProviderTimedOut, False),
    ("reset", ProviderUnreachable, False),
    ("malformed", ProviderMalformed, False),
    ("drop_after=0", ProviderUnreachable, True),
    ("drop_after=3", ProviderDropped, True),
    ("exception=throttlingException", ProviderRateLimited, True),
    ("exception=validationException", ProviderRefused, True),
    ("exception=serviceUnavailableException", ProviderServerError, True),
    ("exception=modelStreamErrorException exception_after=3", ProviderDropped, True),
    ("bad_crc", ProviderMalformed, True),
]


@pytest.mark.parametrize(("fault", "raised", "stream"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_faults_map_to_the_provider_errors(
    provider: BedrockProvider, fault: str, raised: type[ProviderError], stream: bool
) -> None:
    call = request(f"[[fault {fault}]]")
    with pytest.raises(raised) as error:
        if stream:
            await chunks_of(provider, call)
        else:
            await provider.complete(call)
    if isinstance(error.value, ProviderServerError) and "status=" in fault:
        assert error.value.status == int(fault.split("=")[1].split()[0]) or "ModelNotReady" in fault


async def test_the_provider_timeout_ends_a_stalled_stream(
    fake: FakeBedrock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)
    config = ProviderConfig("b", "bedrock", base_url=fake.url, region="us-east-1", timeout_s=0.3)
    bedrock = BedrockProvider(config)
    with trio.fail_after(5), pytest.raises(ProviderTimedOut):
        await chunks_of(bedrock, request("[[fault stall_after=2]]"))
    await bedrock.aclose()


async def test_an_inference_profile_arn_is_one_path_segment(
    provider: BedrockProvider, fake: FakeBedrock
) -> None:
    arn = "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude"
    await provider.complete(ProviderRequest(arn, request().body))
    assert fake.rejections == []
    assert fake.paths[-1] == (
        "/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile"
        "%2Fus.anthropic.claude/converse"
    )
