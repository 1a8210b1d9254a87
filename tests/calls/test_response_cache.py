"""The response cache (DESIGN.md "Response cache"), through the official clients, against
the fake upstream: what is a hit, what it costs (nothing), what is never stored, and
identical calls at once making one provider call."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import anthropic
import openai
import pytest
import trio
import trio.testing

from gateway.accounts.catalog import NANOS_PER_USD, nanos_to_usd
from gateway.config.cache import CacheConfig
from gateway.config.settings import Config, ModelConfig, ProviderConfig
from gateway.edge.dashboard.format import exact
from gateway.fakes.fake_upstream import FakeUpstream
from gateway.store import cache_entries
from shards import FakeClock
from tests.calls.test_anthropic_calls import with_client
from tests.conftest import Gateway, make_config, query_db, start_gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, signed_in
from tests.support.waiting import until

pytestmark = pytest.mark.both_stores

T = TypeVar("T")
IN_PRICE, OUT_PRICE = 3.0, 15.0
UPSTREAM_KEY = "sk-upstream-cache-0123456789"


def cache_config(tmp_path: Path, upstream: FakeUpstream, **cache: Any) -> Config:
    base = make_config(tmp_path)
    provider = ProviderConfig(
        name="upstream",
        kind="openai",
        base_url=upstream.url,
        api_key_env="FAKE_UPSTREAM_KEY",
        zero_retention=True,
    )
    chat = ModelConfig(
        "live-chat",
        "upstream",
        "up-chat",
        capabilities=("tools", "structured_output"),
        zero_retention_available=True,
        input_usd_per_mtok=IN_PRICE,
        output_usd_per_mtok=OUT_PRICE,
    )
    other = replace(chat, id="live-chat-2", upstream_id="up-chat-2")
    embed = ModelConfig("live-embed", "upstream", "up-embed", "embedding", input_usd_per_mtok=0.5)
    return replace(
        base,
        providers=(*base.providers, provider),
        models=(chat, other, replace(embed, output_usd_per_mtok=0.0)),
        cache=replace(CacheConfig(enabled=True), **cache),
    )


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gateway = await start_gateway(nursery, cache_config(tmp_path, upstream))
    yield gateway
    gateway.stop.set()


async def live_key(gw: Gateway, **body: Any) -> str:
    body.setdefault("caps", {"usd_day": 10, "rpm": 1000, "max_in_flight": 100})
    key = await gw.create_key(name="cached", mode="live", **body)
    return str(key["token"])


def client(gw: Gateway, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(api_key=token, base_url=gw.url + "/v1", max_retries=0)


def ask(text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": "live-chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 50,
        "temperature": 0,
        **extra,
    }


async def chat(gw: Gateway, token: str, **body: Any) -> tuple[Any, dict[str, str]]:
    async with client(gw, token) as oa:
        raw = await oa.chat.completions.with_raw_response.create(**body)
        return raw.parse(), dict(raw.headers)


async def money(gw: Gateway, token: str, request_id: str) -> dict[str, Any]:
    async with gw.client(token) as http:
        record = (await http.get(f"/v1/requests/{request_id}")).json()
        key = (await http.get("/v1/key")).json()
        credits = (await http.get("/v1/credits")).json()
    return {
        "record": record,
        "spent": round(key["usage"]["day"]["spent_usd"] * NANOS_PER_USD),
        "reserved": key["usage"]["day"]["reserved_usd"],
        "in_flight": key["rate_limit"]["in_flight"],
        "used": round(credits["used_usd"] * NANOS_PER_USD),
    }


def entries(gw: Gateway) -> list[dict[str, Any]]:
    return query_db(gw.runtime.config.server.db, "SELECT * FROM cache_entries")


async def at_once(gw: Gateway, upstream: FakeUpstream, count: int, one: Callable[[], Any]) -> None:
    """``count`` calls of ``one`` at once, the upstream holding the first until every
    call is in flight and parked."""
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
            await upstream.received(1)
            await until(lambda: len(gw.runtime.inflight) == count, within=10)
            await trio.testing.wait_all_tasks_blocked(0.05)
            upstream.release.set()


def cost(usage: Any) -> int:
    return math.ceil((usage.prompt_tokens * IN_PRICE + usage.completion_tokens * OUT_PRICE) * 1000)


async def test_a_second_identical_call_is_a_hit_that_costs_nothing(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    first, first_headers = await chat(gw, token, **ask())
    second, headers = await chat(gw, token, **ask())
    assert first_headers["x-svc-cache"] == "miss" and headers["x-svc-cache"] == "hit"
    assert upstream.calls == 1
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.usage == first.usage
    original, hit_id = first_headers["x-request-id"], headers["x-request-id"]
    assert hit_id != original
    after = await money(gw, token, hit_id)
    record = after["record"]
    assert record["cache"] == "hit" and record["cache_of"] == original
    assert record["cost"]["settled_usd"] == 0 and record["cost"]["billed_usd"] == 0
    assert record["status"] == "succeeded"
    # what the key spent and the organisation was debited: the original, once
    assert after["spent"] == cost(first.usage) == after["used"]
    assert after["reserved"] == 0 and after["in_flight"] == 0
    assert round(record["saved_usd"] * NANOS_PER_USD) == cost(first.usage)
    miss = (await money(gw, token, original))["record"]
    assert miss["cache"] == "miss"
    exposition = gw.runtime.metrics.exposition().decode()
    assert 'svc_cache_requests_total{result="hit"} 1.0' in exposition
    assert 'svc_cache_requests_total{result="miss"} 1.0' in exposition


CHANGED = {
    "temperature": {"temperature": 0, "seed": 7},
    "a message": {"messages": [{"role": "user", "content": "hello here"}]},
    "the model": {"model": "live-chat-2"},
    "tools": {
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    },
    "response_format": {"response_format": {"type": "json_object"}},
    "max_tokens": {"max_tokens": 49},
}


@pytest.mark.parametrize("field", sorted(CHANGED))
async def test_one_changed_field_is_a_miss(gw: Gateway, upstream: FakeUpstream, field: str) -> None:
    token = await live_key(gw)
    await chat(gw, token, **ask())
    _, headers = await chat(gw, token, **{**ask(), **CHANGED[field]})
    assert headers["x-svc-cache"] == "miss"
    assert upstream.calls == 2


async def test_tags_user_and_metadata_are_not_keyed(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    await chat(gw, token, **ask(), user="a")
    _, headers = await chat(gw, token, **ask(), user="b", extra_headers={"X-Svc-Tags": "team=x"})
    assert headers["x-svc-cache"] == "hit" and upstream.calls == 1


async def test_another_organisation_never_hits(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    org = (await gw.admin("POST", "/admin/orgs", {"name": "other", "credits_usd": 10})).json()
    other = await live_key(gw, org_id=org["id"])
    await chat(gw, token, **ask())
    _, headers = await chat(gw, other, **ask())
    assert headers["x-svc-cache"] == "miss" and upstream.calls == 2
    _, again = await chat(gw, other, **ask())
    assert again["x-svc-cache"] == "hit" and upstream.calls == 2


async def test_zero_retention_is_never_stored(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw, data_mode="zero_retention")
    for _ in range(2):
        _, headers = await chat(gw, token, **ask())
        assert headers["x-svc-cache"] == "bypass"
    assert upstream.calls == 2 and entries(gw) == []


async def test_not_deterministic_and_no_store_bypass_no_cache_refreshes(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    _, headers = await chat(gw, token, **{**ask(), "temperature": 0.7})
    assert headers["x-svc-cache"] == "bypass"
    _, headers = await chat(gw, token, **ask(), extra_headers={"Cache-Control": "no-store"})
    assert headers["x-svc-cache"] == "bypass"
    _, headers = await chat(gw, token, **ask(), extra_headers={"Cache-Control": "no-cache"})
    assert headers["x-svc-cache"] == "miss"  # not served from the cache, but stored
    _, headers = await chat(gw, token, **ask())
    assert headers["x-svc-cache"] == "hit"
    assert upstream.calls == 3


async def test_an_upstream_failure_is_never_cached(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await chat(gw, token, **ask("[[fault status=500]]"))
    assert upstream.calls == 2 and entries(gw) == []


async def test_fifty_identical_calls_at_once_make_one_upstream_call(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    answers: list[tuple[str, str]] = []

    async def one() -> None:
        reply, headers = await chat(gw, token, **ask("[[fault hold]] same"))
        answers.append((headers["x-svc-cache"], reply.choices[0].message.content or ""))

    await at_once(gw, upstream, 50, one)
    assert upstream.calls == 1
    assert sorted(result for result, _ in answers) == ["hit"] * 49 + ["miss"]
    assert len({text for _, text in answers}) == 1


async def test_waiters_make_their_own_calls_when_the_first_fails(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    statuses: list[int] = []

    async def one() -> None:
        try:
            await chat(gw, token, **ask("[[fault hold status=500]]"))
            statuses.append(200)
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)

    await at_once(gw, upstream, 5, one)
    assert upstream.calls == 5, "no error fan-out: each waiter asked for itself"
    assert statuses == [503] * 5


async def stream_chunks(gw: Gateway, token: str, **body: Any) -> tuple[list[Any], str, str]:
    def run(oa: openai.OpenAI) -> tuple[list[Any], str, str]:
        raw = oa.chat.completions.with_raw_response.create(
            **body, stream=True, stream_options={"include_usage": True}
        )
        return list(raw.parse()), raw.headers["x-svc-cache"], raw.headers["x-request-id"]

    return await with_client(gw, token, run)


def deltas(chunks: list[Any]) -> list[str]:
    return [c.choices[0].delta.content or "" for c in chunks if c.choices]


async def test_a_streamed_hit_replays_the_chunks_with_usage(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    first, result, original = await stream_chunks(gw, token, **ask())
    second, again, hit_id = await stream_chunks(gw, token, **ask())
    assert (result, again) == ("miss", "hit") and upstream.calls == 1
    assert len(deltas(first)) > 2 and deltas(second) == deltas(first)
    assert second[-1].usage == first[-1].usage and second[-1].usage is not None
    after = await money(gw, token, hit_id)
    assert after["record"]["cache_of"] == original and after["record"]["stream"] is True
    assert after["record"]["cost"]["settled_usd"] == 0
    # the stream and the call without one share the entry
    reply, headers = await chat(gw, token, **ask())
    assert headers["x-svc-cache"] == "hit" and upstream.calls == 1
    assert reply.choices[0].message.content == "".join(deltas(first))


async def test_a_stream_cut_short_is_not_stored(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    with pytest.raises(openai.APIError):
        await stream_chunks(gw, token, **ask("[[fault drop_after=2]]"))
    assert entries(gw) == []


async def test_a_non_streamed_original_replays_as_a_stream(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    reply, _ = await chat(gw, token, **ask())
    chunks, result, _ = await stream_chunks(gw, token, **ask())
    assert result == "hit" and upstream.calls == 1
    assert "".join(deltas(chunks)) == reply.choices[0].message.content
    assert chunks[-1].usage is not None


async def test_responses_messages_and_embeddings_hit(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    async with client(gw, token) as oa:
        await responses_messages_and_embeddings(gw, token, oa)
    assert upstream.calls == 3


async def responses_messages_and_embeddings(gw: Gateway, token: str, oa: Any) -> None:
    first = await oa.responses.create(model="live-chat", input="hi", temperature=0)
    again = await oa.responses.with_raw_response.create(
        model="live-chat", input="hi", temperature=0
    )
    assert again.headers["x-svc-cache"] == "hit"
    assert again.parse().output_text == first.output_text
    await trio.to_thread.run_sync(messages, gw.url, token)
    vectors = await oa.embeddings.create(model="live-embed", input="x")
    raw_embed = await oa.embeddings.with_raw_response.create(model="live-embed", input="x")
    assert raw_embed.headers["x-svc-cache"] == "hit"
    assert raw_embed.parse().data[0].embedding == vectors.data[0].embedding


def messages(url: str, token: str) -> None:
    with anthropic.Anthropic(base_url=url, auth_token=token, max_retries=0) as ac:
        messages_hit(ac)


def messages_hit(ac: anthropic.Anthropic) -> None:
    body: dict[str, Any] = {
        "model": "live-chat",
        "max_tokens": 40,
        "messages": [{"role": "user", "content": "hi"}],
        "extra_body": {"temperature": 0},
    }
    message = ac.messages.create(**body)
    raw = ac.messages.with_raw_response.create(**body)
    assert raw.headers["x-svc-cache"] == "hit"
    assert raw.parse().content == message.content
    with ac.messages.stream(**body) as stream:
        events = list(stream)
        text = stream.get_final_text()
    assert text == "".join(b.text for b in message.content if b.type == "text")
    # a replayed stream's message_start says the input tokens the original was billed for
    (start,) = [event for event in events if event.type == "message_start"]
    assert start.message.usage.input_tokens == message.usage.input_tokens > 0


async def test_clear_drops_an_organisations_entries(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    await chat(gw, token, **ask())
    cleared = await gw.admin("POST", "/admin/cache/clear", {"org_id": gw.org_id})
    assert cleared.status_code == 200 and cleared.json()["cleared"] == 1
    _, headers = await chat(gw, token, **ask())
    assert headers["x-svc-cache"] == "miss" and upstream.calls == 2


async def test_sweep_keeps_the_newest_max_entries(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    for n in range(3):
        await chat(gw, token, **ask(f"call {n}"))
    left = await gw.runtime.store.write(cache_entries.sweep, gw.runtime.clock.now(), 2)
    assert left == 2
    _, headers = await chat(gw, token, **ask("call 0"))
    assert headers["x-svc-cache"] == "miss"
    _, headers = await chat(gw, token, **ask("call 2"))
    assert headers["x-svc-cache"] == "hit"


async def test_the_usage_page_shows_what_the_cache_saved_by_key(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    first, _ = await chat(gw, token, **ask())
    await chat(gw, token, **ask())
    await chat(gw, token, **ask())
    await admin_user(gw, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gw, "o@example.com") as (page_client, _):
        page = await page_client.get("/dashboard/usage", params={"range": "today"})
    assert page.status_code == 200, page.text
    section = page.text.split("Saved by the response cache", 1)[1]
    saved = nanos_to_usd(2 * cost(first.usage))
    assert "cached" in section  # the key's name
    assert f'title="{exact(saved)} exactly"' in section, section[:600]


@pytest.mark.parametrize(
    ("cache", "second", "expected"),
    [
        ({"scope": "key"}, "same key", "hit"),
        ({"scope": "key"}, "sibling key", "miss"),
        ({"scope": "org"}, "sibling key", "hit"),
        ({"mode": "all"}, "temperature 0.7", "hit"),
        ({"mode": "deterministic"}, "temperature 0.7", "bypass"),
        ({"ttl_s": 60}, "after the ttl", "miss"),
        ({"ttl_s": 60}, "before the ttl", "hit"),
    ],
)
async def test_the_settings_decide_what_is_shared_and_for_how_long(
    nursery: trio.Nursery,
    tmp_path: Path,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    clock: FakeClock,
    cache: dict[str, Any],
    second: str,
    expected: str,
) -> None:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, cache_config(tmp_path, upstream, **cache), clock=clock)
    token, sibling = await live_key(gw), await live_key(gw)
    body = {**ask(), "temperature": 0.7} if second.startswith("temperature") else ask()
    await chat(gw, token, **body)
    clock.advance(61 if second == "after the ttl" else 59)
    _, headers = await chat(gw, sibling if second == "sibling key" else token, **body)
    assert headers["x-svc-cache"] == expected
    gw.stop.set()
