"""Organisation-wide and platform-wide requests per minute, exact under concurrency.

Many keys of one organisation (each far from its own limit) call at once; together they
may make `org_rpm` requests in a clock minute and every request past that is 429
rate_limited with Retry-After 60. The clock is a FakeClock standing mid-minute, so no
test straddles a minute boundary; moving it to the next minute opens a new window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from shards import FakeClock
from tests.conftest import Gateway, make_config, start_gateway

pytestmark = pytest.mark.both_stores

ORG_RPM = 12
KEYS = 5
CALLS = 40
BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path, clock: FakeClock) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(nursery, make_config(tmp_path), clock=clock)
    yield gateway
    gateway.stop.set()


async def org_with_keys(gw: Gateway, policy: dict[str, int] | None) -> list[str]:
    response = await gw.admin("POST", "/admin/orgs", {"name": "acme"})
    org_id = response.json()["id"]
    if policy:
        response = await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", policy)
        assert response.status_code == 200, response.text
    tokens = []
    for i in range(KEYS):
        key = await gw.create_key(org_id=org_id, name=f"k{i}", caps={"rpm": 1000})
        tokens.append(key["token"])
    return tokens


async def burst(gw: Gateway, tokens: list[str], calls: int = CALLS) -> Counter:
    """``calls`` concurrent chat calls spread over ``tokens``: the count of each answer."""
    answers: Counter = Counter()
    limits = httpx.Limits(max_connections=calls)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30.0, limits=limits) as client:

        async def one(token: str) -> None:
            response = await client.post(
                "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {token}"}
            )
            if response.status_code == 200:
                answers["ok"] += 1
                return
            assert response.status_code == 429, response.text
            assert response.json()["error"]["code"] == "rate_limited"
            assert response.headers["Retry-After"] == "60"
            answers[response.json()["error"]["message"]] += 1

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for i in range(calls):
                    nursery.start_soon(one, tokens[i % len(tokens)])
    return answers


async def test_keys_of_one_org_together_get_exactly_org_rpm(gw: Gateway, clock: FakeClock) -> None:
    tokens = await org_with_keys(gw, {"org_rpm": ORG_RPM})
    answers = await burst(gw, tokens)
    assert answers == {
        "ok": ORG_RPM,
        "The organization's requests-per-minute limit is reached.": CALLS - ORG_RPM,
    }
    # another organisation is not affected
    others = await org_with_keys(gw, None)
    assert await burst(gw, others, 10) == {"ok": 10}
    # the next clock minute is a new window
    clock.advance(60)
    assert (await burst(gw, tokens, ORG_RPM))["ok"] == ORG_RPM


async def test_refused_requests_count_in_the_org_window(gw: Gateway) -> None:
    """Every request counts, refused ones too, as in a key's own window: a read that
    the org limit refused still used up the minute."""
    tokens = await org_with_keys(gw, {"org_rpm": 3})
    async with gw.client(tokens[0]) as client:
        codes = [(await client.get("/v1/key")).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    assert await burst(gw, tokens[1:], 4) == {
        "The organization's requests-per-minute limit is reached.": 4
    }


async def test_the_platform_limit_binds_every_organisation(
    nursery: trio.Nursery, tmp_path: Path, clock: FakeClock
) -> None:
    gw = await start_gateway(nursery, make_config(tmp_path, platform_rpm=15), clock=clock)
    try:
        first = await org_with_keys(gw, None)
        second = await org_with_keys(gw, None)
        answers = await burst(gw, first + second, 30)
        assert answers == {
            "ok": 15,
            "The platform's requests-per-minute limit is reached.": 15,
        }
    finally:
        gw.stop.set()


async def test_a_keys_own_limit_waits_the_rest_of_the_minute(gw: Gateway, clock: FakeClock) -> None:
    """The key's own rpm says when its window reopens; the org's limit always says 60."""
    response = await gw.admin("POST", "/admin/orgs", {"name": "acme"})
    org_id = response.json()["id"]
    await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", {"org_rpm": 100})
    key = await gw.create_key(org_id=org_id, caps={"rpm": 2})
    clock.advance(12)  # 10:00:42
    async with gw.client(key["token"]) as client:
        answers = [await client.post("/v1/chat/completions", json=BODY) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["error"]["code"] == "rate_limited"
    assert answers[2].headers["Retry-After"] == "18"
