"""The priced-tool race past one process: ``serve --workers 2`` on SQLite, and two nodes on
one PostgreSQL database (the session's throwaway cluster).

The search server (tests/support/fake_mcp.py) runs in the test; the gateways are real
``svc-gateway serve`` processes fronting it. 200 tools/call of ``search__hang`` (0.01 USD)
at once, spread over the processes, against a key's daily cap of K + 0.5 calls: exactly K
are admitted (held at the upstream until the race is decided), the rest refused
``key_cap_exceeded``; the books after: settled within the cap, billed equal to the
ledger's debits, no pending row. Any request works on any process (the calls, and the
key made through the first one, are served by whichever process the kernel or the test
picks: no sticky sessions).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.cluster.test_cluster import books, fresh_db
from tests.support.fake_mcp import SearchState
from tests.support.pg_cluster import Cluster
from tests.support.procs import Server, base_env, start_server
from tests.support.waiting import until
from tests.tools.test_mcp_gateway import PRICE
from tests.tools.test_mcp_processes import admin
from tests.tools.test_mcp_race import CALLS, tools_call

pytestmark = [pytest.mark.processes, pytest.mark.timeout(150)]

K = 20
CAP_USD = (K + 0.5) * PRICE


def start(tmp_path: Path, url: str, db: str, node: str, *args: str) -> Server:
    where = tmp_path / node
    where.mkdir()
    config = where / "gateway.toml"
    config.write_text(
        f'[[mcp_servers]]\nname = "search"\nurl = "{url}"\nusd_per_call = {PRICE}\ntimeout_s = 60\n'
    )
    env = base_env(SVC_CLUSTER_NODE_ID=node)
    return start_server(where, "--config", str(config), *args, db=db, env=env)


@pytest.fixture(params=["sqlite-workers", "postgres-nodes"])
async def gateways(
    request: pytest.FixtureRequest, tmp_path: Path, search: tuple[SearchState, str]
) -> AsyncIterator[list[Server]]:
    url = search[1]
    started: list[Server] = []
    try:
        if request.param == "postgres-nodes":
            pg_cluster: Cluster = request.getfixturevalue("pg_cluster")
            db = fresh_db(pg_cluster)
            for node in ("n0", "n1"):
                started.append(await trio.to_thread.run_sync(start, tmp_path, url, db, node))
        else:
            db = str(tmp_path / "g.db")
            started.append(
                await trio.to_thread.run_sync(start, tmp_path, url, db, "box", "--workers", "2")
            )
        yield started
    finally:
        search[0].release.set()
        for server in started:
            await trio.to_thread.run_sync(server.stop)


def db_of(server: Server) -> str:
    args = list(server.proc.args)  # type: ignore[arg-type]  # Popen's args: a list here
    return str(args[args.index("--db") + 1])


async def race(urls: list[str], token: str, released: trio.Event) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    headers = {
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "search__hang",
    }
    clients = [
        httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=httpx.Limits())
        for url in urls
    ]

    async def one(client: httpx.AsyncClient) -> None:
        answer: dict[str, Any] = (await client.post("/mcp", json=tools_call("search__hang"))).json()
        if "result" in answer:
            outcomes["error result" if answer["result"].get("isError") else "ok"] += 1
        else:
            outcomes[answer["error"]["data"]["code"]] += 1

    try:
        async with trio.open_nursery() as nursery:
            for n in range(CALLS):
                nursery.start_soon(one, clients[n % len(clients)])
            await released.wait()
    finally:
        for client in clients:
            await client.aclose()
    return outcomes


async def test_200_calls_of_a_priced_tool_never_pass_a_daily_cap_past_one_process(
    gateways: list[Server], search: tuple[SearchState, str], nursery: trio.Nursery
) -> None:
    state = search[0]
    first = gateways[0]
    org = (await admin(first, "/admin/orgs", name="acme"))["id"]
    await admin(first, f"/admin/orgs/{org}/credits", add_usd=100)
    caps = {"usd_day": CAP_USD, "rpm": 10_000, "max_in_flight": 1000}
    made = await admin(first, "/admin/keys", org_id=org, name="k", mode="live", caps=caps)
    released = trio.Event()

    async def release_once_decided() -> None:
        await until(lambda: state.calls.get("hang", 0) >= K, within=60)
        await trio.sleep(0.5)  # a call past the cap would reach the upstream by now
        state.release.set()
        released.set()

    nursery.start_soon(release_once_decided)
    with trio.fail_after(120):
        outcomes = await race([g.url for g in gateways], made["token"], released)
    assert outcomes == {"ok": K, "key_cap_exceeded": CALLS - K}
    assert state.calls["hang"] == K
    got = books(db_of(first))
    assert got["pending"] == 0
    assert got["settled"] <= CAP_USD * 1e9
    assert got["billed"] == got["debited"] == K * PRICE * 1e9
