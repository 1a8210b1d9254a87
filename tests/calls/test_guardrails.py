"""Guardrails on model calls (DESIGN.md, "Guardrails"), end to end: a real gateway with
``[[guardrails]]``, the official ``openai`` and ``anthropic`` clients, and the fake
upstreams (real servers that record what they received and answer the text a test sets).

What is checked: what the provider received (redacted before it left), what the client
received (redacted across chunk boundaries; a deny that leaves no matched byte on the
wire), the money (an input deny reserves nothing and leaves no record; an output deny is
billed on the usage and recorded as blocked), the record's ``guardrails`` and the metric,
a webhook that is down (deny, or allow with ``on_error = "allow"``), a sub-key that
cannot drop its parent's guardrail, and that the matched text is in no record, log line
or metric.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import httpx
import openai
import orjson
import pytest
import trio
from click.testing import CliRunner

from gateway.cli.main import main
from gateway.config.cache import CacheConfig
from gateway.config.guardrails import GuardrailConfig
from gateway.config.settings import ModelConfig, ProviderConfig
from gateway.fakes.fake_anthropic import FakeAnthropic
from gateway.fakes.fake_guardrail_webhook import FakeWebhook
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import state
from tests.conftest import ADMIN_TOKEN, Gateway, make_config, query_db, start_gateway

T = TypeVar("T")
CARD = "4111 1111 1111 1111"
SECRET = "sk-proj-" + "Zq8Xw3Lm" * 5
CLAUDE_KEY = "sk-ant-gateway-own-key-0123456789"
#: a loopback port nothing listens on (connect refused at once)
DOWN = "http://127.0.0.1:9/check"

GUARDRAILS = (
    GuardrailConfig("pii", "pii", on="both", action="redact"),
    GuardrailConfig("no-secrets", "secrets", on="both", action="deny"),
    GuardrailConfig("acme", "regex", on="output", action="flag", patterns=("ACME-[0-9]{4}",)),
    GuardrailConfig("hook-down", "webhook", on="input", url=DOWN, timeout_s=1),
    GuardrailConfig("hook-open", "webhook", on="input", url=DOWN, timeout_s=1, on_error="allow"),
    GuardrailConfig("hook-down-out", "webhook", on="output", url=DOWN, timeout_s=1),
    GuardrailConfig(
        "hook-open-out", "webhook", on="output", url=DOWN, timeout_s=1, on_error="allow"
    ),
)


@pytest.fixture
async def claude(nursery: trio.Nursery) -> FakeAnthropic:
    fake: FakeAnthropic = await nursery.start(FakeAnthropic(keys={CLAUDE_KEY}).serve)
    return fake


@pytest.fixture
async def hook(nursery: trio.Nursery) -> FakeWebhook:
    served: FakeWebhook = await nursery.start(FakeWebhook().serve)
    return served


@pytest.fixture
async def gw(
    nursery: trio.Nursery,
    tmp_path: Path,
    upstream: FakeUpstream,
    claude: FakeAnthropic,
    hook: FakeWebhook,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("UP_KEY", "sk-upstream-0123456789")
    monkeypatch.setenv("CLAUDE_KEY", CLAUDE_KEY)
    base = make_config(tmp_path)
    up = ProviderConfig("up", "openai", base_url=upstream.url, api_key_env="UP_KEY")
    native = ProviderConfig("claude", "anthropic", base_url=claude.url, api_key_env="CLAUDE_KEY")
    prices = {"input_usd_per_mtok": 1.0, "output_usd_per_mtok": 2.0}
    models = (
        ModelConfig("gpt-live", "up", "up-chat", capabilities=("tools",), **prices),
        ModelConfig("claude-live", "claude", "claude-up", **prices),
        ModelConfig("embed-live", "up", "up-embed", kind="embedding", **prices),
    )
    config = replace(
        base,
        providers=(*base.providers, up, native),
        models=models,
        cache=CacheConfig(enabled=True, mode="all"),
        guardrails=(
            *GUARDRAILS,
            GuardrailConfig("hook-live", "webhook", on="both", url=hook.url, timeout_s=1),
            GuardrailConfig(
                "hook-stream", "webhook", on="output", url=hook.url, timeout_s=1, stream_chars=16
            ),
        ),
    )
    gateway = await start_gateway(nursery, config)
    yield gateway
    gateway.stop.set()


async def org_guardrails(gw: Gateway, *names: str) -> None:
    response = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/policy", {"guardrails": list(names)})
    assert response.status_code == 200, response.text


async def live_key(gw: Gateway, *guardrails: str, **body: Any) -> str:
    key = await gw.create_key(
        mode="live", caps={"usd_day": 100}, guardrails=list(guardrails), **body
    )
    return str(key["token"])


async def run(work: Callable[[], T]) -> T:
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(work)


def oai(gw: Gateway, token: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key=token, max_retries=0, timeout=20)


def claude_client(gw: Gateway, token: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, auth_token=token, max_retries=0, timeout=20)


def sent_text(body: dict[str, Any]) -> str:
    return orjson.dumps(body).decode()


async def raw_stream(gw: Gateway, token: str, path: str, body: dict[str, Any]) -> str:
    """A stream's bytes as they came over the wire."""
    async with (
        gw.client(token) as client,
        client.stream("POST", path, json=body) as response,
    ):
        assert response.status_code == 200, await response.aread()
        return (await response.aread()).decode()


# -- input


@pytest.mark.parametrize("stream", [False, True])
async def test_a_card_number_is_redacted_before_the_provider_sees_it(
    gw: Gateway, upstream: FakeUpstream, stream: bool
) -> None:
    token = await live_key(gw, "pii")
    words = f"pay with {CARD} please"

    def chat() -> Any:
        with oai(gw, token) as client:
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-live", messages=[{"role": "user", "content": words}], stream=stream
            )
            if stream:
                list(raw.parse())  # read to its end: the call is settled
            return raw

    raw = await run(chat)
    assert raw.http_response.status_code == 200
    sent = upstream.bodies[-1]["messages"][0]["content"]
    assert sent == "pay with [REDACTED:credit_card] please"
    record = (await state(gw, token, raw.headers["x-request-id"]))["record"]
    assert record["status"] != "blocked"
    rows = query_db(gw.runtime.config.server.db, "SELECT guardrails FROM requests")
    assert [orjson.loads(r["guardrails"]) for r in rows if r["guardrails"]] == [
        [{"name": "pii", "direction": "input", "verdict": "redact"}]
    ]


async def test_every_text_of_a_request_is_checked(gw: Gateway, upstream: FakeUpstream) -> None:
    """Messages, tool-call arguments and tool results on chat; responses ``input`` and
    ``instructions``; embeddings inputs."""
    token = await live_key(gw, "pii")
    messages = [
        {"role": "system", "content": "mail ops@example.com"},
        {"role": "user", "content": [{"type": "text", "text": f"card {CARD}"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": '{"ssn": "123-45-6789"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "ip 10.1.2.3"},
    ]
    async with gw.client(token) as client:
        answer = await client.post(
            "/v1/chat/completions", json={"model": "gpt-live", "messages": messages}
        )
        assert answer.status_code == 200, answer.text
        chat_sent = sent_text(upstream.bodies[-1])
        answer = await client.post(
            "/v1/responses",
            json={"model": "gpt-live", "instructions": "to bob@example.org", "input": CARD},
        )
        assert answer.status_code == 200, answer.text
        responses_sent = sent_text(upstream.bodies[-1])
        answer = await client.post(
            "/v1/embeddings", json={"model": "embed-live", "input": ["x", f"card {CARD}"]}
        )
        assert answer.status_code == 200, answer.text
        embeddings_sent = upstream.bodies[-1]["input"]
    for entity in ("email", "credit_card", "us_ssn", "ip_address"):
        assert f"[REDACTED:{entity}]" in chat_sent
    assert "4111" not in chat_sent and "6789" not in chat_sent and "10.1.2.3" not in chat_sent
    assert "bob@example.org" not in responses_sent and "4111" not in responses_sent
    assert embeddings_sent == ["x", "card [REDACTED:credit_card]"]


@pytest.mark.parametrize("model", ["claude-live", "gpt-live"])
async def test_a_messages_request_is_redacted_passed_through_or_translated(
    gw: Gateway, upstream: FakeUpstream, claude: FakeAnthropic, model: str
) -> None:
    token = await live_key(gw, "pii")

    def create() -> Any:
        with claude_client(gw, token) as client:
            return client.messages.create(
                model=model,
                max_tokens=32,
                system="the customer is ann@example.com",
                messages=[{"role": "user", "content": f"card {CARD}"}],
            )

    await run(create)
    sent = sent_text((claude if model == "claude-live" else upstream).bodies[-1])
    assert "ann@example.com" not in sent and "4111" not in sent
    assert "[REDACTED:email]" in sent and "[REDACTED:credit_card]" in sent


async def test_a_secret_is_denied_with_no_money_reserved_and_no_record(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    await org_guardrails(gw, "no-secrets")
    token = await live_key(gw)

    def chat() -> Any:
        with oai(gw, token) as client:
            return client.chat.completions.create(
                model="gpt-live",
                messages=[{"role": "user", "content": f"deploy with {SECRET}"}],
                stream=True,
            )

    with pytest.raises(openai.BadRequestError) as refused:
        await run(chat)
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["code"] == "content_blocked"
    decisions = refused.value.response.json()["svc"]["policy"]["decisions"]
    assert decisions == [{"rule": "guardrail", "name": "no-secrets", "verdict": "deny"}]
    assert upstream.calls == 0
    request_id = refused.value.response.headers["x-request-id"]
    after = await state(gw, token, request_id)
    assert after["record"] is None
    assert after["reserved"] == 0 and after["spent"] == 0 and after["in_flight"] == 0
    assert query_db(gw.runtime.config.server.db, "SELECT id FROM requests") == []


# -- output, without a stream


async def test_an_output_deny_is_billed_on_its_usage_and_recorded_blocked(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw, "no-secrets")
    upstream.reply = [f"here it is: {SECRET}"]
    async with gw.client(token) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-live", "messages": [{"role": "user", "content": "key?"}]},
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "content_blocked"
    assert SECRET not in answer.text and "sk-proj" not in answer.text
    after = await state(gw, token, answer.headers["x-request-id"])
    record = after["record"]
    assert record["error"] == {"code": "content_blocked"} and record["http_status"] == 400
    assert record["guardrails"] == [
        {"name": "no-secrets", "direction": "output", "verdict": "deny"}
    ]
    assert record["cost"]["billed_usd"] > 0 and after["reserved"] == 0


async def test_an_answer_is_redacted_and_flagged(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw, "pii", "acme")
    upstream.reply = [f"call +1 415-555-2671 about ACME-1234, card {CARD}"]

    def chat() -> Any:
        with oai(gw, token) as client:
            return client.chat.completions.create(
                model="gpt-live", messages=[{"role": "user", "content": "hi"}]
            )

    completion = await run(chat)
    assert completion.choices[0].message.content == (
        "call [REDACTED:phone] about ACME-1234, card [REDACTED:credit_card]"
    )
    rows = query_db(gw.runtime.config.server.db, "SELECT guardrails FROM requests")
    verdicts = orjson.loads(rows[-1]["guardrails"])
    assert {"name": "acme", "direction": "output", "verdict": "flag"} in verdicts
    assert {"name": "pii", "direction": "output", "verdict": "redact"} in verdicts


async def test_a_passed_through_anthropic_answer_is_redacted(
    gw: Gateway, claude: FakeAnthropic
) -> None:
    token = await live_key(gw, "pii")
    claude.reply = [f"write to carl@example.net, card {CARD}"]

    def create() -> Any:
        with claude_client(gw, token) as client:
            return client.messages.create(
                model="claude-live", max_tokens=32, messages=[{"role": "user", "content": "x"}]
            )

    message = await run(create)
    assert message.content[0].text == "write to [REDACTED:email], card [REDACTED:credit_card]"


# -- streams


async def test_a_redaction_split_across_chunks_is_still_redacted(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw, "pii")
    upstream.reply = ["Your card ", "4111 11", "11 1111 ", "1111 is on file; ", "thanks."]
    wire = await raw_stream(
        gw,
        token,
        "/v1/chat/completions",
        {"model": "gpt-live", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    assert "4111" not in wire and "1111" not in wire

    def chat() -> str:
        with oai(gw, token) as client:
            stream = client.chat.completions.create(
                model="gpt-live", messages=[{"role": "user", "content": "x"}], stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

    text = await run(chat)
    assert text == "Your card [REDACTED:credit_card] is on file; thanks."


@pytest.mark.parametrize("model", ["claude-live", "gpt-live"])
async def test_a_messages_stream_is_redacted_across_events(
    gw: Gateway, upstream: FakeUpstream, claude: FakeAnthropic, model: str
) -> None:
    token = await live_key(gw, "pii")
    pieces = ["mail me at jo", "e.bloggs@exa", "mple.com today"]
    claude.reply = upstream.reply = pieces
    assert await run(messages_stream(gw, token, model)) == "mail me at [REDACTED:email] today"


def messages_stream(gw: Gateway, token: str, model: str) -> Callable[[], str]:
    """A streamed Messages call by the anthropic client: the text it received."""

    def streamed() -> str:
        with (
            claude_client(gw, token) as client,
            client.messages.stream(
                model=model, max_tokens=32, messages=[{"role": "user", "content": "x"}]
            ) as stream,
        ):
            return "".join(stream.text_stream)

    return streamed


async def test_an_output_deny_mid_stream_leaves_no_matched_byte_on_the_wire(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw, "no-secrets")
    opening = "Here is the configuration you asked for, with every value filled in. " * 2
    upstream.reply = [opening, "key = sk-pr", "oj-" + "Zq8Xw3Lm" * 5, " done"]
    wire = await raw_stream(
        gw,
        token,
        "/v1/chat/completions",
        {"model": "gpt-live", "messages": [{"role": "user", "content": "x"}], "stream": True},
    )
    assert "Here is the configuration" in wire  # the stream had started
    assert "sk-" not in wire and "Zq8Xw3Lm" not in wire
    assert '"code":"content_blocked"' in wire and wire.endswith("data: [DONE]\n\n")
    with trio.fail_after(10):  # settled once the upstream's usage was read
        await gw.runtime.inflight.wait_settled()
    rows = query_db(gw.runtime.config.server.db, "SELECT error_code, guardrails FROM requests")
    assert rows[-1]["error_code"] == "content_blocked"
    assert orjson.loads(rows[-1]["guardrails"]) == [
        {"name": "no-secrets", "direction": "output", "verdict": "deny"}
    ]


async def test_a_responses_stream_deny_is_an_in_band_failure(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw, "no-secrets")
    upstream.reply = ["x" * 100, f" {SECRET} ", "end"]
    wire = await raw_stream(
        gw, token, "/v1/responses", {"model": "gpt-live", "input": "x", "stream": True}
    )
    assert "sk-proj" not in wire and "content_blocked" in wire
    assert "event: response.failed" in wire


# -- webhooks


async def test_a_webhook_that_is_down_denies(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw, "hook-down")
    async with gw.client(token) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-live", "messages": [{"role": "user", "content": "hello"}]},
        )
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "content_blocked"
    assert answer.json()["svc"]["policy"]["decisions"][0]["name"] == "hook-down"
    assert upstream.calls == 0


async def test_a_webhook_that_is_down_allows_with_on_error_allow(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw, "hook-open")
    async with gw.client(token) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-live", "messages": [{"role": "user", "content": "hello"}]},
        )
    assert answer.status_code == 200, answer.text
    assert upstream.calls == 1


async def test_a_webhook_decides_allow_deny_redact_and_a_late_one_denies(
    gw: Gateway, upstream: FakeUpstream, hook: FakeWebhook
) -> None:
    token = await live_key(gw, "hook-live")

    async def ask(words: str) -> httpx.Response:
        async with gw.client(token) as client:
            return await client.post(
                "/v1/chat/completions",
                json={"model": "gpt-live", "messages": [{"role": "user", "content": words}]},
            )

    assert (await ask("fine")).status_code == 200
    assert hook.received[0] == {"guardrail": "hook-live", "direction": "input", "texts": ["fine"]}
    assert hook.received[1]["direction"] == "output"
    assert (await ask("please hush now")).status_code == 200
    assert upstream.bodies[-1]["messages"][0]["content"] == "please *** now"
    for words in ("forbidden words", "slow answer"):
        refused = await ask(words)
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["code"] == "content_blocked"
    assert upstream.calls == 2


# -- webhooks on streams


def chat_stream(gw: Gateway, token: str) -> Callable[[], str]:
    """A streamed chat call by the openai client: the text it received."""

    def stream() -> str:
        with oai(gw, token) as client:
            chunks = client.chat.completions.create(
                model="gpt-live", messages=[{"role": "user", "content": "x"}], stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    return stream


async def test_a_stream_under_an_output_webhook_leaves_in_allowed_segments(
    gw: Gateway, upstream: FakeUpstream, hook: FakeWebhook
) -> None:
    """``stream_chars = 16``: the held text goes to the webhook each time it reaches 16
    characters, and at the end; every character leaves after the verdict on it."""
    token = await live_key(gw, "hook-stream")
    upstream.reply = ["The answer ", "is forty", "-two, ", "as it ", "always ", "was."]
    assert await run(chat_stream(gw, token)) == "".join(upstream.reply)
    sent = [payload["texts"] for payload in hook.received]
    assert all(payload["direction"] == "output" for payload in hook.received)
    assert ["".join(texts) for texts in sent] == [
        "The answer is forty",
        "-two, as it always ",
        "was.",
    ]
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()
    rows = query_db(gw.runtime.config.server.db, "SELECT guardrails FROM requests")
    assert rows[-1]["guardrails"] is None  # allowed: nothing to name


async def test_an_output_webhook_deny_mid_stream_leaves_no_held_byte_and_bills_the_usage(
    gw: Gateway, upstream: FakeUpstream, hook: FakeWebhook
) -> None:
    token = await live_key(gw, "hook-stream")
    upstream.reply = ["Some text that is safe to say. ", "It is forbidden", " to go on."]
    async with gw.client(token) as client, client.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": "gpt-live", "messages": [{"role": "user", "content": "x"}],
              "stream": True},
    ) as response:  # fmt: skip
        assert response.status_code == 200
        wire = (await response.aread()).decode()
        request_id = response.headers["x-request-id"]
    assert "safe to say" in wire and "forbidden" not in wire and "go on" not in wire
    assert '"code":"content_blocked"' in wire and wire.endswith("data: [DONE]\n\n")
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()
    record = (await state(gw, token, request_id))["record"]
    assert record["error"] == {"code": "content_blocked"}
    assert record["guardrails"] == [
        {"name": "hook-stream", "direction": "output", "verdict": "deny"}
    ]
    assert record["usage"]["completion_tokens"] > 0
    assert record["cost"]["billed_usd"] == record["cost"]["settled_usd"] > 0


@pytest.mark.parametrize("model", ["claude-live", "gpt-live"])
async def test_an_output_webhook_redacts_a_messages_stream(
    gw: Gateway, upstream: FakeUpstream, claude: FakeAnthropic, model: str
) -> None:
    """Passed through (Anthropic's events) or translated (chat chunks): the pieces of a
    text held together go to the webhook joined; its redaction is what leaves."""
    token = await live_key(gw, "hook-live")
    claude.reply = upstream.reply = ["please ", "hu", "sh", " now"]
    assert await run(messages_stream(gw, token, model)) == "please *** now"
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()
    rows = query_db(gw.runtime.config.server.db, "SELECT guardrails FROM requests")
    assert orjson.loads(rows[-1]["guardrails"]) == [
        {"name": "hook-live", "direction": "output", "verdict": "redact"}
    ]


async def test_an_output_webhook_that_is_down_denies_a_stream_and_allows_with_on_error_allow(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    upstream.reply = ["a short answer"]
    closed, open_ = await live_key(gw, "hook-down-out"), await live_key(gw, "hook-open-out")
    body = {"model": "gpt-live", "messages": [{"role": "user", "content": "x"}], "stream": True}
    async with gw.client(closed) as client:
        refused = await client.post("/v1/chat/completions", json=body)
    # nothing left before the verdict: the stream's refusal is a plain 400
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "content_blocked"
    assert "short answer" not in refused.text
    assert refused.json()["svc"]["policy"]["decisions"][0]["name"] == "hook-down-out"
    assert await run(chat_stream(gw, open_)) == "a short answer"


# -- keys


async def test_a_sub_key_cannot_drop_its_parent_guardrail(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    parent = await live_key(gw, "no-secrets", keys_manage=True)
    async with gw.client(parent) as client:
        made = await client.post("/v1/keys", json={"name": "child", "guardrails": ["pii"]})
        assert made.status_code == 201, made.text
        assert made.json()["guardrails"] == ["no-secrets", "pii"]
        child = made.json()["token"]
        unknown = await client.post("/v1/keys", json={"name": "c2", "guardrails": ["nope"]})
        assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "guardrails"
    async with gw.client(child) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-live", "messages": [{"role": "user", "content": SECRET}]},
        )
    assert answer.status_code == 400 and answer.json()["error"]["code"] == "content_blocked"
    assert upstream.calls == 0


async def test_unknown_guardrail_names_are_refused(gw: Gateway) -> None:
    policy = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/policy", {"guardrails": ["x"]})
    assert policy.status_code == 400 and "Unknown guardrail" in policy.text
    key = await gw.admin(
        "POST", "/admin/keys", {"org_id": gw.org_id, "name": "k", "guardrails": ["x"]}
    )
    assert key.status_code == 400 and key.json()["error"]["param"] == "guardrails"


# -- nothing matched is kept


async def test_nothing_matched_is_in_the_database_logs_or_metrics(
    gw: Gateway, upstream: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = await live_key(gw, "pii", "no-secrets")
    upstream.reply = ["Sure, ", "4111 1111 ", "1111 1111 noted."]
    async with gw.client(token) as client:
        for stream in (False, True):
            body = {
                "model": "gpt-live",
                "messages": [{"role": "user", "content": f"card {CARD}"}],
                "stream": stream,
            }
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200
            assert "4111" not in answer.text
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "gpt-live", "messages": [{"role": "user", "content": SECRET}]},
        )
        assert answer.status_code == 400
    async with httpx.AsyncClient(base_url=gw.url) as client:
        metrics = (await client.get("/metrics")).text
    assert 'svc_guardrail_verdicts_total{direction="input",guardrail="pii",verdict="redact"}' in (
        metrics
    )
    assert 'guardrail="no-secrets",verdict="deny"' in metrics
    # the stream's output passed the secrets guardrail: an allow, counted at its end
    assert 'direction="output",guardrail="no-secrets",verdict="allow"} 2.0' in metrics
    gw.runtime.store.close()
    data = Path(gw.runtime.config.server.db).read_bytes()
    for matched in (b"4111", SECRET.encode(), b"Zq8Xw3Lm"):
        assert matched not in data
        assert matched.decode() not in metrics
        assert matched.decode() not in caplog.text


async def test_cli_key_create_takes_repeatable_guardrails(
    gw: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SVC_ADMIN_TOKEN", ADMIN_TOKEN)
    args = ["key", "create", "--org", gw.org_id, "--name", "g", "--mode", "sandbox"]
    args += ["--guardrail", "pii", "--guardrail", "acme", "--url", gw.url, "--json"]

    def invoke() -> Any:
        return CliRunner().invoke(main, args)

    result = await run(invoke)
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.output)["guardrails"] == ["pii", "acme"]


@pytest.mark.parametrize("model", ["claude-live", "gpt-live"])
async def test_a_messages_stream_deny_ends_with_an_error_event(
    gw: Gateway, upstream: FakeUpstream, claude: FakeAnthropic, model: str
) -> None:
    token = await live_key(gw, "no-secrets")
    claude.reply = upstream.reply = ["y" * 100, " key sk-pr", "oj-" + "Zq8Xw3Lm" * 5, " end"]
    body = {
        "model": model,
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    wire = await raw_stream(gw, token, "/v1/messages", body)
    assert "y" * 20 in wire and "sk-" not in wire and "Zq8Xw3Lm" not in wire
    assert wire.rstrip().split("\n\n")[-1].startswith("event: error")
    assert '"code":"content_blocked"' in wire

    def refused() -> Any:
        with claude_client(gw, token) as client:
            return client.messages.create(
                model=model, max_tokens=8, messages=[{"role": "user", "content": SECRET}]
            )

    with pytest.raises(anthropic.BadRequestError) as denied:
        await run(refused)
    assert denied.value.response.json()["svc"]["policy"]["decisions"][0]["name"] == "no-secrets"


async def test_a_guarded_call_neither_reads_nor_stores_the_response_cache(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """An unguarded key's answer is cached (the second call is a hit); a key with
    guardrails asks the provider each time and stores nothing."""
    body = {"model": "gpt-live", "messages": [{"role": "user", "content": "same question"}]}
    plain, guarded = await live_key(gw), await live_key(gw, "pii")
    async with gw.client(plain) as client:
        await client.post("/v1/chat/completions", json=body)
        hit = await client.post("/v1/chat/completions", json=body)
    assert hit.headers["x-svc-cache"] == "hit" and upstream.calls == 1
    async with gw.client(guarded) as client:
        for _ in range(2):
            answer = await client.post("/v1/chat/completions", json=body)
            assert answer.status_code == 200 and answer.headers.get("x-svc-cache") != "hit"
    assert upstream.calls == 3


async def test_an_output_webhook_deny_on_a_passed_through_stream_bills_the_whole_usage(
    gw: Gateway, claude: FakeAnthropic
) -> None:
    """Anthropic's events passed through, denied at the first check (nothing left: a plain
    400): the usage is read from ``message_start`` (held with the denied text) and
    ``message_delta`` (after it); the denied call's is its twin's, a key without
    guardrails."""
    claude.reply = ["It is forbidden", " to go on."]
    body = {
        "model": "claude-live",
        "max_tokens": 64,
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    plain, guarded = await live_key(gw), await live_key(gw, "hook-stream")
    assert "forbidden" in await raw_stream(gw, plain, "/v1/messages", body)
    async with gw.client(guarded) as client:
        refused = await client.post("/v1/messages", json=body)
    assert refused.status_code == 400 and "forbidden" not in refused.text
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert refused.json()["svc"]["policy"]["decisions"][0]["name"] == "hook-stream"
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()
    twin, denied = query_db(
        gw.runtime.config.server.db,
        "SELECT usage, settled_usd_nanos, billed_usd_nanos, error_code, http_status"
        " FROM requests ORDER BY created",
    )
    assert denied["error_code"] == "content_blocked" and denied["http_status"] == 400
    assert denied["usage"] == twin["usage"] and orjson.loads(denied["usage"])["prompt_tokens"]
    assert denied["settled_usd_nanos"] == denied["billed_usd_nanos"] == twin["billed_usd_nanos"]
