"""Benchmark of streamed chat calls through the gateway, against the mock provider.

Run it from a clone, no install needed::

    python bench/streaming.py            # prints a table, updates bench/RESULTS.md
    python bench/streaming.py --no-write # prints only

What is measured:

- **through the gateway**: a real ``svc-gateway serve`` process on 127.0.0.1 (port
  chosen by the OS, a fresh SQLite file in a temp dir, the default config: the mock
  provider at full speed), called over one kept-alive HTTP/1.1 connection by httpx in
  this process. A sandbox key with high rate limits is created through the admin API.
  Each call is ``POST /v1/chat/completions`` with ``stream: true``; the whole walk runs
  (auth, admission, tags, validation, policy, reservation, the stream pump, settlement
  and its durable request record).
- **direct upstream**: the same request body streamed from ``MockProvider.stream`` in
  this process, no HTTP, no gateway: the floor the gateway adds its cost to.

Figures: time to first chunk (from sending the request to the first ``data:`` line of a
chunk; direct: to the first chunk yielded), median and p99, one call at a time; chunks
per second within one stream (the chunks after the first, over the time from the first
to the last), and aggregate chunks per second with 16 streams at once. Each figure is
the best of 3 rounds (the 2-core machine is shared with other jobs). Bounded: about 30 s
on 2 cores, and a hard stop at 60 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import queue
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.providers.base import ProviderRequest  # noqa: E402
from gateway.providers.mock import MockProvider  # noqa: E402

SECTION = "## Streaming (mock provider)"
ADMIN_TOKEN = "bench-admin-token"
MODEL = "gpt-4o-mini"
BODY: dict[str, Any] = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about streaming benchmarks."}],
    "max_tokens": 256,
    "stream": True,
}
SEQUENTIAL_CALLS = 300
CONCURRENCY = 16
CONCURRENT_CALLS_EACH = 20
DIRECT_CALLS = 3000
CONTEXT_CALLS = 100
REPEATS = 3
HARD_LIMIT_S = 60.0
START_TIMEOUT_S = 20.0
LISTENING = re.compile(r"^svc-gateway listening on (http://127\.0\.0\.1:\d+)$")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class StreamTiming:
    first: float  # seconds from the request to the first chunk
    chunks: int
    span: float  # seconds from the first chunk to the last


@dataclass
class Figures:
    ttfc_median_ms: float
    ttfc_p99_ms: float
    chunks_per_s_one_stream: float
    chunks_per_s_concurrent: float | None
    chunks_per_stream: int
    #: context: GET /v1/key (auth, one shard round trip) and the same call not streamed
    floor_median_ms: float | None = None
    non_streamed_median_ms: float | None = None


def summarize(
    timings: list[StreamTiming], concurrent: float | None, **context: float | None
) -> Figures:
    firsts = [t.first * 1000 for t in timings]
    rates = [(t.chunks - 1) / t.span for t in timings if t.span > 0]
    return Figures(
        ttfc_median_ms=statistics.median(firsts),
        ttfc_p99_ms=percentile(firsts, 0.99),
        chunks_per_s_one_stream=statistics.median(rates),
        chunks_per_s_concurrent=concurrent,
        chunks_per_stream=timings[0].chunks,
        **context,
    )


def lowest(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def best(rounds: list[Figures]) -> Figures:
    """The best round per figure: lowest latencies, highest rates."""
    concurrent = [r.chunks_per_s_concurrent for r in rounds if r.chunks_per_s_concurrent]
    return Figures(
        ttfc_median_ms=min(r.ttfc_median_ms for r in rounds),
        ttfc_p99_ms=min(r.ttfc_p99_ms for r in rounds),
        chunks_per_s_one_stream=max(r.chunks_per_s_one_stream for r in rounds),
        chunks_per_s_concurrent=max(concurrent) if concurrent else None,
        chunks_per_stream=rounds[0].chunks_per_stream,
        floor_median_ms=lowest([r.floor_median_ms for r in rounds]),
        non_streamed_median_ms=lowest([r.non_streamed_median_ms for r in rounds]),
    )


# -- the server process ----------------------------------------------------------------------


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    stderr_path: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def start_server(
    workdir: Path,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    *,
    tree: Path = ROOT,
    python: str = sys.executable,
    cpus: set[int] | None = None,
) -> Server:
    """A ``svc-gateway serve`` process on a free loopback port, once it says it listens.

    ``tree``: the source tree it runs (another revision's, with that ``python``);
    ``cpus``: the cores it (and every thread it starts) may run on.
    """
    env = {name: value for name, value in os.environ.items() if not name.startswith("SVC_")}
    env.update(PYTHONPATH=str(tree), PYTHONUNBUFFERED="1", SVC_ADMIN_TOKEN=ADMIN_TOKEN)
    env.update(extra_env or {})
    stderr_path = workdir / "server.stderr"
    command = [python, "-m", "gateway", "serve", "--port", "0", "--db", "bench.db"]
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [*command, *extra_args],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=pinned(cpus),
        )
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        match = LISTENING.match(line)
        if match:
            return Server(proc, match.group(1), stderr_path)
    proc.kill()
    raise SystemExit(f"the server did not start:\n{stderr_path.read_text()}")


def pinned(cpus: set[int] | None) -> Callable[[], None] | None:
    """A ``preexec_fn`` keeping a child process (and every thread it starts) on ``cpus``;
    None (no pinning) for None."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


async def bench_key(url: str) -> str:
    """A sandbox key whose limits the benchmark cannot reach."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=admin, verify=False) as client:
        orgs = (await client.get("/admin/orgs")).json()["data"]
        body = {
            "org_id": orgs[0]["id"],
            "name": "bench",
            "mode": "sandbox",
            "caps": {"rpm": 10_000_000, "max_in_flight": 1000},
        }
        response = await client.post("/admin/keys", json=body)
        response.raise_for_status()
        return str(response.json()["token"])


# -- measuring -------------------------------------------------------------------------------


async def one_stream(client: httpx.AsyncClient, payload: bytes) -> StreamTiming:
    start = time.perf_counter()
    first = last = 0.0
    chunks = 0
    done = False
    async with client.stream("POST", "/v1/chat/completions", content=payload) as response:
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            if line == "data: [DONE]":
                done = True
                continue
            if '"choices":[]' in line:  # a usage chunk (not asked for here)
                continue
            if chunks == 0:
                first = now
            last = now
            chunks += 1
    if not done or chunks == 0:
        raise SystemExit("a stream ended without [DONE]")
    return StreamTiming(first - start, chunks, last - first)


async def gateway_round(url: str, token: str) -> Figures:
    payload = orjson.dumps(BODY)
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, verify=False, timeout=30.0, limits=limits
    ) as client:
        for _ in range(10):  # warm-up: connection, caches
            await one_stream(client, payload)
        timings = [await one_stream(client, payload) for _ in range(SEQUENTIAL_CALLS)]
        total = 0
        start = time.perf_counter()

        async def worker() -> None:
            nonlocal total
            for _ in range(CONCURRENT_CALLS_EACH):
                timing = await one_stream(client, payload)  # not `total += await ...`: that
                total += timing.chunks  # reads total before the await and loses updates

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
        concurrent = total / (time.perf_counter() - start)
        plain = orjson.dumps({**BODY, "stream": False})
        floor = await median_ms(lambda: client.get("/v1/key"))
        non_streamed = await median_ms(lambda: client.post("/v1/chat/completions", content=plain))
    return summarize(
        timings, concurrent, floor_median_ms=floor, non_streamed_median_ms=non_streamed
    )


async def median_ms(call: Callable[[], Awaitable[httpx.Response]]) -> float:
    """Median latency of ``CONTEXT_CALLS`` calls that must answer 200."""
    times = []
    for _ in range(CONTEXT_CALLS):
        start = time.perf_counter()
        response = await call()
        times.append((time.perf_counter() - start) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")
    return statistics.median(times)


async def direct_round() -> Figures:
    mock = MockProvider()
    request = ProviderRequest(
        upstream_model=MODEL, body={**BODY, "stream_options": {"include_usage": True}}
    )

    async def one() -> StreamTiming:
        start = time.perf_counter()
        first = last = 0.0
        chunks = 0
        async for chunk in mock.stream(request):
            if not chunk["choices"]:
                continue
            now = time.perf_counter()
            if chunks == 0:
                first = now
            last = now
            chunks += 1
        return StreamTiming(first - start, chunks, last - first)

    for _ in range(50):
        await one()
    timings = [await one() for _ in range(DIRECT_CALLS)]
    return summarize(timings, None)


async def timed(limit: float, work: Callable[[], Awaitable[Any]]) -> Any:
    with trio.fail_after(limit):
        return await work()


async def measure() -> tuple[Figures, Figures]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
        server = await trio.to_thread.run_sync(start_server, Path(tmp))
        try:
            token = await bench_key(server.url)
            rounds = []
            for _ in range(REPEATS):
                left = HARD_LIMIT_S - (time.monotonic() - started)
                rounds.append(await timed(left, lambda: gateway_round(server.url, token)))
        finally:
            await trio.to_thread.run_sync(server.stop)
    direct = [await direct_round() for _ in range(REPEATS)]
    return best(rounds), best(direct)


# -- report ----------------------------------------------------------------------------------


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    uname = platform.uname()
    return (
        f"{os.cpu_count()} cores, {cpu} ({uname.machine}), {uname.system} {uname.release}, "
        f"Python {platform.python_version()} ({platform.python_implementation()}), "
        f"trio {trio.__version__}, httpx {httpx.__version__}"
    )


def report(gateway: Figures, direct: Figures, runtime_s: float, load: tuple[float, float]) -> str:
    def ratio(a: float, b: float) -> str:
        return f"{a / b:,.0f}×" if b else "n/a"

    def rate(value: float | None) -> str:
        return f"{value:,.0f}" if value is not None else "—"

    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = [
        (
            "time to first chunk, median (ms)",
            f"{gateway.ttfc_median_ms:.2f}",
            f"{direct.ttfc_median_ms:.3f}",
            ratio(gateway.ttfc_median_ms, direct.ttfc_median_ms),
        ),
        (
            "time to first chunk, p99 (ms)",
            f"{gateway.ttfc_p99_ms:.2f}",
            f"{direct.ttfc_p99_ms:.3f}",
            ratio(gateway.ttfc_p99_ms, direct.ttfc_p99_ms),
        ),
        (
            "chunks/s within one stream",
            rate(gateway.chunks_per_s_one_stream),
            rate(direct.chunks_per_s_one_stream),
            ratio(direct.chunks_per_s_one_stream, gateway.chunks_per_s_one_stream),
        ),
        (
            f"chunks/s, {CONCURRENCY} streams at once",
            rate(gateway.chunks_per_s_concurrent),
            "—",
            "",
        ),
    ]
    table = [
        "| measure | through the gateway | direct upstream (in-process) | ratio |",
        "|---|---|---|---|",
    ]
    table += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    table += [
        "",
        "| context (through the gateway, one call at a time) | median (ms) |",
        "|---|---|",
        f"| `GET /v1/key`: HTTP, authentication, one shard read | {gateway.floor_median_ms:.2f} |",
        f"| the same chat call not streamed, whole answer | {gateway.non_streamed_median_ms:.2f} |",
    ]
    return "\n".join(
        [
            SECTION,
            "",
            *table,
            "",
            f"Machine: {machine()}. Date: {now}. Load average (1 min) before / after: "
            f"{load[0]:.2f} / {load[1]:.2f} (other jobs share the machine). "
            f"Benchmark runtime: {runtime_s:.0f} s. Command: `python bench/streaming.py`.",
            "",
            f"One call = `POST /v1/chat/completions` with `stream: true` on `{MODEL}`, served "
            f"by the mock at full speed: {gateway.chunks_per_stream} chunks per stream, then "
            "`[DONE]`. The gateway is a separate `svc-gateway serve` process with a fresh "
            "SQLite file; the client is httpx on one kept-alive loopback connection (16 for "
            f"the concurrent row). Time to first chunk: {SEQUENTIAL_CALLS} calls one at a "
            "time, from sending the request to the first chunk's `data:` line; it includes "
            "authentication, admission, validation, policy, reservation and the start of the "
            "stream pump. Chunks/s within one stream: chunks after the first over the time "
            "from the first to the last. Direct upstream: `MockProvider.stream` on the same "
            "body in this process, no HTTP; the ratio column is how many times slower the "
            f"gateway is. Each figure is the best of {REPEATS} rounds.",
            "",
            *reading(gateway, direct),
        ]
    )


def reading(gateway: Figures, direct: Figures) -> list[str]:
    """What the figures say, computed from this run."""
    lines = ["Reading the figures:", ""]
    if gateway.floor_median_ms is not None:
        walk = gateway.ttfc_median_ms - gateway.floor_median_ms
        lines.append(
            f"- Time to first chunk minus `GET /v1/key`: {walk:.2f} ms, what the model-call "
            "walk (tags, validation, policy, estimate, reservation, the pump's start) adds to "
            "an authenticated request on this machine."
        )
    per_chunk = 1e6 / gateway.chunks_per_s_one_stream
    lines.append(
        f"- Within a stream a chunk costs {per_chunk:.0f} µs through the gateway against "
        f"{1e6 / direct.chunks_per_s_one_stream:.1f} µs in the mock itself: re-encoding the "
        "chunk, SSE framing, the channel hop from the pump to the body, the HTTP write and "
        "the client's parse."
    )
    lines.append(
        f"- With {CONCURRENCY} streams at once the two cores are busy with whole calls "
        f"({gateway.chunks_per_stream} chunks each), so the aggregate chunk rate is bound by "
        "the cost of a call (admission, settlement, its durable request record), not of a "
        "chunk."
    )
    return [*lines, ""]


def write_section(path: Path, section: str) -> None:
    """Add or replace a benchmark's section (found by its heading, the section's first
    line); every other section is kept as it is."""
    heading = section.splitlines()[0]
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text.rstrip("\n") + "\n")


def run_line(command: str, runtime_s: float, load: tuple[float, float]) -> str:
    """The line under a bench's table: where, when, how loaded, how long, how to re-run."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Machine: {machine()}. Date: {now}. Load average (1 min) before / after: "
        f"{load[0]:.2f} / {load[1]:.2f}. Benchmark runtime: {runtime_s:.0f} s. "
        f"Command: `{command}`."
    )


def wants_write(doc: str) -> bool:
    """A bench's command line: ``--no-write`` prints the section without writing it."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    return not parser.parse_args().no_write


def publish(section: str, write: bool) -> None:
    """Print a bench's section and, unless told not to, put it in bench/RESULTS.md."""
    print(section)
    if write:
        write_section(ROOT / "bench" / "RESULTS.md", section)
        print(f"updated {ROOT / 'bench' / 'RESULTS.md'}")


def main() -> None:
    write = wants_write(__doc__)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    gateway, direct = trio.run(measure)
    runtime_s = time.monotonic() - started
    publish(report(gateway, direct, runtime_s, (load_before, os.getloadavg()[0])), write)


if __name__ == "__main__":
    main()
