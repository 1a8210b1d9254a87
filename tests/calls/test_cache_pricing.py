"""Cached input priced end to end: a live key, the official ``openai`` client, a real
gateway and the fake OpenAI upstream reporting cached and cache-written prompt tokens
(``[[fault cached=N cache_write=M]]``).

Each case checks the client's usage, the request record's usage and cost, and the key's
totals in GET /v1/usage against amounts computed here, exactly, from the configured
prices; and that the reservation is still every input token at the input price plus
the output ceiling.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import openai
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.estimate import estimate_prompt_tokens
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.fakes.fake_upstream import FakeUpstream
from tests.conftest import Gateway, make_config, start_gateway

pytestmark = pytest.mark.both_stores

IN, OUT, READ, WRITE = "3", "15", "0.3", "3.75"  # USD per million tokens
MAX_TOKENS = 40
CACHED, WRITTEN = 9, 4
TEXT = f"[[fault cached={CACHED} cache_write={WRITTEN}]] " + "please say hello " * 6


async def start_cache_priced(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> Gateway:
    """A gateway serving plain-chat and cache-chat (with cache prices) on the fake
    upstream, for live keys."""
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", "sk-upstream-cache-0123456789")
    base = make_config(tmp_path)
    provider = ProviderConfig(
        name="upstream", kind="openai", base_url=upstream.url, api_key_env="FAKE_UPSTREAM_KEY"
    )
    plain = ModelConfig(
        "plain-chat",
        "upstream",
        "up-chat",
        input_usd_per_mtok=float(IN),
        output_usd_per_mtok=float(OUT),
    )
    cached = replace(
        plain,
        id="cache-chat",
        cache_read_usd_per_mtok=float(READ),
        cache_write_usd_per_mtok=float(WRITE),
    )
    config = replace(base, providers=(*base.providers, provider), models=(plain, cached))
    return await start_gateway(nursery, config)


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    gateway = await start_cache_priced(nursery, tmp_path, upstream, monkeypatch)
    yield gateway
    gateway.stop.set()


def exact_nanos(prompt: int, cached: int, written: int, output: int, priced: bool) -> int:
    read, write = (READ, WRITE) if priced else (IN, IN)
    usd_per_mtok_x_tokens = (
        (prompt - cached - written) * Fraction(IN)
        + cached * Fraction(read)
        + written * Fraction(write)
        + output * Fraction(OUT)
    )
    return math.ceil(usd_per_mtok_x_tokens * 1000)


def nanos(usd: float) -> int:
    return round(usd * NANOS_PER_USD)


def client_of(gw: Gateway, token: str) -> openai.OpenAI:
    """The official client (the sync one, run on a thread: under trio the async one's
    stream leaves its generators to the garbage collector)."""
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=token, max_retries=0, timeout=10.0)


async def ask(
    gw: Gateway, token: str, model: str, stream: bool
) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """One chat call through the official client: the usage it saw, the request id, the
    body sent."""
    messages = [{"role": "user", "content": TEXT}]
    body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS}

    def call() -> tuple[Any, str]:
        with client_of(gw, token) as client:
            if not stream:
                raw = client.chat.completions.with_raw_response.create(**body)
                return raw.parse().usage, raw.headers["x-request-id"]
            raw = client.chat.completions.with_raw_response.create(
                **body, stream=True, stream_options={"include_usage": True}
            )
            chunks = list(raw.parse())
            return chunks[-1].usage, raw.headers["x-request-id"]

    usage, request_id = await trio.to_thread.run_sync(call)
    assert usage is not None
    return usage.model_dump(), request_id, body


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("model", ["cache-chat", "plain-chat"])
async def test_cached_tokens_are_billed_at_the_cache_prices(
    gw: Gateway, model: str, stream: bool
) -> None:
    token = (await gw.create_key(mode="live", caps={"usd_day": 10}))["token"]
    usage, request_id, body = await ask(gw, token, model, stream)
    details = usage["prompt_tokens_details"]
    assert details["cached_tokens"] == CACHED  # the client sees OpenAI's field
    prompt, output = usage["prompt_tokens"], usage["completion_tokens"]
    assert prompt > CACHED + WRITTEN and output > 0
    want = exact_nanos(prompt, CACHED, WRITTEN, output, priced=model == "cache-chat")
    async with gw.client(token) as client:
        record = (await client.get(f"/v1/requests/{request_id}")).json()
        totals = (await client.get("/v1/usage")).json()["totals"]
    assert record["usage"] == {
        "input_tokens": prompt,
        "output_tokens": output,
        "cached_input_tokens": CACHED,
        "cache_write_tokens": WRITTEN,
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
    }
    cost = record["cost"]
    assert nanos(cost["settled_usd"]) == nanos(cost["billed_usd"]) == want
    # the reservation: every estimated input token at the input price, plus the ceiling
    estimate = estimate_prompt_tokens({"messages": body["messages"]})
    reserved = exact_nanos(estimate, 0, 0, MAX_TOKENS, priced=False)
    assert nanos(cost["reserved_usd"]) == nanos(cost["estimated_usd"]) == reserved
    assert totals["input_tokens"] == prompt and totals["output_tokens"] == output
    assert totals["cached_input_tokens"] == CACHED
    assert totals["cache_write_tokens"] == WRITTEN
    assert nanos(totals["cost_usd"]) == nanos(totals["settled_usd"]) == want


async def test_a_responses_call_reports_and_bills_cached_input(gw: Gateway) -> None:
    token = (await gw.create_key(mode="live", caps={"usd_day": 10}))["token"]

    def call() -> Any:
        with client_of(gw, token) as client:
            return client.responses.with_raw_response.create(
                model="cache-chat", input=TEXT, max_output_tokens=MAX_TOKENS
            )

    raw = await trio.to_thread.run_sync(call)
    response = raw.parse()
    assert response.usage is not None
    assert response.usage.input_tokens_details.cached_tokens == CACHED
    async with gw.client(token) as client:
        record = (await client.get(f"/v1/requests/{raw.headers['x-request-id']}")).json()
    usage = record["usage"]
    assert (usage["cached_input_tokens"], usage["cache_write_tokens"]) == (CACHED, WRITTEN)
    want = exact_nanos(usage["input_tokens"], CACHED, WRITTEN, usage["output_tokens"], True)
    assert nanos(record["cost"]["billed_usd"]) == want


async def test_the_catalog_shows_the_cache_prices(gw: Gateway) -> None:
    async with gw.client() as client:
        models = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert models["cache-chat"]["pricing"] == {
        "input_usd_per_mtok": 3.0,
        "output_usd_per_mtok": 15.0,
        "cache_read_usd_per_mtok": 0.3,
        "cache_write_usd_per_mtok": 3.75,
    }
    plain = models["plain-chat"]["pricing"]
    assert plain["cache_read_usd_per_mtok"] is plain["cache_write_usd_per_mtok"] is None
