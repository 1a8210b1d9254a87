"""The response cache on ``/v1/messages`` passed through to an ``anthropic`` deployment:
the entry keeps Anthropic's own events, and a streamed hit replays them (the official
``anthropic`` client reads the same text); a call without a stream does not use them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import pytest
import trio

from gateway.config.cache import CacheConfig
from gateway.fakes.fake_anthropic import FakeAnthropic
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_messages_native import OUR_KEY, UPSTREAM_KEY, native_config
from tests.conftest import Gateway, start_gateway


@pytest.fixture
async def gw(
    nursery: trio.Nursery,
    tmp_path: Path,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[tuple[Gateway, FakeAnthropic]]:
    fake: FakeAnthropic = await nursery.start(FakeAnthropic(keys={OUR_KEY}).serve)
    monkeypatch.setenv("CLAUDE_KEY", OUR_KEY)
    monkeypatch.setenv("UP_KEY", UPSTREAM_KEY)
    config = replace(native_config(tmp_path, fake, upstream), cache=CacheConfig(enabled=True))
    gateway = await start_gateway(nursery, config)
    yield gateway, fake
    gateway.stop.set()


BODY: dict[str, Any] = {
    "model": "claude-live",
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "hello"}],
    "extra_body": {"temperature": 0},
}


def streamed(url: str, token: str) -> list[tuple[str, str]]:
    """Each stream's text and X-Svc-Cache, twice, then one call without a stream."""
    seen = []
    with anthropic.Anthropic(base_url=url, auth_token=token, max_retries=0) as client:
        for _ in range(2):
            with client.messages.stream(**BODY) as stream:
                seen.append((stream.get_final_text(), stream.response.headers["x-svc-cache"]))
        raw = client.messages.with_raw_response.create(**BODY)
        text = "".join(b.text for b in raw.parse().content if b.type == "text")
        seen.append((text, raw.headers["x-svc-cache"]))
    return seen


async def test_a_passed_through_stream_is_replayed_as_anthropic_events(
    gw: tuple[Gateway, FakeAnthropic],
) -> None:
    gateway, fake = gw
    key = await gateway.create_key(mode="live", caps={"usd_day": 100})
    with trio.fail_after(20):
        seen = await trio.to_thread.run_sync(streamed, gateway.url, key["token"])
    (first, miss), (again, hit), (plain, kept_apart) = seen
    assert (miss, hit, kept_apart) == ("miss", "hit", "miss")
    assert first and again == first == plain
    assert len(fake.bodies) == 2  # the first stream, and the call without one
