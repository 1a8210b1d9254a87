"""``svc-gateway db copy``: an embedded deployment moved to PostgreSQL serves the same books.

A gateway on SQLite gets organisations, keys (a sub-key, a rotation), credits, live calls
with tags and an Idempotency-Key, a webhook, a dashboard user signed in; it stops; the CLI
copies its file into an empty PostgreSQL database; a gateway on that database answers the
same ``/v1/key``, ``/v1/usage``, ``/v1/credits`` and request records, and the dashboard
session made before the copy still holds (users, sessions and the signing secret are
copied). A second copy into the now filled database is refused, and so is a source that
does not exist.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config.settings import Config
from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import Gateway, start_gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, signed_in
from tests.support.pg_cluster import Cluster
from tests.support.procs import assert_one_line_error, run_cli

pytestmark = pytest.mark.processes


def on(config: Config, db: str) -> Config:
    return replace(config, server=replace(config.server, db=db))


async def books(gw: Gateway, tokens: list[str], request_ids: list[str]) -> dict[str, Any]:
    """Everything a key holder reads about its account, per key."""
    out: dict[str, Any] = {}
    for token in tokens:
        async with gw.client(token) as client:
            view = (await client.get("/v1/key")).json()
            view.pop("last_used_at", None)
            view.pop("rate_limit")  # this minute's window lives in memory, on any restart
            usage = [
                (await client.get("/v1/usage", params={"group_by": by})).json()
                for by in ("tag:team", "model")
            ]
            for report in usage:
                # counts of refused requests (these reads' 404s among them), written every
                # 2 s and at a stop: not the books, and read here before they were written
                report.pop("refusals")
            out[token] = {
                "key": view,
                "usage": usage[0],
                "by_model": usage[1],
                "credits": (await client.get("/v1/credits")).json(),
                "records": [
                    (await client.get(f"/v1/requests/{rid}")).json() for rid in request_ids
                ],
            }
    return out


async def test_copy_then_serve_from_postgresql_gives_the_same_books(
    nursery: trio.Nursery,
    tmp_path: Path,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
    pg_cluster: Cluster,
) -> None:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    config = live_config(tmp_path, upstream)
    gw = await start_gateway(nursery, config)
    parent = await gw.create_key(
        name="parent",
        mode="live",
        caps={"usd_day": 10},
        keys_manage=True,
        scopes=["inference", "usage:read"],
    )
    assert (await gw.admin("POST", f"/admin/orgs/{gw.org_id}/credits", {"add_usd": 5})).is_success
    hook = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/webhook", {"url": upstream.url})
    assert hook.is_success, hook.text
    async with gw.client(parent["token"]) as client:
        made = await client.post("/v1/keys", json={"name": "child", "caps": {"usd_day": 1}})
        assert made.status_code == 201, made.text
    child = made.json()
    request_ids = []
    for n, (token, team) in enumerate([(parent["token"], "a"), (child["token"], "b")] * 2):
        async with gw.client(token) as client:
            response = await client.post(
                "/v1/chat/completions",
                json=body_for(f"hello {n}"),
                headers={"X-Svc-Tags": f"team={team}", "Idempotency-Key": f"idem-{n}"},
            )
        assert response.status_code == 200, response.text
        request_ids.append(response.headers["X-Request-Id"])
    rotated = await gw.admin("POST", f"/admin/keys/{parent['id']}/rotate")
    assert rotated.is_success, rotated.text
    tokens = [rotated.json()["token"], child["token"]]
    before = await books(gw, tokens, request_ids)
    await admin_user(gw, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gw, "o@example.com") as (dashboard, answer):
        assert answer.status_code == 303, answer.text
        cookies = dict(dashboard.cookies)
    await gw.aclose()

    pg_cluster.psql("CREATE DATABASE copied")
    url = pg_cluster.url("copied")
    sqlite_path = config.server.db
    copied = await trio.to_thread.run_sync(
        lambda: run_cli("db", "copy", "--from", sqlite_path, "--to", url, "--json")
    )
    assert copied.returncode == 0, copied.stderr
    report = json.loads(copied.stdout)
    assert report["to"] == url
    tables = report["tables"]
    assert tables["requests"] == 4 and tables["keys"] >= 3 and tables["idempotency"] == 4
    assert tables["credit_ledger"] >= 3 and tables["webhooks"] == 1 and tables["orgs"] >= 1
    assert tables["dashboard_users"] == 1 and tables["dashboard_sessions"] == 1

    again = await start_gateway(nursery, on(config, url))
    try:
        assert await books(again, tokens, request_ids) == before
        async with again.client(cookies=cookies) as dashboard:
            page = await dashboard.get("/dashboard/keys")
        assert page.status_code == 200 and "o@example.com" in page.text
        # a retry of a copied Idempotency-Key replays, it does not call again
        calls = upstream.calls
        async with again.client(child["token"]) as client:
            replay = await client.post(
                "/v1/chat/completions",
                json=body_for("hello 1"),
                headers={"X-Svc-Tags": "team=b", "Idempotency-Key": "idem-1"},
            )
        assert replay.status_code == 200 and upstream.calls == calls
        # the ledger's ids go on after the copied ones
        credit = await again.admin("POST", f"/admin/orgs/{again.org_id}/credits", {"add_usd": 1})
        assert credit.is_success, credit.text
    finally:
        await again.aclose()

    refused = await trio.to_thread.run_sync(
        lambda: run_cli("db", "copy", "--from", sqlite_path, "--to", url)
    )
    assert_one_line_error(refused, "is not empty", "nothing copied")
    missing = await trio.to_thread.run_sync(
        lambda: run_cli("db", "copy", "--from", str(tmp_path / "none.db"), "--to", url)
    )
    assert_one_line_error(missing, "no database at")
