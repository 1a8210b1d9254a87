"""The official ``openai`` client against a real server on loopback, sync and async.

Both run in a worker thread (``trio.to_thread.run_sync``): the sync client as it is, the
async client under ``asyncio.run``, the loop its users run it on. (It also runs on trio,
through anyio, and ``test_streaming`` does so; but it stops reading a chat stream at
``[DONE]`` and leaves its async generators to the garbage collector, which trio reports
as a ResourceWarning, an error under this suite's warning policy.) Every answer must
parse into the client's types, and every refusal must raise the client's exception class
for its status, with the spec's ``code`` and ``param``. Retries are off, so one call is
one request; the client's own timeout bounds each call.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import Any, Literal

import openai
import pytest
import trio
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response
from pydantic import BaseModel

from tests.conftest import Gateway

Mode = Literal["sync", "async"]
MODES: list[Mode] = ["sync", "async"]
MODEL = "gpt-4o-mini"
BASIC = "mock-basic"
EMBED = "text-embedding-3-small"
USER: list[Any] = [{"role": "user", "content": "Say hello."}]
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}


class Forecast(BaseModel):
    city: str
    days: int
    rain: bool
    temperatures: list[float]


async def run(gw: Gateway, mode: Mode, make: Callable[[Any], Any], token: str | None = None) -> Any:
    """``make(client)`` with a sync or an async client; a stream is read to its end."""
    options: dict[str, Any] = {
        "base_url": gw.url + "/v1",
        "api_key": token or gw.token,
        "max_retries": 0,
        "timeout": 10.0,
    }

    # plain HTTP on loopback: no certificates to load (each load costs ~30 ms)
    def call_sync() -> Any:
        with openai.OpenAI(
            **options, http_client=openai.DefaultHttpxClient(verify=False)
        ) as client:
            result = make(client)
            return list(result) if isinstance(result, openai.Stream) else result

    async def call_async() -> Any:
        http_client = openai.DefaultAsyncHttpxClient(verify=False)
        async with openai.AsyncOpenAI(**options, http_client=http_client) as client:
            result = await make(client)
            if isinstance(result, openai.AsyncStream):
                return [item async for item in result]
            return result

    if mode == "sync":
        return await trio.to_thread.run_sync(call_sync)
    return await trio.to_thread.run_sync(asyncio.run, call_async())


def svc_of(answer: Any) -> dict[str, Any]:
    svc = (answer.model_extra or {})["svc"]
    assert svc["request_id"].startswith("req_")
    assert isinstance(svc["ignored_parameters"], list)
    return svc


# -- chat completions ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_chat_plain_and_streamed(gateway: Gateway, mode: Mode) -> None:
    plain = await run(
        gateway, mode, lambda c: c.chat.completions.create(model=MODEL, messages=USER, seed=3)
    )
    assert isinstance(plain, ChatCompletion)
    assert plain.model == MODEL
    assert plain.choices[0].finish_reason == "stop"
    content = plain.choices[0].message.content
    assert content
    assert plain.usage is not None and plain.usage.completion_tokens > 0
    assert svc_of(plain)["ignored_parameters"] == []

    chunks = await run(
        gateway,
        mode,
        lambda c: c.chat.completions.create(
            model=MODEL,
            messages=USER,
            seed=3,
            stream=True,
            stream_options={"include_usage": True},
        ),
    )
    assert chunks and all(isinstance(chunk, ChatCompletionChunk) for chunk in chunks)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == content
    assert chunks[-1].choices == [] and chunks[-1].usage == plain.usage
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


@pytest.mark.parametrize("mode", MODES)
async def test_chat_stream_without_include_usage_has_no_usage_chunk(
    gateway: Gateway, mode: Mode
) -> None:
    chunks = await run(
        gateway,
        mode,
        lambda c: c.chat.completions.create(model=MODEL, messages=USER, stream=True),
    )
    assert chunks and all(chunk.choices and chunk.usage is None for chunk in chunks)


@pytest.mark.parametrize("mode", MODES)
async def test_chat_tools(gateway: Gateway, mode: Mode) -> None:
    answer = await run(
        gateway,
        mode,
        lambda c: c.chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER_TOOL]),
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id
    assert call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city", "unit", "days"}
    assert isinstance(arguments["city"], str) and arguments["unit"] in ("c", "f")
    assert isinstance(arguments["days"], int) and 1 <= arguments["days"] <= 7

    # the tool's result ends the loop with a text answer
    follow_up = [
        *USER,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    final = await run(
        gateway,
        mode,
        lambda c: c.chat.completions.create(model=MODEL, messages=follow_up, tools=[WEATHER_TOOL]),
    )
    assert final.choices[0].finish_reason == "stop" and final.choices[0].message.content


@pytest.mark.parametrize("mode", MODES)
async def test_chat_structured_output(gateway: Gateway, mode: Mode) -> None:
    parsed = await run(
        gateway,
        mode,
        lambda c: c.chat.completions.parse(model=MODEL, messages=USER, response_format=Forecast),
    )
    forecast = parsed.choices[0].message.parsed
    assert isinstance(forecast, Forecast)
    assert forecast.temperatures and forecast.city

    schema = {
        "type": "json_schema",
        "json_schema": {
            "name": "pair",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    }
    answer = await run(
        gateway,
        mode,
        lambda c: c.chat.completions.create(model=MODEL, messages=USER, response_format=schema),
    )
    value = json.loads(answer.choices[0].message.content)
    assert set(value) == {"a", "b"}
    assert isinstance(value["a"], int) and isinstance(value["b"], bool)


# -- responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_responses_plain_and_streamed(gateway: Gateway, mode: Mode) -> None:
    plain = await run(
        gateway,
        mode,
        lambda c: c.responses.create(
            model=MODEL, input="Say hello.", instructions="Be brief.", max_output_tokens=64
        ),
    )
    assert isinstance(plain, Response)
    assert plain.status == "completed" and plain.model == MODEL
    assert plain.id.startswith("resp_")
    assert plain.output_text
    assert plain.usage is not None and plain.usage.output_tokens > 0
    assert plain.max_output_tokens == 64
    assert svc_of(plain)["request_id"] == "req_" + plain.id.removeprefix("resp_")

    events = await run(
        gateway,
        mode,
        lambda c: c.responses.create(
            model=MODEL,
            input="Say hello.",
            instructions="Be brief.",
            max_output_tokens=64,
            stream=True,
        ),
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == plain.output_text
    assert events[-1].response.output_text == plain.output_text
    assert events[-1].response.usage == plain.usage


@pytest.mark.parametrize("mode", MODES)
async def test_responses_function_tool_and_text_format(gateway: Gateway, mode: Mode) -> None:
    tool = {"type": "function", **WEATHER_TOOL["function"]}
    answer = await run(
        gateway, mode, lambda c: c.responses.create(model=MODEL, input="Weather?", tools=[tool])
    )
    (item,) = answer.output
    assert item.type == "function_call" and item.name == "get_weather"
    assert set(json.loads(item.arguments)) == {"city", "unit", "days"}

    parsed = await run(
        gateway,
        mode,
        lambda c: c.responses.parse(model=MODEL, input="Forecast?", text_format=Forecast),
    )
    assert isinstance(parsed.output_parsed, Forecast)


def stream_helpers(client: openai.OpenAI) -> tuple[Any, Any, Any]:
    """The client's stream helpers, which check each event against the state so far."""
    tool = openai.pydantic_function_tool(Forecast)
    with client.chat.completions.stream(model=MODEL, messages=USER, tools=[tool]) as stream:
        for _ in stream:
            pass
        tool_call = stream.get_final_completion().choices[0].message.tool_calls[0]
    with client.chat.completions.stream(
        model=MODEL, messages=USER, response_format=Forecast
    ) as stream:
        for _ in stream:
            pass
        chat_parsed = stream.get_final_completion().choices[0].message.parsed
    with client.responses.stream(model=MODEL, input="Forecast?", text_format=Forecast) as stream:
        for _ in stream:
            pass
        responses_parsed = stream.get_final_response().output_parsed
    return tool_call.function.parsed_arguments, chat_parsed, responses_parsed


async def test_stream_helpers_accumulate_tool_calls_and_parse(gateway: Gateway) -> None:
    parsed = await run(gateway, "sync", stream_helpers)
    assert all(isinstance(value, Forecast) for value in parsed), parsed


# -- embeddings ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_embeddings_float_base64_and_dimensions(gateway: Gateway, mode: Mode) -> None:
    texts = ["first text", "second text"]
    floats = await run(
        gateway,
        mode,
        lambda c: c.embeddings.create(model=EMBED, input=texts, encoding_format="float"),
    )
    # the client asks for base64 unless told otherwise, and decodes it
    decoded = await run(gateway, mode, lambda c: c.embeddings.create(model=EMBED, input=texts))
    short = await run(
        gateway, mode, lambda c: c.embeddings.create(model=EMBED, input=texts, dimensions=64)
    )
    for answer in (floats, decoded, short):
        assert answer.model == EMBED
        assert [item.index for item in answer.data] == [0, 1]
        assert answer.usage.prompt_tokens > 0
        svc_of(answer)
    assert [len(item.embedding) for item in floats.data] == [1536, 1536]
    assert [item.embedding for item in decoded.data] == [item.embedding for item in floats.data]
    assert [len(item.embedding) for item in short.data] == [64, 64]
    for item in (*floats.data, *short.data):
        assert math.isclose(math.fsum(x * x for x in item.embedding), 1.0, rel_tol=1e-5)
    assert floats.data[0].embedding != floats.data[1].embedding


# -- refusals: the client's exception class, the spec's code and param -----------------------


def chat_call(**fields: Any) -> Callable[[Any], Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": USER, **fields}
    return lambda c: c.chat.completions.create(**body)


def responses_call(**fields: Any) -> Callable[[Any], Any]:
    body: dict[str, Any] = {"model": MODEL, "input": "hi", **fields}
    return lambda c: c.responses.create(**body)


def embeddings_call(**fields: Any) -> Callable[[Any], Any]:
    body: dict[str, Any] = {"model": EMBED, "input": "hi", **fields}
    return lambda c: c.embeddings.create(**body)


IMAGE = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    }
]
TEXT_SCHEMA = {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}

# (case, call, key settings, exception class, code, param)
REFUSALS: list[tuple[str, Callable[[Any], Any], dict[str, Any] | None, type, str, Any]] = [
    (
        "chat: unknown model",
        chat_call(model="no-such-model"),
        None,
        openai.NotFoundError,
        "model_not_found",
        "model",
    ),
    (
        "chat: role developer",
        chat_call(messages=[{"role": "developer", "content": "x"}]),
        None,
        openai.BadRequestError,
        "invalid_messages",
        "messages",
    ),
    (
        "chat: temperature above 2",
        chat_call(temperature=2.5),
        None,
        openai.BadRequestError,
        "invalid_request",
        "temperature",
    ),
    (
        "chat: top_p above 1",
        chat_call(top_p=1.5),
        None,
        openai.BadRequestError,
        "invalid_request",
        "top_p",
    ),
    (
        "chat: five stop sequences",
        chat_call(stop=["a", "b", "c", "d", "e"]),
        None,
        openai.BadRequestError,
        "invalid_request",
        "stop",
    ),
    ("chat: n above 1", chat_call(n=2), None, openai.BadRequestError, "unsupported_parameter", "n"),
    (
        "chat: logprobs",
        chat_call(logprobs=True),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "logprobs",
    ),
    (
        "chat: store",
        chat_call(store=True),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "store",
    ),
    (
        "chat: forcing tool_choice",
        chat_call(tools=[WEATHER_TOOL], tool_choice="required"),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "tool_choice",
    ),
    (
        "chat: unknown field",
        chat_call(extra_body={"frobnicate": 1}),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "frobnicate",
    ),
    (
        "chat: connectors",
        chat_call(extra_body={"connectors": [{"id": "c"}]}),
        None,
        openai.BadRequestError,
        "connectors_require_user_session",
        "connectors",
    ),
    (
        "chat: max_completion_tokens above the key limit",
        chat_call(max_completion_tokens=100_000),
        None,
        openai.BadRequestError,
        "max_tokens_exceeds_key_limit",
        "max_tokens",
    ),
    (
        "chat: vision on mock-basic",
        chat_call(model=BASIC, messages=IMAGE),
        None,
        openai.BadRequestError,
        "model_lacks_vision",
        "messages",
    ),
    (
        "chat: tools on mock-basic",
        chat_call(model=BASIC, tools=[WEATHER_TOOL]),
        None,
        openai.BadRequestError,
        "model_lacks_tools",
        "tools",
    ),
    (
        "chat: response_format on mock-basic",
        chat_call(model=BASIC, response_format={"type": "json_object"}),
        None,
        openai.BadRequestError,
        "model_lacks_structured_output",
        "response_format",
    ),
    (
        "chat: web search on mock-basic",
        chat_call(model=BASIC, web_search_options={}),
        None,
        openai.BadRequestError,
        "web_search_unavailable",
        "web_search_options",
    ),
    (
        "chat: 17 tags",
        chat_call(metadata={f"t{i}": "v" for i in range(17)}),
        None,
        openai.BadRequestError,
        "invalid_tags",
        "metadata",
    ),
    (
        "chat: missing tag",
        chat_call(),
        {"required_tags": {"team": ""}},
        openai.BadRequestError,
        "missing_tags",
        None,
    ),
    (
        "chat: model outside the allowed list",
        chat_call(),
        {"allowed_models": ["gpt-4o"]},
        openai.PermissionDeniedError,
        "model_not_allowed",
        "model",
    ),
    (
        "chat: zero_retention on mock-basic",
        chat_call(model=BASIC),
        {"data_mode": "zero_retention"},
        openai.BadRequestError,
        "model_not_zdr",
        "model",
    ),
    (
        "chat: confidential key",
        chat_call(),
        {"data_mode": "confidential"},
        openai.InternalServerError,
        "not_implemented",
        None,
    ),
    (
        "chat: embeddings-only key",
        chat_call(),
        {"scopes": ["embeddings"]},
        openai.PermissionDeniedError,
        "scope_denied",
        None,
    ),
    (
        "chat: invalid key",
        chat_call(),
        {"token": "svc_test_nope"},
        openai.AuthenticationError,
        "invalid_api_key",
        None,
    ),
    (
        "responses: input unreadable",
        responses_call(input=[{"type": "bogus"}]),
        None,
        openai.BadRequestError,
        "invalid_input",
        "input",
    ),
    (
        "responses: max_output_tokens above the key limit",
        responses_call(max_output_tokens=100_000),
        None,
        openai.BadRequestError,
        "max_tokens_exceeds_key_limit",
        "max_output_tokens",
    ),
    (
        "responses: text.format on mock-basic",
        responses_call(model=BASIC, text=TEXT_SCHEMA),
        None,
        openai.BadRequestError,
        "model_lacks_structured_output",
        "response_format",
    ),
    (
        "responses: web_search on mock-basic",
        responses_call(model=BASIC, tools=[{"type": "web_search"}]),
        None,
        openai.BadRequestError,
        "web_search_unavailable",
        "tools",
    ),
    (
        "responses: store",
        responses_call(store=True),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "store",
    ),
    (
        "responses: previous_response_id",
        responses_call(previous_response_id="resp_1"),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "previous_response_id",
    ),
    (
        "responses: background",
        responses_call(background=True),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "background",
    ),
    (
        "responses: truncation auto",
        responses_call(truncation="auto"),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "truncation",
    ),
    (
        "responses: file_search tool",
        responses_call(tools=[{"type": "file_search", "vector_store_ids": ["vs_1"]}]),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "tools",
    ),
    (
        "responses: item_reference input",
        responses_call(input=[{"type": "item_reference", "id": "msg_1"}]),
        None,
        openai.BadRequestError,
        "unsupported_parameter",
        "input",
    ),
    (
        "responses: unknown model",
        responses_call(model="no-such-model"),
        None,
        openai.NotFoundError,
        "model_not_found",
        "model",
    ),
    (
        "embeddings: a chat model",
        embeddings_call(model=MODEL),
        None,
        openai.BadRequestError,
        "model_not_allowed",
        "model",
    ),
    (
        "embeddings: dimensions 0",
        embeddings_call(dimensions=0),
        None,
        openai.BadRequestError,
        "invalid_request",
        "dimensions",
    ),
    (
        "embeddings: missing tag",
        embeddings_call(),
        {"required_tags": {"team": ""}},
        openai.BadRequestError,
        "missing_tags",
        None,
    ),
    (
        "embeddings: unknown model",
        embeddings_call(model="no-such-model"),
        None,
        openai.NotFoundError,
        "model_not_found",
        "model",
    ),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    ("make", "key", "error", "code", "param"),
    [row[1:] for row in REFUSALS],
    ids=[row[0] for row in REFUSALS],
)
async def test_refusals_raise_the_matching_exception(
    gateway: Gateway,
    mode: Mode,
    make: Callable[[Any], Any],
    key: dict[str, Any] | None,
    error: type[openai.APIStatusError],
    code: str,
    param: str | None,
) -> None:
    token = gateway.token
    if key is not None:
        token = key["token"] if "token" in key else (await gateway.create_key(**key))["token"]
    with pytest.raises(openai.APIStatusError) as caught:
        await run(gateway, mode, make, token)
    exc = caught.value
    assert type(exc) is error, (type(exc), exc.body)
    assert (exc.code, exc.param) == (code, param), exc.body
    assert exc.request_id is not None and exc.request_id.startswith("req_")
    assert exc.request_id == exc.response.headers["X-Request-Id"]
