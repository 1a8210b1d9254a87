"""Several deployments per model (issue 35): retries before the first byte, health,
strategies, the record's attempts, one settlement. Two real fake upstreams behind one
model; each upstream's behaviour is its standing fault (gateway/fakes/fake_upstream.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.config.settings import Config, DeploymentConfig, ModelConfig, ProviderConfig
from gateway.fakes.fake_upstream import FakeUpstream
from tests.conftest import Gateway, make_config, start_gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, signed_in

IN_PRICE, OUT_PRICE = 3.0, 15.0
MAX_TOKENS = 20
UPSTREAM_KEY = "sk-upstream-routing-0123456789"


def provider(name: str, url: str, timeout_s: float = 30.0) -> ProviderConfig:
    config = ProviderConfig(name=name, kind="openai", base_url=url, api_key_env="ROUTE_KEY")
    return replace(config, timeout_s=timeout_s)


def routed_model(
    model_id: str = "routed", *deployments: DeploymentConfig, **routing: Any
) -> ModelConfig:
    first = deployments[0]
    model = ModelConfig(model_id, first.provider, first.upstream_id, "chat")
    return replace(
        model,
        deployments=deployments,
        input_usd_per_mtok=IN_PRICE,
        output_usd_per_mtok=OUT_PRICE,
        **routing,
    )


def config_of(
    tmp_path: Path, providers: tuple[ProviderConfig, ...], models: tuple[ModelConfig, ...]
) -> Config:
    base = make_config(tmp_path, request_timeout_s=10.0)
    return replace(base, providers=(*base.providers, *providers), models=models)


async def refusing_url() -> str:
    """A loopback address nothing listens on: connections are refused."""
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    return f"http://127.0.0.1:{port}/v1"


@dataclass
class Pair:
    gw: Gateway
    token: str
    a: FakeUpstream
    b: FakeUpstream


async def start_pair(
    nursery: trio.Nursery,
    tmp_path: Path,
    a_url: str | None = None,
    key: dict[str, Any] | None = None,
    extra_models: tuple[ModelConfig, ...] = (),
    **routing: Any,
) -> Pair:
    a: FakeUpstream = await nursery.start(FakeUpstream().serve)
    b: FakeUpstream = await nursery.start(FakeUpstream().serve)
    providers = (provider("a", a_url or a.url), provider("b", b.url))
    routing.setdefault("routing", "ordered")
    model = routed_model(
        "routed", DeploymentConfig("a", "up-a"), DeploymentConfig("b", "up-b"), **routing
    )
    gw = await start_gateway(nursery, config_of(tmp_path, providers, (model, *extra_models)))
    body = {"name": "live", "mode": "live", "caps": {"usd_day": 10, "rpm": 100000}, **(key or {})}
    made = await gw.create_key(**body)
    return Pair(gw, made["token"], a, b)


@pytest.fixture(autouse=True)
def route_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROUTE_KEY", UPSTREAM_KEY)


def chat(model: str = "routed", text: str = "hello there", **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def cost(usage: dict[str, Any], in_price: float = IN_PRICE, out_price: float = OUT_PRICE) -> int:
    return math.ceil(
        (usage["prompt_tokens"] * in_price + usage["completion_tokens"] * out_price) * 1000
    )


async def post(pair: Pair, body: dict[str, Any], **headers: str) -> httpx.Response:
    async with pair.gw.client(pair.token) as client:
        return await client.post("/v1/chat/completions", json=body, headers=headers)


async def record(pair: Pair, request_id: str) -> dict[str, Any]:
    async with pair.gw.client(pair.token) as client:
        response = await client.get(f"/v1/requests/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()


async def spent(pair: Pair) -> int:
    async with pair.gw.client(pair.token) as client:
        key = (await client.get("/v1/key")).json()
    return round(key["usage"]["day"]["spent_usd"] * NANOS_PER_USD)


def settled(view: dict[str, Any]) -> int:
    return round(view["cost"]["settled_usd"] * NANOS_PER_USD)


FAILURES = [
    pytest.param("refused", None, "service_unavailable", id="connection-refused"),
    pytest.param("status=429 retry_after=30", 429, "rate_limited", id="429-retry-after"),
    pytest.param("status=500", 500, "service_unavailable", id="500"),
    pytest.param("status=529", 529, "service_unavailable", id="529-overloaded"),
    pytest.param("status=401", 401, "invalid_request", id="401-our-credential"),
    pytest.param("delay=30", None, "request_timeout", id="stall-past-first-byte"),
]


@pytest.mark.parametrize(("fault", "status", "code"), FAILURES)
async def test_a_failing_first_deployment_is_retried_on_the_second(
    nursery: trio.Nursery, tmp_path: Path, fault: str, status: int | None, code: str
) -> None:
    refused = fault == "refused"
    pair = await start_pair(
        nursery,
        tmp_path,
        a_url=await refusing_url() if refused else None,
        first_byte_timeout_s=0.5,
    )
    pair.a.standing = "" if refused else fault
    response = await post(pair, chat())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "routed"
    assert "fallback_model" not in answer["svc"]
    assert pair.b.served == 1
    assert pair.a.calls == (0 if refused else 1)
    view = await record(pair, answer["svc"]["request_id"])
    assert view["model"] == "routed" and view["provider"] == "b"
    assert [
        (a["provider"], a["upstream_id"], a["status"], a["code"]) for a in view["attempts"]
    ] == [
        ("a", "up-a", status, code),
        ("b", "up-b", 200, None),
    ]
    assert view["attempts"][0]["ttfb_ms"] is None
    assert view["attempts"][1]["ttfb_ms"] is not None
    # one settlement, on the served attempt's usage
    assert settled(view) == cost(answer["usage"]) == await spent(pair)
    # a 429 cools the first deployment for its Retry-After: the next call goes to the second
    second = await post(pair, chat())
    assert second.status_code == 200
    cooled = fault.startswith("status=429") or fault == "status=401"
    assert pair.a.calls == (0 if refused else 1 if cooled else 2)
    async with pair.gw.client() as client:
        metrics = (await client.get("/metrics")).text
    served = (
        'svc_deployment_attempts_total{deployment="1",model="routed",outcome="ok",provider="b"}'
    )
    assert f"{served} 2.0" in metrics
    cooldowns = 'svc_deployment_cooldowns_total{deployment="0",model="routed",provider="a"}'
    assert (f"{cooldowns} 1.0" in metrics) == cooled


@pytest.mark.parametrize(
    ("routing", "fault", "status", "code"),
    [
        pytest.param({}, "status=400", 400, "invalid_request", id="provider-400-not-retried"),
        pytest.param({"max_attempts": 1}, "status=500", 503, "service_unavailable", id="max-1"),
    ],
)
async def test_no_retry(
    nursery: trio.Nursery,
    tmp_path: Path,
    routing: dict[str, Any],
    fault: str,
    status: int,
    code: str,
) -> None:
    pair = await start_pair(nursery, tmp_path, **routing)
    pair.a.standing = fault
    response = await post(pair, chat())
    assert response.status_code == status
    assert response.json()["error"]["code"] == code
    assert (pair.a.calls, pair.b.calls) == (1, 0)


async def test_every_deployment_failing_settles_on_the_last_failure(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_pair(nursery, tmp_path)
    pair.a.standing = "status=500"
    pair.b.standing = "status=429"
    response = await post(pair, chat())
    assert response.status_code == 429  # the last failure's answer
    assert response.json()["error"]["code"] == "rate_limited"
    view = await record(pair, response.headers["X-Request-Id"])
    assert [a["status"] for a in view["attempts"]] == [500, 429]
    assert settled(view) == 0 == await spent(pair)  # the table's row of a 429: nothing


async def test_a_stream_is_retried_before_its_first_chunk(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_pair(nursery, tmp_path)
    pair.a.standing = "status=503"
    body = chat(stream=True, stream_options={"include_usage": True})
    async with (
        pair.gw.client(pair.token) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        text = "".join([line async for line in response.aiter_lines()])
        request_id = response.headers["X-Request-Id"]
    assert '"error"' not in text and "data: [DONE]" in text
    view = await record(pair, request_id)
    assert [a["provider"] for a in view["attempts"]] == ["a", "b"]
    assert view["status"] == "succeeded"


async def test_a_stream_that_fails_after_its_first_chunk_is_not_retried(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_pair(nursery, tmp_path)
    pair.a.standing = "drop_after=2"
    body = chat(stream=True)
    async with (
        pair.gw.client(pair.token) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = [line async for line in response.aiter_lines() if line.startswith("data:")]
        request_id = response.headers["X-Request-Id"]
    assert '"error"' in lines[-2] and lines[-1] == "data: [DONE]"  # in-band
    assert (pair.a.calls, pair.b.calls) == (1, 0)
    view = await record(pair, request_id)
    assert len(view["attempts"]) == 1
    # the spec's table: output streamed, no usage → the full reservation counts
    assert settled(view) == round(view["cost"]["reserved_usd"] * NANOS_PER_USD)
    assert settled(view) == await spent(pair)


async def test_idempotent_call_settles_once_however_many_attempts(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_pair(nursery, tmp_path)
    pair.a.standing = "status=500"
    first = await post(pair, chat(), **{"Idempotency-Key": "route-1"})
    again = await post(pair, chat(), **{"Idempotency-Key": "route-1"})
    assert first.status_code == again.status_code == 200
    assert first.json()["choices"] == again.json()["choices"]
    assert (pair.a.calls, pair.b.calls) == (1, 1)
    assert await spent(pair) == cost(first.json()["usage"])


async def test_weighted_routing_follows_the_weights(nursery: trio.Nursery, tmp_path: Path) -> None:
    a: FakeUpstream = await nursery.start(FakeUpstream().serve)
    b: FakeUpstream = await nursery.start(FakeUpstream().serve)
    model = routed_model(
        "routed", DeploymentConfig("a", "up-a", 3.0), DeploymentConfig("b", "up-b", 1.0)
    )
    providers = (provider("a", a.url), provider("b", b.url))
    gw = await start_gateway(nursery, config_of(tmp_path, providers, (model,)))
    token = (await gw.create_key(mode="live", caps={"rpm": 100000, "usd_day": 100}))["token"]
    body = chat(max_tokens=1)
    async with gw.client(token) as client:
        for _ in range(400):
            response = await client.post("/v1/chat/completions", json=body)
            assert response.status_code == 200
    assert a.calls + b.calls == 400
    assert 260 <= a.calls <= 340, (a.calls, b.calls)


async def test_least_busy_avoids_a_slow_deployment(nursery: trio.Nursery, tmp_path: Path) -> None:
    pair = await start_pair(nursery, tmp_path, routing="least_busy")
    pair.a.standing = "delay=0.5"  # slow, but not failing

    async def caller() -> None:
        async with pair.gw.client(pair.token) as client:
            for _ in range(5):
                response = await client.post("/v1/chat/completions", json=chat(max_tokens=1))
                assert response.status_code == 200

    async with trio.open_nursery() as callers:
        for _ in range(6):
            callers.start_soon(caller)
    assert pair.a.calls + pair.b.calls == 30
    assert pair.b.calls >= 2 * pair.a.calls, (pair.a.calls, pair.b.calls)


async def test_ordered_uses_the_second_only_when_the_first_fails(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_pair(nursery, tmp_path, routing="ordered")
    for _ in range(10):
        assert (await post(pair, chat(max_tokens=1))).status_code == 200
    assert (pair.a.calls, pair.b.calls) == (10, 0)
    pair.a.standing = "status=502"
    assert (await post(pair, chat(max_tokens=1))).status_code == 200
    assert (pair.a.calls, pair.b.calls) == (11, 1)


async def test_a_cap_race_with_failing_first_deployments(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """200 concurrent calls, each first tried on a failing deployment, against a daily
    cap that holds only some: never over the cap, each call settled once."""
    pair = await start_pair(
        nursery, tmp_path, key={"caps": {"usd_day": 0.02, "rpm": 100000, "max_in_flight": 1000}}
    )
    pair.a.standing = "status=500"
    answers: list[httpx.Response] = []

    async def one(client: httpx.AsyncClient) -> None:
        answers.append(await client.post("/v1/chat/completions", json=chat()))

    limits = httpx.Limits(max_connections=200)
    # 400 upstream attempts at once: ~3 s on a quiet machine, 15-22 s with the cores
    # shared four ways, past the client's default 10 s read timeout (a ReadTimeout, not a
    # wrong answer). The race asserts money, not latency: every call gets a minute.
    client = pair.gw.client(pair.token, limits=limits, timeout=60.0)
    async with client, trio.open_nursery() as callers:
        for _ in range(200):
            callers.start_soon(one, client)
    statuses = {r.status_code for r in answers}
    assert statuses <= {200, 402}, statuses
    served = [r.json() for r in answers if r.status_code == 200]
    assert served and len(served) < 200
    total = await spent(pair)
    assert total <= 0.02 * NANOS_PER_USD
    assert total == sum(cost(answer["usage"]) for answer in served)
    assert pair.b.served == len(served)


async def test_the_dashboard_request_page_lists_the_attempts(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_pair(nursery, tmp_path)
    pair.a.standing = "status=529"
    request_id = (await post(pair, chat())).json()["svc"]["request_id"]
    await admin_user(pair.gw, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(pair.gw, "o@example.com") as (client, _):
        page = (await client.get(f"/dashboard/requests/{request_id}")).text
    attempts = page[page.index("<h2>Attempts</h2>") :]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", attempts)
    assert cells[:6] == ["1", "routed", "a", "up-a", "529", "<code>service_unavailable</code>"]
    assert cells[7:12] == ["2", "routed", "b", "up-b", "200"]


async def test_embeddings_are_retried_on_the_next_deployment(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    a: FakeUpstream = await nursery.start(FakeUpstream().serve)
    b: FakeUpstream = await nursery.start(FakeUpstream().serve)
    a.standing = "status=503"
    model = routed_model(
        "routed-embed", DeploymentConfig("a", "up-a"), DeploymentConfig("b", "up-b")
    )
    model = replace(model, kind="embedding", routing="ordered", dimensions=4)
    providers = (provider("a", a.url), provider("b", b.url))
    gw = await start_gateway(nursery, config_of(tmp_path, providers, (model,)))
    token = (await gw.create_key(mode="live", scopes=["embeddings", "usage:read"]))["token"]
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/embeddings", json={"model": "routed-embed", "input": "some words"}
        )
        assert response.status_code == 200, response.text
        request_id = response.json()["svc"]["request_id"]
        view = (await client.get(f"/v1/requests/{request_id}")).json()
    assert [(x["provider"], x["status"]) for x in view["attempts"]] == [("a", 503), ("b", 200)]
    assert response.json()["model"] == "routed-embed"
