"""Live keys against a fake upstream: one test per settlement row and failure mapping.

Each case asserts the HTTP answer AND cost.settled_usd on the request record AND the
key's spend in GET /v1/key AND the organisation's credits in GET /v1/credits.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.estimate import estimate_prompt_tokens
from gateway.calls.provider_errors import REFUSED_PHRASE
from gateway.config.settings import Config, ModelConfig, ProviderConfig
from gateway.fakes.fake_upstream import FakeUpstream
from tests.conftest import Gateway, make_config, start_gateway

pytestmark = pytest.mark.both_stores

IN_PRICE, OUT_PRICE = 3.0, 15.0  # USD per million tokens: 3000 and 15000 nano-USD a token
MAX_TOKENS = 50
UPSTREAM_KEY = "sk-upstream-test-0123456789"


def live_config(
    tmp_path: Path, upstream: FakeUpstream, provider_timeout_s: float = 300.0, **server: Any
) -> Config:
    base = make_config(tmp_path, **server)
    provider = ProviderConfig(
        name="upstream", kind="openai", base_url=upstream.url, api_key_env="FAKE_UPSTREAM_KEY"
    )
    provider = replace(provider, timeout_s=provider_timeout_s)
    chat = ModelConfig("live-chat", "upstream", "up-chat", input_usd_per_mtok=IN_PRICE)
    chat = replace(chat, output_usd_per_mtok=OUT_PRICE)
    embed = ModelConfig("live-embed", "upstream", "up-embed", "embedding", input_usd_per_mtok=0.5)
    models = (chat, replace(embed, output_usd_per_mtok=0.0))
    return replace(base, providers=(*base.providers, provider), models=models)


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, live_config(tmp_path, upstream, request_timeout_s=2.0))
    key = await gw.create_key(name="live", mode="live", caps={"usd_day": 10})
    yield gw, key["token"]
    gw.stop.set()


def body_for(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": "live-chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def cost(prompt: int, completion: int) -> int:
    return math.ceil((prompt * IN_PRICE + completion * OUT_PRICE) * 1000)


def estimate_of(body: dict[str, Any]) -> int:
    upstream = {"messages": body["messages"], "max_tokens": MAX_TOKENS}
    return estimate_prompt_tokens(upstream)


async def state(gw: Gateway, token: str, request_id: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        record = await client.get(f"/v1/requests/{request_id}")
        key = (await client.get("/v1/key")).json()
        credits = (await client.get("/v1/credits")).json()
    return {
        "record": record.json() if record.status_code == 200 else None,
        "spent": round(key["usage"]["day"]["spent_usd"] * NANOS_PER_USD),
        "reserved": key["usage"]["day"]["reserved_usd"],
        "in_flight": key["rate_limit"]["in_flight"],
        "used": round(credits["used_usd"] * NANOS_PER_USD),
        "balance": credits["balance_usd"],
    }


async def call(gw: Gateway, token: str, body: dict[str, Any]) -> httpx.Response:
    async with gw.client(token) as client:
        return await client.post("/v1/chat/completions", json=body)


async def stream_data(
    gw: Gateway, token: str, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[list[str], str]:
    """The ``data:`` payloads of a stream answered 200, and its request id."""
    async with gw.client(token) as client, client.stream("POST", path, json=body) as response:
        assert response.status_code == 200
        data = [
            line[5:].strip() async for line in response.aiter_lines() if line.startswith("data:")
        ]
        return data, response.headers["X-Request-Id"]


def settled(after: dict[str, Any]) -> int:
    return round(after["record"]["cost"]["settled_usd"] * NANOS_PER_USD)


async def test_usage_reported_bills_the_real_cost(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = body_for("hello there")
    response = await call(gw, token, body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    expected = cost(usage["prompt_tokens"], usage["completion_tokens"])
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == expected
    assert after["spent"] == expected and after["used"] == expected
    assert after["reserved"] == 0 and after["in_flight"] == 0
    assert after["record"]["cost"]["billed_usd"] == after["record"]["cost"]["settled_usd"]
    assert usage["prompt_tokens"] <= estimate_of(body)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_provider_refusal_costs_nothing(live: tuple[Gateway, str], status: int) -> None:
    gw, token = live
    response = await call(gw, token, body_for(f"[[fault status={status}]]"))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["message"].startswith(REFUSED_PHRASE)
    assert "upstream says no" in error["message"]
    for leak in ("internal.example", "sk-abcdefgh", UPSTREAM_KEY):
        assert leak not in response.text
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 and after["spent"] == 0 and after["used"] == 0
    assert after["in_flight"] == 0


async def test_provider_429_is_rate_limited_with_retry_after_30(
    live: tuple[Gateway, str],
) -> None:
    gw, token = live
    response = await call(gw, token, body_for("[[fault status=429]]"))
    assert response.status_code == 429
    assert response.json()["error"]["code"] == "rate_limited"
    assert response.headers["Retry-After"] == "30"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == 0 and after["spent"] == 0 and after["used"] == 0


@pytest.mark.parametrize("fault", ["status=500", "status=503", "reset"])
async def test_server_error_counts_the_input_share(live: tuple[Gateway, str], fault: str) -> None:
    gw, token = live
    body = body_for(f"[[fault {fault}]]")
    response = await call(gw, token, body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    assert "Retry-After" in response.headers
    after = await state(gw, token, response.headers["X-Request-Id"])
    share = cost(estimate_of(body), 0)
    assert settled(after) == share and after["spent"] == share
    assert after["used"] == 0, "no usage reported: nothing is debited from credits"
    assert after["record"]["cost"]["billed_usd"] == 0


async def test_error_with_usage_bills_the_reported_usage(live: tuple[Gateway, str]) -> None:
    gw, token = live
    response = await call(gw, token, body_for("[[fault status=500 usage_on_error]]"))
    assert response.status_code == 503
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(5, 3) == after["used"] == after["spent"]


async def test_success_without_usage_counts_the_full_estimate(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = body_for("[[fault no_usage]]")
    response = await call(gw, token, body)
    assert response.status_code == 200
    after = await state(gw, token, response.headers["X-Request-Id"])
    full = cost(estimate_of(body), MAX_TOKENS)
    assert settled(after) == full == after["spent"]
    assert after["used"] == 0


async def assert_timeout_counts_the_full_estimate(gw: Gateway, token: str, delay: float) -> None:
    """A call the upstream answers only after ``delay`` s: 504, the full estimate, unbilled."""
    body = body_for(f"[[fault delay={delay}]]")
    with trio.fail_after(10):
        response = await call(gw, token, body)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "request_timeout"
    assert response.headers["x-should-retry"] == "false"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]
    assert after["used"] == 0


async def test_own_timeout_is_504_and_counts_the_full_estimate(live: tuple[Gateway, str]) -> None:
    await assert_timeout_counts_the_full_estimate(*live, delay=5)


async def test_stream_dropped_after_output_counts_the_full_estimate(
    live: tuple[Gateway, str],
) -> None:
    gw, token = live
    body = body_for("[[fault drop_after=3]]", stream=True)
    data, request_id = await stream_data(gw, token, body)
    assert orjson.loads(data[-2])["error"]["code"] == "service_unavailable"
    assert data[-1] == "[DONE]"
    after = await state(gw, token, request_id)
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]
    assert after["used"] == 0 and after["in_flight"] == 0


async def test_stream_with_usage_bills_the_real_cost(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = body_for("stream me", stream=True, stream_options={"include_usage": True})
    data, request_id = await stream_data(gw, token, body)
    usage = orjson.loads(data[-2])["usage"]
    after = await state(gw, token, request_id)
    assert settled(after) == cost(usage["prompt_tokens"], usage["completion_tokens"])
    assert after["used"] == settled(after)


async def test_stream_failing_after_its_usage_bills_the_real_cost(
    live: tuple[Gateway, str],
) -> None:
    gw, token = live
    body = body_for("[[fault drop_at_end]]", stream=True)
    data, request_id = await stream_data(gw, token, body)
    assert orjson.loads(data[-2])["error"]["code"] == "service_unavailable"
    after = await state(gw, token, request_id)
    usage = after["record"]["usage"]
    real = cost(usage["prompt_tokens"], usage["completion_tokens"])
    assert real < cost(estimate_of(body), MAX_TOKENS)
    assert settled(after) == real == after["spent"] == after["used"]
    assert after["record"]["cost"]["billed_usd"] * NANOS_PER_USD == pytest.approx(real)


@pytest.mark.parametrize("asked", [False, True])
async def test_usage_in_the_finish_chunk_reaches_the_client_only_when_asked(
    live: tuple[Gateway, str], asked: bool
) -> None:
    gw, token = live
    body = body_for("[[fault usage_with_finish]]", stream=True)
    if asked:
        body["stream_options"] = {"include_usage": True}
    data, request_id = await stream_data(gw, token, body)
    chunks = [orjson.loads(item) for item in data[:-1]]
    with_usage = [chunk for chunk in chunks if chunk.get("usage")]
    assert with_usage == ([chunks[-1]] if asked else [])
    if asked:
        assert chunks[-1]["choices"] == []
    after = await state(gw, token, request_id)
    usage = after["record"]["usage"]
    assert settled(after) == cost(usage["prompt_tokens"], usage["completion_tokens"])
    assert after["used"] == settled(after)


async def test_usage_inside_a_content_chunk_doubles_nothing(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = {"model": "live-chat", "input": "[[fault usage_with_content]]", "max_output_tokens": 9}
    async with gw.client(token) as client:
        whole = (await client.post("/v1/responses", json=body)).json()
    data, _ = await stream_data(gw, token, {**body, "stream": True}, "/v1/responses")
    events = [orjson.loads(item) for item in data]
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    text = whole["output"][0]["content"][0]["text"]
    assert "".join(deltas) == text and text
    completed = events[-1]["response"]
    assert completed["output"][0]["content"][0]["text"] == text
    assert completed["usage"] == whole["usage"]


async def test_unreadable_200_counts_the_full_estimate(live: tuple[Gateway, str]) -> None:
    gw, token = live
    body = body_for("[[fault malformed]]")
    response = await call(gw, token, body)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "service_unavailable"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]
    assert after["used"] == 0


async def test_provider_timeout_is_504_and_counts_the_full_estimate(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    config = live_config(tmp_path, upstream, provider_timeout_s=0.5, request_timeout_s=10.0)
    gw = await start_gateway(nursery, config)
    token = (await gw.create_key(name="slow", mode="live", caps={"usd_day": 10}))["token"]
    await assert_timeout_counts_the_full_estimate(gw, token, delay=2)
    gw.stop.set()


async def test_a_fault_of_ours_after_the_call_is_recorded_as_500(
    live: tuple[Gateway, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, token = live

    def broken(*_: Any) -> dict[str, Any]:
        raise RuntimeError("a bug in translating the answer back")

    monkeypatch.setattr("gateway.calls.pipeline.chat_to_response", broken)
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/responses", json={"model": "live-chat", "input": "hi", "max_output_tokens": 9}
        )
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert after["record"]["http_status"] == 500
    assert after["record"]["status"] == "failed"
    assert after["record"]["error"]["code"] == "internal_error"
    assert after["in_flight"] == 0 and after["reserved"] == 0


async def test_a_fault_of_ours_in_the_provider_call_is_recorded_as_500(
    live: tuple[Gateway, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gw, token = live

    async def broken(*_: Any) -> None:
        raise RecursionError("a bug in the provider adapter")

    monkeypatch.setattr("gateway.providers.openai.OpenAIProvider.complete", broken)
    body = body_for("hello")
    response = await call(gw, token, body)
    assert response.status_code == 500
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert after["record"]["http_status"] == 500
    assert after["record"]["error"]["code"] == "internal_error"
    assert settled(after) == cost(estimate_of(body), MAX_TOKENS) == after["spent"]
    assert after["used"] == 0 and after["in_flight"] == 0


async def test_insufficient_credits_refuses_before_the_model(
    live: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gw, _ = live
    org = (await gw.admin("POST", "/admin/orgs", {"name": "poor", "credits_usd": 0.0001})).json()
    key = await gw.create_key(name="poor", mode="live", org_id=org["id"])
    calls = upstream.calls
    response = await call(gw, key["token"], body_for("hello"))
    assert response.status_code == 402
    assert response.json()["error"]["code"] == "insufficient_credits"
    assert upstream.calls == calls, "a refused call never reaches the provider"
    async with gw.client(key["token"]) as client:
        record = await client.get(f"/v1/requests/{response.headers['X-Request-Id']}")
    assert record.status_code == 404


async def test_provider_key_comes_from_the_environment(
    live: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gw, token = live
    assert (await call(gw, token, body_for("who am i", user="end-user-7"))).status_code == 200
    assert upstream.auth[-1] == f"Bearer {UPSTREAM_KEY}"
    assert upstream.bodies[-1]["model"] == "up-chat"
    assert "user" not in upstream.bodies[-1], "user: accepted, no effect, not forwarded"


async def test_live_embeddings(live: tuple[Gateway, str]) -> None:
    gw, token = live
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/embeddings", json={"model": "live-embed", "input": ["one two", "three"]}
        )
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 2
    after = await state(gw, token, response.headers["X-Request-Id"])
    assert settled(after) == math.ceil(3 * 0.5 * 1000)


async def test_openai_client_receives_chunks_as_they_are_sent(
    live: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gw, token = live

    def stream() -> list[int]:
        sent_at_arrival = []
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token) as client:
            body = body_for("[[fault lockstep]]", stream=True)
            for chunk in client.chat.completions.create(**body):
                if chunk.choices and chunk.choices[0].delta.content:
                    sent_at_arrival.append(trio.from_thread.run_sync(upstream.ack))
        return sent_at_arrival

    with trio.fail_after(20):
        arrivals = await trio.to_thread.run_sync(stream)
    assert len(arrivals) >= 4
    # the upstream sends a word only once the client has the one before: each word
    # reaches the client while it is the last one sent (buffered, the call never ends)
    assert arrivals == list(range(1, len(arrivals) + 1))


async def test_spend_survives_a_restart(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    config = live_config(tmp_path, upstream)
    gw = await start_gateway(nursery, config)
    key = await gw.create_key(name="durable", mode="live", caps={"usd_day": 10})
    response = await call(gw, key["token"], body_for("remember me"))
    before = await state(gw, key["token"], response.headers["X-Request-Id"])
    await gw.aclose()
    again = await start_gateway(nursery, config)
    after = await state(again, key["token"], response.headers["X-Request-Id"])
    assert before["spent"] > 0
    assert after["spent"] == before["spent"]
    assert after["balance"] == before["balance"]
    assert after["record"] == before["record"]
    again.stop.set()
