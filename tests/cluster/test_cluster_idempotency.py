"""One Idempotency-Key sent to three nodes at once (issue 29, point 1).

Three ``serve`` nodes on one PostgreSQL database (the ``nodes`` fixture of
tests/cluster/test_cluster.py) and live keys known on every node. Each of KEYS Idempotency-Keys
is sent with the same body to all three nodes at once; each body names its key (a
marker in the message: the gateway does not forward the header), so the fake upstream's
``bodies`` count the provider calls per key, and the records carry it as the tag
``call``. The calls that reach the upstream are held there (``[[fault hold]]``) until
every request is answered or held: the three requests of a key truly overlap, and the
ones that lose the key answer 409 while the winner is still running.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from tests.cluster.test_cluster import LEASE_S, books, db_of, live_key, nodes, org_id, rows
from tests.money.test_durable_money import MAX_TOKENS
from tests.support.procs import Server
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(100)

CHAT = "/v1/chat/completions"
KEYS = 100
API_KEYS = 4
CALLS = 3 * KEYS
MARKER = re.compile(r"\bcall (i\d{3})\b")
OK, CONFLICT = (200, "ok"), (409, "idempotency_conflict")
#: the fixture of tests/cluster/test_cluster.py, which pytest finds here by its name
__all__ = ["nodes"]


def marker(n: int) -> str:
    return f"i{n:03d}"


def body(n: int) -> dict[str, Any]:
    return {
        "model": "live-chat",
        "messages": [{"role": "user", "content": f"call {marker(n)} [[fault hold]]"}],
        "max_tokens": MAX_TOKENS,
    }


def headers(tokens: list[str], n: int) -> dict[str, str]:
    """The n-th Idempotency-Key, on its API key, its marker as the record's tag."""
    return {
        "Authorization": f"Bearer {tokens[n % len(tokens)]}",
        "Idempotency-Key": f"order-{marker(n)}",
        "X-Svc-Tags": f"call={marker(n)}",
    }


@dataclass(frozen=True)
class Answer:
    node: int
    n: int  # the Idempotency-Key's number
    status: int  # 0: no answer (the connection failed)
    code: str
    request_id: str | None = None  # X-Request-Id
    body: dict[str, Any] | None = None

    @classmethod
    def of(cls, node: int, n: int, response: httpx.Response) -> Answer:
        if response.status_code == 200:
            answer = response.json()
            return cls(node, n, 200, "ok", response.headers["X-Request-Id"], answer)
        code = response.text
        if response.headers.get("content-type", "").startswith("application/json"):
            code = response.json()["error"]["code"]
        return cls(node, n, response.status_code, code, response.headers.get("X-Request-Id"))


async def tokens_of(nodes: list[Server]) -> list[str]:
    """API_KEYS live keys of one organisation, each known on every node."""
    org = await org_id(nodes[0])
    tokens: list[str] = []

    async def make() -> None:
        tokens.append(await live_key(nodes, org))

    async with trio.open_nursery() as nursery:
        for _ in range(API_KEYS):
            nursery.start_soon(make)
    return tokens


async def burst(
    nodes: list[Server],
    tokens: list[str],
    upstream: FakeUpstream,
    during: Callable[[], Awaitable[None]] | None = None,
) -> list[Answer]:
    """Every Idempotency-Key to every node at once (``during`` runs beside them); the
    calls that reach the upstream are held until every request is answered or held."""
    answers: list[Answer] = []
    upstream.release = trio.Event()
    limits = httpx.Limits(max_connections=KEYS + 10)
    clients = [httpx.AsyncClient(base_url=s.url, timeout=60, limits=limits) for s in nodes]

    async def one(node: int, n: int) -> None:
        try:
            response = await clients[node].post(CHAT, json=body(n), headers=headers(tokens, n))
        except httpx.TransportError:
            answers.append(Answer(node, n, 0, "no answer"))
        else:
            answers.append(Answer.of(node, n, response))
        upstream._notify()

    try:
        with trio.fail_after(60):
            async with trio.open_nursery() as calls:
                for n in range(KEYS):
                    for node in range(len(nodes)):
                        calls.start_soon(one, node, n)
                if during is not None:
                    calls.start_soon(during)
                await upstream.wait_until(lambda: len(answers) + upstream.open >= CALLS)
                upstream.release.set()
    finally:
        for client in clients:
            await client.aclose()
    return answers


def calls_per_key(upstream: FakeUpstream) -> Counter[str]:
    """Provider calls per Idempotency-Key (its marker)."""
    found: Counter[str] = Counter()
    for sent in upstream.bodies:
        for message in sent.get("messages") or []:
            if match := MARKER.search(str(message.get("content"))):
                found[match.group(1)] += 1
    return found


def records(db: str) -> list[dict[str, Any]]:
    return rows(
        db,
        "SELECT id, tags->>'call' AS call, key_id, status, settled_usd_nanos AS settled"
        " FROM requests",
    )


def answered_ids(answers: list[Answer]) -> dict[int, set[str]]:
    """The request ids the 200s of each Idempotency-Key carry (header and svc block),
    every one checked to be the same in both places."""
    ids: dict[int, set[str]] = defaultdict(set)
    for answer in answers:
        if answer.status == 200:
            assert answer.body is not None
            assert answer.body["svc"]["request_id"] == answer.request_id, answer
            ids[answer.n].add(str(answer.request_id))
    return ids


async def pending_settled(db: str, bound_s: float) -> None:
    """Wait (bounded) until no request row is pending."""
    await until(lambda: not books(db)["pending"], within=bound_s, every=0.1)


async def assert_spend_is_the_records(
    server: Server, tokens: list[str], got: list[dict[str, Any]]
) -> None:
    """Each API key's spend, as ``server`` reports it, is its records' settled sum."""
    settled: Counter[str] = Counter()
    for row in got:
        settled[row["key_id"]] += row["settled"]
    for token in tokens:
        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}
        ) as http:
            view = (await http.get("/v1/key")).json()
        day = view["usage"]["day"]
        assert round(day["spent_usd"] * 1e9) == settled[view["id"]], (view["id"], day)
        assert day["reserved_usd"] == 0, day


async def test_one_key_sent_to_three_nodes_at_once_calls_the_upstream_once(
    nodes: list[Server], upstream: FakeUpstream
) -> None:
    tokens = await tokens_of(nodes)
    answers = await burst(nodes, tokens, upstream)
    db = db_of(nodes)

    kinds = Counter((a.status, a.code) for a in answers)
    assert set(kinds) <= {OK, CONFLICT}, kinds
    # held until all three were in: one ran, the two others found it running
    assert kinds == {OK: KEYS, CONFLICT: 2 * KEYS}, kinds
    markers = {marker(n) for n in range(KEYS)}
    assert calls_per_key(upstream) == dict.fromkeys(markers, 1)
    ids = answered_ids(answers)
    assert all(len(ids[n]) == 1 for n in range(KEYS)), {n: v for n, v in ids.items() if len(v) > 1}

    await pending_settled(db, 5)  # every answer is in: nothing may stay pending
    got = records(db)
    assert Counter(row["call"] for row in got) == dict.fromkeys(markers, 1)
    assert {row["call"]: row["id"] for row in got} == {
        marker(n): next(iter(ids[n])) for n in range(KEYS)
    }
    assert {row["status"] for row in got} == {"succeeded"}
    assert sorted(Counter(row["key_id"] for row in got).values()) == [KEYS // API_KEYS] * API_KEYS
    for server in nodes:
        await assert_spend_is_the_records(server, tokens, got)
    money = books(db)
    assert money["billed"] == money["debited"] > 0, money

    # once settled, a retry of each key (on another node) replays the original answer
    calls = upstream.calls
    first = {a.n: a for a in answers if a.status == 200}
    retries: list[Answer] = []

    async def retry(n: int) -> None:
        node = (first[n].node + 1) % len(nodes)
        async with httpx.AsyncClient(base_url=nodes[node].url, timeout=30) as http:
            response = await http.post(CHAT, json=body(n), headers=headers(tokens, n))
        retries.append(Answer.of(node, n, response))

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for n in range(KEYS):
                nursery.start_soon(retry, n)
    assert Counter((a.status, a.code) for a in retries) == {OK: KEYS}
    for again in retries:
        assert again.request_id == first[again.n].request_id, again
        assert again.body == first[again.n].body, again
    assert upstream.calls == calls
    assert len(records(db)) == KEYS


async def finished_keys_retried_at_once(
    urls: list[str], token: str, upstream: FakeUpstream, keys: int = 120, retries: int = 3
) -> None:
    """``keys`` Idempotency-Keys called once each (round-robin over ``urls``), then
    ``retries`` retries of every finished key at the same moment, one per url in turn:
    each retry is the stored answer with the original's request id, and no retry
    reaches the upstream (issue 50: a retry reading the row was named "in progress")."""
    calls = upstream.calls
    originals: dict[int, str] = {}
    again: list[Answer] = []
    limits = httpx.Limits(max_connections=keys * retries)
    clients = [httpx.AsyncClient(base_url=url, timeout=60, limits=limits) for url in urls]

    async def one(node: int, n: int, into: list[Answer]) -> None:
        response = await clients[node].post(
            CHAT,
            json=body(n) | {"messages": [{"role": "user", "content": f"call {marker(n)}"}]},
            headers=headers([token], n),
        )
        into.append(Answer.of(node, n, response))

    try:
        with trio.fail_after(60):
            firsts: list[Answer] = []
            async with trio.open_nursery() as nursery:
                for n in range(keys):
                    nursery.start_soon(one, n % len(urls), n, firsts)
            assert Counter((a.status, a.code) for a in firsts) == {OK: keys}
            originals = {a.n: str(a.request_id) for a in firsts}
            async with trio.open_nursery() as nursery:
                for n in range(keys):
                    for r in range(retries):
                        nursery.start_soon(one, (n + r) % len(urls), n, again)
    finally:
        for client in clients:
            await client.aclose()
    kinds = Counter((a.status, a.code) for a in again)
    assert kinds == {OK: keys * retries}, kinds
    assert all(a.request_id == originals[a.n] for a in again)
    assert upstream.calls == calls + keys


async def test_finished_keys_retried_at_once_on_three_nodes_all_replay(
    nodes: list[Server], upstream: FakeUpstream
) -> None:
    token = await live_key(nodes, await org_id(nodes[0]))
    await finished_keys_retried_at_once([s.url for s in nodes], token, upstream)


async def test_a_node_killed_mid_burst_calls_no_key_twice_and_keeps_the_books(
    nodes: list[Server], upstream: FakeUpstream
) -> None:
    tokens = await tokens_of(nodes)
    killed = nodes[1]

    async def kill_mid_burst() -> None:
        await upstream.wait_until(lambda: upstream.calls >= KEYS // 4)
        await trio.to_thread.run_sync(killed.kill)

    answers = await burst(nodes, tokens, upstream, during=kill_mid_burst)
    assert killed.proc.poll() is not None

    kinds = Counter((a.status, a.code) for a in answers)
    failed = Counter(a.node for a in answers if a.status == 0)
    assert set(failed) <= {1}, failed  # only the killed node may leave a call unanswered
    assert set(kinds) - {(0, "no answer")} <= {OK, CONFLICT}, kinds
    # (the killed node may have won every key: then the live ones answered only 409s)
    called = calls_per_key(upstream)
    assert max(called.values()) == 1, {k: v for k, v in called.items() if v > 1}
    ids = answered_ids(answers)
    assert all(len(v) == 1 for v in ids.values()), {n: v for n, v in ids.items() if len(v) > 1}

    db = db_of(nodes)
    await pending_settled(db, LEASE_S * 4)  # the dead node's rows, recovered by a live one
    got = records(db)
    per_key = Counter(row["call"] for row in got)
    assert max(per_key.values()) == 1, {k: v for k, v in per_key.items() if v > 1}
    assert set(called) <= set(per_key), sorted(set(called) - set(per_key))
    assert {row["status"] for row in got} <= {"succeeded", "interrupted"}
    by_call = {row["call"]: row for row in got}
    for n, (request_id,) in ids.items():  # an answered key's record is its answer
        assert by_call[marker(n)]["id"] == request_id
        assert by_call[marker(n)]["status"] == "succeeded"
    for server in (nodes[0], nodes[2]):
        await assert_spend_is_the_records(server, tokens, got)
    money = books(db)
    assert money["billed"] == money["debited"], money

    # a retry of every key on a live node: the answered ones replay their answer, the
    # ones the dead node had called are 409 naming their interrupted record, and only a
    # key no node had claimed (its claim died uncommitted) is called now, for the first time
    retries: list[Answer] = []

    async def retry(n: int) -> None:
        async with httpx.AsyncClient(base_url=nodes[0].url, timeout=30) as http:
            response = await http.post(CHAT, json=body(n), headers=headers(tokens, n))
        retries.append(Answer.of(0, n, response))

    upstream.release.set()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            for n in range(KEYS):
                nursery.start_soon(retry, n)
    for again in retries:
        original = by_call.get(marker(again.n))
        if again.n in ids:
            assert (again.status, again.request_id) == (200, *ids[again.n]), again
        elif original is not None:
            assert (again.status, again.code) == CONFLICT, again
            assert original["status"] == "interrupted", original
        else:
            assert again.status == 200, again
            assert marker(again.n) not in called, again
    assert max(calls_per_key(upstream).values()) == 1
