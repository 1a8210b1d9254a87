"""Benchmark of in-process admission: admit + reserve + settle through a ShardPool.

Run it from a clone, no install needed::

    python bench/admission.py            # prints a table, updates bench/RESULTS.md
    python bench/admission.py --no-write # prints only

What one "admission" is here: the three shard round trips of a model call, i.e.
step 3 (admit, taking an in-flight slot), step 8 (reserve against tpm, key and
parent caps, org credits and budget) and step 10 (settle: release the slot and
post part of the reservation), each a real message to a real actor, with the
request objects built per call as a handler would. Keys are sub-keys of a parent
(so both caps are checked), spread over 16 shards, picked at random per call.

Measured:
- latency with one caller: median and p99 of the whole walk, in µs;
- throughput with 100 and with 1000 concurrent callers, in admissions/s;
- each with 10 and with 100,000 keys loaded;
- memory per idle key (tracemalloc, over 100,000 keys created through the pool);
- for context, one bare round trip (admit only) and the same three steps run as
  plain synchronous calls on the shard state (what the actor hop costs).

Total runtime is bounded (about 30 s on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import os
import platform
import random
import re
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shards import (  # noqa: E402
    NANOS_PER_USD,
    AdmitRequest,
    Reservation,
    ReserveRequest,
    SettleRequest,
    ShardPool,
)

USD = NANOS_PER_USD
ORG = "org_bench"
SECTION = "## Admission (shards)"
LATENCY_CALLS = 20_000
THROUGHPUT_SECONDS = 3.0
BIG = 100_000


def key_ids(n: int) -> list[tuple[str, str, str]]:
    """(key id, family id, parent id): families of one parent and 9 sub-keys."""
    out = []
    for i in range(n):
        family = f"fam{i // 10:06d}"
        out.append((f"key{i:07d}", family, f"par{i // 10:06d}"))
    return out


def new_pool(keys: list[tuple[str, str, str]]) -> ShardPool:
    pool = ShardPool(n_shards=16)
    pool.set_org(ORG, 10**9 * USD, None)
    for key, family, parent in keys:
        pool.load_spend(key, family, 0, 0)
        pool.load_spend(parent, family, 0, 0)
    return pool


async def walk(pool: ShardPool, key: str, family: str, parent: str) -> None:
    """One admission: the three steps of a model call, as the gateway sends them."""
    admission = await pool.admit(
        AdmitRequest(
            key_id=key, family_id=family, org_id=ORG, rpm=1_000_000_000, max_in_flight=10_000
        )
    )
    assert admission.ok
    reservation = await pool.reserve(
        ReserveRequest(
            key_id=key,
            family_id=family,
            parent_id=parent,
            org_id=ORG,
            tokens=1_200,
            tpm=None,
            cost=3_000_000,
            key_usd_day=10**6 * USD,
            key_usd_month=10**7 * USD,
            parent_usd_day=10**7 * USD,
            parent_usd_month=10**8 * USD,
            org_cost=3_000_000,
            check_credits=True,
        )
    )
    assert isinstance(reservation, Reservation)
    await pool.settle(
        SettleRequest(
            key_id=key,
            family_id=family,
            parent_id=parent,
            org_id=ORG,
            slot_taken=True,
            reservation=reservation,
            cap_amount=1_000_000,
            billed_amount=1_000_000,
        )
    )


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(len(sorted_ns) * q))] / 1_000


async def latency(n_keys: int) -> tuple[float, float]:
    keys = key_ids(n_keys)
    pool = new_pool(keys)
    rng = random.Random(1)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        for _ in range(2_000):  # warm up
            await walk(pool, *rng.choice(keys))
        samples = []
        clock = time.perf_counter_ns
        picks = [rng.choice(keys) for _ in range(LATENCY_CALLS)]
        gc.collect()
        for key, family, parent in picks:
            t0 = clock()
            await walk(pool, key, family, parent)
            samples.append(clock() - t0)
        nursery.cancel_scope.cancel()
    samples.sort()
    return statistics.median(samples) / 1_000, percentile(samples, 0.99)


async def throughput(n_keys: int, callers: int) -> float:
    keys = key_ids(n_keys)
    pool = new_pool(keys)
    done = 0
    stop_at = 0.0

    async def caller(seed: int) -> None:
        nonlocal done
        rng = random.Random(seed)
        while trio.current_time() < stop_at:
            await walk(pool, *rng.choice(keys))
            done += 1

    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        stop_at = trio.current_time() + 0.5  # warm up
        async with trio.open_nursery() as group:
            for i in range(callers):
                group.start_soon(caller, i)
        done = 0
        gc.collect()
        start = trio.current_time()
        stop_at = start + THROUGHPUT_SECONDS
        async with trio.open_nursery() as group:
            for i in range(callers):
                group.start_soon(caller, i)
        elapsed = trio.current_time() - start
        stats = pool.statistics()
        assert stats.failed == 0 and stats.timed_out == 0, stats
        nursery.cancel_scope.cancel()
    return done / elapsed


async def bytes_per_idle_key() -> float:
    """Memory the pool holds per key after one full admission, then idle."""
    keys = key_ids(BIG)
    pool = ShardPool(n_shards=16)
    pool.set_org(ORG, 10**9 * USD, None)
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        for key, family, parent in keys[:10]:  # create parents and warm caches first
            await walk(pool, key, family, parent)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for key, family, parent in keys[10:]:
            await walk(pool, key, family, parent)
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        nursery.cancel_scope.cancel()
    # parents are keys too: count them
    created = sum(pool.statistics().keys_per_shard) - 10 - len({k[2] for k in keys[:10]})
    return (after - before) / created


async def bare_round_trip() -> float:
    pool = new_pool(key_ids(10))
    request = AdmitRequest(
        key_id="key0000000", family_id="fam000000", org_id=ORG, rpm=10**9, max_in_flight=1,
        take_slot=False,
    )  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(pool.run)
        samples = []
        clock = time.perf_counter_ns
        for _ in range(LATENCY_CALLS):
            t0 = clock()
            await pool.admit(request)
            samples.append(clock() - t0)
        nursery.cancel_scope.cancel()
    return statistics.median(samples) / 1_000


def synchronous_steps() -> float:
    """The same three steps as direct calls on the shard state: no actor, no await."""
    keys = key_ids(10)
    pool = new_pool(keys)
    state = pool._shards[pool.shard_index(keys[0][1])].state  # the handlers themselves
    key, family, parent = keys[0]
    samples = []
    clock = time.perf_counter_ns
    for _ in range(LATENCY_CALLS):
        t0 = clock()
        state.admit(
            AdmitRequest(key_id=key, family_id=family, org_id=ORG, rpm=10**9, max_in_flight=10**4)
        )
        res = state.reserve(
            ReserveRequest(
                key_id=key, family_id=family, parent_id=parent, org_id=ORG, tokens=1_200,
                cost=3_000_000, key_usd_day=10**6 * USD, key_usd_month=10**7 * USD,
                parent_usd_day=10**7 * USD, parent_usd_month=10**8 * USD,
                org_cost=3_000_000,
            )
        )  # fmt: skip
        assert isinstance(res, Reservation)
        state.settle(
            SettleRequest(
                key_id=key, family_id=family, parent_id=parent, org_id=ORG, slot_taken=True,
                reservation=res, cap_amount=1_000_000, billed_amount=1_000_000,
            )
        )  # fmt: skip
        samples.append(clock() - t0)
    return statistics.median(samples) / 1_000


def machine() -> str:
    u = platform.uname()
    return (
        f"{os.cpu_count()} cores, {platform.processor() or u.machine}, "
        f"{u.system} {u.release}, Python {platform.python_version()} "
        f"({platform.python_implementation()}), trio {trio.__version__}"
    )


def progress(what: str) -> None:
    print(f"... {what}", file=sys.stderr, flush=True)


def run_all() -> str:
    t_start = time.perf_counter()
    progress("latency, one caller")
    lat = {n: trio.run(latency, n) for n in (10, BIG)}
    progress("throughput, 100 and 1000 callers")
    tput = {(n, c): trio.run(throughput, n, c) for n in (10, BIG) for c in (100, 1000)}
    progress("memory per idle key")
    per_key = trio.run(bytes_per_idle_key)
    progress("context")
    bare = trio.run(bare_round_trip)
    sync = synchronous_steps()
    elapsed = time.perf_counter() - t_start

    def flat(a: float, b: float) -> str:
        return f"{(b - a) / a * 100:+.0f} %"

    lines = [
        "| measure | 10 keys | 100,000 keys | 100k vs 10 | target |",
        "|---|---|---|---|---|",
        f"| one caller, median (µs) | {lat[10][0]:.1f} | {lat[BIG][0]:.1f} | "
        f"{flat(lat[10][0], lat[BIG][0])} | ≤ 30 |",
        f"| one caller, p99 (µs) | {lat[10][1]:.1f} | {lat[BIG][1]:.1f} | "
        f"{flat(lat[10][1], lat[BIG][1])} | ≤ 150 |",
        f"| 100 callers (admissions/s) | {tput[10, 100]:,.0f} | {tput[BIG, 100]:,.0f} | "
        f"{flat(tput[10, 100], tput[BIG, 100])} | |",
        f"| 1000 callers (admissions/s) | {tput[10, 1000]:,.0f} | {tput[BIG, 1000]:,.0f} | "
        f"{flat(tput[10, 1000], tput[BIG, 1000])} | ≥ 30,000 |",
        "",
        "| context | value |",
        "|---|---|",
        f"| memory per idle key (tracemalloc, 100,000 keys) | {per_key:,.0f} B (target ≤ 2,048) |",
        f"| one bare round trip (admit only, request prebuilt), median | {bare:.1f} µs |",
        f"| the three steps as plain synchronous calls (no actor), median | {sync:.1f} µs |",
        "",
        f"Machine: {machine()}. Date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC. "
        f"Benchmark runtime: {elapsed:.0f} s. Command: `python bench/admission.py`.",
    ]
    return "\n".join(lines)


def write_section(table: str, notes: str) -> Path:
    path = ROOT / "bench" / "RESULTS.md"
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    body = f"{SECTION}\n\n{table}\n\n{notes.strip()}\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: body + "\n", text, count=1).rstrip("\n") + "\n"
    else:
        text = text.rstrip("\n") + "\n\n" + body
    path.write_text(text)
    return path


NOTES = """
One admission = admit (step 3) + reserve (step 8) + settle (step 10): three messages
to a shard actor, each awaited, with the request objects built per call. Keys are
sub-keys (parent caps checked too), chosen at random per call, over 16 shards.
"100k vs 10" is the change from 10 to 100,000 keys loaded (flat = near 0).
See "Reading the figures" below for where the time goes.
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    table = run_all()
    print(table)
    if not args.no_write:
        print(f"\nwritten to {write_section(table, NOTES)}")


if __name__ == "__main__":
    main()
