"""Streams and deadlines through a real server: keep-alives, timeouts, a dropped client.

The server runs with a short deadline (``request_timeout_s`` 1.5) and keep-alive interval
(``keepalive_s`` 0.3); the sandbox mock is replaced by a slow one (``chunk_delay``), so a
call outlives its deadline. The shards read a ``FakeClock``, so a minute boundary cannot
reset the counters a test reads. Raw server-sent events are read with httpx streaming;
every wait is bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import trio

from gateway.providers.mock import MockProvider
from shards import FakeClock
from tests.conftest import Gateway, make_config, start_gateway
from tests.support.waiting import until

CHAT = "/v1/chat/completions"
RESP = "/v1/responses"
DEADLINE_S = 1.5
KEEPALIVE_S = 0.3
KEEPALIVE = ": keep-alive"
MODEL = "gpt-4o"  # input 2.50, output 10.00 USD per million tokens
PRICES = (2.50, 10.00)


def chat_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "tell me a story"}], **fields}


def responses_body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "input": "tell me a story", **fields}


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Gateway]:
    config = make_config(tmp_path, request_timeout_s=DEADLINE_S, keepalive_s=KEEPALIVE_S)
    gateway = await start_gateway(nursery, config, clock=FakeClock(1_795_341_630.0))
    yield gateway
    gateway.stop.set()


def slow(gw: Gateway, chunk_delay: float) -> None:
    gw.runtime.mock = MockProvider.for_models(gw.runtime.config.models, chunk_delay=chunk_delay)


def client(gw: Gateway, token: str | None = None) -> httpx.AsyncClient:
    return gw.client(token or gw.token, verify=False)  # plain HTTP on loopback


async def key_view(gw: Gateway, token: str | None = None) -> dict[str, Any]:
    async with client(gw, token) as c:
        response = await c.get("/v1/key")
    assert response.status_code == 200, response.text
    return response.json()


async def record(gw: Gateway, request_id: str) -> dict[str, Any]:
    rows = await gw.runtime.store.read(
        lambda conn: conn.execute("SELECT * FROM requests WHERE id = ?", (request_id,)).fetchall()
    )
    assert len(rows) == 1, request_id
    return dict(rows[0])


async def stream_lines(
    gw: Gateway, path: str, body: dict[str, Any], token: str | None = None
) -> tuple[httpx.Response, list[tuple[float, str]]]:
    """Every non-empty line of a stream, with the time it arrived (from the request)."""
    lines: list[tuple[float, str]] = []
    start = trio.current_time()
    async with client(gw, token) as c, c.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        async for line in response.aiter_lines():
            if line:
                lines.append((trio.current_time() - start, line))
    return response, lines


async def open_raw_stream(
    gw: Gateway, path: str, body: dict[str, Any], token: str, data_lines: int = 1
) -> tuple[str, trio.SocketStream]:
    """POST on a raw socket and read until ``data_lines`` data lines have arrived.

    Returns the request id and the open socket: closing it is a client that goes away
    mid-stream (an HTTP client library would finish reading or warn about it).
    """
    host, port = gw.url.removeprefix("http://").rsplit(":", 1)
    payload = orjson.dumps(body)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    sock = await trio.open_tcp_stream(host, int(port))
    await sock.send_all(head.encode() + payload)
    received = b""
    while received.count(b"\ndata: ") < data_lines:
        chunk = await sock.receive_some()
        assert chunk, received
        received += chunk
    headers, _, _ = received.partition(b"\r\n\r\n")
    status, *fields = headers.decode().split("\r\n")
    assert status.startswith("HTTP/1.1 200"), status
    found = dict(line.split(": ", 1) for line in fields)
    return {k.lower(): v for k, v in found.items()}["x-request-id"], sock


def data_of(lines: list[tuple[float, str]]) -> list[str]:
    return [line.removeprefix("data: ") for _, line in lines if line.startswith("data: ")]


# -- keep-alives and the streamed deadline ---------------------------------------------------


async def test_keepalives_between_slow_chunks_then_an_in_band_timeout(gw: Gateway) -> None:
    slow(gw, 0.45)  # silent for longer than a keep-alive interval before every chunk
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with trio.fail_after(DEADLINE_S + 3):
        response, lines = await stream_lines(gw, CHAT, body)
    assert response.headers["X-Request-Id"].startswith("req_")
    kinds = ["keep" if line == KEEPALIVE else "data" for _, line in lines]
    assert set(kinds) == {"keep", "data"}, lines
    # a keep-alive arrives while the provider is silent between two chunks
    first_data = kinds.index("data")
    assert "keep" in kinds[first_data:], kinds
    data = data_of(lines)
    assert data[-1] == "[DONE]"
    last = orjson.loads(data[-2])
    assert set(last) == {"error"}
    error = last["error"]
    assert error["code"] == "request_timeout"
    assert error["type"] == "api_error"
    assert error["message"]
    chunks = [orjson.loads(item) for item in data[:-2]]
    assert chunks and all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert all(chunk["choices"] and "usage" not in chunk for chunk in chunks), "no usage chunk"
    # the deadline ended it, not the end of the answer
    assert all(chunk["choices"][0]["finish_reason"] is None for chunk in chunks)
    arrived = lines[-1][0]
    assert DEADLINE_S - 0.1 <= arrived < DEADLINE_S + 1.0


async def test_a_silent_provider_gets_only_keepalives_then_the_timeout(gw: Gateway) -> None:
    slow(gw, DEADLINE_S * 2)  # not one chunk before the deadline
    with trio.fail_after(DEADLINE_S + 3):
        response, lines = await stream_lines(gw, CHAT, chat_body(stream=True))
    keepalives = [at for at, line in lines if line == KEEPALIVE]
    # one every 0.3 s from the start, the first one included: 4 or 5 in 1.5 s
    assert len(keepalives) >= 4, lines
    gaps = [b - a for a, b in zip([0.0, *keepalives], keepalives, strict=False)]
    assert max(gaps) < KEEPALIVE_S * 2, gaps
    data = data_of(lines)
    assert len(data) == 2 and data[1] == "[DONE]", data
    assert orjson.loads(data[0])["error"]["code"] == "request_timeout"
    # the record says what the client got: a 200 carrying an in-band error
    row = await record(gw, response.headers["X-Request-Id"])
    assert (row["http_status"], row["error_code"]) == (200, "request_timeout")
    assert row["settled_usd_nanos"] == row["reserved_usd_nanos"] > 0


async def test_responses_stream_past_the_deadline_ends_with_response_failed(gw: Gateway) -> None:
    slow(gw, 0.45)
    with trio.fail_after(DEADLINE_S + 3):
        _, lines = await stream_lines(gw, RESP, responses_body(stream=True))
    assert any(line == KEEPALIVE for _, line in lines)
    events = [orjson.loads(item) for item in data_of(lines)]
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds
    assert kinds[-1] == "response.failed"
    assert "response.completed" not in kinds and "response.incomplete" not in kinds
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "request_timeout"
    assert failed["error"]["message"]
    # every data line has its matching event line
    names = [line.removeprefix("event: ") for _, line in lines if line.startswith("event: ")]
    assert names == kinds


async def test_the_openai_client_raises_the_in_band_timeout(gw: Gateway) -> None:
    """Sync client in a thread: the async one, stopped by an exception mid-stream, would
    leave its generators to the garbage collector (a ResourceWarning under trio)."""
    slow(gw, 0.45)
    received: list[Any] = []

    def consume() -> None:
        with openai.OpenAI(
            base_url=gw.url + "/v1", api_key=gw.token, max_retries=0, timeout=10.0
        ) as ai:
            stream = ai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
            )
            for chunk in stream:
                received.append(chunk)

    with pytest.raises(openai.APIError) as caught:
        await trio.to_thread.run_sync(consume)
    assert received, "chunks arrived before the deadline"
    assert caught.value.code == "request_timeout"
    assert caught.value.type == "api_error"


@pytest.mark.parametrize(
    ("path", "body"),
    [(CHAT, chat_body(stream=True)), (RESP, responses_body(stream=True))],
    ids=["chat", "responses"],
)
async def test_a_deadline_shorter_than_the_keepalive_interval_is_still_in_band(
    nursery: trio.Nursery, tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    """request_timeout_s 1 under the default 15 s keep-alive: the deadline passes before
    the first keep-alive and before any chunk. The stream opens (200) with the in-band
    request_timeout, as the spec says of every streamed call, instead of an HTTP 504."""
    config = make_config(tmp_path, request_timeout_s=1.0)
    assert config.server.keepalive_s > 1.0
    gw = await start_gateway(nursery, config)
    slow(gw, 5.0)
    try:
        with trio.fail_after(4):
            response, lines = await stream_lines(gw, path, body)
        # Read before stopping: a stopped gateway has closed its store.
        row = await record(gw, response.headers["X-Request-Id"])
    finally:
        gw.stop.set()
    events = [orjson.loads(item) for item in data_of(lines) if item != "[DONE]"]
    if path == CHAT:
        assert data_of(lines)[-1] == "[DONE]"
        assert [event["error"]["code"] for event in events] == ["request_timeout"]
    else:
        assert events[-1]["type"] == "response.failed"
        assert events[-1]["response"]["error"]["code"] == "request_timeout"
    assert 0.9 <= lines[-1][0] < 2.0
    assert (row["http_status"], row["error_code"]) == (200, "request_timeout")


# -- the non-streamed deadline ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"), [(CHAT, chat_body()), (RESP, responses_body())], ids=["chat", "responses"]
)
async def test_a_non_streamed_call_past_the_deadline_is_504(
    gw: Gateway, path: str, body: dict[str, Any]
) -> None:
    slow(gw, 0.45)
    start = trio.current_time()
    with trio.fail_after(DEADLINE_S + 3):
        async with client(gw) as c:
            response = await c.post(path, json=body)
    elapsed = trio.current_time() - start
    assert response.status_code == 504, response.text
    assert response.headers["x-should-retry"] == "false"
    error = response.json()["error"]
    assert (error["code"], error["type"], error["param"]) == ("request_timeout", "api_error", None)
    assert DEADLINE_S - 0.1 <= elapsed < DEADLINE_S + 1.0
    # our own 504: the full reserved estimate counts against the caps
    row = await record(gw, response.headers["X-Request-Id"])
    assert (row["http_status"], row["error_code"]) == (504, "request_timeout")
    assert row["settled_usd_nanos"] == row["reserved_usd_nanos"] > 0
    view = await key_view(gw)
    assert view["rate_limit"]["in_flight"] == 0
    assert view["usage"]["day"]["reserved_usd"] == 0


async def test_the_openai_client_does_not_retry_a_504(gw: Gateway) -> None:
    slow(gw, 0.45)
    key = await gw.create_key()
    with trio.fail_after(3 * DEADLINE_S + 3), pytest.raises(openai.InternalServerError) as caught:
        async with openai.AsyncOpenAI(
            base_url=gw.url + "/v1", api_key=key["token"], max_retries=2
        ) as ai:
            await ai.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "x"}]
            )
    assert caught.value.status_code == 504
    assert caught.value.code == "request_timeout"
    # x-should-retry: false kept the client from retrying
    view = await key_view(gw, key["token"])
    assert view["rate_limit"]["requests_this_minute"] == 2  # the call and this read


# -- a client that drops the stream ----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [(CHAT, chat_body(stream=True)), (RESP, responses_body(stream=True))],
    ids=["chat", "responses"],
)
async def test_a_dropped_stream_frees_its_slot_and_counts_the_full_estimate(
    gw: Gateway, path: str, body: dict[str, Any]
) -> None:
    slow(gw, 0.05)
    key = await gw.create_key()
    with trio.fail_after(5):
        request_id, sock = await open_raw_stream(gw, path, body, key["token"], data_lines=4)
        await sock.aclose()  # the client goes away mid-stream

    async def freed() -> dict[str, Any] | None:
        view = await key_view(gw, key["token"])
        return view if view["rate_limit"]["in_flight"] == 0 else None

    view = await until(freed, within=1.0, every=0.02)
    assert view["usage"]["day"]["reserved_usd"] == 0
    row = await record(gw, request_id)
    assert row["stream"] == 1
    assert row["status"] == "cancelled"  # the client went away; billed like a drop
    assert row["usage"] is None  # the usage chunk never came
    assert row["settled_usd_nanos"] == row["reserved_usd_nanos"] > 0
    assert view["usage"]["day"]["spent_usd"] == pytest.approx(row["reserved_usd_nanos"] / 1e9)


async def ended_call(gw: Gateway) -> bool:
    """No call of the sandbox key is in flight."""
    return bool((await key_view(gw))["rate_limit"]["in_flight"] == 0)


async def test_a_client_that_stops_reading_is_ended_by_the_deadline(gw: Gateway) -> None:
    """An answer of about 10,000 chunks to a client that reads one and then nothing: the
    pump fills the channel and the socket buffers and waits to hand over a chunk when
    the deadline passes. The call ends on time, and the provider's stream is closed then,
    not left to the garbage collector (which trio reports as a ResourceWarning)."""
    schema = {"type": "array", "minItems": 3000, "items": {"type": "string"}}
    big = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    body = chat_body(stream=True, response_format=big)
    assert gw.runtime.nursery is not None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = trio.current_time()
        with trio.fail_after(DEADLINE_S + 3):
            request_id, sock = await open_raw_stream(gw, CHAT, body, gw.token)
            async with sock:
                # every read counts against the key's requests per minute: poll gently
                await until(lambda: ended_call(gw), within=DEADLINE_S + 3)
                ended = trio.current_time() - start
            # the client goes away: the pump stops waiting for it and ends
            nursery = gw.runtime.nursery
            await until(
                lambda: not any(t.name.endswith(".pump") for t in nursery.child_tasks),
                within=DEADLINE_S + 3,
                every=0.02,
            )
        gc.collect()
    assert DEADLINE_S - 0.1 <= ended < DEADLINE_S + 1.0
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []
    row = await record(gw, request_id)
    assert row["error_code"] == "request_timeout"
    assert row["settled_usd_nanos"] == row["reserved_usd_nanos"] > 0


# -- the reservation of an omitted output budget ----------------------------------------------


async def test_an_omitted_budget_reserves_the_key_maximum_while_streaming(gw: Gateway) -> None:
    slow(gw, 0.2)
    limit = 1000
    key = await gw.create_key(caps={"max_output_tokens": limit})
    with trio.fail_after(5):
        _, sock = await open_raw_stream(gw, CHAT, chat_body(stream=True), key["token"])
        async with sock:
            view = await key_view(gw, key["token"])
    assert view["rate_limit"]["in_flight"] == 1
    tokens = view["rate_limit"]["tokens_this_minute"]
    prompt_estimate = tokens - limit
    assert 0 < prompt_estimate < 200
    expected = (prompt_estimate * PRICES[0] + limit * PRICES[1]) / 1e6
    assert view["usage"]["day"]["reserved_usd"] == pytest.approx(expected, abs=1e-9)


# -- determinism -----------------------------------------------------------------------------


def content_of(answer: dict[str, Any]) -> dict[str, Any]:
    """An answer without what is per call (the svc block, ids, created): its content."""
    content = orjson.loads(orjson.dumps(answer))  # a deep copy
    for key in ("svc", "id", "created"):
        content.pop(key, None)
    for choice in content.get("choices", ()):
        for part in (choice.get("message"), choice.get("delta")):
            for call in (part or {}).get("tool_calls") or ():
                call.pop("id", None)
    return content


def call_id(answer: dict[str, Any]) -> str:
    """The completion id the sandbox gives a call: its request id's hex."""
    return "chatcmpl-" + answer["svc"]["request_id"].removeprefix("req_")


async def chat_stream(gw: Gateway, body: dict[str, Any]) -> list[dict[str, Any]]:
    with trio.fail_after(10):
        _, lines = await stream_lines(gw, CHAT, {**body, "stream": True})
    data = data_of(lines)
    assert data[-1] == "[DONE]"
    return [orjson.loads(item) for item in data[:-1]]


async def post(gw: Gateway, path: str, body: dict[str, Any]) -> dict[str, Any]:
    with trio.fail_after(10):
        async with client(gw) as c:
            response = await c.post(path, json=body)
    assert response.status_code == 200, response.text
    return response.json()


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
        },
    },
}


@pytest.mark.parametrize(
    "extra",
    [{}, {"tools": [TOOL]}, {"temperature": 0.3, "seed": 5, "max_tokens": 7}],
    ids=["text", "tool call", "sampling and a short budget"],
)
async def test_chat_is_deterministic_streamed_or_not(gw: Gateway, extra: dict[str, Any]) -> None:
    body = chat_body(**extra)
    first, second = await post(gw, CHAT, body), await post(gw, CHAT, body)
    assert content_of(first) == content_of(second)
    assert first["svc"]["request_id"] != second["svc"]["request_id"]
    assert (first["id"], second["id"]) == (call_id(first), call_id(second))
    usage_body = {**body, "stream_options": {"include_usage": True}}
    streamed, again = await chat_stream(gw, usage_body), await chat_stream(gw, usage_body)
    assert [content_of(c) for c in streamed] == [content_of(c) for c in again]
    message = first["choices"][0]["message"]
    deltas = [chunk["choices"][0]["delta"] for chunk in streamed if chunk["choices"]]
    content = "".join(delta.get("content") or "" for delta in deltas)
    arguments = "".join(
        call["function"].get("arguments") or ""
        for delta in deltas
        for call in delta.get("tool_calls") or ()
    )
    if message.get("tool_calls"):
        assert arguments == message["tool_calls"][0]["function"]["arguments"]
        assert orjson.loads(arguments).keys() == {"city", "days"}
    else:
        assert content == message["content"] and content
    assert streamed[-1]["usage"] == first["usage"]
    finish = [chunk["choices"][0]["finish_reason"] for chunk in streamed if chunk["choices"]]
    assert finish[-1] == first["choices"][0]["finish_reason"]
    assert {chunk["id"] for chunk in streamed} == {call_id(streamed[0])}
    assert streamed[0]["id"] != first["id"]


async def test_responses_is_deterministic_streamed_or_not(gw: Gateway) -> None:
    body = responses_body()
    first, second = await post(gw, RESP, body), await post(gw, RESP, body)
    text = first["output"][0]["content"][0]["text"]
    assert text and text == second["output"][0]["content"][0]["text"]
    assert first["usage"] == second["usage"]
    streamed: list[str] = []
    for _ in range(2):
        with trio.fail_after(10):
            _, lines = await stream_lines(gw, RESP, {**body, "stream": True})
        events = [orjson.loads(item) for item in data_of(lines)]
        assert events[-1]["type"] == "response.completed"
        deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
        streamed.append("".join(deltas))
        completed = events[-1]["response"]
        assert completed["output"][0]["content"][0]["text"] == text
        assert completed["usage"] == first["usage"]
    assert streamed == [text, text]


@pytest.mark.parametrize("model", ["gpt-4o-mini", MODEL])
async def test_every_chunk_of_a_chat_stream_carries_the_svc_block(gw: Gateway, model: str) -> None:
    body = chat_body(model=model, web_search_options={})
    answer = await post(gw, CHAT, body)
    with trio.fail_after(10):
        response, lines = await stream_lines(gw, CHAT, {**body, "stream": True})
    chunks = [orjson.loads(item) for item in data_of(lines)[:-1]]
    expected = {"request_id": response.headers["X-Request-Id"]}
    expected["ignored_parameters"] = answer["svc"]["ignored_parameters"]
    assert "web_search_options" in expected["ignored_parameters"], "the mock searches nothing"
    assert chunks and all(chunk["svc"] == expected for chunk in chunks)
    assert all("usage" not in chunk for chunk in chunks), "usage only when asked for"


async def test_every_response_object_of_a_responses_stream_carries_the_svc_block(
    gw: Gateway,
) -> None:
    body = responses_body(tools=[{"type": "web_search"}])
    answer = await post(gw, RESP, body)
    with trio.fail_after(10):
        response, lines = await stream_lines(gw, RESP, {**body, "stream": True})
    events = [orjson.loads(item) for item in data_of(lines)]
    objects = [event["response"] for event in events if "response" in event]
    assert [event["type"] for event in events if "response" in event] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    expected = {"request_id": response.headers["X-Request-Id"]}
    expected["ignored_parameters"] = answer["svc"]["ignored_parameters"]
    assert "web_search_options" in expected["ignored_parameters"], "chat names, as documented"
    assert all(obj["svc"] == expected for obj in objects)
