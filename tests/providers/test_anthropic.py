"""The anthropic kind against the fake Messages API (gateway/fakes/fake_anthropic.py), a
real server that refuses what the real API refuses: every call here also checks that the
translated request was one Anthropic accepts (``fake.rejected`` stays empty)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest
import trio

from gateway.config.settings import ProviderConfig
from gateway.fakes.fake_anthropic import ERROR_TEXT, FakeAnthropic
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.anthropic_translate import ANSWER_TOOL, DEFAULT_MAX_TOKENS
from gateway.providers.base import (
    EmbeddingRequest,
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

KEY = "anthropic.test.credential~1"
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeAnthropic:
    return await nursery.start(FakeAnthropic(keys={KEY}).serve)


@pytest.fixture
async def provider(fake: FakeAnthropic) -> AsyncIterator[AnthropicProvider]:
    config = ProviderConfig("claude", "anthropic", base_url=fake.url, timeout_s=5.0)
    provider = AnthropicProvider(config, lambda: [KEY])
    yield provider
    await provider.aclose()
    assert fake.rejected == [], "the fake refused a translated request"


def request(*messages: dict[str, Any], key: str = KEY, **body: Any) -> ProviderRequest:
    full = {"model": "claude-x", "messages": list(messages), "max_tokens": 20, **body}
    return ProviderRequest("claude-up", full, api_key=key)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def chunks_of(provider: AnthropicProvider, req: ProviderRequest) -> list[dict[str, Any]]:
    return [chunk async for chunk in provider.stream(req)]


async def test_a_plain_chat_is_a_chat_completion_with_its_usage(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    result = await provider.complete(request(user("hello [[cache read=100 write=50]]")))
    answer = result.completion
    assert answer["object"] == "chat.completion"
    choice = answer["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == "alpha bravo charlie delta echo foxtrot"
    assert choice["finish_reason"] == "stop"
    sent = fake.bodies[-1]
    assert sent["model"] == "claude-up" and sent["max_tokens"] == 20
    assert fake.headers[-1]["x-api-key"] == KEY
    assert fake.headers[-1]["anthropic-version"] == "2023-06-01"
    input_tokens = len(orjson.dumps(sent["messages"]).decode().split())
    assert result.usage is not None
    assert result.usage.prompt_tokens == input_tokens + 150
    assert (result.usage.cached_tokens, result.usage.cache_write_tokens) == (100, 50)
    assert result.usage.completion_tokens == 6
    assert answer["usage"]["prompt_tokens_details"] == {
        "cached_tokens": 100,
        "cache_write_tokens": 50,
    }


async def test_max_tokens_is_always_sent(provider: AnthropicProvider, fake: FakeAnthropic) -> None:
    req = ProviderRequest("claude-up", {"model": "m", "messages": [user("hi")]}, api_key=KEY)
    await provider.complete(req)
    assert fake.bodies[-1]["max_tokens"] == DEFAULT_MAX_TOKENS
    await provider.complete(request(user("hi"), max_completion_tokens=3))
    assert fake.bodies[-1]["max_tokens"] == 3
    result = await provider.complete(request(user("hi"), max_tokens=2))
    assert result.completion["choices"][0]["finish_reason"] == "length"


async def test_system_messages_are_lifted_and_turns_merged(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    await provider.complete(
        request(
            {"role": "system", "content": "be brief"},
            user("first"),
            {"role": "assistant", "content": "ok"},
            {"role": "developer", "content": [{"type": "text", "text": "be kind"}]},
            user("second"),
            {"role": "user", "content": [{"type": "text", "text": "third"}]},
            seed=7,
            stop=["charlie"],
            temperature=1.5,
            top_p=0.5,
        )
    )
    sent = fake.bodies[-1]
    assert sent["system"] == "be brief\n\nbe kind"
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    assert [b["text"] for b in sent["messages"][2]["content"]] == ["second", "third"]
    assert "seed" not in sent
    assert sent["stop_sequences"] == ["charlie"]
    assert (sent["temperature"], sent["top_p"]) == (1.0, 0.5)


async def test_stop_sequence_ends_the_answer(provider: AnthropicProvider) -> None:
    result = await provider.complete(request(user("hi"), stop="charlie"))
    choice = result.completion["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("alpha bravo", "stop")


async def test_seed_and_web_search_are_named_ignored(provider: AnthropicProvider) -> None:
    body = {"messages": [], "seed": 1, "temperature": 0.2, "web_search_options": {}}
    assert provider.ignored_parameters(body) == ["seed", "web_search_options"]
    assert provider.ignored_parameters({"messages": []}) == []


async def test_a_tool_call_round_trip_keeps_the_ids(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    first = await provider.complete(request(user("weather in Paris?"), tools=[WEATHER]))
    choice = first.completion["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "alpha"}
    assert fake.bodies[-1]["tools"][0]["input_schema"] == WEATHER["function"]["parameters"]
    second = await provider.complete(
        request(
            user("weather in Paris?"),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
            tools=[WEATHER],
        )
    )
    assert second.completion["choices"][0]["message"]["content"] == "the tool said sunny"
    sent = fake.bodies[-1]["messages"]
    assert sent[1]["content"][0]["id"] == call["id"]
    assert sent[2]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": call["id"],
        "content": "sunny",
    }


@pytest.mark.parametrize(
    ("choice", "parallel", "sent"),
    [
        ("auto", None, {"type": "auto"}),
        ("none", None, {"type": "none"}),
        ("required", None, {"type": "any"}),
        ({"type": "function", "function": {"name": "get_weather"}}, None,
         {"type": "tool", "name": "get_weather"}),
        (None, False, {"type": "auto", "disable_parallel_tool_use": True}),
    ],
)  # fmt: skip
async def test_tool_choice_is_mapped(
    provider: AnthropicProvider, fake: FakeAnthropic, choice: Any, parallel: Any, sent: Any
) -> None:
    extra = {"tool_choice": choice} if choice else {}
    if parallel is not None:
        extra["parallel_tool_calls"] = parallel
    await provider.complete(request(user("hi"), tools=[WEATHER], **extra))
    assert fake.bodies[-1]["tool_choice"] == sent


SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "city",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "people": {"type": "integer"}},
            "required": ["name", "people"],
        },
    },
}


@pytest.mark.parametrize("stream", [False, True])
async def test_a_json_schema_answer_comes_from_a_forced_tool(
    provider: AnthropicProvider, fake: FakeAnthropic, stream: bool
) -> None:
    req = request(user("a city"), response_format=SCHEMA)
    if stream:
        chunks = await chunks_of(provider, req)
        content = "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"])
    else:
        message = (await provider.complete(req)).completion["choices"][0]
        content, finish = message["message"]["content"], message["finish_reason"]
        assert "tool_calls" not in message["message"]
    assert orjson.loads(content) == {"name": "alpha", "people": 7}
    assert finish == "stop"
    sent = fake.bodies[-1]
    assert sent["tool_choice"] == {"type": "tool", "name": ANSWER_TOOL}
    assert sent["tools"][-1]["input_schema"] == SCHEMA["json_schema"]["schema"]
    assert "response_format" not in sent


async def test_images_are_sent_as_base64_and_url_sources(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
    ]
    await provider.complete(request({"role": "user", "content": content}))
    blocks = fake.bodies[-1]["messages"][0]["content"]
    assert blocks[1]["source"] == {
        "type": "base64",
        "media_type": "image/png",
        "data": PNG.split(",", 1)[1],
    }
    assert blocks[2]["source"] == {"type": "url", "url": "https://example.com/cat.jpg"}


async def test_what_anthropic_cannot_take_is_refused_before_sending(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    bmp = [{"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}]
    for req in (
        request({"role": "user", "content": bmp}),
        request({"role": "assistant", "content": "hi"}, user("hello")),
    ):
        with pytest.raises(ProviderRefused) as refused:
            await provider.complete(req)
        assert refused.value.status == 400
    assert fake.calls == 0


async def test_a_stream_is_chunked_as_openai_streams(provider: AnthropicProvider) -> None:
    chunks = await chunks_of(provider, request(user("hi [[cache read=4]]"), stream=True))
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-1])
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == []
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 6
    assert usage["prompt_tokens_details"] == {"cached_tokens": 4}


async def test_a_streamed_tool_call_gives_its_id_and_name_then_arguments(
    provider: AnthropicProvider,
) -> None:
    chunks = await chunks_of(provider, request(user("weather?"), tools=[WEATHER], stream=True))
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if c["choices"] and c["choices"][0]["delta"].get("tool_calls")
    ]
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("toolu_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert all("id" not in call and call["index"] == 0 for call in calls[1:])
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert orjson.loads(arguments) == {"city": "alpha"}
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, ProviderRefused),
        (401, ProviderRefused),
        (403, ProviderRefused),
        (404, ProviderRefused),
        (413, ProviderRefused),
        (429, ProviderRateLimited),
        (500, ProviderServerError),
        (529, ProviderServerError),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_statuses_map_to_the_provider_errors(
    provider: AnthropicProvider, status: int, error: type[ProviderError], stream: bool
) -> None:
    req = request(user(f"[[fault status={status}]]"), stream=stream)
    with pytest.raises(error) as raised:
        await (chunks_of(provider, req) if stream else provider.complete(req))
    assert raised.value.message == ERROR_TEXT
    if isinstance(raised.value, ProviderRefused | ProviderServerError):
        assert raised.value.status == status


async def test_an_echoed_key_is_cut_out(provider: AnthropicProvider) -> None:
    with pytest.raises(ProviderRefused) as refused:
        await provider.complete(request(user("[[fault status=401 echo=auth]]")))
    assert KEY not in refused.value.message and "[key]" in refused.value.message


async def test_a_wrong_key_is_the_apis_401(
    provider: AnthropicProvider, fake: FakeAnthropic
) -> None:
    with pytest.raises(ProviderRefused) as refused:
        await provider.complete(request(user("hi"), key="not.the.key~0"))
    assert refused.value.status == 401
    assert fake.rejected == [(401, "invalid x-api-key")]
    fake.rejected.clear()


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("reset", ProviderUnreachable),
        ("drop_after=0", ProviderDropped),
        ("drop_after=2", ProviderDropped),
        ("error_after=1", ProviderDropped),
        ("error_first", ProviderServerError),
    ],
)
async def test_stream_failures(
    provider: AnthropicProvider, fault: str, error: type[ProviderError]
) -> None:
    with pytest.raises(error) as raised:
        await chunks_of(provider, request(user(f"[[fault {fault}]]"), stream=True))
    if fault == "error_first":
        assert isinstance(raised.value, ProviderServerError) and raised.value.status == 529


async def test_an_unreadable_answer_is_malformed(provider: AnthropicProvider) -> None:
    with pytest.raises(ProviderMalformed):
        await provider.complete(request(user("[[fault malformed]]")))


async def test_a_slow_answer_times_out(fake: FakeAnthropic) -> None:
    config = ProviderConfig("claude", "anthropic", base_url=fake.url, timeout_s=0.2)
    provider = AnthropicProvider(config)
    with pytest.raises(ProviderTimedOut):
        await provider.complete(request(user("[[fault delay=2]]")))
    await provider.aclose()


async def test_embeddings_are_refused(provider: AnthropicProvider) -> None:
    with pytest.raises(ProviderRefused) as refused:
        await provider.embed(EmbeddingRequest("claude-up", ["hi"], None, KEY))
    assert "no embeddings" in refused.value.message


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"seed": 1}, "seed: Extra inputs"),
        ({"max_tokens": None}, "max_tokens: Field required"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "alternate"),
        (
            {
                "messages": [
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}
                    ]}
                ]
            },
            "unexpected tool_use_id",
        ),
    ],
)  # fmt: skip
async def test_the_fake_refuses_what_the_api_refuses(
    fake: FakeAnthropic, change: dict[str, Any], reason: str
) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    body = {k: v for k, v in {**body, **change}.items() if v is not None}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient() as client:
        response = await client.post(f"{fake.url}/v1/messages", json=body, headers=headers)
        assert response.status_code == 400
        assert response.json()["error"]["type"] == "invalid_request_error"
        assert reason in response.json()["error"]["message"]
        del headers["anthropic-version"]
        response = await client.post(f"{fake.url}/v1/messages", json=body, headers=headers)
        assert response.status_code == 400
    fake.rejected.clear()
