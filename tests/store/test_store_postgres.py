"""PostgreSQL as the store: what only a database server brings (DESIGN.md "Past one machine").

Several servers (nodes) on one database, start-up against a database that
cannot be reached, two processes starting at once on a fresh database, and the database
stopped and started under load. The cluster is the session's throwaway one
(``pg_cluster``); each test has its own database.
"""

from __future__ import annotations

import itertools
import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from gateway.config.settings import Config
from gateway.fakes.fake_upstream import FakeUpstream
from gateway.observe import alerts
from gateway.store import READ_RETRY_S, Store
from gateway.store.sql import Conn
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import start_gateway
from tests.support.pg_cluster import Cluster, free_port
from tests.support.procs import Server, assert_one_line_error, base_env, run_cli, start_server
from tests.support.waiting import until

pytestmark = pytest.mark.processes

_names = itertools.count()


@pytest.fixture
def pg_db(pg_cluster: Cluster) -> str:
    """A fresh database on the session's cluster."""
    name = f"pgt_{next(_names)}"
    pg_cluster.psql(f"CREATE DATABASE {name}")
    return pg_cluster.url(name)


def rows(url: str, sql: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(sql).fetchall()


async def ready_again(url: str, within: float) -> None:
    """Wait until /readyz says ready (the store's reader reconnects on a probe)."""
    async with httpx.AsyncClient(base_url=url) as http:

        async def ready() -> bool:
            return (await http.get("/readyz")).status_code == 200

        await until(ready, within=within, every=READ_RETRY_S)


def on(config: Config, url: str) -> Config:
    return replace(config, server=replace(config.server, db=url))


async def test_servers_share_the_database_and_a_live_node_id_is_refused(
    tmp_path: Path, pg_db: str
) -> None:
    """Several nodes may serve one PostgreSQL database (issue 22), each under its own
    ``[cluster] node_id``; a second process with the id of a live node is refused."""
    env = base_env(SVC_CLUSTER_NODE_ID="n1", SVC_CLUSTER_LEASE_S="2")
    first = await trio.to_thread.run_sync(lambda: start_server(tmp_path, db=pg_db, env=env))
    try:
        other = base_env(SVC_CLUSTER_NODE_ID="n2", SVC_CLUSTER_LEASE_S="2")
        second = await trio.to_thread.run_sync(lambda: start_server(tmp_path, db=pg_db, env=other))
        try:
            same = await trio.to_thread.run_sync(
                lambda: run_cli("serve", "--port", "0", "--db", pg_db, cwd=tmp_path, env=env)
            )
            assert_one_line_error(same, "node id 'n1' is held by a live node")
            for server in (first, second):
                async with httpx.AsyncClient(base_url=server.url) as client:
                    assert (await client.get("/v1/models")).status_code == 200
        finally:
            await trio.to_thread.run_sync(second.stop)
    finally:
        await trio.to_thread.run_sync(first.stop)
    # a node that stopped left its registration expired: its id starts again at once
    again = await trio.to_thread.run_sync(lambda: start_server(tmp_path, db=pg_db, env=env))
    await trio.to_thread.run_sync(again.stop)


async def test_an_unreachable_database_at_start_is_a_one_line_error(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/gateway"
    result = await trio.to_thread.run_sync(
        lambda: run_cli("serve", "--port", "0", "--db", url, cwd=tmp_path)
    )
    assert result.returncode != 0
    assert_one_line_error(result, "cannot reach the database", url)


async def test_a_password_in_the_url_is_never_printed(tmp_path: Path) -> None:
    url = f"postgresql://postgres:s3cret-pw@127.0.0.1:{free_port()}/gateway"
    result = await trio.to_thread.run_sync(
        lambda: run_cli("serve", "--port", "0", "--db", url, cwd=tmp_path)
    )
    assert result.returncode != 0
    assert "s3cret-pw" not in result.stderr + result.stdout


async def test_two_servers_starting_at_once_migrate_once(tmp_path: Path, pg_db: str) -> None:
    """Both race on a fresh database: both serve (two nodes); the schema's versions are
    each applied once."""
    servers: list[Server] = []
    refusals: list[str] = []

    def one(n: int) -> None:
        where = tmp_path / str(n)
        where.mkdir()
        try:
            servers.append(start_server(where, db=pg_db))
        except AssertionError as exc:  # exited during start-up: its stderr is in the message
            refusals.append(str(exc))

    async with trio.open_nursery() as nursery:
        for n in range(2):
            nursery.start_soon(trio.to_thread.run_sync, one, n)
    try:
        assert len(servers) == 2 and not refusals, refusals
    finally:
        for server in servers:
            await trio.to_thread.run_sync(server.stop)
    versions = [row["version"] for row in rows(pg_db, "SELECT version FROM schema_migrations")]
    assert sorted(versions) == list(range(1, len(versions) + 1)) and len(versions) >= 4


async def test_the_database_stopped_and_started_under_load(
    nursery: trio.Nursery,
    tmp_path: Path,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    pg_cluster: Cluster,
    pg_db: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Calls run while the database stops and starts again: no 500; a call that cannot be
    recorded is refused 503 admission_unavailable with Retry-After; once the database is
    back every call the upstream saw has exactly one record, no row is left pending, and
    the records, the key's window and the credits agree. Webhook delivery says once that
    it paused and once that it resumed, not on every poll."""
    caplog.set_level(logging.INFO, logger="gateway.observe.alerts")
    monkeypatch.setattr(alerts, "POLL_S", 0.02)  # many polls while the database is down
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, on(live_config(tmp_path, upstream), pg_db))
    key = await gw.create_key(
        name="live", mode="live", caps={"usd_day": 1000, "rpm": 1_000_000, "max_in_flight": 100}
    )
    headers = {"Authorization": f"Bearer {key['token']}"}
    statuses: Counter[int] = Counter()
    refusals: list[httpx.Response] = []
    stop_load = trio.Event()
    served_after = trio.Event()
    restarted = False

    async def client(n: int) -> None:
        async with httpx.AsyncClient(base_url=gw.url, headers=headers, timeout=30) as http:
            for i in itertools.count():
                if stop_load.is_set():
                    return
                marker = f"m{n}x{i}"
                body = body_for(f"call {marker} [[fault delay=0.02]]", stream=i % 2 == 1)
                response = await http.post(
                    "/v1/chat/completions", json=body, headers={"X-Svc-Tags": f"call={marker}"}
                )
                statuses[response.status_code] += 1
                if response.status_code == 503:
                    refusals.append(response)
                elif response.status_code == 200 and restarted:
                    served_after.set()

    async with trio.open_nursery() as load:
        for n in range(6):
            load.start_soon(client, n)
        with trio.fail_after(60):
            await upstream.wait_until(lambda: upstream.calls >= 20)
            await trio.to_thread.run_sync(pg_cluster.stop)
            # the calls in flight wait to settle; a new one, and a read, are refused, and
            # a load balancer is told to look elsewhere
            async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
                probe = await http.post("/v1/chat/completions", json=body_for("probe"))
                read = await http.get("/v1/usage")
                unready = await http.get("/readyz")
            refusals += [probe, read]
            assert unready.status_code == 503, unready.text
            assert unready.json() == {"status": "unready", "reason": "store_unavailable"}
            await trio.to_thread.run_sync(pg_cluster.start)
            restarted = True
            await served_after.wait()
            await upstream.wait_until(lambda: upstream.calls >= 60)
            await ready_again(gw.url, within=60)
        stop_load.set()
    with trio.fail_after(10):
        await gw.runtime.inflight.wait_settled()

    assert set(statuses) <= {200, 503}, statuses
    assert statuses[200] > 0 and refusals
    for response in refusals:
        assert response.json()["error"]["code"] == "admission_unavailable", response.text
        assert int(response.headers["Retry-After"]) > 0
    assert not rows(pg_db, "SELECT id FROM requests WHERE status = 'pending'")
    async with httpx.AsyncClient(base_url=gw.url, headers=headers) as http:
        usage = (await http.get("/v1/usage", params={"group_by": "tag:call"})).json()
        view = (await http.get("/v1/key")).json()
        credits = (await http.get("/v1/credits")).json()
    counted = {row["group"]: row["requests"] for row in usage["data"]}
    seen = {
        message["content"].split()[1]
        for body in upstream.bodies
        for message in body.get("messages") or []
        if str(message.get("content", "")).startswith("call m")
    }
    assert seen and seen <= set(counted), sorted(seen - set(counted))
    assert set(counted.values()) == {1}
    assert statuses[200] == sum(counted.values())
    assert usage["totals"]["settled_usd"] == pytest.approx(view["usage"]["day"]["spent_usd"])
    assert view["usage"]["day"]["reserved_usd"] == 0
    assert credits["used_usd"] == pytest.approx(usage["totals"]["cost_usd"])
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.observe.alerts"]
    paused = [m for m in said if m.startswith("webhook delivery paused")]
    assert len(paused) <= 1, said
    assert said.count("webhook delivery resumed") == len(paused), said
    gw.stop.set()


def column_names(conn: Conn, table: str) -> set[str]:
    return {column[0] for column in conn.execute(f"SELECT * FROM {table}", ()).description}


def columns(db: str) -> dict[str, set[str]]:
    """Each table of the database at ``db`` and its column names."""
    store = Store(db)
    try:
        tables = store.call(store.backend.tables)
        return {table: store.call(column_names, table) for table in tables}
    finally:
        store.close()


def test_both_stores_have_the_same_tables_and_columns(tmp_path: Path, pg_db: str) -> None:
    """One migration, one version on both: after the last one, every table has the same
    columns on SQLite and on PostgreSQL."""
    on_sqlite = columns(str(tmp_path / "g.db"))
    assert on_sqlite == columns(pg_db)
    assert "trace_id" in on_sqlite["requests"] and "dashboard_secrets" in on_sqlite
