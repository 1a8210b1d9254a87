"""Routing on several nodes (issue 35): two gateway nodes on one PostgreSQL database,
served in this process, one model with two deployments on two fake upstreams (a, c)
and a dearer fallback on a third (b). Every
node applies the same rules; health is each node's own (docs/decisions/routing.md); a
top-up to a dearer fallback goes through the node's leases, so a shared cap holds."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.accounts.catalog import NANOS_PER_USD
from gateway.fakes.fake_upstream import FakeUpstream
from tests.cluster.test_cluster import fresh_db, in_process_node, rows
from tests.conftest import ADMIN_TOKEN, Gateway
from tests.support.pg_cluster import Cluster

pytestmark = pytest.mark.timeout(120)

IN_PRICE, OUT_PRICE = 3.0, 15.0
BACKUP_IN, BACKUP_OUT = 6.0, 30.0
CONFIG = """
[server]
request_timeout_s = 30

[[providers]]
name = "a"
kind = "openai"
base_url = "{a}"
api_key_env = "ROUTE_KEY"

[[providers]]
name = "b"
kind = "openai"
base_url = "{b}"
api_key_env = "ROUTE_KEY"

[[providers]]
name = "c"
kind = "openai"
base_url = "{c}"
api_key_env = "ROUTE_KEY"

[[models]]
id = "routed"
routing = "ordered"
fallbacks = ["backup"]
input_usd_per_mtok = {in_price}
output_usd_per_mtok = {out_price}

[[models.deployments]]
provider = "a"
upstream_id = "up-a"

[[models.deployments]]
provider = "c"
upstream_id = "up-c"

[[models]]
id = "backup"
provider = "b"
upstream_id = "up-backup"
input_usd_per_mtok = {backup_in}
output_usd_per_mtok = {backup_out}
"""


class Nodes:
    def __init__(self, nodes: list[Gateway], db: str, *fakes: FakeUpstream) -> None:
        self.nodes, self.db = nodes, db
        self.a, self.b, self.c = fakes

    async def key(self, caps: dict[str, Any]) -> str:
        made = await self.nodes[0].admin(
            "POST", "/admin/orgs", {"name": "acme", "credits_usd": 100}
        )
        assert made.status_code == 201, made.text
        body = {"org_id": made.json()["id"], "name": "live", "mode": "live", "caps": caps}
        response = await self.nodes[0].admin("POST", "/admin/keys", body)
        assert response.status_code == 201, response.text
        return str(response.json()["token"])


@pytest.fixture
async def two_nodes(
    nursery: trio.Nursery, tmp_path: Path, pg_cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Nodes]:
    monkeypatch.setenv("ROUTE_KEY", "sk-upstream-routing")
    a: FakeUpstream = await nursery.start(FakeUpstream().serve)
    b: FakeUpstream = await nursery.start(FakeUpstream().serve)
    c: FakeUpstream = await nursery.start(FakeUpstream().serve)
    config = tmp_path / "gateway.toml"
    prices = {"in_price": IN_PRICE, "out_price": OUT_PRICE}
    prices |= {"backup_in": BACKUP_IN, "backup_out": BACKUP_OUT}
    config.write_text(CONFIG.format(a=a.url, b=b.url, c=c.url, **prices))
    db = fresh_db(pg_cluster)
    started: list[Gateway] = []
    try:
        for n in range(2):
            node = await in_process_node(nursery, config, db, f"r{n}", admin_token=ADMIN_TOKEN)
            started.append(node)
        yield Nodes(started, db, a, b, c)
    finally:
        for gateway in started:
            await gateway.aclose()


def chat(model: str = "routed") -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20}


async def call(node: Gateway, token: str) -> httpx.Response:
    async with node.client(token) as client:
        return await client.post("/v1/chat/completions", json=chat())


async def test_cooldowns_are_each_nodes_own(two_nodes: Nodes) -> None:
    token = await two_nodes.key({"usd_day": 10, "rpm": 10_000})
    one, two = two_nodes.nodes
    two_nodes.a.standing = "status=429 retry_after=30"
    assert (await call(one, token)).status_code == 200  # a 429, then c
    assert (await call(one, token)).status_code == 200  # a cools on node one: c only
    assert (two_nodes.a.calls, two_nodes.c.calls) == (1, 2)
    assert (await call(two, token)).status_code == 200  # node two has not seen a's 429
    assert (await call(two, token)).status_code == 200
    assert (two_nodes.a.calls, two_nodes.c.calls) == (2, 4)
    assert two_nodes.b.calls == 0  # no fallback: the model's deployments served


async def test_a_shared_cap_holds_with_fallback_top_ups_across_nodes(two_nodes: Nodes) -> None:
    """Every call fails on both deployments of the model and falls back to a dearer
    model (a top-up per call, through each node's leases): the day's cap shared by the
    nodes is never passed, and each call is settled once."""
    cap_usd = 0.01
    token = await two_nodes.key({"usd_day": cap_usd, "rpm": 100_000, "max_in_flight": 1000})
    two_nodes.a.standing = two_nodes.c.standing = "status=500"
    answers: list[httpx.Response] = []

    async def one(client: httpx.AsyncClient) -> None:
        answers.append(await client.post("/v1/chat/completions", json=chat()))

    limits = httpx.Limits(max_connections=30)
    async with (
        two_nodes.nodes[0].client(token, limits=limits) as first,
        two_nodes.nodes[1].client(token, limits=limits) as second,
        trio.open_nursery() as callers,
    ):
        for i in range(120):
            callers.start_soon(one, (first, second)[i % 2])
    statuses = {r.status_code for r in answers}
    assert statuses <= {200, 402, 503}, statuses
    served = [r.json() for r in answers if r.status_code == 200]
    assert served and len(served) < 120, statuses
    assert all(answer["model"] == "backup" for answer in served)
    async with two_nodes.nodes[0].client(token) as client:
        key = (await client.get("/v1/key")).json()
    spent = round(key["usage"]["day"]["spent_usd"] * NANOS_PER_USD)
    assert spent <= cap_usd * NANOS_PER_USD
    # each call settled once: one record per call, its settled amounts summing to the spend
    records = rows(
        two_nodes.db,
        "SELECT id, status, model, settled_usd_nanos FROM requests WHERE mode = 'live'",
    )
    assert len({r["id"] for r in records}) == len(records)
    assert all(r["status"] != "pending" for r in records)
    assert sum(r["settled_usd_nanos"] for r in records) == spent
    succeeded = [r for r in records if r["status"] == "succeeded"]
    assert len(succeeded) == len(served)
    assert all(r["model"] == "backup" for r in succeeded)
    billed = sum(
        math.ceil(
            (a["usage"]["prompt_tokens"] * BACKUP_IN + a["usage"]["completion_tokens"] * BACKUP_OUT)
            * 1000
        )
        for a in served
    )
    assert sum(r["settled_usd_nanos"] for r in succeeded) == billed
