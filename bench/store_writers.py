"""Benchmark of the SQLite store alone with several writer processes (issue 34).

Run it from a clone, no install needed::

    python bench/store_writers.py                 # prints the figures
    python bench/store_writers.py --processes 1   # one writer process, for the ratio
    python bench/store_writers.py --seconds 5 --callers 64

``serve --workers N`` runs N processes on one SQLite file (WAL, ``synchronous=FULL``),
each with its own :class:`gateway.store.Store` and its batching writer; SQLite takes one
writer at a time for the whole file. This bench runs ``--processes`` such processes
(default 4), each with ``--callers`` concurrent callers that do what a call does to the
store, through the store's own API, as ``gateway/calls/lifecycle.py`` does it on a
worker: ``store.write(records.open_call, <the pending row>, None)`` then
``store.write(records.settle_call, ...)`` with its settled values, its credit debit
(a ledger row) and the posted amounts leaving the worker's three leases (key day, key
month, organisation credits), each awaited (committed) before the next. Every process
starts at one instant and stops at a deadline; settled calls/s is the calls whose
settlement committed, all processes together, over the time they ran (the database is
counted afterwards to check the processes' own counts). Also: a call's two writes, median
and p99 (ms), and the CPU time of the writer processes per settled call.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.streaming import machine, percentile  # noqa: E402
from gateway.store import Store, records  # noqa: E402
from gateway.store.sql import Conn  # noqa: E402

ORG = "org_bench"
KEY = "key_bench"
LIMITS = [f"{KEY}:day", f"{KEY}:month", f"{ORG}:credits"]
RESERVED = 40_000
SETTLED = 30_000


def node(i: int) -> str:
    return f"bench-w{i}"


def prepare(conn: Conn, processes: int) -> None:
    """The organisation (the ledger's foreign key) and each worker's three leases."""
    conn.execute(
        "INSERT INTO orgs (id, name, residency, policy, created_at) VALUES (?, ?, NULL, '{}', ?)",
        (ORG, "bench", time.time()),
    )
    for i in range(processes):
        for limit in LIMITS:
            conn.execute(
                "INSERT INTO leases (limit_id, node_id, amount, window_end) VALUES (?, ?, ?, ?)",
                (limit, node(i), 10**15, time.time() + 86_400),
            )


def pending_row(request_id: str, node_id: str) -> dict[str, Any]:
    """What ``Lifecycle._pending_row`` writes (a non-streamed chat call)."""
    now = time.time()
    return {
        "id": request_id,
        "key_id": KEY,
        "parent_id": None,
        "org_id": ORG,
        "created": now,
        "day": time.strftime("%Y-%m-%d", time.gmtime(now)),
        "month": time.strftime("%Y-%m", time.gmtime(now)),
        "endpoint": "/v1/chat/completions",
        "model": "live-chat",
        "provider": "upstream",
        "status": records.PENDING,
        "http_status": None,
        "stream": 0,
        "tags": {"team": "bench"},
        "usage": None,
        "estimated_usd_nanos": RESERVED,
        "reserved_usd_nanos": RESERVED,
        "settled_usd_nanos": 0,
        "billed_usd_nanos": 0,
        "latency_ms": None,
        "error_code": None,
        "mode": "live",
        "trace_id": None,
        "node_id": node_id,
    }


def settlement(request_id: str, node_id: str) -> tuple[Any, ...]:
    """The arguments of ``records.settle_call`` after a call billed ``SETTLED``."""
    values = {
        "status": "succeeded",
        "http_status": 200,
        "usage": records.usage_row(12, 8, 20, 0, 0),
        "settled_usd_nanos": SETTLED,
        "billed_usd_nanos": SETTLED,
        "latency_ms": 3.5,
        "error_code": None,
    }
    ledger = {
        "org_id": ORG,
        "amount_nanos": -SETTLED,
        "kind": "usage",
        "request_id": request_id,
        "created_at": time.time(),
    }
    leases = (node_id, [(limit, SETTLED) for limit in LIMITS])
    return request_id, values, ledger, None, None, leases


async def writer_process(
    db: str, index: int, callers: int, start_at: float, seconds: float
) -> None:
    """One worker's store under load; prints its figures as one JSON line."""
    store = Store(db)
    node_id = node(index)
    waits: list[float] = []
    commits: list[float] = []
    store.on_commit = commits.append
    settled = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(store.run)
        await trio.sleep(max(0.0, start_at - time.time()))
        cpu_before = time.process_time()
        began = time.perf_counter()
        deadline = trio.current_time() + seconds

        async def caller(c: int) -> None:
            nonlocal settled
            n = 0
            while trio.current_time() < deadline:
                request_id = f"req_{index}_{c}_{n}"
                n += 1
                t0 = time.perf_counter()
                await store.write(records.open_call, pending_row(request_id, node_id), None)
                await store.write(
                    records.settle_call, *settlement(request_id, node_id), must_land=True
                )
                waits.append((time.perf_counter() - t0) * 1000)
                settled += 1

        async with trio.open_nursery() as callers_nursery:
            for c in range(callers):
                callers_nursery.start_soon(caller, c)
        elapsed = time.perf_counter() - began
        cpu = time.process_time() - cpu_before
        nursery.cancel_scope.cancel()
    store.close()
    figures = {
        "settled": settled,
        "elapsed": elapsed,
        "cpu": cpu,
        "median_ms": statistics.median(waits),
        "p99_ms": percentile(waits, 0.99),
        "commits": len(commits),
        "commit_ms": statistics.median(commits) * 1000,
    }
    print(json.dumps(figures), flush=True)


def run(processes: int, callers: int, seconds: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
        db = str(Path(tmp) / "store.db")
        store = Store(db)
        store.call(prepare, processes)
        store.close()
        start_at = time.time() + 1.0 + 0.2 * processes
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--child",
                    db,
                    str(i),
                    str(callers),
                    repr(start_at),
                    repr(seconds),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for i in range(processes)
        ]
        outs = [json.loads(child.communicate(timeout=seconds + 60)[0]) for child in children]
        with sqlite3.connect(db) as conn:
            (in_db,) = conn.execute(
                "SELECT COUNT(*) FROM requests WHERE status = 'succeeded'"
            ).fetchone()
    settled = sum(o["settled"] for o in outs)
    if in_db != settled:
        raise SystemExit(f"the processes settled {settled} calls, the database holds {in_db}")
    elapsed = max(o["elapsed"] for o in outs)
    return {
        "calls_per_s": settled / elapsed,
        "median_ms": statistics.median(o["median_ms"] for o in outs),
        "p99_ms": max(o["p99_ms"] for o in outs),
        "cpu_ms_per_call": sum(o["cpu"] for o in outs) / settled * 1000,
        "settled": settled,
        "commits_per_s": sum(o["commits"] for o in outs) / elapsed,
        "ops_per_commit": 2 * settled / sum(o["commits"] for o in outs),
        "commit_ms": statistics.median(o["commit_ms"] for o in outs),
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        db, index, callers, start_at, seconds = sys.argv[2:7]
        trio.run(writer_process, db, int(index), int(callers), float(start_at), float(seconds))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=32, help="concurrent calls per process")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{machine()}; {args.processes} processes x {args.callers} callers, {args.seconds} s")
    for _ in range(args.rounds):
        load = os.getloadavg()[0]
        got = run(args.processes, args.callers, args.seconds)
        print(
            f"settled calls/s {got['calls_per_s']:,.0f}  two writes median {got['median_ms']:.1f}"
            f" ms p99 {got['p99_ms']:.1f} ms  writer CPU/call {got['cpu_ms_per_call']:.3f} ms"
            f"  commits/s {got['commits_per_s']:,.0f} of {got['ops_per_commit']:.1f} writes,"
            f" {got['commit_ms']:.2f} ms each (median, lock wait included)"
            f"  ({got['settled']} calls; load before {load:.2f}, after {os.getloadavg()[0]:.2f})",
            flush=True,
        )


if __name__ == "__main__":
    main()
