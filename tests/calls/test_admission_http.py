"""Spend caps under concurrency, through HTTP (issue 3's acceptance).

200 calls race against a daily cap that admits exactly k worst-case reservations. The
mock model holds every admitted call until each of the 200 was either admitted or
refused, so every admitted call still holds its reservation while the others arrive
(an event, not a delay: it holds however slow the machine): the cap must admit exactly
k, refuse the rest with 402 key_cap_exceeded, and settled + reserved spend must never
pass the cap while the calls run or after.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.calls.estimate import estimate_prompt_tokens
from gateway.providers.mock import MockProvider
from tests.conftest import Gateway

pytestmark = pytest.mark.both_stores

CALLS = 200
K = 7
MAX_TOKENS = 16
BODY: dict[str, Any] = {
    "model": "gpt-4o-mini",
    "messages": [{"role": "user", "content": "count the ways"}],
    "max_tokens": MAX_TOKENS,
}
ROOMY = {"rpm": 1000, "max_in_flight": 250}  # only the spend cap may refuse


def worst_case_nanos(gw: Gateway) -> int:
    """The reservation of one BODY call: estimated prompt + the full output budget."""
    model = gw.runtime.catalog.get(BODY["model"])
    assert model is not None
    prompt = estimate_prompt_tokens({"messages": BODY["messages"], "max_tokens": MAX_TOKENS})
    return model.cost_nanos(prompt, MAX_TOKENS)


def cap_for(gw: Gateway, k: int) -> float:
    """A daily cap in USD that fits k worst-case reservations and not k + 1."""
    return (k + 0.5) * worst_case_nanos(gw) / NANOS_PER_USD


class HeldMock:
    """The sandbox mock, holding each call until every call of the race was either
    admitted (it reached the provider) or refused (its answer came back). ``moved`` is
    set at each admission or refusal (a watcher replaces it once it has looked)."""

    def __init__(self, gw: Gateway, calls: int = CALLS) -> None:
        self.calls = calls
        self.inner = MockProvider.for_models(gw.runtime.config.models)
        self.admitted = self.refused = 0
        self.everyone_in = trio.Event()
        self.moved = trio.Event()
        gw.runtime.mock = self  # type: ignore[assignment]

    def count(self, *, refused: bool) -> None:
        if refused:
            self.refused += 1
        else:
            self.admitted += 1
        self.moved.set()
        if self.admitted + self.refused == self.calls:
            self.everyone_in.set()

    async def complete(self, request: Any) -> Any:
        self.count(refused=False)
        await self.everyone_in.wait()
        return await self.inner.complete(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def key_usage(client: httpx.AsyncClient, token: str) -> dict[str, Any]:
    response = await client.get("/v1/key", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text
    return response.json()["usage"]["day"]


async def race(
    gw: Gateway, held: HeldMock, tokens: list[str], watched: list[str], cap_usd: float
) -> Counter:
    """CALLS concurrent calls spread over ``tokens``; meanwhile spend of ``watched`` keys is
    sampled after every admission or refusal and must never pass ``cap_usd``. Returns the
    count of each answer."""
    answers: Counter = Counter()
    peaks: list[float] = []
    limits = httpx.Limits(max_connections=CALLS + 10)
    async with httpx.AsyncClient(base_url=gw.url, timeout=60.0, limits=limits) as client:

        async def one(token: str) -> None:
            response = await client.post(
                "/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {token}"}
            )
            code = response.json()["error"]["code"] if response.status_code != 200 else "ok"
            answers[(response.status_code, code)] += 1
            if response.status_code != 200:
                held.count(refused=True)

        async def watch() -> None:
            """One sample for the admissions and refusals since the last (at most one
            per call: every read counts against the keys' requests per minute)."""
            while True:
                await held.moved.wait()
                held.moved = trio.Event()
                for token in watched:
                    usage = await key_usage(client, token)
                    peaks.append(usage["spent_usd"] + usage["reserved_usd"])

        with trio.fail_after(60):
            async with trio.open_nursery() as outer:
                outer.start_soon(watch)
                async with trio.open_nursery() as calls:
                    for i in range(CALLS):
                        calls.start_soon(one, tokens[i % len(tokens)])
                outer.cancel_scope.cancel()
        for token in watched:
            usage = await key_usage(client, token)
            assert usage["reserved_usd"] == 0
            assert usage["spent_usd"] <= cap_usd
        assert (await key_usage(client, watched[0]))["spent_usd"] > 0
    assert peaks and max(peaks) <= cap_usd + 1e-12
    return answers


@pytest.mark.timeout(120)
async def test_a_daily_cap_admits_exactly_k_of_200_concurrent_calls(gateway: Gateway) -> None:
    held = HeldMock(gateway)
    cap = cap_for(gateway, K)
    key = await gateway.create_key(caps={**ROOMY, "usd_day": cap})
    answers = await race(gateway, held, [key["token"]], [key["token"]], cap)
    assert answers == {(200, "ok"): K, (402, "key_cap_exceeded"): CALLS - K}


@pytest.mark.timeout(120)
async def test_sub_keys_and_their_parent_share_one_cap_under_concurrency(
    gateway: Gateway,
) -> None:
    """The parent's cap binds its whole family: two sub-keys (each allowed the parent's
    full cap) and the parent itself race; together they get exactly k admissions."""
    held = HeldMock(gateway)
    cap = cap_for(gateway, K)
    parent = await gateway.create_key(keys_manage=True, caps={**ROOMY, "usd_day": cap})
    children = []
    async with gateway.client(parent["token"]) as client:
        for name in ("a", "b"):
            body = {"name": name, "caps": {**ROOMY, "usd_day": cap}}
            response = await client.post("/v1/keys", json=body)
            assert response.status_code == 201, response.text
            children.append(response.json()["token"])
    tokens = [parent["token"], *children]
    answers = await race(gateway, held, tokens, tokens, cap)
    assert answers == {(200, "ok"): K, (402, "key_cap_exceeded"): CALLS - K}
