"""The gemini kind (gateway/providers/gemini/) against the fake Gemini API, a real server
that refuses every request the real API would refuse (gateway/fakes/fake_gemini.py);
and its translations, table by table."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config.settings import ProviderConfig, load_config
from gateway.fakes.fake_gemini import PIXEL, SIGNATURE, WEATHER, FakeGemini
from gateway.providers.base import (
    EmbeddingRequest,
    ProviderDropped,
    ProviderMalformed,
    ProviderRateLimited,
    ProviderRefused,
    ProviderRequest,
    ProviderServerError,
    ProviderTimedOut,
    ProviderUnreachable,
)
from gateway.providers.gemini import GeminiProvider
from gateway.providers.gemini.gemini_answer import completion
from gateway.providers.gemini.gemini_request import generate_request, tool_call_id
from gateway.providers.gemini.gemini_schema import SchemaRefused, gemini_schema
from gateway.providers.mock import MockProvider
from gateway.providers.registry import build_providers

KEY = "gemini.test.key~0123456789"


@pytest.fixture
async def fake(nursery: trio.Nursery) -> FakeGemini:
    return await nursery.start(FakeGemini(KEY).serve)


@pytest.fixture
async def provider(fake: FakeGemini) -> AsyncIterator[GeminiProvider]:
    gemini = GeminiProvider(ProviderConfig("gem", "gemini", base_url=fake.url, timeout_s=5.0))
    yield gemini
    await gemini.aclose()


def request(text: str, **body: Any) -> ProviderRequest:
    messages = body.pop("messages", [{"role": "user", "content": text}])
    return ProviderRequest(
        upstream_model="gemini-test",
        body={"model": "gemini-test", "messages": messages, "max_tokens": 20, **body},
        api_key=KEY,
        request_id="req_0123",
    )


async def collect(provider: GeminiProvider, call: ProviderRequest) -> list[dict[str, Any]]:
    return [chunk async for chunk in provider.stream(call)]


# -- translation ---------------------------------------------------------------------------


def test_the_request_carries_system_turns_tools_and_config() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, img(PIXEL)]},
            {"role": "user", "content": "and this"},
        ],
        "max_tokens": 30,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": "END",
        "seed": 7,
        "tools": [WEATHER],
        "tool_choice": "auto",
    }
    gemini = generate_request(body)
    assert gemini["systemInstruction"] == {"parts": [{"text": "be brief"}]}
    assert [c["role"] for c in gemini["contents"]] == ["user"]  # two user turns merged
    parts = gemini["contents"][0]["parts"]
    assert parts[0] == {"text": "look"} and parts[2] == {"text": "and this"}
    assert parts[1]["inlineData"]["mimeType"] == "image/png"
    assert gemini["generationConfig"] == {
        "maxOutputTokens": 30,
        "temperature": 0.5,
        "topP": 0.9,
        "seed": 7,
        "stopSequences": ["END"],
    }
    declaration = gemini["tools"][0]["functionDeclarations"][0]
    assert declaration["parameters"] == {
        "type": "OBJECT",
        "properties": {
            "city": {"type": "STRING"},
            "unit": {"type": "STRING", "nullable": True, "enum": ["c", "f"]},
        },
        "required": ["city"],
    }
    assert gemini["toolConfig"] == {"functionCallingConfig": {"mode": "AUTO"}}


def test_an_image_by_url_is_file_data() -> None:
    content = [img("https://example.com/cat.jpeg?size=2")]
    gemini = generate_request({"messages": [{"role": "user", "content": content}]})
    assert gemini["contents"][0]["parts"] == [
        {"fileData": {"fileUri": "https://example.com/cat.jpeg?size=2", "mimeType": "image/jpeg"}}
    ]


def img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("none", {"mode": "NONE"}),
        ("required", {"mode": "ANY"}),
        (
            {"type": "function", "function": {"name": "get_weather"}},
            {"mode": "ANY", "allowedFunctionNames": ["get_weather"]},
        ),
    ],
)
def test_tool_choice(choice: Any, config: dict[str, Any]) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    gemini = generate_request({**body, "tool_choice": choice})
    assert gemini["toolConfig"] == {"functionCallingConfig": config}


def test_tool_results_find_their_function_by_the_call_id() -> None:
    calls = [
        {
            "id": "call_a__thought__c2ln",
            "type": "function",
            "function": {"name": "f", "arguments": '{"x":1}'},
        },
        {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]
    gemini = generate_request(
        {
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "call_b", "content": "plain"},
                {"role": "tool", "tool_call_id": "call_a__thought__c2ln", "content": '{"temp": 3}'},
            ]
        }
    )
    model, user = gemini["contents"][1:]
    assert model["parts"] == [
        {"functionCall": {"name": "f", "args": {"x": 1}}, "thoughtSignature": "c2ln"},
        {"functionCall": {"name": "g", "args": {}}},
    ]
    assert user["parts"] == [
        {"functionResponse": {"name": "g", "response": {"content": "plain"}}},
        {"functionResponse": {"name": "f", "response": {"temp": 3}}},
    ]


def test_schemas_are_cut_to_geminis_subset() -> None:
    schema = {
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        "type": "object",
        "properties": {
            "p": {"$ref": "#/$defs/Point"},
            "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
            "either": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            "kind": {"const": "k"},
            "level": {"enum": [1, 2]},
        },
        "required": ["p", "missing"],
        "additionalProperties": False,
    }
    assert gemini_schema(schema, ordered=True) == {
        "type": "OBJECT",
        "properties": {
            "p": {
                "type": "OBJECT",
                "properties": {"x": {"type": "INTEGER"}},
                "propertyOrdering": ["x"],
            },
            "tags": {"type": "ARRAY", "items": {"type": "STRING"}},
            "either": {"anyOf": [{"type": "STRING"}, {"type": "NUMBER"}]},
            "kind": {"type": "STRING", "enum": ["k"]},
            "level": {},
        },
        "required": ["p"],
        "propertyOrdering": ["p", "tags", "either", "kind", "level"],
    }
    recursive = {"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}}}
    with pytest.raises(SchemaRefused):
        gemini_schema({**recursive, "$ref": "#/$defs/N"})


def test_the_answer_becomes_a_chat_completion() -> None:
    answer = {
        "candidates": [
            {
                "content": {
                    "role": "model",
                    "parts": [
                        {"text": "thinking...", "thought": True},
                        {"text": "Let me check. "},
                        {"functionCall": {"name": "get_weather", "args": {"city": "Oslo"}}},
                    ],
                },
                "finishReason": "STOP",
            }
        ],
        "usageMetadata": {
            "promptTokenCount": 100,
            "cachedContentTokenCount": 60,
            "candidatesTokenCount": 10,
            "thoughtsTokenCount": 5,
            "totalTokenCount": 115,
        },
    }
    result, usage = completion(answer, "req_1", "gemini-test")
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me check. "
    call = choice["message"]["tool_calls"][0]
    assert call["id"] == tool_call_id("req_1", 0)
    assert call["function"] == {"name": "get_weather", "arguments": '{"city":"Oslo"}'}
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens) == (100, 15, 60)
    assert result["usage"]["prompt_tokens_details"] == {"cached_tokens": 60}


@pytest.mark.parametrize(
    ("reason", "finish"),
    [("MAX_TOKENS", "length"), ("SAFETY", "content_filter"), ("RECITATION", "content_filter")],
)
def test_finish_reasons(reason: str, finish: str) -> None:
    answer = {"candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": reason}]}
    assert completion(answer, "r", "m")[0]["choices"][0]["finish_reason"] == finish


def test_a_blocked_prompt_is_content_filter() -> None:
    answer = {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}
    result, usage = completion(answer, "r", "m")
    assert result["choices"][0]["finish_reason"] == "content_filter"
    assert usage is not None and usage.prompt_tokens == 3


# -- against the fake ------------------------------------------------------------------------


async def test_complete(provider: GeminiProvider, fake: FakeGemini) -> None:
    result = await provider.complete(request("hello [[fault cached=2 thoughts=3]]"))
    assert fake.refusals == []
    assert fake.paths == ["/v1beta/models/gemini-test:generateContent"]
    assert fake.keys == [KEY]
    message = result.completion["choices"][0]["message"]
    assert message["content"] == "alpha bravo charlie delta echo foxtrot"
    assert result.usage is not None
    assert result.usage.cached_tokens == 2
    assert result.usage.completion_tokens == 6 + 3


async def test_stream_is_shaped_like_openais(provider: GeminiProvider, fake: FakeGemini) -> None:
    chunks = await collect(provider, request("hello"))
    assert fake.paths == ["/v1beta/models/gemini-test:streamGenerateContent?alt=sse"]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "alpha bravo charlie delta echo foxtrot"
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)


async def test_streamed_tool_call(provider: GeminiProvider, fake: FakeGemini) -> None:
    chunks = await collect(provider, request("weather?", tools=[WEATHER]))
    assert fake.refusals == []
    calls = [
        c["choices"][0]["delta"]["tool_calls"]
        for c in chunks
        if c["choices"] and "tool_calls" in c["choices"][0]["delta"]
    ]
    assert calls == [
        [
            {
                "index": 0,
                "id": tool_call_id("req_0123", 0, SIGNATURE),
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"alpha","unit":"c"}'},
            }
        ]
    ]
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"


async def test_embeddings(provider: GeminiProvider, fake: FakeGemini) -> None:
    result = await provider.embed(
        EmbeddingRequest("text-embedding-004", ["one two", "three"], 8, KEY)
    )
    assert fake.refusals == []
    assert fake.paths == ["/v1beta/models/text-embedding-004:batchEmbedContents"]
    assert [len(v) for v in result.vectors] == [8, 8]
    assert result.usage.prompt_tokens > 0
    with pytest.raises(ProviderRefused, match="text only"):
        await provider.embed(EmbeddingRequest("text-embedding-004", [[1, 2, 3]], None, KEY))


async def test_a_wrong_key_is_refused_by_the_fake(provider: GeminiProvider) -> None:
    with pytest.raises(ProviderRefused) as caught:
        await provider.complete(replace_key(request("hi"), "wrong.key.0123456789"))
    assert caught.value.status == 400


def replace_key(call: ProviderRequest, key: str) -> ProviderRequest:
    return ProviderRequest(call.upstream_model, call.body, key, request_id=call.request_id)


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("status=400", ProviderRefused),
        ("status=403", ProviderRefused),
        ("status=429", ProviderRateLimited),
        ("status=500", ProviderServerError),
        ("status=503", ProviderServerError),
        ("reset", ProviderUnreachable),
        ("malformed", ProviderMalformed),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_faults(provider: GeminiProvider, fault: str, error: type, stream: bool) -> None:
    with pytest.raises(error):
        if stream and fault != "malformed":
            await collect(provider, request(f"[[fault {fault}]]"))
        else:
            await provider.complete(request(f"[[fault {fault}]]"))


@pytest.mark.parametrize("fault", ["drop_after=2", "error_after=2"])
async def test_a_stream_cut_after_output_is_dropped(provider: GeminiProvider, fault: str) -> None:
    seen: list[dict[str, Any]] = []
    with pytest.raises(ProviderDropped) as caught:
        async for chunk in provider.stream(request(f"[[fault {fault}]]")):
            seen.append(chunk)
    assert seen, "output had started"
    assert "internal.example" not in caught.value.message or fault == "error_after=2"


async def test_a_timeout(fake: FakeGemini) -> None:
    slow = GeminiProvider(ProviderConfig("gem", "gemini", base_url=fake.url, timeout_s=0.3))
    with pytest.raises(ProviderTimedOut):
        await slow.complete(request("[[fault delay=2]]"))
    await slow.aclose()


async def test_the_key_echoed_in_an_error_is_cut_out(provider: GeminiProvider) -> None:
    with pytest.raises(ProviderRefused) as caught:
        await provider.complete(request("[[fault status=400 echo=key]]"))
    assert KEY not in caught.value.message and "[key]" in caught.value.message


async def test_what_gemini_cannot_take_is_refused_before_the_call(
    provider: GeminiProvider, fake: FakeGemini
) -> None:
    orphan = [
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "c", "content": "1"},
    ]
    with pytest.raises(ProviderRefused, match="answers no tool call"):
        await provider.complete(request("", messages=orphan))
    assert fake.calls == 0


async def test_ignored_parameters(provider: GeminiProvider) -> None:
    body = {"parallel_tool_calls": False, "seed": 1, "temperature": 0.2}
    assert provider.ignored_parameters(body) == ["parallel_tool_calls"]


# -- the documented example ------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "providers" / "gemini.md"


def test_the_documented_config_loads(tmp_path: Path) -> None:
    """docs/providers/gemini.md's example, read by the real loader: it cannot drift."""
    blocks = re.findall(r"```toml\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1
    path = tmp_path / "gateway.toml"
    path.write_text(blocks[0], encoding="utf-8")
    config = load_config(path, environ={})
    google = config.provider("google")
    assert google.kind == "gemini"
    assert google.base_url == "https://generativelanguage.googleapis.com"
    assert google.api_key_env == "GEMINI_API_KEY"
    chat, embed = config.models
    assert (chat.provider, chat.cache_read_usd_per_mtok) == ("google", 0.03)
    assert (embed.kind, embed.dimensions) == ("embedding", 768)
    assert isinstance(build_providers(config, MockProvider())["google"], GeminiProvider)
