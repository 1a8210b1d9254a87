"""Benchmark of ``serve --workers`` (issue 34): CPU per call and calls/s with 1 and 2
workers, and the open-loop latency tail.

Run it from a clone, no install needed::

    python bench/workers.py --cpu          # 1 vs 2 workers, rounds in turn
    python bench/workers.py --open-loop    # 50 calls/s: the gateway against the upstream
    python bench/workers.py --open-loop --trace DIR   # and what stalled the slow calls

``--cpu``: two gateways on one fake upstream (``gateway/fakes/fake_upstream.py``), one
with ``[server] workers = 1``, one with 2, each on its own SQLite file, and four sides
(``SIDES``) taken in turn, the order rotating from round to round: the reference (1
worker, 16 callers); 2 workers with 16 callers each (32: what a worker added costs per
call, at the same load per worker); 2 workers with 16 callers in all (each worker half
as busy); and the reference with 8 callers (what being half as busy costs one process,
workers aside). Callers are on kept-alive connections (:mod:`bench.raw_http`), calls
non-streamed, 400 a round. Per round: calls/s, and the CPU time of the whole process
group (the parent and its workers, from the kernel's CPU clock of each) per call,
against the reference's of the same round. Twice: with the gateways pinned to the first
core (the load and the upstream on the other: CPU per call, each side's rate on one
core), and unpinned (every process on both cores: what a second worker buys on this
machine, where the load and the upstream need CPU too).

``--open-loop``: one gateway (one worker, pinned to the first core as in
``bench/live_upstream.py``) and the fake upstream. Calls are sent on a fixed schedule,
``--rate`` per second, whatever the answers (a connection from a pool of idle ones, or a
new one): a call's latency runs from its scheduled instant to its whole answer, so a
stall delays every call it meets. Slices of ``--slice`` seconds go to the upstream
directly (the base) and to the gateway in turn; added latency is the gateway's
percentile minus the upstream's. ``--trace DIR`` runs the gateway under
``bench/stall_trace.py``, which logs the collector's runs, the store's commits and the
trio scheduler's long task steps with their instants, and prints what overlapped the
slowest calls and the fastest.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live_upstream import (  # noqa: E402
    BODY,
    Target,
    at_once,
    config_toml,
    cpu_seconds,
    in_turn,
    pin_cores,
    raw_call,
    start_target,
    start_upstream,
)
from bench.raw_http import RawConnection  # noqa: E402
from bench.stall_trace import SITECUSTOMIZE  # noqa: E402
from bench.stores import children  # noqa: E402
from bench.streaming import machine, percentile  # noqa: E402

CALLS_EACH = 25
ROUNDS = 8
RATE = 50.0
SLICE_S = 10.0
SLICES = 6


def with_workers(config: str, workers: int) -> str:
    return config.replace("[server]\n", f"[server]\nworkers = {workers}\n", 1)


def group_cpu(pid: int) -> float:
    """CPU seconds of a gateway and its workers (a parent of workers spends almost none)."""
    return sum(cpu_seconds(p) for p in (pid, *children(pid)))


@dataclass(frozen=True)
class Side:
    """One side of the ``--cpu`` comparison: a gateway and how many callers load it."""

    name: str
    workers: int
    callers: int


#: the reference first; then 2 workers with the reference's callers per worker (what a
#: worker added costs), with its callers in all (each worker half as busy), and the
#: reference with half its callers (what half as busy costs one process, workers aside)
SIDES = (
    Side("1 worker, 16 callers", 1, 16),
    Side("2 workers, 32 callers (16 each)", 2, 32),
    Side("2 workers, 16 callers (8 each)", 2, 16),
    Side("1 worker, 8 callers", 1, 8),
)


async def cpu_round(target: Target, callers: int) -> tuple[float, float]:
    """``callers`` callers, non-streamed calls: (calls/s, CPU ms per call of the process
    group)."""
    payload = orjson.dumps(BODY)
    each = CALLS_EACH * 16 // callers  # the same number of calls in every round
    before = group_cpu(target.pid)
    seconds, _, _ = await at_once(target, partial(raw_call, payload=payload), each, None, callers)
    calls = callers * each
    return calls / seconds, (group_cpu(target.pid) - before) * 1000 / calls


async def measure_cpu(pinned: bool, count: int) -> list[list[tuple[float, float]]]:
    """Rounds of every side in turn (the order rotates from round to round): per round,
    each side's (calls/s, CPU ms per call)."""
    cpus = pin_cores() if pinned else None
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    targets: dict[int, Target] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            for workers in (1, 2):
                config = with_workers(config_toml(upstream_url), workers)
                targets[workers] = await start_target(
                    f"w{workers}", Path(tmp) / f"w{workers}", config, cpus
                )
            rounds = [partial(cpu_round, targets[s.workers], s.callers) for s in SIDES]
            for side in rounds:  # warm: connections, leases, the caches
                await side()
            results = []
            for i in range(count):
                figures: dict[int, tuple[float, float]] = {}
                for k in ((i + j) % len(rounds) for j in range(len(rounds))):
                    figures[k] = await rounds[k]()
                results.append([figures[k] for k in range(len(rounds))])
            return results
    finally:
        for target in targets.values():
            await trio.to_thread.run_sync(target.server.stop)
        upstream.kill()
        upstream.wait(timeout=5)
        if pinned:
            os.sched_setaffinity(0, range(os.cpu_count() or 1))


def cpu_report(label: str, rounds: list[list[tuple[float, float]]], load: float) -> str:
    """One row per side: calls/s and CPU per call (medians), and the CPU per call against
    the first side's in the same round (median of the rounds, and their range)."""
    lines = []
    for k, side in enumerate(SIDES):
        rate = statistics.median(r[k][0] for r in rounds)
        cpu = statistics.median(r[k][1] for r in rounds)
        ratios = sorted(r[k][1] / r[0][1] for r in rounds)
        against = (
            f"{statistics.median(ratios):.3f} ({ratios[0]:.3f} to {ratios[-1]:.3f})" if k else ""
        )
        lines.append(f"| {label}: {side.name} | {rate:,.0f} | {cpu:.3f} | {against} |")
    lines.append(f"| {label}: load (1 min) after | {load:.2f} | | |")
    return "\n".join(lines)


# -- the open loop ------------------------------------------------------------------------


@dataclass
class Endpoint:
    host: str
    port: int
    path: str
    headers: dict[str, str]


def endpoint(url: str, path: str, token: str) -> Endpoint:
    parts = urlsplit(url)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    return Endpoint(parts.hostname or "", parts.port or 80, parts.path + path, headers)


async def open_loop(target: Endpoint, rate: float, seconds: float) -> list[tuple[float, float]]:
    """Calls on a fixed schedule: (scheduled wall instant, latency ms) of each."""
    payload = orjson.dumps(BODY)
    idle: list[RawConnection] = []
    done: list[tuple[float, float]] = []

    async def one(at: float) -> None:
        conn = idle.pop() if idle else RawConnection(target.host, target.port, target.headers)
        status, body = await conn.post(target.path, payload)
        if status != 200:
            raise SystemExit(f"HTTP {status}: {body[:300]!r}")
        latency = (trio.current_time() - at) * 1000
        done.append((time.time() - latency / 1000, latency))
        idle.append(conn)

    async with trio.open_nursery() as nursery:
        start = trio.current_time() + 0.05
        for i in range(int(rate * seconds)):
            at = start + i / rate
            await trio.sleep_until(at)
            nursery.start_soon(one, at)
    for conn in idle:
        await conn.aclose()
    return done


@dataclass
class Sides:
    direct: list[tuple[float, float]]
    gateway: list[tuple[float, float]]
    #: per pair of slices: (added p50, added p99)
    pairs: list[tuple[float, float]]
    #: the gateway's threads: seconds runnable but waiting for a core, and on a core,
    #: over its slices (the kernel's schedstat)
    waited_s: float = 0.0
    ran_s: float = 0.0


def schedstat(pid: int) -> tuple[float, float]:
    """Seconds on a core and seconds runnable waiting for one, all threads of ``pid``."""
    ran = waited = 0
    for path in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            on, wait, _ = path.read_text().split()
        except (FileNotFoundError, ValueError):
            continue
        ran, waited = ran + int(on), waited + int(wait)
    return ran / 1e9, waited / 1e9


def added(direct: list[float], gateway: list[float]) -> tuple[float, float]:
    return (
        statistics.median(gateway) - statistics.median(direct),
        percentile(gateway, 0.99) - percentile(direct, 0.99),
    )


async def measure_open_loop(
    rate: float, slice_s: float, slices: int, trace: Path | None
) -> tuple[Sides, int]:
    cpus = pin_cores()
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    extra = {}
    if trace is not None:
        (trace / "sitecustomize.py").write_text(SITECUSTOMIZE)
        extra = {"BENCH_STALL_TRACE": str(trace / "events.jsonl")}
        extra["PYTHONPATH"] = f"{trace}{os.pathsep}{ROOT}"
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            target = await start_target(
                "gateway", Path(tmp) / "gw", config_toml(upstream_url), cpus, extra_env=extra
            )
            try:
                gateway = endpoint(target.server.url, "/v1/chat/completions", target.token)
                direct = endpoint(upstream_url, "/chat/completions", "sk-bench-upstream")
                await open_loop(gateway, rate, 2.0)  # warm
                await open_loop(direct, rate, 2.0)
                sides = Sides([], [], [])

                async def gateway_slice() -> list[tuple[float, float]]:
                    ran, waited = schedstat(target.pid)
                    calls = await open_loop(gateway, rate, slice_s)
                    ran_after, waited_after = schedstat(target.pid)
                    sides.ran_s += ran_after - ran
                    sides.waited_s += waited_after - waited
                    return calls

                for i in range(slices):
                    base, cand = await in_turn(
                        partial(open_loop, direct, rate, slice_s), gateway_slice, swap=i % 2 == 1
                    )
                    sides.direct += base
                    sides.gateway += cand
                    sides.pairs.append(added([x for _, x in base], [x for _, x in cand]))
                return sides, target.pid
            finally:
                await trio.to_thread.run_sync(target.server.stop)
    finally:
        upstream.kill()
        upstream.wait(timeout=5)


def open_loop_report(sides: Sides, rate: float, load: tuple[float, float]) -> str:
    direct = [x for _, x in sides.direct]
    gateway = [x for _, x in sides.gateway]
    p50, p99 = added(direct, gateway)
    ratios = sorted(b / a for a, b in sides.pairs)
    return "\n".join(
        [
            f"open loop {rate:g} calls/s, {len(gateway)} calls each side",
            f"  upstream direct: p50 {statistics.median(direct):.2f} ms,"
            f" p99 {percentile(direct, 0.99):.2f} ms",
            f"  gateway:         p50 {statistics.median(gateway):.2f} ms,"
            f" p99 {percentile(gateway, 0.99):.2f} ms",
            f"  added: p50 {p50:.2f} ms, p99 {p99:.2f} ms, p99/p50 {p99 / p50:.2f}"
            f" (per pair of slices {statistics.median(ratios):.2f},"
            f" {ratios[0]:.2f} to {ratios[-1]:.2f})",
            f"  the gateway per call: {sides.ran_s * 1000 / len(gateway):.2f} ms on a core,"
            f" {sides.waited_s * 1000 / len(gateway):.2f} ms runnable waiting for its core",
            f"  load (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}",
        ]
    )


def stalls(sides: Sides, trace: Path, pid: int) -> str:
    """What the gateway logged during its slowest calls, and during as many fast ones."""
    events = [json.loads(line) for line in (trace / "events.jsonl").read_text().splitlines()]
    events = [e for e in events if e["pid"] == pid]
    ordered = sorted(sides.gateway, key=lambda call: call[1])
    slow, fast = ordered[-10:], ordered[len(ordered) // 2 - 5 : len(ordered) // 2 + 5]
    lines = []
    for name, calls in (("slowest", slow[::-1]), ("median", fast)):
        lines.append(f"{name} calls:")
        for at, latency in calls:
            end = at + latency / 1000
            during = [e for e in events if e["start"] < end and e["start"] + e["ms"] / 1000 > at]
            seen = ", ".join(f"{e['what']} {e['ms']:.1f} ms" for e in during) or "nothing logged"
            lines.append(f"  {latency:6.2f} ms: {seen}")
    kinds: dict[str, list[float]] = {}
    for e in events:
        kinds.setdefault(e["what"].split(" ")[0], []).append(e["ms"])
    lines.append("all events logged (count, median ms, max ms):")
    for what, values in sorted(kinds.items()):
        lines.append(f"  {what}: {len(values)}, {statistics.median(values):.2f}, {max(values):.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--open-loop", action="store_true")
    parser.add_argument("--rate", type=float, default=RATE)
    parser.add_argument("--slice", type=float, default=SLICE_S)
    parser.add_argument("--slices", type=int, default=SLICES)
    parser.add_argument("--trace", type=Path)
    args = parser.parse_args()
    print(machine(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if args.cpu:
        print("| side | calls/s | CPU per call (ms) | ÷ the first side, median (range) |")
        print("|---|---|---|---|")
        for pinned in (True, False):
            rounds = trio.run(measure_cpu, pinned, args.rounds)
            label = "gateways on core 0" if pinned else "unpinned"
            print(cpu_report(label, rounds, os.getloadavg()[0]), flush=True)
    if args.open_loop:
        if args.trace:
            args.trace.mkdir(parents=True, exist_ok=True)
            (args.trace / "events.jsonl").write_text("")
        before = os.getloadavg()[0]
        sides, pid = trio.run(measure_open_loop, args.rate, args.slice, args.slices, args.trace)
        print(open_loop_report(sides, args.rate, (before, os.getloadavg()[0])))
        if args.trace:
            print(stalls(sides, args.trace, pid))


if __name__ == "__main__":
    main()
