"""Benchmark of the two stores: live calls through the gateway on SQLite and on PostgreSQL.

Run it from a clone, no install needed (PostgreSQL 15's binaries must be on the machine)::

    python bench/stores.py            # prints a table, updates bench/RESULTS.md
    python bench/stores.py --no-write # prints only

One run, the same for both stores: the fake upstream of the tests (answers at once), a
throwaway PostgreSQL cluster (``tests/support/pg_cluster.py``, default durability: fsync on,
synchronous_commit on), then for each store a ``svc-gateway serve`` and an httpx client
with a live key. Figures: a non-streamed call's whole answer one at a time (median, p99),
calls per second with 16 at once, and the CPU each call costs the gateway process and,
on PostgreSQL, the database server's processes (from /proc, during the concurrent part).
Then the store alone: settlements (a pending row, then its settlement: two writes per
call, as a call makes them) from 64 writers at once, as commits per second. Short:
about a minute on 2 cores.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live_upstream import BODY, UPSTREAM_KEY, config_toml, live_key, start_upstream  # noqa: E402
from bench.streaming import (  # noqa: E402
    percentile,
    publish,
    run_line,
    start_server,
    wants_write,
)
from gateway.store import Store, records  # noqa: E402
from tests.support.pg_cluster import Cluster, destroy, find_bin_dir, start_cluster  # noqa: E402

SECTION = "## Stores: SQLite and PostgreSQL"
SEQUENTIAL_CALLS = 300
CONCURRENCY = 16
CONCURRENT_CALLS_EACH = 40
WRITERS = 64
WRITES_EACH = 40
TICKS = os.sysconf("SC_CLK_TCK")
T = TypeVar("T")


@dataclass
class Figures:
    median_ms: float
    p99_ms: float
    calls_per_s: float
    gateway_cpu_ms: float
    database_cpu_ms: float | None
    commits_per_s: float
    write_median_ms: float


def cpu_s(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime + stime
    return total / TICKS


def children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(stat.parent.name))
        except (FileNotFoundError, ValueError, IndexError):
            continue
    return found


def postgres_pids(cluster: Cluster) -> list[int]:
    """The postmaster and its children (one backend per connection)."""
    master = int((cluster.data / "postmaster.pid").read_text().split()[0])
    return [master, *children(master)]


async def calls(url: str, token: str, gateway_pid: int, db_pids: list[int]) -> tuple[float, ...]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    payload = orjson.dumps(BODY)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=30.0, limits=limits
    ) as client:

        async def one() -> float:
            start = time.perf_counter()
            response = await client.post("/v1/chat/completions", content=payload)
            if response.status_code != 200:
                raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")
            return (time.perf_counter() - start) * 1000

        for _ in range(20):
            await one()
        times = [await one() for _ in range(SEQUENTIAL_CALLS)]
        cpu_before = cpu_s([gateway_pid]), cpu_s(db_pids)
        start = time.perf_counter()

        async def worker() -> None:
            for _ in range(CONCURRENT_CALLS_EACH):
                await one()

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - start
        done = CONCURRENCY * CONCURRENT_CALLS_EACH
        gateway_cpu = (cpu_s([gateway_pid]) - cpu_before[0]) / done * 1000
        database_cpu = (cpu_s(db_pids) - cpu_before[1]) / done * 1000
    return (
        statistics.median(times),
        percentile(times, 0.99),
        done / elapsed,
        gateway_cpu,
        database_cpu,
    )


def pending(n: int) -> dict[str, object]:
    return {
        "id": f"req_{n}",
        "key_id": "key_bench",
        "org_id": "org_bench",
        "created": time.time(),
        "day": "2026-11-24",
        "month": "2026-11",
        "status": records.PENDING,
        "tags": {"team": "bench"},
        "reserved_usd_nanos": 1000,
        "settled_usd_nanos": 0,
    }


async def commits(db: str) -> tuple[float, float]:
    """Writes per second through the store's batched writer, and a write's median wait."""
    store = Store(db)
    waits: list[float] = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            start = time.perf_counter()

            async def writer(w: int) -> None:
                for i in range(WRITES_EACH):
                    n = w * WRITES_EACH + i
                    began = time.perf_counter()
                    await store.write(records.open_call, pending(n), None)
                    values = {"status": "succeeded", "settled_usd_nanos": 900}
                    await store.write(records.settle_call, f"req_{n}", values, None, None, None)
                    waits.append((time.perf_counter() - began) * 500)  # per write

            async with trio.open_nursery() as writers:
                for w in range(WRITERS):
                    writers.start_soon(writer, w)
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
    finally:
        store.close()
    return WRITERS * WRITES_EACH * 2 / elapsed, statistics.median(waits)


async def measure(cluster: Cluster) -> dict[str, Figures]:
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    results: dict[str, Figures] = {}
    try:
        for name in ("SQLite", "PostgreSQL"):
            with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
                work = Path(tmp)
                config = work / "gateway.toml"
                config.write_text(config_toml(upstream_url))
                args: tuple[str, ...] = ("--config", str(config))
                db_pids: list[int] = []
                if name == "PostgreSQL":
                    await trio.to_thread.run_sync(cluster.psql, "CREATE DATABASE bench_calls")
                    args += ("--db", cluster.url("bench_calls"))
                server = await trio.to_thread.run_sync(
                    lambda args=args, work=work: start_server(
                        work, args, {"BENCH_UPSTREAM_KEY": UPSTREAM_KEY}
                    )
                )
                try:
                    if name == "PostgreSQL":
                        db_pids = postgres_pids(cluster)
                    token = await live_key(server.url)
                    live = await calls(server.url, token, server.proc.pid, db_pids)
                finally:
                    await trio.to_thread.run_sync(server.stop)
                if name == "PostgreSQL":
                    await trio.to_thread.run_sync(cluster.psql, "CREATE DATABASE bench_store")
                    store_db = cluster.url("bench_store")
                else:
                    store_db = str(work / "store.db")
                rate, wait = await commits(store_db)
            results[name] = Figures(
                *live[:4], live[4] if db_pids else None, commits_per_s=rate, write_median_ms=wait
            )
    finally:
        upstream.kill()
        upstream.wait(timeout=5)
    return results


def report(results: dict[str, Figures], runtime_s: float, load: tuple[float, float]) -> str:
    sq, pg = results["SQLite"], results["PostgreSQL"]
    rows = [
        ("whole answer one at a time, median (ms)", sq.median_ms, pg.median_ms, ".2f"),
        ("whole answer one at a time, p99 (ms)", sq.p99_ms, pg.p99_ms, ".2f"),
        (f"calls/s, {CONCURRENCY} at once", sq.calls_per_s, pg.calls_per_s, ",.0f"),
        ("gateway process CPU per call (ms)", sq.gateway_cpu_ms, pg.gateway_cpu_ms, ".2f"),
    ]
    table = [
        "| measure | SQLite | PostgreSQL |",
        "|---|---|---|",
        *(f"| {name} | {a:{f}} | {b:{f}} |" for name, a, b, f in rows),
        f"| database server CPU per call (ms) | (in the gateway process) | "
        f"{pg.database_cpu_ms or 0:.2f} |",
        f"| store alone: writes/s, {WRITERS} writers | {sq.commits_per_s:,.0f} | "
        f"{pg.commits_per_s:,.0f} |",
        f"| store alone: a write's wait, median (ms) | {sq.write_median_ms:.2f} | "
        f"{pg.write_median_ms:.2f} |",
    ]
    return "\n".join(
        [
            SECTION,
            "",
            *table,
            "",
            run_line("python bench/stores.py", runtime_s, load),
            "",
            "One run for both stores: the fake upstream (answers at once), a `svc-gateway "
            "serve` on each store in turn, and httpx as the client with a live key (each call "
            "writes its pending row, then its settlement and credit debit, both committed "
            "before the answer). PostgreSQL 15 is a throwaway cluster on loopback with its "
            "default durability (fsync, synchronous_commit on), reached by psycopg 3 (libpq, "
            "binary wheel) on the store's worker threads. "
            f"{SEQUENTIAL_CALLS} calls one at a time, then "
            f"{CONCURRENCY * CONCURRENT_CALLS_EACH} calls {CONCURRENCY} at once (CPU is "
            f"measured over those); the store alone: {WRITERS} writers making "
            f"{WRITES_EACH} calls' two writes each.",
            "",
            "- One driver measured: psycopg 3 (synchronous, on the store's worker threads). "
            "asyncpg through trio-asyncio, the alternative, was not measured.",
            "- A call waits for two commits (its pending row before the provider is asked, its "
            "settlement before the answer): on PostgreSQL each is a round trip and a WAL flush "
            "of the database server, on SQLite an fsync from the gateway's own process. "
            "On PostgreSQL the database server's CPU comes on top of the gateway's. With 2 "
            "cores shared by the client, the upstream, the gateway and the database, the "
            "calls/s row is bound by CPU, and CPU per call varies by a third between runs.",
            "- The store alone batches: many writers share one transaction, so its writes/s "
            "is far above one commit per call.",
            "",
        ]
    )


def run_on_postgres(
    doc: str,
    measure: Callable[[Cluster], Awaitable[T]],
    report: Callable[[T, float, tuple[float, float]], str],
) -> None:
    """A bench's main: a throwaway durable PostgreSQL cluster around ``measure``, then its
    ``report`` (with the runtime and load) printed and published."""
    write = wants_write(doc)
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise SystemExit("PostgreSQL binaries (initdb, pg_ctl) not found")
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    cluster = start_cluster(bin_dir, durable=True)
    try:
        results = trio.run(measure, cluster)
    finally:
        destroy(cluster)
    load = (load_before, os.getloadavg()[0])
    publish(report(results, time.monotonic() - started, load), write)


if __name__ == "__main__":
    run_on_postgres(__doc__, measure, report)
