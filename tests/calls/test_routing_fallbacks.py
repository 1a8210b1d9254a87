"""Fallback models (issue 35): tried only when every deployment failed before the first
byte, and only if the key could call the fallback itself; the reservation topped up to
the fallback's worst case, the call settled once at the served model's price."""

from __future__ import annotations

import math
import sqlite3
from contextlib import closing
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.config.settings import DeploymentConfig
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_routing import (
    Pair,
    chat,
    config_of,
    cost,
    post,
    provider,
    record,
    routed_model,
    settled,
    spent,
)
from tests.conftest import start_gateway

#: the fallback is ten times dearer
BACKUP_IN, BACKUP_OUT = 30.0, 150.0


async def start_fallback(
    nursery: trio.Nursery,
    tmp_path: Path,
    key: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    **backup: Any,
) -> Pair:
    a: FakeUpstream = await nursery.start(FakeUpstream().serve)
    b: FakeUpstream = await nursery.start(FakeUpstream().serve)
    a.standing = "status=500"
    providers = (replace(provider("a", a.url), zero_retention=True), provider("b", b.url))
    routed = routed_model(
        "routed",
        DeploymentConfig("a", "up-a"),
        fallbacks=("backup",),
        capabilities=("tools",),
        zero_retention_available=True,
    )
    fallback = routed_model("backup", DeploymentConfig("b", "up-b"))
    backup = {"capabilities": ("tools",), **backup}
    fallback = replace(
        fallback, input_usd_per_mtok=BACKUP_IN, output_usd_per_mtok=BACKUP_OUT, **backup
    )
    gw = await start_gateway(nursery, config_of(tmp_path, providers, (routed, fallback)))
    if policy:
        response = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/policy", policy)
        assert response.status_code == 200, response.text
    body = {"name": "live", "mode": "live", "caps": {"usd_day": 10, "rpm": 1000}, **(key or {})}
    return Pair(gw, (await gw.create_key(**body))["token"], a, b)


async def test_a_fallback_serves_at_its_own_price(nursery: trio.Nursery, tmp_path: Path) -> None:
    pair = await start_fallback(nursery, tmp_path)
    response = await post(pair, chat())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model"] == "backup"
    assert answer["svc"]["fallback_model"] == "backup"
    view = await record(pair, answer["svc"]["request_id"])
    assert (view["model"], view["provider"]) == ("backup", "b")
    assert [(a["model"], a["status"]) for a in view["attempts"]] == [
        ("routed", 500),
        ("backup", 200),
    ]
    billed = cost(answer["usage"], BACKUP_IN, BACKUP_OUT)
    assert settled(view) == billed == await spent(pair)
    # the reservation was topped up to the fallback's worst case: ten times the first's
    estimated = round(view["cost"]["estimated_usd"] * NANOS_PER_USD)
    reserved = round(view["cost"]["reserved_usd"] * NANOS_PER_USD)
    assert reserved >= 9 * estimated


async def test_a_streamed_fallback_names_the_served_model(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_fallback(nursery, tmp_path)
    async with (
        pair.gw.client(pair.token) as client,
        client.stream("POST", "/v1/chat/completions", json=chat(stream=True)) as response,
    ):
        assert response.status_code == 200
        text = "".join([line async for line in response.aiter_lines()])
    assert '"model":"backup"' in text and '"fallback_model":"backup"' in text
    assert '"error"' not in text


EXCLUSIONS = [
    pytest.param({"key": {"allowed_models": ["routed"]}}, {}, id="key-allowed-models"),
    pytest.param({"policy": {"contract_blocked_models": ["backup"]}}, {}, id="contract-rule"),
    pytest.param({"key": {"data_mode": "zero_retention"}}, {}, id="zero-retention"),
    pytest.param({"backup": {"capabilities": ()}}, {"tools": True}, id="missing-capability"),
    pytest.param({"backup": {"context_window": 30}}, {}, id="small-context-window"),
    # the first model's worst case fits the cap, the fallback's (ten times) does not
    pytest.param({"key": {"caps": {"usd_day": 0.002}}}, {}, id="cap-cannot-hold-the-top-up"),
]


@pytest.mark.parametrize(("setup", "request_extra"), EXCLUSIONS)
async def test_no_fallback_the_key_could_not_call_itself(
    nursery: trio.Nursery, tmp_path: Path, setup: dict[str, Any], request_extra: dict[str, Any]
) -> None:
    pair = await start_fallback(
        nursery,
        tmp_path,
        key=setup.get("key"),
        policy=setup.get("policy"),
        **setup.get("backup", {}),
    )
    body = chat()
    if request_extra.get("tools"):
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    response = await post(pair, body)
    # the original failure: the first model's provider failed (5xx)
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "service_unavailable"
    assert (pair.a.calls, pair.b.calls) == (1, 0)
    view = await record(pair, response.headers["X-Request-Id"])
    assert [a["model"] for a in view["attempts"]] == ["routed"]
    # the table's row of a 5xx with nothing produced: the input share, at the first's price
    assert settled(view) == await spent(pair) > 0
    assert settled(view) < math.ceil(view["cost"]["reserved_usd"] * NANOS_PER_USD)


async def test_responses_and_messages_name_the_fallback(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    pair = await start_fallback(nursery, tmp_path)
    text = [{"role": "user", "content": "hello"}]
    async with pair.gw.client(pair.token) as client:
        response = await client.post(
            "/v1/responses", json={"model": "routed", "input": "hello", "max_output_tokens": 20}
        )
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "backup"
        body = {"model": "routed", "messages": text, "max_tokens": 20, "stream": True}
        async with client.stream("POST", "/v1/messages", json=body) as streamed:
            assert streamed.status_code == 200
            events = "".join([line async for line in streamed.aiter_lines()])
    assert '"model":"backup"' in events and "event: error" not in events
    assert pair.a.calls == 2 and pair.b.served == 2


async def test_the_pending_row_holds_the_topped_up_reservation(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """While the fallback is asked, its pending row says the topped-up reservation:
    recovery after a crash there would count the fallback's worst case, not the first's."""
    pair = await start_fallback(nursery, tmp_path)
    pair.b.standing = "hold"
    answered: list[httpx.Response] = []
    done = trio.Event()

    async def call() -> None:
        answered.append(await post(pair, chat()))
        done.set()

    nursery.start_soon(call)
    with trio.fail_after(10):
        await pair.b.wait_until(lambda: pair.b.open == 1)
    with closing(sqlite3.connect(pair.gw.runtime.config.server.db)) as db:
        ((estimated, reserved),) = db.execute(
            "SELECT estimated_usd_nanos, reserved_usd_nanos FROM requests WHERE status = 'pending'"
        ).fetchall()
    assert reserved >= 9 * estimated
    pair.b.release.set()
    with trio.fail_after(10):
        await done.wait()
    assert answered[0].status_code == 200, answered[0].text


async def test_a_fallbacks_attempts_wait_for_its_own_first_byte_timeout(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The requested model gives up on a silent deployment after its 0.3 s; its fallback,
    slower to start (1 s before its first byte) and configured for it (5 s), is waited
    for by its own timeout, not the requested model's: its first deployment serves."""
    a, b, c = [await nursery.start(FakeUpstream().serve) for _ in range(3)]
    a.standing = "status=500"
    b.standing = "delay=1"
    providers = tuple(provider(name, up.url) for name, up in (("a", a), ("b", b), ("c", c)))
    routed = routed_model(
        "routed", DeploymentConfig("a", "up-a"), fallbacks=("backup",), first_byte_timeout_s=0.3
    )
    backup = routed_model(
        "backup",
        DeploymentConfig("b", "up-b"),
        DeploymentConfig("c", "up-c"),
        routing="ordered",
        first_byte_timeout_s=5.0,
    )
    gw = await start_gateway(nursery, config_of(tmp_path, providers, (routed, backup)))
    key = await gw.create_key(name="live", mode="live", caps={"usd_day": 10, "rpm": 1000})
    pair = Pair(gw, key["token"], a, b)
    response = await post(pair, chat())
    assert response.status_code == 200, response.text
    view = await record(pair, response.json()["svc"]["request_id"])
    assert [(a["model"], a["provider"], a["status"]) for a in view["attempts"]] == [
        ("routed", "a", 500),
        ("backup", "b", 200),
    ]
    assert c.calls == 0
