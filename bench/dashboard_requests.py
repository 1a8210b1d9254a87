"""Benchmark of the dashboard's request list over 1,000,000 request records.

Run it from a clone (PostgreSQL's binaries on the machine for the second store)::

    python bench/dashboard_requests.py              # SQLite, then PostgreSQL if found
    python bench/dashboard_requests.py --sqlite     # SQLite only
    python bench/dashboard_requests.py --rows 200000

For each store: a ``svc-gateway serve`` makes the schema, an organisation with ten keys
and an owner; the server stops; 1,000,000 records are written straight into the database
(90 days, ten keys, five models, three statuses, a ``team`` tag of five values; on
PostgreSQL with COPY); the server starts again and an owner signed in asks, over HTTP,
for the whole rendered page (what a browser waits for), each ``REPEAT`` times:

- the first page, unfiltered; filtered by model, by status, by key, by tag, by a month;
- a deep page: the page after the 900,000th record (its keyset cursor), and after it.

It prints the median and the slowest of each. The issue's bar: under 200 ms a page.
PostgreSQL: a throwaway cluster (``tests/support/pg_cluster.py``), durable settings.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.pg_cluster import destroy, find_bin_dir, start_cluster  # noqa: E402
from tests.support.procs import ADMIN_TOKEN, Server, base_env, start_server  # noqa: E402

PASSWORD = "bench passphrase long enough"
EMAIL = "owner@bench.example"
REPEAT = 15
DEEP = 900_000
KEYS = 10
MODELS = ("gpt-4o-mini", "gpt-4o", "claude-3-5-sonnet", "gemini-1.5-pro", "llama-3-70b")
STATUSES = ("succeeded",) * 8 + ("failed", "cancelled")
TEAMS = ("search", "ads", "maps", "mail", "docs")
SPAN_S = 90 * 86400
COLUMNS = (
    "id", "key_id", "org_id", "created", "day", "month", "endpoint", "model", "provider",
    "status", "http_status", "stream", "tags", "usage", "estimated_usd_nanos",
    "reserved_usd_nanos", "settled_usd_nanos", "billed_usd_nanos", "latency_ms",
    "error_code", "mode", "parent_id", "trace_id", "node_id",
)  # fmt: skip


def rows(count: int, org_id: str, key_ids: list[str], now: float) -> list[tuple[object, ...]]:
    rng = random.Random(33)
    out = []
    for i in range(count):
        created = now - SPAN_S * (i / count) - rng.random()
        when = datetime.fromtimestamp(created, UTC)
        status = rng.choice(STATUSES)
        cost = rng.randrange(1_000, 5_000_000)
        out.append((
            f"req_{i:024x}", key_ids[i % len(key_ids)], org_id, created,
            when.strftime("%Y-%m-%d"), when.strftime("%Y-%m"), "/v1/chat/completions",
            MODELS[i % len(MODELS)], "openai", status, 200 if status == "succeeded" else 502,
            0, orjson.dumps({"team": TEAMS[i % len(TEAMS)]}).decode(),
            orjson.dumps({"prompt_tokens": 120, "completion_tokens": 40}).decode(),
            cost, cost, cost, cost, 123.4, None if status == "succeeded" else "upstream_error",
            "live", None, None, None,
        ))  # fmt: skip
    return out


def fill_sqlite(path: Path, data: list[tuple[object, ...]]) -> None:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")  # a bench's fill, not the gateway's writes
    conn.execute("PRAGMA cache_size = -262144")
    marks = ", ".join("?" for _ in COLUMNS)
    with conn:
        conn.executemany(f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({marks})", data)
    conn.execute("ANALYZE")
    conn.close()


def fill_postgres(url: str, data: list[tuple[object, ...]]) -> None:
    import psycopg  # only the store imports a driver in the gateway; a bench may

    with psycopg.connect(url, autocommit=True) as conn:
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY requests ({', '.join(COLUMNS)}) FROM STDIN") as copy,
        ):
            for row in data:
                copy.write_row(row)
        conn.execute("ANALYZE requests")


def setup(server: Server) -> tuple[str, list[str]]:
    with server.client(ADMIN_TOKEN) as admin:
        org_id = admin.post("/admin/orgs", json={"name": "Bench"}).json()["id"]
        keys = [
            admin.post(
                "/admin/keys", json={"org_id": org_id, "name": f"key-{i}", "mode": "live"}
            ).json()["id"]
            for i in range(KEYS)
        ]
        made = admin.post(
            "/admin/users",
            json={"org_id": org_id, "email": EMAIL, "role": "owner", "password": PASSWORD},
        )
        assert made.status_code == 201, made.text
    return org_id, keys


def sign_in(server: Server) -> httpx.Client:
    client = httpx.Client(base_url=server.url, timeout=30.0)
    form = client.get("/dashboard/login").text
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert csrf is not None
    answer = client.post(
        "/dashboard/login",
        data={"email": EMAIL, "password": PASSWORD, "csrf_token": csrf.group(1)},
    )
    assert answer.status_code in (200, 303), answer.text
    return client


def cpu_ms(pids: list[int]) -> float:
    """CPU time (user + system) the processes have used, from /proc, in milliseconds."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total * 1000 / os.sysconf("SC_CLK_TCK")


def timed(
    client: httpx.Client, params: dict[str, str], pids: list[int]
) -> tuple[float, float, float, int]:
    """The page's wall time (median, slowest) and the CPU the gateway (and, on PostgreSQL,
    the database's processes) spent on it, a mean: on a busy shared machine the wall time
    measures the machine as much as the page, the CPU time does not."""
    times = []
    listed = 0
    cpu_before = cpu_ms(pids)
    for _ in range(REPEAT):
        start = time.perf_counter()
        page = client.get("/dashboard/requests", params=params)
        times.append((time.perf_counter() - start) * 1000)
        assert page.status_code == 200, page.text[:500]
        listed = len(re.findall(r'href="/dashboard/requests/req_', page.text))
    cpu = (cpu_ms(pids) - cpu_before) / REPEAT
    return statistics.median(times), max(times), cpu, listed


def database_pids(cluster_data: Path | None) -> list[int]:
    """The PostgreSQL server's processes (the postmaster's children included)."""
    if cluster_data is None:
        return []
    postmaster = int((cluster_data / "postmaster.pid").read_text().split()[0])
    children = Path(f"/proc/{postmaster}/task/{postmaster}/children").read_text().split()
    return [postmaster, *map(int, children)]


def older_link(client: httpx.Client, params: dict[str, str]) -> dict[str, str]:
    page = client.get("/dashboard/requests", params=params).text
    found = re.search(r'class="button" href="\?([^"]+)">Older requests', page)
    assert found is not None
    return dict(httpx.QueryParams(found.group(1).replace("&amp;", "&")))


def run(
    store: str, db: str | Path, workdir: Path, count: int, cluster_data: Path | None = None
) -> list[tuple[str, float, float, float, int]]:
    server = start_server(workdir, db=db, env=base_env(), timeout=300)
    org_id, keys = setup(server)
    assert server.stop(signal.SIGTERM) == 0, server.stderr()
    now = time.time()
    began = time.perf_counter()
    data = rows(count, org_id, keys, now)
    if store == "sqlite":
        fill_sqlite(Path(db), data)
    else:
        fill_postgres(str(db), data)
    print(f"{store}: {count:,} records written in {time.perf_counter() - began:.0f} s", flush=True)
    deep_at = min(DEEP, count * 9 // 10)
    deep_row = data[deep_at]
    deep = f"{deep_row[3]!r}~{deep_row[0]}"
    del data
    server = start_server(workdir, db=db, env=base_env(), timeout=600)
    try:
        client = sign_in(server)
        month = datetime.fromtimestamp(now - 40 * 86400, UTC).strftime("%Y-%m")
        cases = {
            "first page": {},
            "first page, by model": {"model": MODELS[1]},
            "first page, by status": {"status": "cancelled"},
            "first page, by key": {"key_id": keys[3]},
            "first page, by tag": {"tag": "team=maps"},
            "first page, last month": {"range": "last_month"},
            f"deep page (after record {deep_at:,})": {"before": deep},
        }
        cases["the page after the deep one"] = older_link(
            client, cases[f"deep page (after record {deep_at:,})"]
        )
        cases["deep page, by tag"] = {"tag": "team=maps", "before": deep}
        cases[f"first page, {month}, by tag"] = {
            "tag": "team=maps", "range": "custom", "start": f"{month}-01", "end": f"{month}-28",
        }  # fmt: skip
        results = []
        floor = []  # the same session's smallest page (no records): the machine's floor now
        for _ in range(REPEAT):
            start = time.perf_counter()
            assert client.get("/dashboard/account").status_code == 200
            floor.append((time.perf_counter() - start) * 1000)
        print(
            f"{store:10} {'floor: /dashboard/account':42} median {statistics.median(floor):7.1f} ms"
        )
        pids = [server.proc.pid, *database_pids(cluster_data)]
        for name, params in cases.items():
            median, slowest, cpu, listed = timed(client, params, pids)
            results.append((name, median, slowest, cpu, listed))
            line = (
                f"median {median:7.1f} ms  slowest {slowest:7.1f} ms  CPU {cpu:6.1f} ms"
                f"  ({listed} rows)"
            )
            print(f"{store:10} {name:42} {line}", flush=True)
        client.close()
    finally:
        server.stop(signal.SIGTERM)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--sqlite", action="store_true", help="SQLite only")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-dash-") as tmp:
        work = Path(tmp)
        (work / "sqlite").mkdir()
        run("sqlite", work / "sqlite" / "g.db", work / "sqlite", args.rows)
        bin_dir = None if args.sqlite else find_bin_dir()
        if bin_dir is None:
            print("postgresql: skipped (no binaries)" if not args.sqlite else "")
            return
        cluster = start_cluster(bin_dir, durable=True)
        try:
            cluster.psql("CREATE DATABASE bench")
            (work / "pg").mkdir()
            run("postgresql", cluster.url("bench"), work / "pg", args.rows, cluster.data)
        finally:
            destroy(cluster)


if __name__ == "__main__":
    main()
