"""A key known on every node at once (issue 29): several nodes on one PostgreSQL.

A key made through one node works on the others as soon as its creation has answered:
a node that meets a token of a key it does not hold looks the key up by its prefix
(gateway/accounts/key_lookup.py) instead of waiting for the change poll. The nodes are real
``serve`` processes (tests/cluster/test_cluster.py's fixtures); calls go to the fake upstream.

How many lookups a node made is read from the database itself: only a lookup reads keys
by prefix, so the index scans of ``idx_keys_prefix`` (``pg_stat_user_indexes``, flushed
by a backend when its node's connection closes) count them.
"""

from __future__ import annotations

import itertools
import math
import secrets
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from gateway.accounts.key_lookup import LOOKUPS_PER_ADDRESS, MISS_TTL_S
from gateway.fakes.fake_upstream import FakeUpstream
from tests.cluster.test_cluster import ADMIN, admin, body, live_key, nodes, org_id, rows, start_node
from tests.support.pg_cluster import Cluster
from tests.support.procs import Server
from tests.support.waiting import until

__all__ = ["nodes"]  # the fixture, imported to be used here

pytestmark = pytest.mark.timeout(120)

_names = itertools.count()
#: the flood's concurrent callers (one alone, waiting for each answer, is too slow)
FLOODERS = 10


async def first_calls(servers: list[Server], token: str) -> list[list[int]]:
    """The statuses of a first GET /v1/key and chat completion with ``token`` on each of
    ``servers``, all at once and with no retry: the first server is asked for the chat
    first, the others for the key first."""
    headers = {"Authorization": f"Bearer {token}"}
    statuses: list[list[int]] = [[] for _ in servers]

    async def calls(i: int) -> None:
        async with httpx.AsyncClient(
            base_url=servers[i].url, headers=headers, timeout=30
        ) as client:
            key = partial(client.get, "/v1/key")
            chat = partial(client.post, "/v1/chat/completions", json=body("first", "delay=0"))
            for call in (chat, key) if i == 0 else (key, chat):
                statuses[i].append((await call()).status_code)

    async with trio.open_nursery() as nursery:
        for i in range(len(servers)):
            nursery.start_soon(calls, i)
    return statuses


async def test_a_key_made_on_one_node_answers_at_once_on_the_others(
    nodes: list[Server],
) -> None:
    """Issue 29's acceptance: made through node A (of an organisation made a moment
    before), the key answers 200 on B and C right after its creation answered."""
    org = await org_id(nodes[0])
    made = await admin(
        nodes[0],
        "POST",
        "/admin/keys",
        org_id=org,
        name="fresh",
        mode="live",
        scopes=["inference", "usage:read"],
    )
    assert await first_calls(nodes[1:], made["token"]) == [[200, 200], [200, 200]]


async def make_keys(server: Server, org: str, n: int) -> list[str]:
    """``n`` live keys made at once through ``server``."""
    tokens: list[str] = []

    async def make() -> None:
        made = await admin(server, "POST", "/admin/keys", org_id=org, name="k", mode="live")
        tokens.append(made["token"])

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(make)
    return tokens


async def first_key_reads(server: Server, tokens: list[str]) -> list[tuple[int, float]]:
    """A GET /v1/key with each of ``tokens`` at once on ``server``: (status, seconds)."""
    answers: list[tuple[int, float]] = []
    limits = httpx.Limits(max_connections=len(tokens))
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

        async def one(token: str) -> None:
            start = time.monotonic()
            response = await client.get("/v1/key", headers={"Authorization": f"Bearer {token}"})
            answers.append((response.status_code, time.monotonic() - start))

        async with trio.open_nursery() as nursery:
            for token in tokens:
                nursery.start_soon(one, token)
    return answers


async def test_twenty_keys_made_at_once_answer_at_once_on_another_node(
    nodes: list[Server],
) -> None:
    """Issue 50: lookups are coalesced, never refused for being many (4 at once and 50
    a second for the whole node left 16 of 20 new keys with a 401)."""
    tokens = await make_keys(nodes[0], await org_id(nodes[0]), 20)
    answers = await first_key_reads(nodes[1], tokens)
    assert [status for status, _ in answers] == [200] * 20


async def test_a_flood_of_bogus_tokens_from_one_address_spares_new_keys_from_another(
    nodes: list[Server],
) -> None:
    """150 unknown tokens a second from 127.0.0.2 at node B; keys made on A and used at
    once on B from 127.0.0.1 answer 200 within 0.1 s (issue 50: the flood spent a budget
    shared by every client, and new keys were 401 for up to 0.62 s)."""
    org = await org_id(nodes[0])
    flooding = trio.Event()
    stop = trio.Event()
    sent = 0
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")

    async def flood(client: httpx.AsyncClient) -> None:
        nonlocal sent
        while not stop.is_set():  # each of FLOODERS at 150 / FLOODERS a second
            headers = {"Authorization": f"Bearer {unknown_token()}"}
            assert (await client.get("/v1/key", headers=headers)).status_code == 401
            sent += 1
            if sent == 100:
                flooding.set()
            await trio.sleep(FLOODERS / 150)

    calm: list[tuple[int, float]] = []
    for _ in range(3):  # the same without the flood: how fast this machine is now
        calm += await first_key_reads(nodes[1], await make_keys(nodes[0], org, 2))
    async with (
        httpx.AsyncClient(base_url=nodes[1].url, transport=transport) as client,
        trio.open_nursery() as nursery,
    ):
        for _ in range(FLOODERS):
            nursery.start_soon(flood, client)
        with trio.fail_after(30):
            await flooding.wait()
            start, before = time.monotonic(), sent
            answers: list[tuple[int, float]] = []
            for _ in range(5):
                tokens = await make_keys(nodes[0], org, 2)
                answers += await first_key_reads(nodes[1], tokens)
            rate = (sent - before) / (time.monotonic() - start)
        stop.set()
    assert [status for status, _ in answers] == [200] * 10
    # within 0.1 s; on a machine so loaded that the calm reads are slow already, within
    # 3 times the slowest of them (before: up to 0.62 s, or a 401)
    bound = max(0.1, 3 * max(took for _, took in calm))
    assert max(took for _, took in answers) <= bound, (answers, bound)
    assert rate > LOOKUPS_PER_ADDRESS, rate  # the flood outran its address's budget


async def test_a_sub_key_made_on_one_node_answers_at_once_on_another(
    nodes: list[Server],
) -> None:
    parent = await live_key(nodes, await org_id(nodes[0]))
    headers = {"Authorization": f"Bearer {parent}"}
    async with httpx.AsyncClient(base_url=nodes[0].url, headers=headers) as client:
        response = await client.post("/v1/keys", json={"name": "sub"})
    assert response.status_code == 201, response.text
    assert await first_calls(nodes[1:], response.json()["token"]) == [[200, 200], [200, 200]]


async def test_a_key_of_an_organisation_made_elsewhere_keeps_its_policy_at_once(
    nodes: list[Server],
) -> None:
    """A looked-up key's organisation is loaded with it: its plan (no live calls here)
    holds on a node that had not heard of the organisation yet."""

    async def known_on_b(org: str) -> bool:
        async with httpx.AsyncClient(base_url=nodes[1].url, headers=ADMIN) as client:
            listed = (await client.get("/admin/orgs")).json()["data"]
        return any(o["id"] == org for o in listed)

    for _ in range(5):  # the poll may bring the organisation first: then once more
        org = await org_id(nodes[0])
        await admin(nodes[0], "PUT", f"/admin/orgs/{org}/policy", entitlements={"live": False})
        if not await known_on_b(org):
            break
    # (on a loaded machine B's poll may win every time: the policy must hold all the same,
    # the lookup reloads organisations whenever the change counter moved)
    made = await admin(nodes[0], "POST", "/admin/keys", org_id=org, name="planless", mode="live")
    headers = {"Authorization": f"Bearer {made['token']}"}
    async with httpx.AsyncClient(base_url=nodes[1].url, headers=headers, timeout=30) as client:
        response = await client.post("/v1/chat/completions", json=body("p", "delay=0"))
    assert response.status_code == 403, response.text
    assert response.json()["error"]["code"] == "entitlement_denied"


# -- the bound on lookups --------------------------------------------------------------------


@pytest.fixture
def one_node(
    tmp_path: Path, pg_cluster: Cluster, upstream: FakeUpstream
) -> Iterator[tuple[Server, str]]:
    """One node on a database of its own, and the database's URL."""
    name = f"pgk_{next(_names)}"
    pg_cluster.psql(f"CREATE DATABASE {name}")
    db = pg_cluster.url(name)
    server = start_node(tmp_path, db, upstream, 0)
    try:
        yield server, db
    finally:
        server.stop()


def unknown_token() -> str:
    return f"svc_live_{secrets.token_hex(6)}_{secrets.token_hex(16)}"


async def hammer(server: Server, tokens: list[str], at_once: int = 20) -> float:
    """A GET /v1/key with each of ``tokens``, ``at_once`` at a time; every one must be
    the 401. Returns the seconds they took."""
    statuses: list[int] = []
    pending = iter(tokens)
    limits = httpx.Limits(max_connections=at_once)
    start = time.monotonic()
    async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as client:

        async def caller() -> None:
            for token in pending:
                response = await client.get("/v1/key", headers={"Authorization": f"Bearer {token}"})
                statuses.append(response.status_code)

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(at_once):
                    nursery.start_soon(caller)
    assert statuses == [401] * len(tokens)
    return time.monotonic() - start


async def lookups_made(server: Server, db: str) -> int:
    """Stop ``server``; the lookups by prefix its connections made (once they closed)."""
    await trio.to_thread.run_sync(server.stop)
    dbname = db.rsplit("/", 1)[1]

    def closed() -> bool:
        (row,) = rows(
            db,
            "SELECT COUNT(*) AS n FROM pg_stat_activity"
            f" WHERE datname = '{dbname}' AND pid != pg_backend_pid()",
        )
        return int(row["n"]) == 0

    await until(lambda: trio.to_thread.run_sync(closed), within=10)
    (row,) = rows(
        db,
        "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelname = 'idx_keys_prefix'",
    )
    return int(row["idx_scan"])


async def test_an_unknown_token_hammered_reads_the_store_once_per_miss_ttl(
    one_node: tuple[Server, str],
) -> None:
    server, db = one_node
    calls = 300
    took = await hammer(server, [unknown_token()] * calls)
    made = await lookups_made(server, db)
    assert 1 <= made <= math.ceil(took / MISS_TTL_S) + 1 < calls, (made, took)


async def test_unknown_prefixes_varied_read_the_store_at_most_the_bound_per_second(
    one_node: tuple[Server, str],
) -> None:
    server, db = one_node
    calls = 600
    took = await hammer(server, [unknown_token() for _ in range(calls)])
    made = await lookups_made(server, db)
    assert 1 <= made <= LOOKUPS_PER_ADDRESS * (math.ceil(took) + 1), (made, took)
    assert made < calls, (made, took)
