"""The mock provider: deterministic, OpenAI-shaped answers, checked with the openai types.

Every answer is validated against the ``openai`` package's pydantic models; JSON that a
schema asks for is validated by the pydantic model the schema was made from.
"""

from __future__ import annotations

import datetime
import enum
import json
import math
import re
import uuid
from typing import Any, Literal

import orjson
import pydantic
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from openai._models import construct_type
from openai._types import omit
from openai.lib._parsing._embeddings import parse_embedding_response
from openai.types import CreateEmbeddingResponse
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from gateway.calls.estimate import estimate_prompt_tokens
from gateway.config.settings import default_config
from gateway.providers.base import (
    EmbeddingRequest,
    ProviderDropped,
    ProviderError,
    ProviderRateLimited,
    ProviderRefused,
    ProviderRequest,
    ProviderServerError,
    ProviderUnreachable,
    Usage,
    embedding_response,
)
from gateway.providers.mock import _TOKEN, MockProvider, count_tokens, prompt_tokens

HELLO = {"messages": [{"role": "user", "content": "Say hello."}]}


REQUEST_ID = "req_" + "5eed" * 6


async def complete(
    body: dict[str, Any], model: str = "gpt-4o-mini", request_id: str = ""
) -> ChatCompletion:
    result = await MockProvider().complete(ProviderRequest(model, body, request_id=request_id))
    completion = ChatCompletion.model_validate(result.completion)
    assert result.usage is not None
    assert completion.usage is not None
    assert completion.usage.model_dump(exclude_none=True) == result.usage.as_dict()
    return completion


async def chunks(
    body: dict[str, Any], provider: MockProvider | None = None, request_id: str = ""
) -> list[Any]:
    request = ProviderRequest("gpt-4o-mini", body, request_id=request_id)
    stream = (provider or MockProvider()).stream(request)
    return [ChatCompletionChunk.model_validate(chunk) async for chunk in stream]


def streamed_text(parts: list[ChatCompletionChunk]) -> str:
    return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)


def streamed_arguments(parts: list[ChatCompletionChunk]) -> str:
    deltas = [c.choices[0].delta for c in parts if c.choices]
    calls = [call for delta in deltas for call in delta.tool_calls or []]
    return "".join(call.function.arguments or "" for call in calls if call.function)


# ---------------------------------------------------------------- text answers


async def test_completion_is_an_openai_chat_completion() -> None:
    completion = await complete(HELLO)
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{24}", completion.id)
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o-mini"
    (choice,) = completion.choices
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert choice.message.content and choice.message.content.startswith("This is a")
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == prompt_tokens(HELLO) > 0
    assert completion.usage.completion_tokens == count_tokens(choice.message.content)
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + (
        completion.usage.completion_tokens
    )


async def test_same_body_same_answer_and_different_body_different_answer() -> None:
    first, again = await complete(HELLO), await complete(json.loads(json.dumps(HELLO)))
    assert first.model_dump(exclude={"id"}) == again.model_dump(exclude={"id"})
    assert first.id != again.id  # two calls: ids are per call, content is not
    other = await complete({"messages": [{"role": "user", "content": "Say goodbye."}]})
    assert other.choices != first.choices
    seeded = await complete({**HELLO, "seed": 7})
    assert seeded.choices != first.choices
    assert (await complete(HELLO, model="gpt-4o")).choices != first.choices


async def test_ids_and_created_come_from_the_request_id_and_the_clock() -> None:
    mock = MockProvider(clock=lambda: 1_800_000_000.75)
    request = ProviderRequest("gpt-4o-mini", TOOLS, request_id=REQUEST_ID)
    completion = ChatCompletion.model_validate((await mock.complete(request)).completion)
    hex_id = REQUEST_ID.removeprefix("req_")
    assert (completion.id, completion.created) == (f"chatcmpl-{hex_id}", 1_800_000_000)
    (call,) = completion.choices[0].message.tool_calls or []
    assert call.id == f"call_{hex_id}"
    parts = await chunks(TOOLS, mock, request_id=REQUEST_ID)
    assert {(c.id, c.created) for c in parts} == {(completion.id, completion.created)}


async def test_stream_carries_the_same_answer_in_several_chunks() -> None:
    completion = await complete(HELLO, request_id=REQUEST_ID)
    parts = await chunks(HELLO, request_id=REQUEST_ID)
    assert all(c.object == "chat.completion.chunk" and c.id == completion.id for c in parts)
    assert parts[0].choices[0].delta.role == "assistant"
    content_chunks = [c for c in parts if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 5
    assert streamed_text(parts) == completion.choices[0].message.content
    finishing = [c.choices[0].finish_reason for c in parts if c.choices]
    assert finishing[:-1] == [None] * (len(finishing) - 1)
    assert finishing[-1] == "stop"
    assert parts[-1].choices == []
    assert parts[-1].usage == completion.usage
    assert all(c.usage is None for c in parts[:-1])


@pytest.mark.parametrize("limit", [1, 2, 5])
async def test_max_tokens_cuts_the_answer(limit: int) -> None:
    full = (await complete(HELLO)).choices[0].message.content or ""
    for key in ("max_tokens", "max_completion_tokens"):
        cut = await complete({**HELLO, key: limit})
        content = cut.choices[0].message.content or ""
        assert cut.usage is not None
        assert cut.usage.completion_tokens == count_tokens(content) == limit
        assert cut.choices[0].finish_reason == "length"
        assert full.startswith(content) and content != full
        parts = await chunks({**HELLO, key: limit})
        assert streamed_text(parts) == content
        assert parts[-2].choices[0].finish_reason == "length"


async def test_a_generous_max_tokens_changes_nothing() -> None:
    full = await complete(HELLO)
    roomy = await complete({**HELLO, "max_tokens": 10_000})
    assert roomy.choices[0].message.content == full.choices[0].message.content
    assert roomy.choices[0].finish_reason == "stop"


async def test_stop_sequence_ends_the_content() -> None:
    full = (await complete(HELLO)).choices[0].message.content or ""
    word = full.split()[-2]
    stopped = await complete({**HELLO, "stop": ["\u2603", word]})
    content = stopped.choices[0].message.content
    assert content == full[: full.index(word)]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("images", "phrase"), [(1, "I see 1 image."), (3, "I see 3 images.")])
async def test_images_are_accepted_and_mentioned(images: int, phrase: str) -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What?"}]}]}
    body["messages"][0]["content"] += [image] * images
    completion = await complete(body)
    assert phrase in (completion.choices[0].message.content or "")
    assert "image" not in ((await complete(HELLO)).choices[0].message.content or "")


# ---------------------------------------------------------------- tools


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class WeatherQuery(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(min_length=3, max_length=40)
    unit: Unit
    days: int = pydantic.Field(ge=1, le=14)
    hourly: bool


def tool(name: str, model: type[pydantic.BaseModel]) -> dict[str, Any]:
    return tool_of(name, model.model_json_schema())


def tool_of(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


TOOLS = {
    **HELLO,
    "tools": [tool("get_weather", WeatherQuery), tool("other", WeatherQuery)],
}


async def test_tools_get_a_call_to_the_first_function_with_valid_arguments() -> None:
    completion = await complete(TOOLS)
    (choice,) = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)
    WeatherQuery.model_validate_json(call.function.arguments)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == count_tokens(call.function.arguments)
    assert completion.usage.prompt_tokens == prompt_tokens(TOOLS)


async def test_streamed_tool_call_is_the_same_call_in_deltas() -> None:
    call = ((await complete(TOOLS, request_id=REQUEST_ID)).choices[0].message.tool_calls or [])[0]
    parts = await chunks(TOOLS, request_id=REQUEST_ID)
    (opening,) = parts[0].choices[0].delta.tool_calls or []
    assert (opening.id, opening.function and opening.function.name) == (call.id, "get_weather")
    assert len([c for c in parts if c.choices and c.choices[0].delta.tool_calls]) >= 5
    assert streamed_arguments(parts) == call.function.arguments
    assert parts[-2].choices[0].finish_reason == "tool_calls"
    assert parts[-1].usage is not None


@pytest.mark.parametrize(
    "body",
    [
        {**TOOLS, "tool_choice": "none"},
        {**TOOLS, "tools": []},
        {**TOOLS, "messages": [*TOOLS["messages"], {"role": "tool", "content": "21 C"}]},
    ],
    ids=["tool_choice none", "no tools", "after a tool result"],
)
async def test_no_tool_call(body: dict[str, Any]) -> None:
    completion = await complete(body)
    assert completion.choices[0].message.tool_calls is None
    assert completion.choices[0].finish_reason == "stop"


# ---------------------------------------------------------------- structured output


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Address(pydantic.BaseModel):
    street: str
    zip_code: str = pydantic.Field(min_length=5, max_length=5)


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str
    age: int = pydantic.Field(gt=0, lt=150)
    score: float = pydantic.Field(ge=0.0, le=1.0)
    ratio: float = pydantic.Field(gt=0.0, lt=0.001)
    step: int = pydantic.Field(multiple_of=7, ge=10, le=30)
    kind: Literal["admin"]
    color: Color
    tags: list[str] = pydantic.Field(min_length=3)
    pair: tuple[int, bool]
    address: Address
    past: list[Address] = pydantic.Field(min_length=2, max_length=2)
    nickname: str | None
    born: datetime.date
    seen: datetime.datetime
    ident: uuid.UUID
    extra: dict[str, int]
    nothing: None


class Tree(pydantic.BaseModel):
    label: str
    children: list[Tree]
    parent: Tree | None


SCHEMA_MODELS = [WeatherQuery, Address, Person, Tree]


@pytest.mark.parametrize("model", SCHEMA_MODELS, ids=lambda m: m.__name__)
async def test_json_schema_answer_validates(model: type[pydantic.BaseModel]) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": model.__name__, "schema": model.model_json_schema()},
    }
    for seed in range(5):  # several digests, so that several draws are checked
        body = {**HELLO, "seed": seed, "response_format": response_format}
        completion = await complete(body)
        content = completion.choices[0].message.content or ""
        model.model_validate_json(content)
        assert streamed_text(await chunks(body)) == content


@pytest.mark.parametrize(
    ("schema", "check"),
    [
        ({"const": 42}, lambda v: v == 42),
        ({"enum": ["a", "b"]}, lambda v: v in ("a", "b")),
        ({"type": ["null", "integer"]}, lambda v: isinstance(v, int)),
        ({"type": "null"}, lambda v: v is None),
        ({"type": "array", "items": {"type": "boolean"}, "minItems": 4}, lambda v: len(v) >= 4),
        ({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 7}, lambda v: v == 6),
        ({"items": {"type": "number"}}, lambda v: all(isinstance(x, float) for x in v)),
        ({"required": ["x"]}, lambda v: isinstance(v, dict) and "x" in v),
        ({"type": "string", "minLength": 50}, lambda v: len(v) >= 50),
    ],
)
async def test_json_schema_keywords(schema: dict[str, Any], check: Any) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    completion = await complete({**HELLO, "response_format": format_})
    assert check(json.loads(completion.choices[0].message.content or ""))


# Schemas a caller may send that once made the mock fail: recursion with no end (a
# RecursionError, or a loop that never returned) and bounds beyond what JSON numbers carry
# (orjson writes integers of at most 64 bits). Each still gets a value, as JSON text.
RECURSIVE_SCHEMAS = {
    "$ref to the root": {"$ref": "#"},
    "allOf of the root": {"allOf": [{"$ref": "#"}]},
    "anyOf of the root": {"anyOf": [{"$ref": "#"}]},
    "oneOf of the root": {"oneOf": [{"$ref": "#"}]},
    "required self-recursive $defs": {
        "$defs": {
            "n": {"type": "object", "properties": {"c": {"$ref": "#/$defs/n"}}, "required": ["c"]}
        },
        "$ref": "#/$defs/n",
    },
    "$ref loop": {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    },
    "allOf of a $ref to itself": {
        "allOf": [{"$ref": "#/$defs/a"}],
        "$defs": {"a": {"$ref": "#/$defs/a"}},
    },
    "two required recursive members": {
        "$defs": {
            "n": {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/n"}, "b": {"$ref": "#/$defs/n"}},
                "required": ["a", "b"],
            }
        },
        "$ref": "#/$defs/n",
    },
    "array of itself": {"type": "array", "minItems": 2, "items": {"$ref": "#"}},
    "anyOf with a non-schema branch": {"anyOf": [{"$ref": "#"}, 1], "required": ["x"]},
}
HUGE_NUMBER_SCHEMAS = {
    "integer minimum 1e300": {"type": "integer", "minimum": 1e300},
    "integer exclusiveMinimum 10**30": {"type": "integer", "exclusiveMinimum": 10**30},
    "integer maximum -10**30": {"type": "integer", "maximum": -(10**30)},
    "integer between the float extremes": {
        "type": "integer",
        "minimum": -1.7e308,
        "maximum": 1.7e308,
        "multipleOf": 1e200,
    },
    "number between the float extremes": {
        "type": "number",
        "minimum": -1.7e308,
        "maximum": 1.7e308,
    },
    "number on a tiny multipleOf": {"type": "number", "minimum": 1e300, "multipleOf": 1e-300},
    "number on the smallest multipleOf": {"type": "number", "multipleOf": 5e-324},
    "number beyond 64 bits on multipleOf 1": {"type": "number", "minimum": 1e25, "multipleOf": 1},
}
ODD_SCHEMAS = {**RECURSIVE_SCHEMAS, **HUGE_NUMBER_SCHEMAS}


def as_received(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` as the server reads it (orjson: an integer beyond 64 bits is a float)."""
    return orjson.loads(json.dumps(body))


@pytest.mark.parametrize("schema", ODD_SCHEMAS.values(), ids=ODD_SCHEMAS)
async def test_every_schema_gets_a_json_answer(schema: dict[str, Any]) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = as_received({**HELLO, "max_tokens": 200, "response_format": format_})
    completion = await complete(body)
    content = completion.choices[0].message.content or ""
    if completion.choices[0].finish_reason == "stop":
        json.loads(content)
    assert streamed_text(await chunks(body)) == content
    parameters = as_received({**HELLO, "tools": [tool_of("f", schema)]})
    (call,) = (await complete(parameters)).choices[0].message.tool_calls or []
    json.loads(call.function.arguments)


@pytest.mark.parametrize("schema", HUGE_NUMBER_SCHEMAS.values(), ids=HUGE_NUMBER_SCHEMAS)
async def test_numbers_stay_within_what_json_carries(schema: dict[str, Any]) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    completion = await complete(as_received({**HELLO, "response_format": format_}))
    value = json.loads(completion.choices[0].message.content or "")
    if schema["type"] == "integer":
        assert isinstance(value, int) and -(2**63) <= value < 2**63
    else:
        assert isinstance(value, int | float) and math.isfinite(value)


@pytest.mark.parametrize(
    ("schema", "check"),
    [
        ({"type": "integer", "minimum": 2**62, "maximum": 2**62 + 10}, lambda v: v >= 2**62),
        ({"type": "integer", "minimum": 1e300}, lambda v: v == 2**63 - 1),
        ({"type": "integer", "maximum": -1e300}, lambda v: v == -(2**63)),
        ({"type": "number", "minimum": 1e300}, lambda v: 1e300 <= v < math.inf),
        ({"type": "number", "maximum": -1e300}, lambda v: -math.inf < v <= -1e300),
    ],
)
async def test_large_bounds_are_met_where_64_bits_allow(schema: dict[str, Any], check: Any) -> None:
    format_ = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    completion = await complete({**HELLO, "response_format": format_})
    assert check(json.loads(completion.choices[0].message.content or ""))


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_schema", "json_schema": "x"},
        {"type": "json_schema", "json_schema": [1]},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "x", "schema": 1}},
    ],
    ids=["json_schema a string", "json_schema an array", "no json_schema", "schema a number"],
)
async def test_an_odd_response_format_gets_an_object(response_format: dict[str, Any]) -> None:
    """The parser refuses these shapes; the mock answers them anyway, never crashes."""
    completion = await complete({**HELLO, "response_format": response_format})
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


async def test_json_object_answer_is_an_object() -> None:
    completion = await complete({**HELLO, "response_format": {"type": "json_object"}})
    assert isinstance(json.loads(completion.choices[0].message.content or ""), dict)


# ---------------------------------------------------------------- embeddings, parameters


async def test_embeddings_are_deterministic_unit_vectors() -> None:
    provider = MockProvider.for_models(default_config().models)
    inputs: list[Any] = ["hello", "world", [101, 7592, 102]]
    result = await provider.embed(EmbeddingRequest("text-embedding-3-small", inputs, None, None))
    assert [len(v) for v in result.vectors] == [1536, 1536, 1536]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-5) for v in result.vectors)
    assert len({tuple(v) for v in result.vectors}) == 3
    assert result.usage == Usage(prompt_tokens=1 + 1 + 3, total_tokens=5)
    again = await MockProvider().embed(
        EmbeddingRequest("text-embedding-3-small", ["hello"], 256, None)
    )
    assert len(again.vectors[0]) == 256
    prefix = result.vectors[0][:256]
    norm = math.sqrt(math.fsum(x * x for x in prefix))
    pairs = zip(again.vectors[0], prefix, strict=True)
    assert all(math.isclose(a, b / norm, abs_tol=1e-6) for a, b in pairs)


@pytest.mark.parametrize("encoding_format", ["float", "base64"])
async def test_embedding_response_is_what_the_openai_client_reads(encoding_format: Any) -> None:
    result = await MockProvider().embed(
        EmbeddingRequest("text-embedding-3-small", ["a", "b"], 64, None)
    )
    body = embedding_response(result, "text-embedding-3-small", encoding_format)
    # as the client does: build the response unvalidated (a base64 vector is a string where
    # the type says list), then decode base64 itself when its caller named no format
    built = construct_type(type_=CreateEmbeddingResponse, value=body)
    decoded = parse_embedding_response(built, encoding_format=omit)
    parsed = CreateEmbeddingResponse.model_validate(decoded.model_dump())
    assert parsed.usage.prompt_tokens == parsed.usage.total_tokens == 2
    assert [d.index for d in parsed.data] == [0, 1]
    assert [d.embedding for d in parsed.data] == result.vectors
    if encoding_format == "base64":
        assert all(isinstance(item["embedding"], str) for item in body["data"])


def test_ignored_parameters_are_those_the_mock_does_not_read() -> None:
    body = {
        **HELLO,
        "model": "m",
        "temperature": 0.2,
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "web_search_options": {},
        "reasoning_effort": "low",
    }
    assert MockProvider().ignored_parameters(body) == ["web_search_options", "reasoning_effort"]
    assert MockProvider().ignored_parameters(TOOLS) == []


async def test_chunk_delay_paces_the_stream(autojump_clock: trio.abc.Clock) -> None:
    start = trio.current_time()
    parts = await chunks(HELLO, MockProvider(chunk_delay=0.25))
    assert trio.current_time() - start == pytest.approx(0.25 * len(parts))
    start = trio.current_time()
    await chunks(HELLO)
    assert trio.current_time() == start


async def test_mock_usage_stays_below_the_estimate() -> None:
    completion = await complete(TOOLS)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens <= estimate_prompt_tokens(TOOLS)


@pytest.mark.parametrize(
    "error",
    [
        ProviderRefused(400, "bad", usage=Usage(3)),
        ProviderRateLimited("slow down"),
        ProviderServerError(503),
        ProviderUnreachable("connection refused"),
        ProviderDropped("reset", usage=Usage(3, 4)),
    ],
    ids=lambda error: type(error).__name__,
)
def test_every_provider_failure_is_a_provider_error(error: ProviderError) -> None:
    assert isinstance(error, ProviderError)
    assert error.usage in (None, Usage(3, 0, 3), Usage(3, 4, 7))
    if isinstance(error, ProviderRefused | ProviderServerError):
        assert error.status in (400, 503)


# a long ASCII text mixing every class of character the token pattern tells apart
LONG_ASCII = st.text(
    alphabet=st.sampled_from("ab_Z9 \t\n\r\x0b\x0c\x1c\x1f.,-!\x00\x7f"), min_size=1024
)


@given(LONG_ASCII)
def test_the_quick_count_of_a_long_text_is_the_patterns_count(text: str) -> None:
    """Long ASCII texts are counted with bytes operations: the same number as the
    token pattern's matches, whitespace at either end included."""
    assert count_tokens(text) == len(_TOKEN.findall(text))
    assert count_tokens(" " + text + " ") == len(_TOKEN.findall(" " + text + " "))
