"""POST /v1/messages and /v1/messages/count_tokens through the official ``anthropic`` SDK.

A real gateway, the sandbox mock (deterministic text, tool calls and streams) and, for
usage with cache tokens, a live key on the fake OpenAI upstream. The SDK's sync client
runs on a thread (as the cache pricing tests run the ``openai`` one). Errors must raise
the SDK's own classes with the spec's codes readable in ``error.code``.
"""

from __future__ import annotations

import base64
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import pytest
import trio

from gateway.calls.estimate import estimate_prompt_tokens
from gateway.calls.parse.anthropic_messages import parse_messages
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_admission_http import HeldMock, cap_for
from tests.calls.test_cache_pricing import start_cache_priced
from tests.conftest import Gateway

T = TypeVar("T")
MODEL = "gpt-4o-mini"
HELLO = [{"role": "user", "content": "Say hello."}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
#: a 1x1 PNG
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082"
    )
).decode()


def sdk(gw: Gateway, token: str, **options: Any) -> anthropic.Anthropic:
    options.setdefault("max_retries", 0)
    return anthropic.Anthropic(base_url=gw.url, auth_token=token, timeout=10.0, **options)


async def run(gw: Gateway, token: str, work: Callable[[anthropic.Anthropic], T]) -> T:
    def call() -> T:
        with sdk(gw, token) as client:
            return work(client)

    return await trio.to_thread.run_sync(call)


async def refused(gw: Gateway, token: str, work: Callable[[anthropic.Anthropic], Any]) -> Any:
    """The SDK's exception of a refused call."""
    with pytest.raises(anthropic.APIStatusError) as caught:
        await run(gw, token, work)
    return caught.value


async def record_of(gw: Gateway, token: str, request_id: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        response = await client.get(f"/v1/requests/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def test_a_message_is_answered_in_anthropic_shape_and_recorded(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    raw = await run(
        gateway,
        token,
        lambda c: c.messages.with_raw_response.create(
            model=MODEL, max_tokens=64, messages=HELLO, metadata={"user_id": '{"device": "d"}'}
        ),
    )
    message = raw.parse()
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.content[0].type == "text" and message.content[0].text
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    assert message.usage.cache_read_input_tokens == 0
    request_id = raw.headers["x-request-id"]
    assert "x-ratelimit-limit-requests" in raw.headers
    record = await record_of(gateway, token, request_id)
    assert record["endpoint"] == "messages" and record["status"] == "succeeded"
    assert record["usage"]["output_tokens"] == message.usage.output_tokens
    assert record["tags"] == {}  # metadata carries user_id, never tags


async def test_a_streamed_message_matches_the_whole_answer(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]

    def streamed(client: anthropic.Anthropic) -> tuple[str, anthropic.types.Message]:
        with client.messages.stream(model=MODEL, max_tokens=64, messages=HELLO) as stream:
            text = "".join(stream.text_stream)
            return text, stream.get_final_message()

    text, final = await run(gateway, token, streamed)
    whole = await run(
        gateway, token, lambda c: c.messages.create(model=MODEL, max_tokens=64, messages=HELLO)
    )
    assert text and final.content[0].type == "text" and final.content[0].text == text
    assert whole.content[0].type == "text" and whole.content[0].text == text
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens
    assert final.id.startswith("msg_")


async def test_raw_stream_events_follow_anthropics_sequence(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    body = {"model": MODEL, "max_tokens": 32, "messages": HELLO, "stream": True}
    async with gateway.client(token) as client:
        response = await client.post(
            "/v1/messages?beta=true",
            json=body,
            headers={"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"},
        )
    assert response.status_code == 200
    events = [line[7:] for line in response.text.splitlines() if line.startswith("event: ")]
    assert events[0] == "message_start" and events[1] == "content_block_start"
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(events[2:-3]) == {"content_block_delta"}


async def test_tools_round_trip_tool_use_and_tool_result(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    first = await run(
        gateway,
        token,
        lambda c: c.messages.create(model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER]),
    )
    assert first.stop_reason == "tool_use"
    use = next(block for block in first.content if block.type == "tool_use")
    assert use.name == "get_weather" and isinstance(use.input, dict) and "city" in use.input
    follow = [
        *ask,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": use.id, "content": "Sunny, 21 C"},
            ],
        },
    ]
    second = await run(
        gateway,
        token,
        lambda c: c.messages.create(model=MODEL, max_tokens=64, messages=follow, tools=[WEATHER]),
    )
    assert second.stop_reason in ("end_turn", "max_tokens")
    assert second.content[0].type == "text"

    def streamed(client: anthropic.Anthropic) -> anthropic.types.Message:
        with client.messages.stream(
            model=MODEL, max_tokens=64, messages=ask, tools=[WEATHER]
        ) as stream:
            return stream.get_final_message()

    final = await run(gateway, token, streamed)
    streamed_use = next(block for block in final.content if block.type == "tool_use")
    assert final.stop_reason == "tool_use" and streamed_use.input == use.input


async def test_system_prompt_stop_sequences_thinking_and_an_image(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "What is it?"}]}]
    raw = await run(
        gateway,
        token,
        lambda c: c.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=64,
            system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            stop_sequences=["\n\n"],
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=messages,
            extra_body={"top_k": 5},
        ),
    )
    message = raw.parse()
    assert message.content[0].type == "text" and "1 image" in message.content[0].text
    svc = raw.http_response.json()["svc"]
    assert {"top_k", "thinking", "cache_control"} <= set(svc["ignored_parameters"])


async def test_count_tokens_is_the_conservative_estimate(gateway: Gateway) -> None:
    token = (await gateway.create_key())["token"]
    counted = await run(
        gateway,
        token,
        lambda c: c.messages.count_tokens(model=MODEL, messages=HELLO, system="Be brief."),
    )
    want = parse_messages({"model": MODEL, "messages": HELLO, "system": "Be brief."}, 4096,
                          counting=True).prompt_estimate()  # fmt: skip
    assert counted.input_tokens == want > 0
    async with gateway.client(token) as client:
        view = (await client.get("/v1/key")).json()
    assert view["usage"]["day"]["reserved_usd"] == 0


async def test_errors_raise_the_sdks_classes_with_the_specs_codes(gateway: Gateway) -> None:
    create: Callable[[anthropic.Anthropic], Any] = lambda c: c.messages.create(  # noqa: E731
        model=MODEL, max_tokens=16, messages=HELLO
    )
    error = await refused(gateway, "sk-not-a-key", create)
    assert isinstance(error, anthropic.AuthenticationError)
    assert error.body["type"] == "error"  # the SDK keeps the whole body
    assert error.body["error"]["type"] == "authentication_error"
    assert error.body["error"]["code"] == "invalid_api_key"
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        answer = await client.post("/v1/messages", headers={"x-api-key": "sk-x"}, json={})
    assert answer.status_code == 401
    assert answer.json()["type"] == "error"
    assert "Authorization: Bearer" in answer.json()["error"]["message"]

    embeddings_only = (await gateway.create_key(scopes=["embeddings"]))["token"]
    error = await refused(gateway, embeddings_only, create)
    assert isinstance(error, anthropic.PermissionDeniedError)
    assert error.body["error"]["code"] == "scope_denied"

    token = (await gateway.create_key())["token"]
    error = await refused(
        gateway,
        token,
        lambda c: c.messages.create(model="no-such-model", max_tokens=16, messages=HELLO),
    )
    assert (
        isinstance(error, anthropic.NotFoundError)
        and error.body["error"]["code"] == "model_not_found"
    )

    error = await refused(
        gateway,
        token,
        lambda c: c.messages.create(model=MODEL, max_tokens=128000, messages=HELLO),
    )
    assert isinstance(error, anthropic.BadRequestError)
    assert error.body["error"]["code"] == "max_tokens_exceeds_key_limit"
    assert error.body["error"]["param"] == "max_tokens"
    assert "CLAUDE_CODE_MAX_OUTPUT_TOKENS" in error.body["error"]["message"]

    error = await refused(
        gateway,
        token,
        lambda c: c.messages.create(
            model=MODEL, max_tokens=16, messages=HELLO, extra_body={"mcp_servers": []}
        ),
    )
    assert isinstance(error, anthropic.BadRequestError)
    assert (
        error.body["error"]["code"] == "unsupported_parameter"
        and error.body["error"]["param"] == "mcp_servers"
    )
    assert error.body["error"]["type"] == "invalid_request_error"

    async with gateway.client(token) as client:
        unknown = await client.post("/v1/messages/batches", json={})
        not_json = await client.post(
            "/v1/messages", content=b"{", headers={"Content-Type": "application/json"}
        )
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    assert not_json.status_code == 400
    assert not_json.json()["error"]["type"] == "invalid_request_error"
    assert not_json.headers["request-id"] == not_json.headers["x-request-id"]

    one_a_minute = (await gateway.create_key(caps={"rpm": 1}))["token"]
    await run(gateway, one_a_minute, create)
    error = await refused(gateway, one_a_minute, create)
    assert (
        isinstance(error, anthropic.RateLimitError)
        and error.body["error"]["code"] == "rate_limited"
    )
    assert error.response.headers["retry-after"]


@pytest.mark.both_stores
@pytest.mark.timeout(120)
async def test_a_daily_cap_counts_messages_and_chat_completions_together(
    gateway: Gateway,
) -> None:
    """200 concurrent calls, half of them /v1/messages and half chat completions, against
    one daily cap that fits exactly k worst-case reservations of either. The mock holds
    every admitted call until each of the 200 was admitted or refused (an event, not a
    delay), so every admission still holds its reservation while the others arrive."""
    calls, k = 200, 7
    held = HeldMock(gateway, calls)
    # both bodies reserve the same: the same messages and output budget
    cap = cap_for(gateway, k)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "count the ways"}],
            "max_tokens": 16}  # fmt: skip
    assert parse_messages(chat, 4096).prompt_estimate() == estimate_prompt_tokens(
        {"messages": chat["messages"], "max_tokens": 16}
    )
    key = await gateway.create_key(caps={"rpm": 1000, "max_in_flight": 250, "usd_day": cap})
    answers: Counter[tuple[str, int]] = Counter()
    limits = httpx.Limits(max_connections=calls + 10)
    # a race of money, not of latency: under load 200 calls at once outlast the default
    # 10 s read timeout (a ReadTimeout, not a wrong answer), so each gets a minute
    async with gateway.client(key["token"], limits=limits, timeout=60.0) as client:

        async def one(path: str) -> None:
            response = await client.post(path, json=chat)
            answers[(path, response.status_code)] += 1
            if response.status_code != 200:
                held.count(refused=True)
                assert response.json()["error"]["code"] == "key_cap_exceeded"

        with trio.fail_after(60):
            async with trio.open_nursery() as race:
                for i in range(calls):
                    race.start_soon(one, ("/v1/messages", "/v1/chat/completions")[i % 2])
        usage = (await client.get("/v1/key")).json()["usage"]["day"]
    admitted = sum(n for (_, status), n in answers.items() if status == 200)
    assert admitted == k and sum(answers.values()) == calls
    assert {status for _, status in answers} == {200, 402}
    assert usage["reserved_usd"] == 0 and 0 < usage["spent_usd"] <= cap


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    """The cache pricing tests' gateway: live keys on the fake OpenAI upstream."""
    gateway = await start_cache_priced(nursery, tmp_path, upstream, monkeypatch)
    yield gateway
    gateway.stop.set()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_live_call_reports_cache_tokens_as_anthropic_counts_them(
    live: Gateway, stream: bool
) -> None:
    token = (await live.create_key(mode="live", caps={"usd_day": 10}))["token"]
    text = "[[fault cached=9 cache_write=4]] " + "please say hello " * 6
    messages = [{"role": "user", "content": text}]

    def call(client: anthropic.Anthropic) -> tuple[anthropic.types.Message, str]:
        if not stream:
            raw = client.messages.with_raw_response.create(
                model="cache-chat", max_tokens=40, messages=messages
            )
            return raw.parse(), raw.headers["x-request-id"]
        with client.messages.stream(model="cache-chat", max_tokens=40, messages=messages) as s:
            return s.get_final_message(), s.response.headers["x-request-id"]

    message, request_id = await run(live, token, call)
    usage = message.usage
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (9, 4)
    record = await record_of(live, token, request_id)
    assert record["endpoint"] == "messages" and record["stream"] is stream
    assert record["usage"]["input_tokens"] == usage.input_tokens + 9 + 4
    assert record["usage"]["output_tokens"] == usage.output_tokens
    assert record["cost"]["billed_usd"] > 0


async def test_tags_idempotency_and_required_tags_govern_messages(gateway: Gateway) -> None:
    key = await gateway.create_key(required_tags={"team": ""})
    body = {"model": MODEL, "max_tokens": 16, "messages": HELLO, "svc_tags": {"team": "a"},
            "metadata": {"user_id": "u-1"}}  # fmt: skip
    async with gateway.client(key["token"]) as client:
        first = await client.post(
            "/v1/messages", json=body, headers={"Idempotency-Key": "k-1", "X-Svc-Tags": "app=cc"}
        )
        again = await client.post(
            "/v1/messages", json=body, headers={"Idempotency-Key": "k-1", "X-Svc-Tags": "app=cc"}
        )
        untagged = await client.post("/v1/messages", json={**body, "svc_tags": None})
    assert first.status_code == again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    record = await record_of(gateway, key["token"], first.headers["x-request-id"])
    assert record["tags"] == {"team": "a", "app": "cc"}
    assert untagged.status_code == 400
    assert untagged.json()["type"] == "error"
    assert untagged.json()["error"]["code"] == "missing_tags"


async def test_upstream_failures_answer_in_anthropics_dialect(live: Gateway) -> None:
    token = (await live.create_key(mode="live", caps={"usd_day": 10}))["token"]
    before = [{"role": "user", "content": "[[fault status=500]] hello"}]
    error = await refused(
        live, token, lambda c: c.messages.create(model="cache-chat", max_tokens=16, messages=before)
    )
    assert isinstance(error, anthropic.InternalServerError)
    assert error.body["type"] == "error" and error.body["error"]["code"]

    cut = [{"role": "user", "content": "[[fault drop_after=2]] " + "say hello " * 5}]

    def streamed(client: anthropic.Anthropic) -> str:
        with client.messages.stream(model="cache-chat", max_tokens=40, messages=cut) as stream:
            return "".join(stream.text_stream)

    with pytest.raises(anthropic.APIStatusError) as caught:
        await run(live, token, streamed)
    assert caught.value.body["error"]["code"] == "service_unavailable"
