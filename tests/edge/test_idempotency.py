"""Idempotency-Key on chat completions and responses, with live keys on the fake upstream.

The upstream's call counter proves how many calls reached the model; GET /v1/key and
GET /v1/credits prove how many were charged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from shards import FakeClock
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import Gateway, start_gateway

pytestmark = pytest.mark.both_stores

CHAT, RESP = "/v1/chat/completions", "/v1/responses"
REUSED = ("idempotency_key_reused", "Idempotency-Key")


@pytest.fixture
def config(tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    config = live_config(tmp_path, upstream, request_timeout_s=5.0)
    # zero retention needs both: the model offers it, and its provider agreed to it
    models = tuple(replace(m, zero_retention_available=True) for m in config.models)
    providers = tuple(replace(p, zero_retention=True) for p in config.providers)
    return replace(config, models=models, providers=providers)


@pytest.fixture
async def gw(nursery: trio.Nursery, config: Any, clock: FakeClock) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(nursery, config, clock=clock)
    yield gateway
    gateway.stop.set()


async def live_key(gw: Gateway, caps: dict[str, int] | None = None, **settings: Any) -> str:
    caps = {"rpm": 1000, **(caps or {})}
    key = await gw.create_key(name="live", mode="live", caps=caps, **settings)
    return key["token"]


def responses_body(text: str) -> dict[str, Any]:
    return {"model": "live-chat", "input": text, "max_output_tokens": 50}


async def post(
    gw: Gateway, token: str, body: dict[str, Any], idem: str | None, path: str = CHAT
) -> httpx.Response:
    headers = {"Idempotency-Key": idem} if idem is not None else {}
    async with gw.client(token) as client:
        return await client.post(path, json=body, headers=headers)


async def charges(gw: Gateway, token: str) -> tuple[float, float, int]:
    """(the key's spend today, the organisation's credits used, the key's request records)."""
    async with gw.client(token) as client:
        key = (await client.get("/v1/key")).json()
        credits = (await client.get("/v1/credits")).json()
        usage = (await client.get("/v1/usage")).json()
    return key["usage"]["day"]["spent_usd"], credits["used_usd"], usage["totals"]["requests"]


def assert_error(response: httpx.Response, status: int, code: str, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


@pytest.mark.parametrize(
    ("path", "body"),
    [(CHAT, body_for("replay me")), (RESP, responses_body("replay me"))],
    ids=["chat", "responses"],
)
async def test_a_retry_replays_the_stored_answer(
    gw: Gateway, upstream: FakeUpstream, path: str, body: dict[str, Any]
) -> None:
    token = await live_key(gw)
    first = await post(gw, token, body, "order-1", path)
    assert first.status_code == 200, first.text
    spent = await charges(gw, token)
    assert spent[0] > 0 and spent[1] > 0 and spent[2] == 1
    again = await post(gw, token, body, "order-1", path)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert again.headers["X-Request-Id"] == first.headers["X-Request-Id"]
    assert again.json()["svc"]["request_id"] == first.headers["X-Request-Id"]
    assert "X-RateLimit-Remaining-Requests" in again.headers
    assert upstream.calls == 1
    assert await charges(gw, token) == spent  # no second charge, no second record


async def test_the_openai_client_replays_with_extra_headers(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)

    def twice() -> tuple[Any, Any]:
        with openai.OpenAI(base_url=f"{gw.url}/v1", api_key=token, max_retries=0) as client:
            headers = {"Idempotency-Key": "sdk-1"}
            first = client.chat.completions.create(**body_for("sdk"), extra_headers=headers)
            second = client.chat.completions.create(**body_for("sdk"), extra_headers=headers)
        return first, second

    with trio.fail_after(20):
        first, second = await trio.to_thread.run_sync(twice)
    assert first.id == second.id
    assert first.choices[0].message.content == second.choices[0].message.content
    assert upstream.calls == 1


async def test_a_different_body_is_422_with_param(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    assert (await post(gw, token, body_for("one"), "k")).status_code == 200
    response = await post(gw, token, body_for("two"), "k")
    assert_error(response, 422, "idempotency_key_reused", "Idempotency-Key")
    # the same body on the other endpoint is another request too
    response = await post(gw, token, responses_body("one"), "k", RESP)
    assert_error(response, 422, "idempotency_key_reused", "Idempotency-Key")
    assert upstream.calls == 1


async def test_a_repeat_while_in_progress_is_409(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw)
    body = body_for("[[fault hold]] slow")
    answers: dict[str, httpx.Response] = {}

    async def original() -> None:
        answers["first"] = await post(gw, token, body, "slow-1")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(original)
        await upstream.received(1)  # the original claimed its key before calling
        answers["repeat"] = await post(gw, token, body, "slow-1")
        upstream.release.set()
    repeat = answers["repeat"]
    assert_error(repeat, 409, "idempotency_conflict", "Idempotency-Key")
    assert repeat.headers["Retry-After"] == "1"
    assert repeat.headers["x-should-retry"] == "true"  # the original's answer is coming
    assert answers["first"].headers["X-Request-Id"] in repeat.json()["error"]["message"]
    assert upstream.calls == 1
    # once it is done, the repeat replays
    done = await post(gw, token, body, "slow-1")
    assert done.json() == answers["first"].json()


async def test_a_repeat_takes_no_in_flight_slot(gw: Gateway, upstream: FakeUpstream) -> None:
    """With max_in_flight 1 and the original running, a repeat is its 409, not a 429."""
    token = await live_key(gw, caps={"max_in_flight": 1})
    done = await post(gw, token, body_for("done"), "done-1")
    slow = body_for("[[fault hold]] slow")
    answers: dict[str, httpx.Response] = {}

    async def original() -> None:
        answers["first"] = await post(gw, token, slow, "slow-1")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(original)
        await upstream.received(2)  # the original holds its slot at the upstream
        answers["repeat"] = await post(gw, token, slow, "slow-1")
        answers["replay"] = await post(gw, token, body_for("done"), "done-1")
        answers["other"] = await post(gw, token, body_for("new"), "new-1")
        upstream.release.set()
    assert_error(answers["repeat"], 409, "idempotency_conflict", "Idempotency-Key")
    assert answers["replay"].status_code == 200
    assert answers["replay"].headers["X-Request-Id"] == done.headers["X-Request-Id"]
    assert_error(answers["other"], 429, "too_many_in_flight", None)  # a new call needs a slot
    assert answers["first"].status_code == 200
    assert upstream.calls == 2


async def test_a_replay_counts_in_the_request_window(gw: Gateway, upstream: FakeUpstream) -> None:
    token = await live_key(gw, caps={"rpm": 3})
    first = await post(gw, token, body_for("count"), "count-1")
    replay = await post(gw, token, body_for("count"), "count-1")
    assert replay.headers["X-RateLimit-Remaining-Requests"] == "1"
    assert_error(await post(gw, token, body_for("other"), "count-1"), 422, *REUSED)
    refused = await post(gw, token, body_for("count"), "count-1")
    assert_error(refused, 429, "rate_limited", None)
    assert first.status_code == 200 and upstream.calls == 1


@pytest.mark.parametrize("case", ["streamed", "zero_retention"])
async def test_an_answer_that_was_not_stored_is_409_naming_the_original(
    gw: Gateway, upstream: FakeUpstream, case: str
) -> None:
    if case == "streamed":
        token = await live_key(gw)
        body = body_for("stream me", stream=True)
    else:
        token = await live_key(gw, data_mode="zero_retention")
        body = body_for("secret")
    first = await post(gw, token, body, "once")
    assert first.status_code == 200, first.text
    original = first.headers["X-Request-Id"]
    again = await post(gw, token, body, "once")
    assert_error(again, 409, "idempotency_conflict", "Idempotency-Key")
    assert again.headers["x-should-retry"] == "false"  # a retry gets the same answer
    assert original in again.json()["error"]["message"]
    assert upstream.calls == 1
    async with gw.client(token) as client:  # the original's record is where it says
        assert (await client.get(f"/v1/requests/{original}")).status_code == 200


async def test_twenty_concurrent_requests_make_one_upstream_call(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    token = await live_key(gw)
    body = body_for("[[fault delay=0.3]] race")
    answers: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=25)
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "race-1"}
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, limits=limits) as client:

        async def one() -> None:
            answers.append(await client.post(CHAT, json=body, headers=headers))

        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(one)
    kinds = Counter(r.status_code for r in answers)
    assert set(kinds) <= {200, 409}
    assert kinds[200] >= 1
    ids = {r.headers["X-Request-Id"] for r in answers if r.status_code == 200}
    assert len(ids) == 1  # every 200 is the one original answer
    assert upstream.calls == 1
    spent, used, records = await charges(gw, token)
    async with gw.client(token) as client:
        record = (await client.get(f"/v1/requests/{ids.pop()}")).json()
    assert spent == record["cost"]["settled_usd"] and used == record["cost"]["billed_usd"]
    assert records == 1


async def test_retries_of_finished_keys_at_the_same_moment_all_replay(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """120 finished keys, 3 retries of each at once: 360 stored answers, none a 409
    naming a retry that was only reading the row (the shortcut before any read did)."""
    token = await live_key(gw, caps={"rpm": 5000, "max_in_flight": 200})
    keys = [f"done-{n}" for n in range(120)]
    originals: dict[str, str] = {}
    retries: list[tuple[str, httpx.Response]] = []
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=120)
    async with httpx.AsyncClient(base_url=gw.url, timeout=30, limits=limits) as client:

        async def call(idem: str, into: list[tuple[str, httpx.Response]]) -> None:
            answer = await client.post(
                CHAT, json=body_for(idem), headers={**headers, "Idempotency-Key": idem}
            )
            into.append((idem, answer))

        firsts: list[tuple[str, httpx.Response]] = []
        # the originals 20 at a time (this module's calls time out after 5 s, and 120 at
        # once on a loaded machine ran out of it); the retries below all at once
        twenty = trio.CapacityLimiter(20)

        async def first(idem: str) -> None:
            async with twenty:
                await call(idem, firsts)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for idem in keys:
                    nursery.start_soon(first, idem)
            for idem, answer in firsts:
                assert answer.status_code == 200, answer.text
                originals[idem] = answer.headers["X-Request-Id"]
            async with trio.open_nursery() as nursery:
                for idem in keys * 3:
                    nursery.start_soon(call, idem, retries)
    kinds = Counter(answer.status_code for _, answer in retries)
    assert kinds == {200: 360}, [a.text for _, a in retries if a.status_code != 200][:3]
    assert all(a.headers["X-Request-Id"] == originals[idem] for idem, a in retries)
    assert upstream.calls == 120


async def test_a_repeat_with_a_malformed_tags_header_is_400(
    gw: Gateway, upstream: FakeUpstream
) -> None:
    """A malformed X-Svc-Tags is refused on a repeat too, not replayed over (the
    document forbids it; schemathesis found the replay accepting it)."""
    token = await live_key(gw)
    body = body_for("tagged")
    assert (await post(gw, token, body, "tags-1")).status_code == 200
    async with gw.client(token) as client:
        again = await client.post(
            CHAT, json=body, headers={"Idempotency-Key": "tags-1", "X-Svc-Tags": "no-equals"}
        )
    assert_error(again, 400, "invalid_tags", "X-Svc-Tags")
    assert upstream.calls == 1


async def test_a_retry_after_a_restart_still_replays(
    nursery: trio.Nursery, config: Any, upstream: FakeUpstream, clock: FakeClock
) -> None:
    gw = await start_gateway(nursery, config, clock=clock)
    token = await live_key(gw)
    first = await post(gw, token, body_for("durable"), "restart-1")
    assert first.status_code == 200
    await gw.aclose()
    again = await start_gateway(nursery, config, clock=clock)
    try:
        retry = await post(again, token, body_for("durable"), "restart-1")
        assert retry.status_code == 200, retry.text
        assert retry.headers["X-Request-Id"] == first.headers["X-Request-Id"]
        assert retry.json() == first.json()
        assert upstream.calls == 1
    finally:
        again.stop.set()


async def test_keys_expire_after_24_hours(
    gw: Gateway, upstream: FakeUpstream, clock: FakeClock
) -> None:
    token = await live_key(gw)
    first = await post(gw, token, body_for("old"), "day-1")
    clock.advance(24 * 3600 - 1)
    assert (await post(gw, token, body_for("old"), "day-1")).json() == first.json()
    assert upstream.calls == 1
    clock.advance(2)
    late = await post(gw, token, body_for("old"), "day-1")
    assert late.status_code == 200
    assert late.headers["X-Request-Id"] != first.headers["X-Request-Id"]
    assert upstream.calls == 2


async def test_keys_are_scoped_to_the_calling_key(gw: Gateway, upstream: FakeUpstream) -> None:
    one, two = await live_key(gw), await live_key(gw)
    a = await post(gw, one, body_for("same"), "shared")
    b = await post(gw, two, body_for("other body"), "shared")  # no 422: another key's
    assert (a.status_code, b.status_code) == (200, 200)
    assert a.headers["X-Request-Id"] != b.headers["X-Request-Id"]
    assert upstream.calls == 2


async def test_a_failed_call_is_not_kept(gw: Gateway, upstream: FakeUpstream) -> None:
    """A refusal or failure is not an answer to replay: the retry is a new attempt."""
    token = await live_key(gw)
    failed = await post(gw, token, body_for("[[fault status=500]]"), "flaky")
    assert failed.status_code == 503
    retry = await post(gw, token, body_for("[[fault status=500]]"), "flaky")
    assert retry.status_code == 503
    assert retry.headers["X-Request-Id"] != failed.headers["X-Request-Id"]
    assert upstream.calls == 2


@pytest.mark.parametrize("value", ["", "x" * 256, "tab\there"])
async def test_a_malformed_header_is_400(gw: Gateway, value: str) -> None:
    token = await live_key(gw)
    response = await post(gw, token, body_for("hi"), value)
    assert_error(response, 400, "invalid_request", "Idempotency-Key")
    assert response.headers["X-RateLimit-Remaining-Requests"] == "999"


@pytest.mark.parametrize("case", ["malformed header", "body not JSON"])
async def test_a_refused_request_with_the_header_counts_in_the_request_window(
    gw: Gateway, upstream: FakeUpstream, case: str
) -> None:
    """Like every refused request: counted, with the rate-limit headers; past the key's
    rpm the answer is the 429, not the 400."""
    token = await live_key(gw, caps={"rpm": 2})
    headers = {"Idempotency-Key": "x" * 300 if case == "malformed header" else "fine"}
    content = orjson.dumps(body_for("hi")) if case == "malformed header" else b"{bad"

    async def send() -> httpx.Response:
        async with gw.client(token) as client:
            return await client.post(CHAT, content=content, headers=headers)

    first = await send()
    assert first.status_code == 400, first.text
    assert first.headers["X-RateLimit-Remaining-Requests"] == "1"
    assert (await send()).headers["X-RateLimit-Remaining-Requests"] == "0"
    assert_error(await send(), 429, "rate_limited", None)
    assert upstream.calls == 0
