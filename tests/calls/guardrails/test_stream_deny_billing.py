"""An output deny in a stream, billed on the provider's usage (DESIGN.md, "Guardrails";
issue 45, point 4): for every endpoint that streams (chat completions, responses,
``/v1/messages``) and every provider kind that streams usage, through the fake upstreams
(real servers) and the official ``openai`` and ``anthropic`` clients.

Each case streams the same answer twice: for a key without guardrails (the twin: its
record is settled on the usage the provider reported) and for a key whose ``secrets``
guardrail denies it mid-stream. The denied call's client gets the in-band
``content_blocked`` error and no byte of the secret; its record has the twin's usage,
``settled_usd = usage × price`` (billed, the key is live), the error ``content_blocked``
and the guardrail's deny verdict; and the secret is nowhere in the database.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import anthropic
import openai
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.config.guardrails import GuardrailConfig
from gateway.config.settings import Config, ModelConfig, ProviderConfig
from gateway.fakes.fake_anthropic import FakeAnthropic
from gateway.fakes.fake_azure import FakeAzure
from gateway.fakes.fake_bedrock import FakeBedrock
from gateway.fakes.fake_gemini import FakeGemini
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_bedrock_calls import record_of
from tests.calls.test_guardrails import claude_client, oai, run
from tests.conftest import Gateway, make_config, start_gateway

IN_PRICE, OUT_PRICE = 3.0, 15.0  # USD per million tokens
SECRET = "sk-proj-" + "Zq8Xw3Lm" * 5
OPENING = "Here is the configuration you asked for, with every value filled in. " * 2
#: the answer: a secret after some text that leaves, then more text after it
REPLY = [OPENING, "key = sk-pr", SECRET.removeprefix("sk-pr"), " and that is all", " folks."]
KEYS = {
    "UP_KEY": "sk-upstream-0123456789",
    "CLAUDE_KEY": "sk-ant-gateway-own-key-0123456789",
    "AZURE_KEY": "4f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "GEMINI_KEY": "gemini.own.credential~42",
    "AWS_ACCESS_KEY_ID": "AKIAGATEWAYBEDROCK01",
    "AWS_SECRET_ACCESS_KEY": "gw/Secret+Access/Key0123456789abcdefghijK",
}
KINDS = ("openai", "azure", "anthropic", "bedrock", "gemini")
ENDPOINTS = ("chat", "responses", "messages")


@dataclass
class Upstreams:
    """One fake of each provider kind, each answering :data:`REPLY`."""

    openai: FakeUpstream
    azure: FakeAzure
    anthropic: FakeAnthropic
    bedrock: FakeBedrock
    gemini: FakeGemini


@pytest.fixture
async def fakes(nursery: trio.Nursery) -> Upstreams:
    azure = FakeAzure(keys=frozenset({KEYS["AZURE_KEY"]}), deployments=frozenset({"gpt-prod"}))
    aws: dict[str, tuple[str, str | None]] = {
        KEYS["AWS_ACCESS_KEY_ID"]: (KEYS["AWS_SECRET_ACCESS_KEY"], None)
    }
    started = Upstreams(
        await nursery.start(FakeUpstream().serve),
        await nursery.start(azure.serve),
        await nursery.start(FakeAnthropic(keys={KEYS["CLAUDE_KEY"]}).serve),
        await nursery.start(FakeBedrock(credentials=aws, region="eu-west-1").serve),
        await nursery.start(FakeGemini(KEYS["GEMINI_KEY"]).serve),
    )
    for kind in KINDS:
        getattr(started, kind).reply = list(REPLY)
    return started


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, fakes: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(nursery, kinds_config(tmp_path, fakes, monkeypatch, 15.0))
    yield gateway
    gateway.stop.set()


def kinds_config(
    tmp_path: Path, fakes: Upstreams, monkeypatch: pytest.MonkeyPatch, timeout_s: float
) -> Config:
    """A model on each fake, the ``no-secrets`` guardrail denying answers."""
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    base = make_config(tmp_path, request_timeout_s=timeout_s)
    providers = (
        ProviderConfig("openai", "openai", base_url=fakes.openai.url, api_key_env="UP_KEY"),
        ProviderConfig("azure", "azure", base_url=fakes.azure.endpoint, api_key_env="AZURE_KEY"),
        ProviderConfig(
            "anthropic", "anthropic", base_url=fakes.anthropic.url, api_key_env="CLAUDE_KEY"
        ),
        ProviderConfig("bedrock", "bedrock", base_url=fakes.bedrock.url, region="eu-west-1"),
        ProviderConfig("gemini", "gemini", base_url=fakes.gemini.url, api_key_env="GEMINI_KEY"),
    )
    upstream_ids = {
        "openai": "up-chat",
        "azure": "gpt-prod",
        "anthropic": "claude-up",
        "bedrock": "anthropic.claude-3-5-sonnet-20240620-v1:0",
        "gemini": "gemini-2.5-flash",
    }
    models = tuple(
        ModelConfig(
            f"{kind}-model",
            kind,
            upstream_ids[kind],
            input_usd_per_mtok=IN_PRICE,
            output_usd_per_mtok=OUT_PRICE,
        )
        for kind in KINDS
    )
    return replace(
        base,
        providers=(*base.providers, *providers),
        models=models,
        guardrails=(GuardrailConfig("no-secrets", "secrets", on="output", action="deny"),),
    )


@dataclass
class Streamed:
    """What a client made of a stream: the text it received, the error that ended it
    (its code; None: the stream ended well) and the call's request id."""

    text: str
    error: str | None
    request_id: str


def chat(client: openai.OpenAI, model: str, words: str) -> Streamed:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": words}], stream=True
    )
    text, error = "", None
    try:
        for chunk in raw.parse():
            text += "".join(choice.delta.content or "" for choice in chunk.choices)
    except openai.APIError as exc:
        error = exc.code
    return Streamed(text, error, raw.headers["x-request-id"])


def responses(client: openai.OpenAI, model: str, words: str) -> Streamed:
    raw = client.responses.with_raw_response.create(model=model, input=words, stream=True)
    text, error = "", None
    for event in raw.parse():
        if event.type == "response.output_text.delta":
            text += event.delta
        elif event.type == "response.failed":
            assert event.response.error is not None
            error = event.response.error.code
    return Streamed(text, error, raw.headers["x-request-id"])


def messages(client: anthropic.Anthropic, model: str, words: str) -> Streamed:
    raw = client.messages.with_raw_response.create(
        model=model,
        max_tokens=64,
        messages=[{"role": "user", "content": words}],
        stream=True,
    )
    text, error = "", None
    try:
        for event in raw.parse():
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text += event.delta.text
    except anthropic.APIStatusError as exc:
        assert isinstance(exc.body, dict)
        error = exc.body["error"]["code"]
    return Streamed(text, error, raw.headers["x-request-id"])


async def stream(
    gw: Gateway, token: str, endpoint: str, model: str, words: str = "the config?"
) -> Streamed:
    def call() -> Streamed:
        if endpoint == "messages":
            with claude_client(gw, token) as claude:
                return messages(claude, model, words)
        with oai(gw, token) as client:
            use: Callable[[openai.OpenAI, str, str], Streamed] = (
                chat if endpoint == "chat" else responses
            )
            return use(client, model, words)

    return await run(call)


def nanos(usd: float) -> int:
    return round(usd * NANOS_PER_USD)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_stream_denied_mid_way_is_billed_on_the_provider_usage(
    gw: Gateway, kind: str
) -> None:
    model = f"{kind}-model"
    plain = str((await gw.create_key(mode="live", caps={"usd_day": 100}))["token"])
    guarded = await gw.create_key(mode="live", caps={"usd_day": 100}, guardrails=["no-secrets"])
    token = str(guarded["token"])
    for endpoint in ENDPOINTS:
        twin = await stream(gw, plain, endpoint, model)
        assert twin.error is None and SECRET in twin.text, (endpoint, twin)
        reported = (await record_of(gw, plain, twin.request_id))["usage"]
        assert reported["completion_tokens"] > 0, (endpoint, reported)

        denied = await stream(gw, token, endpoint, model)
        assert denied.error == "content_blocked", (endpoint, denied)
        # the stream had started: what left is the answer's opening (the window holds
        # back the last characters before the secret)
        assert "Here is the configuration" in denied.text, (endpoint, denied.text)
        assert "".join(REPLY).startswith(denied.text), (endpoint, denied.text)
        assert "sk-" not in denied.text and "Zq8Xw3Lm" not in denied.text
        # the client's stream ended at the deny; the upstream is read on to its usage
        with trio.fail_after(10):
            await gw.runtime.inflight.wait_settled()
        blocked = await record_of(gw, token, denied.request_id)
        assert blocked["status"] == "failed" and blocked["error"] == {"code": "content_blocked"}
        assert blocked["guardrails"] == [
            {"name": "no-secrets", "direction": "output", "verdict": "deny"}
        ]
        usage = blocked["usage"]
        assert usage == reported, endpoint
        price = math.ceil(
            (usage["prompt_tokens"] * IN_PRICE + usage["completion_tokens"] * OUT_PRICE) * 1000
        )
        assert nanos(blocked["cost"]["settled_usd"]) == price, (endpoint, blocked["cost"])
        assert nanos(blocked["cost"]["billed_usd"]) == price
        assert nanos(blocked["cost"]["reserved_usd"]) > price
    async with gw.client(token) as client:
        key = (await client.get("/v1/key")).json()
    assert key["usage"]["day"]["reserved_usd"] == 0 and key["rate_limit"]["in_flight"] == 0
    gw.runtime.store.close()
    for path in Path(gw.runtime.config.server.db).parent.iterdir():
        if path.is_file():
            assert b"Zq8Xw3Lm" not in path.read_bytes(), path.name


async def guarded_key(gw: Gateway) -> str:
    key = await gw.create_key(mode="live", caps={"usd_day": 100}, guardrails=["no-secrets"])
    return str(key["token"])


@pytest.mark.parametrize("endpoint", ENDPOINTS)
async def test_an_upstream_that_dies_after_the_deny_settles_as_a_stream_ended_early(
    gw: Gateway, endpoint: str
) -> None:
    """The upstream is cut after the secret and before its usage: no usage to bill, so
    the row of a stream that ended early (output streamed: the full reservation counts
    against the caps, nothing billed); the record still says why the stream ended."""
    token = await guarded_key(gw)
    denied = await stream(gw, token, endpoint, "openai-model", "[[fault drop_after=5]]")
    assert denied.error == "content_blocked" and "Zq8Xw3Lm" not in denied.text
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()
    blocked = await record_of(gw, token, denied.request_id)
    assert blocked["error"] == {"code": "content_blocked"} and blocked["usage"] is None
    assert blocked["guardrails"] == [
        {"name": "no-secrets", "direction": "output", "verdict": "deny"}
    ]
    cost = blocked["cost"]
    assert cost["settled_usd"] == cost["reserved_usd"] > 0 and cost["billed_usd"] == 0


async def test_after_a_deny_the_upstream_is_read_on_only_until_the_deadline(
    nursery: trio.Nursery, tmp_path: Path, fakes: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upstream that stalls after the secret: the client's stream ended at the deny
    (it does not wait), and the call's deadline ends the reading; settled as a stream that
    ended early, the record saying content_blocked, not request_timeout."""
    gw = await start_gateway(nursery, kinds_config(tmp_path, fakes, monkeypatch, 2.0))
    token = await guarded_key(gw)
    denied = await stream(gw, token, "chat", "openai-model", "[[fault stall_after=5]]")
    assert denied.error == "content_blocked" and "Zq8Xw3Lm" not in denied.text
    assert len(gw.runtime.inflight) == 1  # told at the deny, the call still reading on
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()
    blocked = await record_of(gw, token, denied.request_id)
    assert blocked["error"] == {"code": "content_blocked"} and blocked["usage"] is None
    assert blocked["cost"]["settled_usd"] == blocked["cost"]["reserved_usd"]
    gw.stop.set()
