"""The response cache across processes: ``serve --workers 2`` on SQLite, and two nodes on
one PostgreSQL; 50 identical calls at once make one upstream call (the claim row in the
store), the others are hits. And ``svc-gateway cache clear`` against a real server."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from tests.cluster.test_cluster import fresh_db, live_key, org_id
from tests.money.test_durable_money import CONFIG, OUT_PRICE
from tests.support.pg_cluster import Cluster
from tests.support.procs import Server, base_env, cli_json, start_server

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

CACHE = "\n[cache]\nenabled = true\n"
CALLS = 50


def start(tmp_path: Path, db: str, upstream: FakeUpstream, name: str, *args: str) -> Server:
    where = tmp_path / name
    where.mkdir()
    config = where / "gateway.toml"
    config.write_text(CONFIG.format(url=upstream.url, price=OUT_PRICE) + CACHE)
    env = base_env(FAKE_UPSTREAM_KEY="sk-upstream", SVC_CLUSTER_NODE_ID=name)
    return start_server(where, "--config", str(config), *args, db=db, env=env)


@pytest.fixture(params=["workers", "nodes"])
async def servers(
    request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream
) -> AsyncIterator[list[Server]]:
    """One ``serve --workers 2`` on SQLite, or two nodes on one PostgreSQL database."""
    started: list[Server] = []
    try:
        if request.param == "workers":
            db = str(tmp_path / "g.db")
            started.append(
                await trio.to_thread.run_sync(start, tmp_path, db, upstream, "w", "--workers", "2")
            )
        else:
            pg_cluster: Cluster = request.getfixturevalue("pg_cluster")
            db = fresh_db(pg_cluster)
            for name in ("n0", "n1"):
                started.append(await trio.to_thread.run_sync(start, tmp_path, db, upstream, name))
        yield started
    finally:
        upstream.release.set()
        for server in started:
            await trio.to_thread.run_sync(server.stop)


def ask(text: str) -> dict[str, Any]:
    return {
        "model": "live-chat",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 20,
        "temperature": 0,
    }


async def test_fifty_identical_calls_make_one_upstream_call(
    servers: list[Server], upstream: FakeUpstream
) -> None:
    org = await org_id(servers[0])
    token = await live_key(servers, org)
    results: Counter[str] = Counter()
    texts: set[str] = set()
    limits = httpx.Limits(max_connections=CALLS + 10)
    clients = [
        httpx.AsyncClient(
            base_url=server.url,
            timeout=60.0,
            limits=limits,
            headers={"Authorization": f"Bearer {token}"},
        )
        for server in servers
    ]

    async def one(n: int) -> None:
        response = await clients[n % len(clients)].post(
            "/v1/chat/completions", json=ask("[[fault hold]] the same question")
        )
        assert response.status_code == 200, response.text
        results[response.headers["X-Svc-Cache"]] += 1
        texts.add(response.json()["choices"][0]["message"]["content"])

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for n in range(CALLS):
                    nursery.start_soon(one, n)
                await upstream.received(1)
                # the others reach their wait on the claim (each process reads it again
                # every 50 ms); then the first is answered
                await trio.sleep(1.0)
                upstream.release.set()
    finally:
        for client in clients:
            await client.aclose()
    assert upstream.calls == 1
    assert results == Counter({"hit": CALLS - 1, "miss": 1})
    assert len(texts) == 1


async def test_cache_clear_from_the_cli(servers: list[Server], upstream: FakeUpstream) -> None:
    org = await org_id(servers[0])
    token = await live_key(servers, org)
    upstream.release.set()
    async with httpx.AsyncClient(
        base_url=servers[-1].url, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        first = await client.post("/v1/chat/completions", json=ask("clear me"))
        second = await client.post("/v1/chat/completions", json=ask("clear me"))
        assert [first.headers["X-Svc-Cache"], second.headers["X-Svc-Cache"]] == ["miss", "hit"]
        cleared = cli_json("cache", "clear", "--org", org, "--url", servers[0].url)
        assert cleared["cleared"] == 1
        third = await client.post("/v1/chat/completions", json=ask("clear me"))
    assert third.headers["X-Svc-Cache"] == "miss"
    assert upstream.calls == 2
