"""``svc-gateway serve --workers 2``: two serving processes on one port (issue 34).

One ``python -m gateway serve --workers 2`` process (tests/support/procs.py) on a new
SQLite file, and on a fresh database of the session's throwaway PostgreSQL; its workers
are nodes of one deployment.
Live keys call the fake upstream (gateway/fakes/fake_upstream.py), as in
tests/cluster/test_cluster.py, whose race and books this file reuses: the kernel spreads
the race's connections over the two workers, and the records say which worker served
each call (``requests.node_id``).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config.settings import ConfigError, load_config
from gateway.fakes.fake_upstream import FakeUpstream
from tests.cluster.test_cluster import (
    ADMIN,
    CALLS,
    ROOMY,
    admin,
    body,
    books,
    fresh_db,
    live_key,
    org_id,
    race,
    rows,
)
from tests.cluster.test_cluster_idempotency import finished_keys_retried_at_once
from tests.edge.test_dashboard_auth import PASSWORD, csrf_in
from tests.money.test_durable_money import CONFIG, OUT_PRICE, WORST_CASE
from tests.support.pg_cluster import Cluster
from tests.support.procs import (
    Server,
    assert_one_line_error,
    base_env,
    run_cli,
    start_server,
)
from tests.support.waiting import until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(150)]

#: admitted by the caps of the races: enough calls that both workers take leases
K = 20
#: the default lease: the kill test needs no lease to expire (the parent takes over)
LEASE_S = 10
NODE = "box"
#: worker kills in the restart test, in turn (a worker killed again soon restarts after
#: a doubled backoff: 0.5, 1 s for two kills of one worker; 10 were run by hand)
WORKER_KILLS = 4
PARENT_RESTARTS = 2
STARTED = re.compile(r"worker (\S+) started \(pid (\d+)\)")


def start_workers(tmp_path: Path, db: str, upstream: FakeUpstream, *args: str) -> Server:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG.format(url=upstream.url, price=OUT_PRICE))
    env = base_env(
        FAKE_UPSTREAM_KEY="sk-upstream",
        SVC_CLUSTER_NODE_ID=NODE,
        SVC_CLUSTER_LEASE_S=str(LEASE_S),
    )
    return start_server(tmp_path, "--config", str(config), "--workers", "2", *args, db=db, env=env)


@pytest.fixture(params=["sqlite", "postgres"])
async def workers(
    request: pytest.FixtureRequest, tmp_path: Path, upstream: FakeUpstream
) -> AsyncIterator[Server]:
    if request.param == "postgres":
        pg_cluster: Cluster = request.getfixturevalue("pg_cluster")
        db = fresh_db(pg_cluster)
    else:
        db = str(tmp_path / "g.db")
    server = await trio.to_thread.run_sync(start_workers, tmp_path, db, upstream)
    try:
        yield server
    finally:
        upstream.release.set()
        if server.proc.poll() is None:
            assert await trio.to_thread.run_sync(server.stop) == 0, server.stderr()


def db_of(server: Server) -> str:
    args = list(server.proc.args)  # type: ignore[arg-type]  # Popen's args: a list here
    return str(args[args.index("--db") + 1])


def started(server: Server) -> list[tuple[str, int]]:
    """The workers the parent started so far, in order: (node id, pid)."""
    return [(node, int(pid)) for node, pid in STARTED.findall(server.stderr())]


def served_by(db: str, status: str = "succeeded") -> Counter[str]:
    """How many calls of ``status`` each worker (node id) recorded."""
    found = rows(db, f"SELECT node_id FROM requests WHERE status = '{status}'")
    return Counter(row["node_id"] for row in found)


def refused_by(db: str, key_id: str, code: str, total: int) -> Counter[str]:
    """How many calls of ``key_id`` refused with ``code`` each worker counted, once the
    counts of all ``total`` are written (each worker writes its counts every couple of
    seconds); an empty Counter before that."""
    found = rows(
        db,
        f"SELECT node_id, count FROM refusal_counts WHERE key_id = '{key_id}' AND code = '{code}'",
    )
    counts = Counter({row["node_id"]: row["count"] for row in found})
    return counts if counts.total() == total else Counter()


#: the node ids of the two workers
BOTH = {f"{NODE}-w0", f"{NODE}-w1"}


async def test_a_daily_cap_and_an_orgs_credits_admit_exactly_k_over_two_workers(
    workers: Server, upstream: FakeUpstream
) -> None:
    db = db_of(workers)
    token = await live_key([workers], await org_id(workers), usd_day=(K + 0.5) * WORST_CASE / 1e9)
    answers = await race([workers.url], [token], upstream)
    assert answers == {(200, "ok"): K, (402, "key_cap_exceeded"): CALLS - K}
    got = books(db)
    assert got["pending"] == 0 and got["settled"] <= (K + 0.5) * WORST_CASE
    assert got["billed"] == got["debited"]

    org = await org_id(workers, credits_usd=(K + 0.5) * WORST_CASE / 1e9)
    token = await live_key([workers], org)
    answers = await race([workers.url], [token], upstream)
    assert answers == {(200, "ok"): K, (402, "insufficient_credits"): CALLS - K}
    got = books(db)
    assert got["pending"] == 0 and got["billed"] == got["debited"]
    (spent,) = rows(
        db,
        f"SELECT -COALESCE(SUM(amount_nanos), 0) AS debited FROM credit_ledger"
        f" WHERE amount_nanos < 0 AND org_id = '{org}'",
    )
    assert spent["debited"] <= (K + 0.5) * WORST_CASE
    # which worker admitted is not asserted: the kernel hands out the connections, and a
    # worker whose lease holds the headroom may admit every call a race can have


async def test_a_keys_rpm_admits_exactly_rpm_over_two_workers(
    workers: Server, upstream: FakeUpstream
) -> None:
    """Within one clock minute, exactly rpm calls are admitted over the two workers. The
    key is found by each worker through its prefix: nothing but the race counts against
    its rpm.

    The workers are real processes on the machine's clock (no clock can be handed to
    them), so the race starts at least 15 s before a minute ends: it takes 1–3 s here
    (5 under a loaded machine), and the wait is 0 s three times in four (at most 15 s;
    it was up to 30 s with a race started only in a minute's first half). A race that
    crossed a minute anyway fails by name below, never silently."""
    rpm = 40
    org = await org_id(workers)
    made = await admin(
        workers,
        "POST",
        "/admin/keys",
        org_id=org,
        name="rpm",
        mode="live",
        scopes=["inference"],
        caps={**ROOMY, "rpm": rpm},
    )
    await until(lambda: time.time() % 60 < 45, within=20, every=0.2)
    minute, started = int(time.time() // 60), time.monotonic()
    answers = await race([workers.url], [made["token"]], upstream, faults="delay=0")
    took = time.monotonic() - started
    assert int(time.time() // 60) == minute, f"the race crossed a minute (it took {took:.1f} s)"
    assert answers == {(200, "ok"): rpm, (429, "rate_limited"): CALLS - rpm}
    # both workers took part, serving or refusing (on a loaded machine one of them may
    # admit the whole minute's rpm before the other's first call reaches its shard)
    db = db_of(workers)
    refused = await until(
        partial(refused_by, db, made["id"], "rate_limited", CALLS - rpm), within=10
    )
    assert set(served_by(db)) | set(refused) == BOTH


async def test_finished_keys_retried_at_once_over_two_workers_all_replay(
    workers: Server, upstream: FakeUpstream
) -> None:
    token = await live_key([workers], await org_id(workers))
    await finished_keys_retried_at_once([workers.url], token, upstream)


async def test_kill_9_of_a_worker_under_load_is_restarted_and_keeps_the_books(
    workers: Server, upstream: FakeUpstream
) -> None:
    """Clients call the port steadily; one worker is killed (SIGKILL) mid-way. The parent
    starts it again under its node id (its predecessor's pending rows settled at once),
    and it serves again: nothing pending, the cap never passed, every call answered 200
    has its settled record, every call the upstream received has a record."""
    db = db_of(workers)
    cap = 60 * WORST_CASE
    token = await live_key([workers], await org_id(workers), usd_day=cap / 1e9)
    upstream.release.set()
    (victim, pid) = started(workers)[1]
    answered: set[str] = set()
    restarted = trio.Event()

    async def client(n: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        after = 0
        for i in itertools.count():
            tag = f"k{n}x{i}"
            # a connection each: every call is spread anew over the workers
            async with httpx.AsyncClient(base_url=workers.url, headers=headers, timeout=20) as http:
                try:
                    response = await http.post(
                        "/v1/chat/completions",
                        json=body(tag, "delay=0.1"),
                        headers={"X-Svc-Tags": f"call={tag}"},
                    )
                except httpx.TransportError:
                    continue  # its worker was killed: not answered
            if response.status_code == 402:
                return  # the cap is reached
            assert response.status_code in (200, 503), response.text
            if response.status_code == 200:
                answered.add(tag)
                after += restarted.is_set()
            if after >= 5:
                return

    with trio.fail_after(90):
        async with trio.open_nursery() as load:
            for n in range(6):
                load.start_soon(client, n)
            await upstream.wait_until(lambda: upstream.calls >= 12)
            ready = readies(workers)
            os.kill(pid, signal.SIGKILL)
            await until(lambda: len(started(workers)) > 2, within=30, every=0.1)
            assert started(workers)[2][0] == victim
            # it accepts once ready (issue 50): the calls that count come after that
            await until(partial(readies_past, workers, ready), within=30, every=0.1)
            restarted.set()
    new_pid = started(workers)[2][1]
    assert workers.proc.poll() is None
    got = books(db)
    assert got["pending"] == 0
    assert got["settled"] <= cap
    assert got["billed"] == got["debited"]
    recorded = {
        r["tag"]: r["status"] for r in rows(db, "SELECT tags->>'call' AS tag, status FROM requests")
    }
    assert all(recorded.get(tag) == "succeeded" for tag in answered), answered - set(recorded)
    received = {
        str(m["content"]).split()[1]
        for b in upstream.bodies
        for m in b.get("messages") or []
        if str(m.get("content", "")).startswith("call k")
    }
    assert received <= set(recorded), sorted(received - set(recorded))
    assert set(served_by(db)) == BOTH
    # the restarted worker (registered anew under the same node id) served calls
    assert new_pid != pid
    (row,) = rows(
        db,
        f"SELECT COUNT(*) AS n FROM requests WHERE node_id = '{victim}' AND status = 'succeeded'"
        f" AND created > (SELECT started_at FROM cluster_nodes WHERE node_id = '{victim}')",
    )
    assert row["n"] > 0


def readies(server: Server) -> int:
    """How many times a worker of ``server`` said it was ready."""
    return server.stderr().count("gateway.serving.server: ready ")


def readies_past(server: Server, count: int) -> bool:
    return readies(server) > count


# a call cut by a kill leaves httpx's request-body generator unfinished (a warning at
# its collection, not a failure of the server)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_workers_and_the_parent_restarted_under_load_answer_no_503(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Issue 50: a worker accepts only once ready, so a restart of a worker (killed
    WORKER_KILLS times in turn, each once its sibling is ready) or of the parent answers
    no 503 "The gateway is starting" (calls cut by a kill fail in transport, retried)."""
    db = str(tmp_path / "g.db")
    server = await trio.to_thread.run_sync(start_workers, tmp_path, db, upstream)
    servers = [server]
    token = await live_key([server], await org_id(server))
    upstream.release.set()
    statuses: Counter[int] = Counter()
    stop = trio.Event()

    async def client() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        while not stop.is_set():
            # a connection each: every call is handed anew to a worker
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=20) as http:
                try:
                    response = await http.post("/v1/chat/completions", json=body("r", "delay=0"))
                except httpx.TransportError:
                    await trio.sleep(0.01)  # its worker was killed, or the parent is away
                    continue
            statuses[response.status_code] += 1

    async def served(calls: int) -> None:
        """Until ``calls`` more calls were answered."""
        goal = sum(statuses.values()) + calls
        await until(lambda: sum(statuses.values()) >= goal, within=20)

    try:
        with trio.fail_after(120):
            async with trio.open_nursery() as load:
                for _ in range(8):
                    load.start_soon(client)
                for kill in range(WORKER_KILLS):
                    await served(20)
                    ready = readies(server)
                    pids = dict(started(server))  # each worker's last start
                    os.kill(pids[f"{NODE}-w{kill % 2}"], signal.SIGKILL)
                    await until(partial(readies_past, server, ready), within=20, every=0.05)
                for _ in range(PARENT_RESTARTS):
                    await trio.to_thread.run_sync(servers[-1].stop)
                    servers.append(
                        await trio.to_thread.run_sync(
                            start_workers, tmp_path, db, upstream, "--port", str(server.port)
                        )
                    )
                    await served(20)
                stop.set()
    finally:
        await trio.to_thread.run_sync(servers[-1].stop)
    assert statuses[503] == 0, (statuses, servers[0].stderr()[-3000:])
    assert set(statuses) == {200}, statuses


async def test_sigterm_to_the_parent_stops_every_worker_gracefully(
    workers: Server, upstream: FakeUpstream
) -> None:
    """SIGTERM to the parent while calls are in flight on both workers: every call is
    answered, every worker stops, the parent exits 0, no row is left pending."""
    db = db_of(workers)
    token = await live_key([workers], await org_id(workers), usd_day=1000)
    pids = [pid for _node, pid in started(workers)]
    statuses: list[int] = []
    upstream.release = trio.Event()

    async def call(i: int) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=workers.url, headers=headers, timeout=30) as http:
            response = await http.post("/v1/chat/completions", json=body(f"g{i}"))
        statuses.append(response.status_code)

    sent = 0
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            # the kernel hands the connections to the workers: calls are added, ten at a
            # time, until both hold some (bounded)
            while set(served_by(db, "pending")) != BOTH and sent < 80:
                for i in range(sent, sent + 10):
                    nursery.start_soon(call, i)
                sent += 10
                await upstream.wait_until(lambda n=sent: upstream.calls >= n)
            assert set(served_by(db, "pending")) == BOTH
            workers.proc.send_signal(signal.SIGTERM)
            await until(lambda: "stopping" in workers.stderr(), within=10)
            upstream.release.set()
        assert await trio.to_thread.run_sync(workers.stop) == 0, workers.stderr()
    assert statuses == [200] * sent
    assert books(db)["pending"] == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_an_admin_call_by_id_right_after_its_create_finds_it_on_either_worker(
    workers: Server,
) -> None:
    """An organisation and a key made through the port are found by id at once, on a new
    connection (either worker), not a 404 until the other worker's change poll: the
    miss runs the poll's step first. Concurrent pairs spread the connections over both
    workers; an id that is nowhere is still the 404."""
    answers: Counter[tuple[str, int]] = Counter()

    async def call(method: str, path: str, **json: object) -> Any:
        async with httpx.AsyncClient(base_url=workers.url, headers=ADMIN) as http:
            response = await http.request(method, path, json=json)
        answers[(path.split("/")[-1], response.status_code)] += 1
        return response.json()

    async def made_then_used(i: int) -> None:
        org = (await call("POST", "/admin/orgs", name=f"org {i}"))["id"]
        await call("POST", f"/admin/orgs/{org}/credits", add_usd=5)
        key = (await call("POST", "/admin/keys", org_id=org, name=f"key {i}"))["id"]
        await call("PATCH", f"/admin/keys/{key}/caps", usd_day=1)

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(12):
                nursery.start_soon(made_then_used, i)
    assert answers == {
        ("orgs", 201): 12,
        ("credits", 200): 12,
        ("keys", 201): 12,
        ("caps", 200): 12,
    }
    nowhere = await call("POST", "/admin/orgs/org_nowhere/credits", add_usd=5)
    assert nowhere["error"]["code"] == "not_found"


async def test_a_sub_key_right_after_its_create_is_found_and_listed_on_either_worker(
    workers: Server,
) -> None:
    """The sub-key API reads its own writes across workers as the admin API does: a
    sub-key made through the port is changed, listed and revoked at once, each call on a
    new connection (either worker), not a 404 or a list without it until the other
    worker's change poll. An id that is nowhere is still the 404."""
    parent = await live_key([workers], await org_id(workers))
    answers: Counter[tuple[str, int]] = Counter()

    async def call(method: str, path: str, **json: object) -> Any:
        async with httpx.AsyncClient(
            base_url=workers.url, headers={"Authorization": f"Bearer {parent}"}
        ) as http:
            response = await http.request(method, path, json=json or None)
        answers[(method, response.status_code)] += 1
        return response.json()

    async def made_then_used(i: int) -> None:
        child = (await call("POST", "/v1/keys", name=f"child {i}"))["id"]
        listed = await call("GET", "/v1/keys?limit=100")
        assert child in [row["id"] for row in listed["data"]]
        await call("PATCH", f"/v1/keys/{child}", disabled=True)
        await call("DELETE", f"/v1/keys/{child}")

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(12):
                nursery.start_soon(made_then_used, i)
    assert answers == {("POST", 201): 12, ("GET", 200): 12, ("PATCH", 200): 12, ("DELETE", 200): 12}
    nowhere = await call("DELETE", "/v1/keys/key_nowhere")
    assert nowhere["error"]["code"] == "not_found"


async def test_a_key_made_on_the_dashboard_is_listed_and_found_on_either_worker(
    workers: Server,
) -> None:
    """The dashboard reads its own writes across workers too: a key made through the port
    is on the Keys page, and its revoke confirmation found, on new connections (either
    worker) at once, not after the other worker's change poll."""
    org = await org_id(workers)
    await admin(
        workers,
        "POST",
        "/admin/users",
        org_id=org,
        email="o@example.com",
        role="owner",
        password=PASSWORD,
    )
    async with httpx.AsyncClient(base_url=workers.url) as client:
        login = await client.get("/dashboard/login")
        signing_in = {"email": "o@example.com", "password": PASSWORD}
        answer = await client.post(
            "/dashboard/login", data={**signing_in, "csrf_token": csrf_in(login.text)}
        )
        assert answer.status_code == 303, answer.text
        cookies = client.cookies

    async def page(method: str, path: str, **form: str) -> httpx.Response:
        async with httpx.AsyncClient(base_url=workers.url, cookies=cookies) as http:
            return await http.request(method, path, data=form or None)

    csrf = csrf_in((await page("GET", "/dashboard/keys/new")).text)

    async def made_then_found(i: int) -> None:
        form = {"name": f"dash {i}", "mode": "sandbox", "environment": "development"}
        form |= {"data_mode": "standard", "scopes": "inference", "csrf_token": csrf}
        made = await page("POST", "/dashboard/keys", **form)
        assert made.status_code == 200 and "svc_test_" in made.text, made.text
        listed = (await page("GET", "/dashboard/keys")).text
        found = re.search(rf'dash {i}</.*?href="/dashboard/keys/(key_\w+)/rotate"', listed, re.S)
        assert found is not None, f"dash {i} is not on the Keys page"
        confirm = await page("GET", f"/dashboard/keys/{found[1]}/revoke")
        assert confirm.status_code == 200 and f"dash {i}" in confirm.text

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for i in range(8):
                nursery.start_soon(made_then_found, i)


def test_several_workers_on_an_in_memory_database_are_refused(tmp_path: Path) -> None:
    result = run_cli("serve", "--workers", "2", "--port", "0", "--db", ":memory:", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "--workers 2", ":memory:")


def test_a_worker_that_cannot_start_stops_the_group_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "g.db").write_bytes(b"not a database, but a file the parent can lock")
    result = run_cli("serve", "--workers", "2", "--port", "0", "--db", "g.db", cwd=tmp_path)
    assert result.returncode == 1
    assert_one_line_error(result, "-w0 could not start")
    assert "not an SQLite database" in result.stderr
    assert not (tmp_path / "g.db.lock").exists()


async def test_a_second_server_on_the_workers_sqlite_file_is_refused(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """The one-server lock is the group's: the parent holds it, naming its pid."""
    db = tmp_path / "g.db"
    server = await trio.to_thread.run_sync(start_workers, tmp_path, str(db), upstream)
    try:
        second = run_cli("serve", "--port", "0", "--db", str(db), cwd=tmp_path)
        assert_one_line_error(second, f"pid {server.proc.pid}", "one server per database")
    finally:
        assert await trio.to_thread.run_sync(server.stop) == 0, server.stderr()


def test_the_workers_key_and_flag(tmp_path: Path) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text('[server]\nworkers = "auto"\n')
    assert load_config(config, environ={}).server.workers == (os.cpu_count() or 1)
    config.write_text("[server]\nworkers = 3\n")
    assert load_config(config, environ={}).server.workers == 3
    assert load_config(environ={}).server.workers == 1
    for bad in ("0", '"many"', "true"):
        config.write_text(f"[server]\nworkers = {bad}\n")
        with pytest.raises(ConfigError, match=r"server\.workers"):
            load_config(config, environ={})
    result = run_cli("serve", "--workers", "none", "--port", "0", cwd=tmp_path)
    assert result.returncode == 2
    assert_one_line_error(result, "--workers")
