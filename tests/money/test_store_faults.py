"""Store faults at the claim and at the settlement, injected by the database itself.

A ``serve`` node runs on a database of the session's throwaway PostgreSQL. The test
installs triggers that make the database refuse the first N claims of an
Idempotency-Key (a deadlock, SQLSTATE 40P01) or the first N settlements of a pending
row (a serialization failure, 40001), as PostgreSQL does to the loser of a conflict
between nodes. The counter is a sequence: ``nextval`` is not undone by the rollback.
Nothing in the gateway knows of it: the faults are the database's.

What must hold: no 500 for a retryable fault; a claim that keeps losing is a retryable
503 before the provider is asked; a settlement that keeps losing is retried until it
commits (readiness says ``settlements_queued`` meanwhile), so no call the provider
served stays ``pending`` on a live node; nothing stays reserved, without a restart.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from tests.cluster.test_cluster import start_node
from tests.money.test_durable_money import WORST_CASE, chat_body, live_key, nanos, received_markers
from tests.support.pg_cluster import Cluster
from tests.support.procs import Server

pytestmark = pytest.mark.timeout(120)

FAULT_FUNCTION = """
CREATE SEQUENCE IF NOT EXISTS test_faults;
CREATE OR REPLACE FUNCTION test_fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF nextval('test_faults') <= TG_ARGV[1]::int THEN
        RAISE EXCEPTION 'injected by the test' USING ERRCODE = TG_ARGV[0];
    END IF;
    RETURN NEW;
END $$;
"""
AT_CLAIM = "BEFORE INSERT ON idempotency FOR EACH ROW"
AT_SETTLEMENT = (
    "BEFORE UPDATE ON requests FOR EACH ROW"
    " WHEN (OLD.status = 'pending' AND NEW.status <> 'pending')"
)


@pytest.fixture
async def node(
    tmp_path: Path, pg_cluster: Cluster, upstream: FakeUpstream
) -> AsyncIterator[tuple[Server, str]]:
    name = f"faults_{tmp_path.name[-12:].lower().replace('-', '_')}"
    pg_cluster.psql(f"CREATE DATABASE {name}")
    db = pg_cluster.url(name)
    server = await trio.to_thread.run_sync(start_node, tmp_path, db, upstream, 0)
    try:
        yield server, db
    finally:
        upstream.release.set()
        await trio.to_thread.run_sync(server.stop)


def inject(db: str, where: str, sqlstate: str, times: int) -> None:
    """From now on the database refuses the next ``times`` statements ``where`` says
    with ``sqlstate``."""
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(FAULT_FUNCTION)
        conn.execute("ALTER SEQUENCE test_faults RESTART")
        conn.execute(
            f"CREATE OR REPLACE TRIGGER test_fault {where}"
            f" EXECUTE FUNCTION test_fault('{sqlstate}', '{times}')"
        )


def faults_used(db: str) -> int:
    with psycopg.connect(db) as conn:
        row = conn.execute("SELECT last_value, is_called FROM test_faults").fetchone()
    assert row is not None
    return int(row[0]) if row[1] else 0


def query(db: str, sql: str) -> list[dict[str, Any]]:
    with psycopg.connect(db, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(sql).fetchall()


async def call(server: Server, token: str, marker: str, idem: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if idem is not None:
        headers["Idempotency-Key"] = idem
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        return await client.post(
            "/v1/chat/completions", json=chat_body(marker, "none", stream=False), headers=headers
        )


async def key_state(server: Server, token: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.url) as client:
        answer = await client.get("/v1/key", headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def assert_nothing_held(server: Server, token: str, db: str) -> None:
    """Nothing reserved nor in flight in the node's memory, nothing pending in the store."""
    key = await key_state(server, token)
    assert key["usage"]["day"]["reserved_usd"] == 0, key["usage"]
    assert key["rate_limit"]["in_flight"] == 0, key["rate_limit"]
    assert query(db, "SELECT id FROM requests WHERE status = 'pending'") == []
    # what the records settled is what the key's day window holds
    (settled,) = query(db, "SELECT COALESCE(SUM(settled_usd_nanos), 0) AS n FROM requests")
    assert settled["n"] == nanos(key["usage"]["day"]["spent_usd"])


async def test_a_claim_that_loses_a_few_conflicts_is_served_once(
    node: tuple[Server, str], upstream: FakeUpstream
) -> None:
    server, db = node
    token = await live_key(server)
    inject(db, AT_CLAIM, "40P01", 3)
    answer = await call(server, token, "c0001", "idem-1")
    assert answer.status_code == 200, answer.text
    assert faults_used(db) >= 4  # three refused, then the claim that landed
    assert received_markers(upstream) == ["c0001"]
    (claim,) = query(db, "SELECT state, request_id FROM idempotency")
    assert (claim["state"], claim["request_id"]) == ("stored", answer.json()["svc"]["request_id"])
    again = await call(server, token, "c0001", "idem-1")
    assert again.json() == answer.json()  # the replay: no second provider call
    assert received_markers(upstream) == ["c0001"]
    await assert_nothing_held(server, token, db)


async def test_a_claim_that_keeps_losing_is_a_retryable_503_before_the_provider(
    node: tuple[Server, str], upstream: FakeUpstream
) -> None:
    server, db = node
    token = await live_key(server)
    inject(db, AT_CLAIM, "40P01", 1000)
    refused = await call(server, token, "c0002", "idem-2")
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "admission_unavailable"
    assert int(refused.headers["Retry-After"]) > 0
    assert upstream.calls == 0
    await assert_nothing_held(server, token, db)
    assert query(db, "SELECT * FROM requests") == []  # refused before the model: no record
    inject(db, AT_CLAIM, "40P01", 0)
    served = await call(server, token, "c0002", "idem-2")
    assert served.status_code == 200, served.text
    assert received_markers(upstream) == ["c0002"]


async def test_a_settlement_that_loses_conflicts_is_retried_until_it_commits(
    node: tuple[Server, str], upstream: FakeUpstream
) -> None:
    """More conflicts than one batch retries: the settlement is deferred, retried on its
    own until it lands, readiness says so meanwhile; the call is answered and billed."""
    server, db = node
    token = await live_key(server)
    inject(db, AT_SETTLEMENT, "40001", 12)
    async with trio.open_nursery() as nursery:
        answers: list[httpx.Response] = []

        async def one() -> None:
            answers.append(await call(server, token, "c0003", None))

        nursery.start_soon(one)
        # deferred for at least two retry rounds: each probe is its own round trip
        with trio.fail_after(30):
            async with httpx.AsyncClient(base_url=server.url) as client:
                while (await client.get("/readyz")).json().get("reason") != "settlements_queued":
                    pass
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert faults_used(db) > 12
    (row,) = query(db, "SELECT status, settled_usd_nanos, billed_usd_nanos FROM requests")
    assert row["status"] == "succeeded"
    assert 0 < row["billed_usd_nanos"] == row["settled_usd_nanos"] < WORST_CASE
    async with httpx.AsyncClient(base_url=server.url) as client:
        assert (await client.get("/readyz")).status_code == 200
    await assert_nothing_held(server, token, db)
    (debited,) = query(
        db, "SELECT -SUM(amount_nanos) AS n FROM credit_ledger WHERE amount_nanos < 0"
    )
    assert debited["n"] == row["billed_usd_nanos"]
