"""Benchmark of live calls: an HTTP upstream called directly, and through the gateway.

Run it from a clone, no install needed::

    python bench/live_upstream.py            # prints a table, updates bench/RESULTS.md
    python bench/live_upstream.py --no-write # prints only

Three processes on 127.0.0.1: the fake OpenAI-compatible upstream of the tests
(``tests/fake_upstream.py``, trio + h11, answers at once), a ``svc-gateway serve``
configured with that upstream as an ``openai`` provider, and this client (httpx). A live
key of an organisation with credits calls the gateway; the same bodies go straight to the
upstream for the "direct" column. Figures per call, one at a time: the whole answer of a
non-streamed call, and the first chunk of a streamed one (median and p99); then calls per
second with 16 at once. Each figure is the best of 3 rounds. Bounded: about 40 s on 2
cores, and a hard stop at 90 s.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.streaming import (  # noqa: E402
    ADMIN_TOKEN,
    percentile,
    publish,
    run_line,
    start_server,
    wants_write,
)

SECTION = "## Live calls (HTTP upstream)"
UPSTREAM_KEY = "sk-bench-upstream"
BODY = {
    "model": "live-chat",
    "messages": [{"role": "user", "content": "Tell me about gateways."}],
    "max_tokens": 64,
}
SEQUENTIAL_CALLS = 300
CONCURRENCY = 16
CONCURRENT_CALLS_EACH = 25
REPEATS = 3
HARD_LIMIT_S = 90.0
UPSTREAM_SCRIPT = """
import sys, trio
from tests.fake_upstream import FakeUpstream

async def main():
    async with trio.open_nursery() as nursery:
        upstream = await nursery.start(FakeUpstream().serve)
        print(upstream.url, flush=True)

trio.run(main)
"""


@dataclass
class Figures:
    whole_median_ms: float
    whole_p99_ms: float
    ttfc_median_ms: float
    ttfc_p99_ms: float
    calls_per_s: float


def config_toml(upstream_url: str) -> str:
    return f"""
[[providers]]
name = "upstream"
kind = "openai"
base_url = "{upstream_url}"
api_key_env = "BENCH_UPSTREAM_KEY"

[[models]]
id = "live-chat"
provider = "upstream"
upstream_id = "up-chat"
kind = "chat"
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
"""


def start_upstream() -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM_SCRIPT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    if not url.startswith("http://127.0.0.1:"):
        proc.kill()
        raise SystemExit("the fake upstream did not start")
    return proc, url


async def live_key(url: str) -> str:
    """A live key of a new organisation with ample credits and no reachable limit."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=admin) as client:
        org = await client.post("/admin/orgs", json={"name": "bench", "credits_usd": 1000})
        org.raise_for_status()
        body = {
            "org_id": org.json()["id"],
            "name": "bench",
            "mode": "live",
            "caps": {"rpm": 10_000_000, "max_in_flight": 1000},
        }
        response = await client.post("/admin/keys", json=body)
        response.raise_for_status()
        return response.json()["token"]


async def whole(client: httpx.AsyncClient, payload: bytes) -> float:
    start = time.perf_counter()
    response = await client.post("/chat/completions", content=payload)
    if response.status_code != 200:
        raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")
    return (time.perf_counter() - start) * 1000


async def first_chunk(client: httpx.AsyncClient, payload: bytes) -> float:
    start = time.perf_counter()
    first = 0.0
    async with client.stream("POST", "/chat/completions", content=payload) as response:
        if response.status_code != 200:
            raise SystemExit(f"HTTP {response.status_code}")
        async for line in response.aiter_lines():
            if line.startswith("data: ") and not first:
                first = (time.perf_counter() - start) * 1000
    return first


async def one_round(base_url: str, token: str) -> Figures:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    plain = orjson.dumps(BODY)
    streamed = orjson.dumps({**BODY, "stream": True})
    async with httpx.AsyncClient(
        base_url=base_url, headers=headers, timeout=30.0, limits=limits
    ) as client:
        for _ in range(10):
            await whole(client, plain)
        wholes = [await whole(client, plain) for _ in range(SEQUENTIAL_CALLS)]
        firsts = [await first_chunk(client, streamed) for _ in range(SEQUENTIAL_CALLS)]
        start = time.perf_counter()

        async def worker() -> None:
            for _ in range(CONCURRENT_CALLS_EACH):
                await whole(client, plain)

        async with trio.open_nursery() as nursery:
            for _ in range(CONCURRENCY):
                nursery.start_soon(worker)
        rate = CONCURRENCY * CONCURRENT_CALLS_EACH / (time.perf_counter() - start)
    return Figures(
        whole_median_ms=statistics.median(wholes),
        whole_p99_ms=percentile(wholes, 0.99),
        ttfc_median_ms=statistics.median(firsts),
        ttfc_p99_ms=percentile(firsts, 0.99),
        calls_per_s=rate,
    )


def best(rounds: list[Figures]) -> Figures:
    return Figures(
        whole_median_ms=min(r.whole_median_ms for r in rounds),
        whole_p99_ms=min(r.whole_p99_ms for r in rounds),
        ttfc_median_ms=min(r.ttfc_median_ms for r in rounds),
        ttfc_p99_ms=min(r.ttfc_p99_ms for r in rounds),
        calls_per_s=max(r.calls_per_s for r in rounds),
    )


async def rounds_of(work: Callable[[], Awaitable[Figures]], deadline: float) -> Figures:
    results = []
    for _ in range(REPEATS):
        with trio.fail_at(deadline):
            results.append(await work())
    return best(results)


async def measure() -> tuple[Figures, Figures]:
    deadline = trio.current_time() + HARD_LIMIT_S
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            config = Path(tmp) / "gateway.toml"
            config.write_text(config_toml(upstream_url))
            server = await trio.to_thread.run_sync(
                lambda: start_server(
                    Path(tmp),
                    ("--config", str(config)),
                    {"BENCH_UPSTREAM_KEY": UPSTREAM_KEY},
                )
            )
            try:
                token = await live_key(server.url)
                gateway = await rounds_of(lambda: one_round(f"{server.url}/v1", token), deadline)
                direct = await rounds_of(lambda: one_round(upstream_url, UPSTREAM_KEY), deadline)
            finally:
                await trio.to_thread.run_sync(server.stop)
    finally:
        upstream.kill()
        upstream.wait(timeout=5)
    return gateway, direct


def report(gateway: Figures, direct: Figures, runtime_s: float, load: tuple[float, float]) -> str:
    rows = [
        ("whole answer, median (ms)", gateway.whole_median_ms, direct.whole_median_ms),
        ("whole answer, p99 (ms)", gateway.whole_p99_ms, direct.whole_p99_ms),
        ("first chunk of a stream, median (ms)", gateway.ttfc_median_ms, direct.ttfc_median_ms),
        ("first chunk of a stream, p99 (ms)", gateway.ttfc_p99_ms, direct.ttfc_p99_ms),
    ]
    table = [
        "| measure | through the gateway | direct upstream | ratio |",
        "|---|---|---|---|",
        *(f"| {name} | {g:.2f} | {d:.2f} | {g / d:.1f}× |" for name, g, d in rows),
        f"| calls/s, {CONCURRENCY} at once (not streamed) | {gateway.calls_per_s:,.0f} | "
        f"{direct.calls_per_s:,.0f} | {direct.calls_per_s / gateway.calls_per_s:.1f}× |",
    ]
    added = gateway.whole_median_ms - direct.whole_median_ms
    return "\n".join(
        [
            SECTION,
            "",
            *table,
            "",
            run_line("python bench/live_upstream.py", runtime_s, load),
            "",
            "Three processes on loopback: the fake OpenAI-compatible upstream of the tests "
            "(answers at once), a `svc-gateway serve` with it as an `openai` provider, and "
            "httpx as the client; a live key of an organisation with credits. The ratio is "
            "how many times slower (or, for calls/s, how many fewer) through the gateway. "
            f"Each figure is the best of {REPEATS} rounds of {SEQUENTIAL_CALLS} calls one at "
            "a time, then "
            f"{CONCURRENCY * CONCURRENT_CALLS_EACH} calls {CONCURRENCY} at once.",
            "",
            f"- The gateway adds {added:.2f} ms to a whole non-streamed call: the whole walk "
            "(authentication, admission, validation, policy, reservation, its own upstream "
            "HTTP call over a pooled connection, settlement, the request record and the "
            "credit debit committed to SQLite before the answer).",
            "- Against a real model (hundreds of ms to seconds per call) that cost is within "
            "the noise; with 2 cores shared by three processes, the calls/s row is bound by "
            "CPU, not by waiting.",
            "",
        ]
    )


def main() -> None:
    write = wants_write(__doc__)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    gateway, direct = trio.run(measure)
    load = (load_before, os.getloadavg()[0])
    publish(report(gateway, direct, time.monotonic() - started, load), write)


if __name__ == "__main__":
    main()
