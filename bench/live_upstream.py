"""Benchmark of live calls: an HTTP upstream called directly, and through the gateway.

Run it from a clone, no install needed::

    python bench/live_upstream.py                 # prints a table, updates bench/RESULTS.md
    python bench/live_upstream.py --no-write      # prints only
    python bench/live_upstream.py --against REV   # this tree against REV, alternating
    python bench/live_upstream.py --metrics-cost  # CPU per call, metrics on vs off
    python bench/live_upstream.py --kinds         # CPU per call, anthropic vs openai kind
                                                  # (prints only; --pairs N, default 8;
                                                  # --profile DIR: py-spy of each kind)
    python bench/live_upstream.py --portkey       # CPU per call and per chunk against
                                                  # Portkey, a pure proxy (prints only;
                                                  # --pairs N, default 8; needs node, npm)
    python bench/live_upstream.py --profile DIR   # py-spy of the gateway under load
                                                  # (pip install -e '.[bench]')

Three processes on 127.0.0.1: the fake OpenAI-compatible upstream of the tests
(``gateway/fakes/fake_upstream.py``, trio + h11, answers at once), a ``svc-gateway serve``
configured with that upstream as an ``openai`` provider, and this client: httpx for the
one-caller phases (where the same client also calls the upstream directly), the lean
keep-alive client of ``bench/raw_http.py`` for the 16-caller phases (so that the load
side's own CPU does not set their rate). On a machine of two cores or more the gateway
is pinned to the first core and this client and the upstream to the others, so that the
gateway's own cost is what limits it.

One round measures, with a live key of an organisation with credits:

- one caller: non-streamed calls through the gateway and the same body straight to the
  upstream, taking turns (the added latency is the gateway's median or p99 minus the
  upstream's), and the first chunk of short streams;
- 16 callers, non-streamed calls: calls/s, and the gateway process's CPU time (user +
  system, all threads, from the kernel's CPU clock of the process) per call;
- 16 callers, short streams (16 words): streamed calls/s;
- 16 callers, long streams (200 chunks from the upstream): the gateway's CPU time per
  chunk relayed (CPU over the phase ÷ ``data:`` chunks the clients received);
- 16 callers, streams at a model's pace (100 chunks, one every 2 ms): the same figure
  when each upstream read holds a chunk, as it does with a model. In the burst of 200 a
  read holds as many chunks as arrived meanwhile, so a gateway that keeps up reads (and
  sends) more often: its CPU per chunk measures its speed as much as its cost.

Then, once: the gateway's RSS with N streams open at once (each stalled by the upstream
after its first chunk, ``--open-streams``).

``--against REV`` builds REV in a venv of its own (``git archive`` of REV, ``pip install``
with pip's cache; kept under the temp dir by commit and reused), runs both gateways on
the same upstream and gives them the rounds in turn (which goes first alternates), so a
burst of the machine's other load meets both sides of a pair; the ratios (this tree ÷
REV) are the medians of the per-pair ratios. Bounded: about 60 s.

``--metrics-cost`` runs two gateways on the same upstream, one with ``[server] metrics =
false``, and sends them the same short rounds in turn (non-streamed calls and streams),
reading each server process's CPU time around each round: the CPU per call with the
counting on and off, and their ratio per pair of adjacent rounds.

``--kinds`` (issue 31) runs one gateway with two providers, an ``anthropic`` one on the
Anthropic fake of the tests (``gateway/fakes/fake_anthropic.py``, which checks every
request as the real API would) and an ``openai`` one on the OpenAI fake, and a model on
each at the same prices. Pair after pair, 16 callers send the same prompt to one model,
then to the other (which goes first alternates), non-streamed calls then short streams,
and the gateway's CPU time is read around each round: CPU per call for each kind and the
ratio anthropic ÷ openai (the median of the per-pair ratios, and their range). The fakes
differ, but they run in processes of their own: only the gateway's CPU is counted.
Bounded: no pair starts after 70 s.

``--portkey`` (issue 34) runs this tree's gateway and the Portkey OSS gateway (Node.js,
installed once from npm, pinned: ``bench/portkey.py``) on the same fake upstream, both
pinned to the same core; Portkey relays each call where its headers say, so it is the
cost of a proxy that keeps no accounts. Pair after pair, each gets a round of 16 callers'
non-streamed calls then 200-chunk streams (which goes first alternates): calls/s, and each
server process's CPU time per call and per chunk, with the ratio svc-gateway ÷ Portkey
(the median of the per-pair ratios, and their range). Bounded: no pair starts after 60 s.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import httpx
import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import portkey  # noqa: E402
from bench.raw_http import RawConnection  # noqa: E402
from bench.streaming import (  # noqa: E402
    ADMIN_TOKEN,
    Server,
    percentile,
    publish,
    run_line,
    start_server,
)

T = TypeVar("T")
SECTION = "## Live calls (HTTP upstream)"
CHAT_PATH = "/v1/chat/completions"
AGAINST_SECTION = "## Hot path against the base revision (alternating)"
METRICS_SECTION = "## Metrics cost (CPU per call, on vs off)"
KINDS_SECTION = "## Native kinds: CPU per call, anthropic against openai (issue 31)"
#: ``--kinds``: the provider kinds compared, the first ÷ the second
KINDS = ("anthropic", "openai")
KINDS_PAIRS = 8
#: ``--kinds``: calls per caller in a round of non-streamed calls, streams in a streamed one
KINDS_CALLS_EACH = 15
KINDS_STREAMS_EACH = 8
#: ``--kinds``: no pair of rounds starts after this many seconds (bounded on a busy machine)
KINDS_BUDGET_S = 70.0
PORTKEY_SECTION = "## Against Portkey, a pure proxy (issue 34)"
PORTKEY_PAIRS = 8
#: ``--portkey``: one side's round: 16 callers × this many non-streamed calls, then
#: 16 × this many long streams
PORTKEY_CALLS_EACH = 25
PORTKEY_STREAMS_EACH = 4
#: ``--portkey``: then one caller alone, this many non-streamed calls in a row
PORTKEY_CALLS_ALONE = 100
#: ``--portkey``: no pair of rounds starts after this many seconds
PORTKEY_BUDGET_S = 60.0
COST_PAIRS = 10
COST_CALLS = 300
COST_STREAMS = 60
UPSTREAM_KEY = "sk-bench-upstream"
#: the upstream's name of the gateway's model (calls through Portkey name it: it maps no names)
UPSTREAM_MODEL = "up-chat"
#: words per long stream: the upstream sends one chunk per word
CHUNKS = 200
#: the gateway's model, on the upstream's ``UPSTREAM_MODEL``
MODEL = "live-chat"
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Tell me about gateways."}],
    "max_tokens": 16,
}
SHORT_STREAM = {**BODY, "stream": True}
LONG_STREAM = {**BODY, "max_tokens": CHUNKS, "stream": True}
#: a model's pace: a chunk every PACE_S (the fake upstream's ``chunk_delay``), so that each
#: read of the upstream holds one chunk, as with a real model, where a burst of 200 lets
#: a read hold many (and the figure depends on how far behind the gateway falls)
PACE_S = 0.002
PACED_CHUNKS = 100
PACED_STREAM = {
    **BODY,
    "max_tokens": PACED_CHUNKS,
    "stream": True,
    "messages": [
        {"role": "user", "content": f"Tell me about gateways. [[fault chunk_delay={PACE_S}]]"}
    ],
}
#: held open by the upstream after its first chunk, until the client leaves
STALLED_STREAM = {
    **SHORT_STREAM,
    "messages": [{"role": "user", "content": "Stay open. [[fault stall_after=1]]"}],
}
CONCURRENCY = 16
OPEN_STREAMS = 1000
PAIRS = 4
HARD_LIMIT_S = 90.0
#: ``--against``: the most one pair of rounds, or one side's RSS phase, may take
PHASE_LIMIT_S = 40.0
#: a fake provider of the tests as a process of its own: it prints its URL, then serves
FAKE_SCRIPT = """
import trio
from gateway.fakes.{module} import {cls}

async def main():
    async with trio.open_nursery() as nursery:
        fake = await nursery.start({cls}({args}).serve)
        print(fake.url, flush=True)

trio.run(main)
"""
UPSTREAM_SCRIPT = FAKE_SCRIPT.format(
    module="fake_upstream", cls="FakeUpstream", args=f"max_words={CHUNKS}"
)
#: ``--kinds``: the Anthropic fake (it checks every request as the real API would), with
#: answers as long as the OpenAI fake's
ANTHROPIC_SCRIPT = FAKE_SCRIPT.format(
    module="fake_anthropic",
    cls="FakeAnthropic",
    args=f"keys={{{UPSTREAM_KEY!r}}}, max_words={CHUNKS}",
)


@dataclass(frozen=True)
class Sizes:
    """How much one round measures: the full table, or a short round (``--short``,
    ``--against``) for alternating comparisons on a busy machine."""

    sequential: int = 300
    calls_each: int = 25
    short_streams_each: int = 10
    long_streams_each: int = 2
    rounds: int = 3


SHORT = Sizes(sequential=150, calls_each=15, short_streams_each=6, long_streams_each=2, rounds=1)
#: ``--profile``: longer phases of 16 callers, sampled by py-spy
PROFILED = Sizes(sequential=20, calls_each=60, short_streams_each=1, long_streams_each=4, rounds=1)
#: one side's round of ``--against``: a few seconds, so that pairs stay close in time
PAIRED = Sizes(sequential=60, calls_each=8, short_streams_each=3, long_streams_each=1, rounds=1)


@dataclass
class Figures:
    """One round's figures; every one is a median of the round's calls or a rate."""

    whole_median_ms: float
    whole_p99_ms: float
    direct_median_ms: float
    direct_p99_ms: float
    ttfc_median_ms: float
    ttfc_p99_ms: float
    #: one caller, non-streamed: the gateway's CPU time per call (the calls alternate
    #: with calls straight to the upstream, which cost the gateway nothing)
    cpu_ms_per_call_alone: float
    #: 16 callers, non-streamed: calls/s and the gateway's CPU time per call
    calls_per_s: float
    cpu_ms_per_call: float
    #: 16 callers, short streams
    streams_per_s: float
    #: 16 callers, long streams: the gateway's CPU time per chunk relayed
    cpu_us_per_chunk: float
    chunks_per_stream: float
    #: 16 callers, streams at a model's pace: the gateway's CPU time per chunk relayed
    cpu_us_per_paced_chunk: float

    @property
    def added_median_ms(self) -> float:
        return self.whole_median_ms - self.direct_median_ms

    @property
    def added_p99_ms(self) -> float:
        return self.whole_p99_ms - self.direct_p99_ms


@dataclass
class Target:
    """A gateway under test: its process, and a live key on it; ``model``: the model its
    calls name; ``route``: more headers for every call (a proxy's routing, ``--portkey``)."""

    name: str
    server: Server
    token: str
    model: str = MODEL
    route: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1"

    @property
    def pid(self) -> int:
        return self.server.proc.pid

    @property
    def headers(self) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        return {**auth, **self.route}

    def connection(self) -> RawConnection:
        """A new keep-alive connection of the load phases, with this target's key."""
        host, _, port = self.server.url.removeprefix("http://").partition(":")
        return RawConnection(host, int(port), self.headers)


def config_toml(upstream_url: str, metrics: bool = True) -> str:
    return f"""
[server]
metrics = {str(metrics).lower()}
max_connections = {OPEN_STREAMS + 100}
# every stream of the open-streams phase comes from this client's one address
max_connections_per_client = {OPEN_STREAMS + 100}

[[providers]]
name = "upstream"
kind = "openai"
base_url = "{upstream_url}"
api_key_env = "BENCH_UPSTREAM_KEY"
max_connections = {OPEN_STREAMS + 100}

[[models]]
id = "{MODEL}"
provider = "upstream"
upstream_id = "{UPSTREAM_MODEL}"
kind = "chat"
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
"""


def pin_cores() -> set[int] | None:
    """The gateway's core; this process (and the upstream it starts) moves to the others.
    None on a machine of one core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return None
    os.sched_setaffinity(0, set(cores[1:]))
    return {cores[0]}


def start_upstream(script: str = UPSTREAM_SCRIPT) -> tuple[subprocess.Popen[str], str]:
    """A fake provider (``script``, the OpenAI fake by default) and its URL."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
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


def build_revision(rev: str) -> tuple[Path, str]:
    """REV's source tree and a Python with its dependencies: built once per commit
    (``git archive``, a venv, ``pip install`` through pip's cache), then reused."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    home = Path(tempfile.gettempdir()) / f"svc-bench-rev-{sha[:12]}"
    tree, venv = home / "tree", home / "venv"
    python = str(venv / "bin" / "python")
    if (home / "ready").exists():
        return tree, python
    shutil.rmtree(home, ignore_errors=True)
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(tree)],
        check=True,
    )
    (home / "ready").touch()
    return tree, python


async def live_key(url: str) -> str:
    """A live key of a new organisation with ample credits and no reachable limit."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=admin) as client:
        org = await client.post("/admin/orgs", json={"name": "bench", "credits_usd": 100_000})
        org.raise_for_status()
        body = {
            "org_id": org.json()["id"],
            "name": "bench",
            "mode": "live",
            "caps": {"rpm": 10_000_000, "max_in_flight": 2 * OPEN_STREAMS},
        }
        response = await client.post("/admin/keys", json=body)
        response.raise_for_status()
        return str(response.json()["token"])


async def start_target(
    name: str,
    workdir: Path,
    config_text: str,
    cpus: set[int] | None,
    tree: Path = ROOT,
    python: str = sys.executable,
    extra_env: dict[str, str] | None = None,
) -> Target:
    """A gateway in ``workdir`` with that config (and ``extra_env``), and a live key on it."""
    workdir.mkdir()
    config = workdir / "gateway.toml"
    config.write_text(config_text)
    server = await trio.to_thread.run_sync(
        lambda: start_server(
            workdir,
            ("--config", str(config)),
            {"BENCH_UPSTREAM_KEY": UPSTREAM_KEY, **(extra_env or {})},
            tree=tree,
            python=python,
            cpus=cpus,
        )
    )
    return Target(name, server, await live_key(server.url))


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


async def raw_call(conn: RawConnection, payload: bytes) -> bytes:
    """One call to its end (a stream's whole body); any answer but a 200 stops the run."""
    status, body = await conn.post(CHAT_PATH, payload)
    if status != 200:
        raise SystemExit(f"HTTP {status}: {body[:300]!r}")
    return body


async def raw_chunks(conn: RawConnection, payload: bytes) -> int:
    """Stream one call to its end; the chunks received (``data:`` lines but [DONE])."""
    lines = (await raw_call(conn, payload)).split(b"\n")
    return sum(1 for line in lines if line.startswith(b"data: ") and line != b"data: [DONE]")


async def at_once(
    target: Target,
    work: Callable[[RawConnection], Awaitable[T]],
    each: int,
    profile: Path | None = None,
    callers: int = CONCURRENCY,
) -> tuple[float, float, list[T]]:
    """``work`` ``each`` times in each of ``callers`` (16) callers, each on a kept-alive
    connection of its own (:mod:`bench.raw_http`): (seconds, CPU seconds of the gateway,
    what the calls returned); ``profile``: py-spy's samples of the gateway."""
    results: list[T] = []
    connections = [target.connection() for _ in range(callers)]

    async def caller(conn: RawConnection) -> None:
        for _ in range(each):
            results.append(await work(conn))

    profiler = start_profiler(target.pid, profile) if profile is not None else None
    start, cpu_start = time.perf_counter(), cpu_seconds(target.pid)
    try:
        async with trio.open_nursery() as nursery:
            for conn in connections:
                nursery.start_soon(caller, conn)
        seconds, cpu = time.perf_counter() - start, cpu_seconds(target.pid) - cpu_start
    finally:
        if profiler is not None:
            await trio.to_thread.run_sync(stop_profiler, profiler)
        for conn in connections:
            await conn.aclose()
    return seconds, cpu, results


def start_profiler(pid: int, output: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` (Python frames only, CPU only: idle stacks are left out)."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--rate", "500"]
    proc = subprocess.Popen(
        [*command, "--nonblocking", "--output", str(output)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    time.sleep(0.5)  # attached
    return proc


def stop_profiler(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)


def profile_summary(path: Path, top: int = 25) -> str:
    """The functions of a py-spy raw profile (collapsed stacks) with the largest share
    of the serving thread's samples (the trio run loop's: the store's worker threads
    are left out), inclusive (the function anywhere on the stack, leaving out the
    frames under every request, from the process's start to the run loop) and self
    (the leaf)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = everything = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        samples = int(count)
        everything += samples
        if not any(frame.startswith("unrolled_run (") for frame in frames):
            continue
        total += samples
        for frame in set(frames):
            inclusive[frame] += samples
        own[frames[-1]] += samples
    shares = [(name, n) for name, n in inclusive.most_common() if n < 0.9 * total]
    lines = [f"{path.name}: {total} samples of the serving thread ({everything} in all)"]
    lines += ["", "inclusive:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in shares[:top]]
    lines += ["", "self:"]
    lines += [f"  {100 * n / total:5.1f} %  {name}" for name, n in own.most_common(top)]
    return "\n".join(lines)


async def one_round(
    target: Target, upstream_url: str, sizes: Sizes, profile: Path | None = None
) -> Figures:
    """Every figure of one round against ``target``; ``profile``: a directory where
    py-spy's samples of the 16-caller phases are written."""
    headers = target.headers
    upstream_headers = {**headers, "Authorization": f"Bearer {UPSTREAM_KEY}"}
    plain, short, long, paced = (
        orjson.dumps(b) for b in (BODY, SHORT_STREAM, LONG_STREAM, PACED_STREAM)
    )
    async with (
        httpx.AsyncClient(base_url=target.url, headers=headers, timeout=30.0) as client,
        httpx.AsyncClient(base_url=upstream_url, headers=upstream_headers) as direct,
    ):
        for _ in range(10):
            await whole(client, plain)
            await whole(direct, plain)
        wholes, directs = [], []
        cpu_start = cpu_seconds(target.pid)
        for _ in range(sizes.sequential):
            directs.append(await whole(direct, plain))
            wholes.append(await whole(client, plain))
        cpu_alone = (cpu_seconds(target.pid) - cpu_start) / sizes.sequential
        firsts = [await first_chunk(client, short) for _ in range(sizes.sequential // 2)]
        calls_per_s, cpu_per_call = await calls_at_once(
            target, plain, sizes.calls_each, profile / "calls.txt" if profile else None
        )
        seconds, _, _ = await at_once(
            target, partial(raw_chunks, payload=short), sizes.short_streams_each
        )
        streams_per_s = CONCURRENCY * sizes.short_streams_each / seconds
        cpu_per_chunk, chunks_per_stream = await chunks_at_once(
            target, long, sizes.long_streams_each, profile / "chunks.txt" if profile else None
        )
        cpu_per_paced_chunk, _ = await chunks_at_once(target, paced, 1)
    return Figures(
        whole_median_ms=statistics.median(wholes),
        whole_p99_ms=percentile(wholes, 0.99),
        direct_median_ms=statistics.median(directs),
        direct_p99_ms=percentile(directs, 0.99),
        ttfc_median_ms=statistics.median(firsts),
        ttfc_p99_ms=percentile(firsts, 0.99),
        cpu_ms_per_call_alone=cpu_alone * 1000,
        calls_per_s=calls_per_s,
        cpu_ms_per_call=cpu_per_call * 1000,
        streams_per_s=streams_per_s,
        cpu_us_per_chunk=cpu_per_chunk * 1e6,
        chunks_per_stream=chunks_per_stream,
        cpu_us_per_paced_chunk=cpu_per_paced_chunk * 1e6,
    )


async def calls_at_once(
    target: Target, payload: bytes, each: int, profile: Path | None = None
) -> tuple[float, float]:
    """16 callers, ``each`` non-streamed calls each: calls/s, and the gateway's CPU
    seconds per call."""
    seconds, cpu, _ = await at_once(target, partial(raw_call, payload=payload), each, profile)
    calls = CONCURRENCY * each
    return calls / seconds, cpu / calls


async def chunks_at_once(
    target: Target, payload: bytes, each: int, profile: Path | None = None
) -> tuple[float, float]:
    """16 callers, ``each`` streams each: the gateway's CPU seconds per chunk relayed
    (``data:`` chunks the clients received), and the chunks per stream."""
    _, cpu, counts = await at_once(target, partial(raw_chunks, payload=payload), each, profile)
    chunks = sum(counts)
    return cpu / chunks, chunks / (CONCURRENCY * each)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def rss_with_open_streams(target: Target, count: int) -> tuple[float, float]:
    """The gateway's RSS (MiB) before, and with ``count`` streams open at once (each has
    its first chunk; the upstream holds it open). Raw sockets: this side stays light."""
    host, port = target.server.url.removeprefix("http://").split(":")
    body = orjson.dumps(STALLED_STREAM)
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {target.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    opened: list[trio.SocketStream] = []
    limiter = trio.CapacityLimiter(64)

    async def open_one() -> None:
        async with limiter:
            sock = await trio.open_tcp_stream(host, int(port))
            opened.append(sock)
            await sock.send_all(request)
            received = b""
            while b"\ndata: " not in received:
                data = await sock.receive_some(65536)
                if not data:
                    raise SystemExit(f"a stream closed before its first chunk: {received!r}")
                received += data

    before = rss_mib(target.pid)
    try:
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(open_one)
        return before, rss_mib(target.pid)
    finally:
        for sock in opened:
            await sock.aclose()


async def measure(
    sizes: Sizes, open_streams: int, profile: Path | None = None
) -> tuple[list[Figures], tuple[float, float]]:
    deadline = trio.current_time() + HARD_LIMIT_S
    cpus = pin_cores()
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            target = await start_target("this", Path(tmp) / "this", config_toml(upstream_url), cpus)
            try:
                rounds = []
                for _ in range(sizes.rounds):
                    with trio.fail_at(deadline):
                        rounds.append(await one_round(target, upstream_url, sizes, profile))
                with trio.fail_at(deadline):
                    rss = await rss_with_open_streams(target, open_streams)
            finally:
                await trio.to_thread.run_sync(target.server.stop)
    finally:
        upstream.kill()
        upstream.wait(timeout=5)
    return rounds, rss


@dataclass
class Against:
    """``--against``: the pairs of rounds (base, this) and each side's RSS figures."""

    rev: str
    pairs: list[tuple[Figures, Figures]]
    rss: dict[str, tuple[float, float]]


async def measure_against(rev: str, sizes: Sizes, pairs: int, open_streams: int) -> Against:
    tree, python = await trio.to_thread.run_sync(build_revision, rev)
    start = trio.current_time()
    cpus = pin_cores()
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    targets: list[Target] = []
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            config = config_toml(upstream_url)
            base = await start_target("base", Path(tmp) / "base", config, cpus, tree, python)
            targets.append(base)
            this = await start_target("this", Path(tmp) / "this", config, cpus)
            targets.append(this)
            results = []
            for index in range(pairs):
                with trio.fail_after(PHASE_LIMIT_S):
                    order = (base, this) if index % 2 == 0 else (this, base)
                    figures = {t.name: await one_round(t, upstream_url, sizes) for t in order}
                print(
                    f"pair {index + 1} done at {trio.current_time() - start:.1f} s", file=sys.stderr
                )
                results.append((figures["base"], figures["this"]))
            rss = {}
            for target in (base, this):
                with trio.fail_after(PHASE_LIMIT_S):
                    started = time.perf_counter()
                    rss[target.name] = await rss_with_open_streams(target, open_streams)
                print(
                    f"{target.name}: {open_streams} streams opened in "
                    f"{time.perf_counter() - started:.1f} s",
                    file=sys.stderr,
                )
            return Against(rev, results, rss)
    finally:
        await stop_all([target.server for target in targets], upstream)


async def stop_all(servers: list[Server], upstream: subprocess.Popen[str]) -> None:
    """Stop the servers, then the fake upstream they call."""
    for server in servers:
        await trio.to_thread.run_sync(server.stop)
    upstream.kill()
    upstream.wait(timeout=5)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, to the nanosecond: Linux's
    CPU clock of the process, the id ``clock_getcpuclockid(3)`` gives. (``/proc/<pid>/stat``
    counts 10 ms ticks: a 16-caller phase of ``--against`` is some 30 of them, so one tick
    more or less moved a pair's ratio by 3 %.)"""
    return time.clock_gettime(((~pid) << 3) | 2)


async def cost_round(base_url: str, token: str, pid: int) -> float:
    """CPU seconds of the server per call over one round (calls then streams)."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    plain = orjson.dumps(BODY)
    streamed = orjson.dumps({**BODY, "stream": True})
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30.0) as client:
        await whole(client, plain)  # a warm connection
        start = cpu_seconds(pid)
        for _ in range(COST_CALLS):
            await whole(client, plain)
        for _ in range(COST_STREAMS):
            await first_chunk(client, streamed)
        return (cpu_seconds(pid) - start) / (COST_CALLS + COST_STREAMS)


async def measure_cost() -> list[tuple[float, float]]:
    """(on, off) CPU per call, for adjacent rounds taken in turn (which goes first
    alternates too)."""
    deadline = trio.current_time() + 4 * HARD_LIMIT_S
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    servers: list[Server] = []
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            targets = []
            for metrics in (True, False):
                workdir = Path(tmp) / ("on" if metrics else "off")
                workdir.mkdir()
                config = workdir / "gateway.toml"
                config.write_text(config_toml(upstream_url, metrics))
                server = await trio.to_thread.run_sync(
                    partial(
                        start_server,
                        workdir,
                        ("--config", str(config)),
                        {"BENCH_UPSTREAM_KEY": UPSTREAM_KEY},
                    )
                )
                servers.append(server)
                targets.append((f"{server.url}/v1", await live_key(server.url), server.proc.pid))
            on, off = (partial(cost_round, url, token, pid) for url, token, pid in targets)
            pairs = []
            for index in range(COST_PAIRS):
                with trio.fail_at(deadline):
                    pairs.append(await in_turn(on, off, swap=index % 2 == 1))
            return pairs
    finally:
        await stop_all(servers, upstream)


async def in_turn(
    first: Callable[[], Awaitable[T]], second: Callable[[], Awaitable[T]], swap: bool
) -> tuple[T, T]:
    """One round of each side, ``first``'s figure first: ``second`` goes first if ``swap``.
    Callers alternate ``swap`` from pair to pair, so that a burst of the machine's other
    load meets both sides of a pair, and neither side always runs on the other's heels."""
    if swap:
        b = await second()
        return await first(), b
    a = await first()
    return a, await second()


def paired_row(label: str, pairs: list[tuple[float, float]], scale: float = 1000) -> str:
    """A table row of figures taken in pairs: each side's median (× ``scale``), and the
    median of the per-pair ratios first ÷ second with their range."""
    first = statistics.median(p[0] for p in pairs) * scale
    second = statistics.median(p[1] for p in pairs) * scale
    ratios = sorted(p[0] / p[1] for p in pairs)
    return (
        f"| {label} | {first:.3f} | {second:.3f} | {statistics.median(ratios):.3f} "
        f"(pairs from {ratios[0]:.3f} to {ratios[-1]:.3f}) |"
    )


def cost_report(
    pairs: list[tuple[float, float]], runtime_s: float, load: tuple[float, float]
) -> str:
    return "\n".join(
        [
            METRICS_SECTION,
            "",
            "| measure | metrics on | metrics off | on ÷ off |",
            "|---|---|---|---|",
            paired_row(f"server CPU per call, median of {len(pairs)} rounds (ms)", pairs),
            "",
            run_line("python bench/live_upstream.py --metrics-cost", runtime_s, load),
            "",
            "Two gateways on the same fake upstream, one with `[server] metrics = false`; "
            f"each round is {COST_CALLS} non-streamed live calls then {COST_STREAMS} streams, "
            "one at a time, and the two servers take turns (which one goes first alternates), "
            "so that a burst of the machine's other load meets both sides of a pair. The "
            "figure is the server process's CPU time (user + system, all threads, from "
            "the kernel's CPU clock of the process) over the round, per call; the ratio "
            "column is the median of the per-pair ratios. Both servers log every request "
            "(text format): only the counting differs. Target: on ÷ off within 1.05.",
            "",
        ]
    )


def kinds_config(urls: dict[str, str]) -> str:
    """``--kinds``: one gateway, a provider of each kind (on its fake, by URL) and a model
    on each (``live-<kind>``), at the same prices."""
    parts = ["[server]\nmetrics = true\n"]
    for kind in KINDS:
        parts.append(
            f"""
[[providers]]
name = "{kind}"
kind = "{kind}"
base_url = "{urls[kind]}"
api_key_env = "BENCH_UPSTREAM_KEY"

[[models]]
id = "live-{kind}"
provider = "{kind}"
upstream_id = "up-{kind}"
kind = "chat"
input_usd_per_mtok = 0.15
output_usd_per_mtok = 0.60
"""
        )
    return "".join(parts)


async def timed_call(conn: RawConnection, payload: bytes) -> float:
    """One call to its end (a stream's last byte): milliseconds."""
    start = time.perf_counter()
    await raw_call(conn, payload)
    return (time.perf_counter() - start) * 1000


async def kind_round(
    target: Target,
    payload: bytes,
    each: int,
    latencies: list[float],
    profile: Path | None = None,
) -> float:
    """The gateway's CPU seconds per call over one round of 16 callers sending ``payload``
    ``each`` times; every call's milliseconds go to ``latencies``; ``profile``: py-spy's
    samples of the gateway over the round."""
    _, cpu, times = await at_once(target, partial(timed_call, payload=payload), each, profile)
    latencies.extend(times)
    return cpu / (CONCURRENCY * each)


@dataclass
class KindRounds:
    """``--kinds``: per mode (``calls``, ``streams``) the pairs of adjacent rounds' CPU
    seconds per call (anthropic, openai); per (kind, mode) every call's milliseconds;
    per kind the ``data:`` chunks of one stream."""

    cpu: dict[str, list[tuple[float, float]]]
    latencies: dict[tuple[str, str], list[float]]
    chunks: dict[str, int]


async def kinds_rounds(
    target: Target, pairs: int, started: float, profile: Path | None = None
) -> KindRounds:
    """The pairs of rounds; ``profile``: then one longer round of non-streamed calls per
    kind, sampled by py-spy into ``<kind>.txt`` there."""
    modes = {"calls": (BODY, KINDS_CALLS_EACH), "streams": (SHORT_STREAM, KINDS_STREAMS_EACH)}
    payloads = {
        (kind, mode): orjson.dumps({**body, "model": f"live-{kind}"})
        for kind in KINDS
        for mode, (body, _) in modes.items()
    }
    latencies: dict[tuple[str, str], list[float]] = {key: [] for key in payloads}
    chunks = {}
    conn = target.connection()
    try:
        for kind in KINDS:  # warm both paths (connections to each fake, first-call work)
            for mode in modes:
                await kind_round(target, payloads[kind, mode], 2, [])
            chunks[kind] = await raw_chunks(conn, payloads[kind, "streams"])
    finally:
        await conn.aclose()
    cpu: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes}
    for index in range(pairs):
        if trio.current_time() - started > KINDS_BUDGET_S:
            print(f"out of time after {index} pairs", file=sys.stderr)
            break
        with trio.fail_after(PHASE_LIMIT_S):
            for mode, (_, each) in modes.items():
                first, second = (
                    partial(kind_round, target, payloads[kind, mode], each, latencies[kind, mode])
                    for kind in KINDS
                )
                cpu[mode].append(await in_turn(first, second, swap=index % 2 == 1))
        print(f"pair {index + 1} done at {trio.current_time() - started:.1f} s", file=sys.stderr)
    for kind in KINDS if profile is not None else ():
        assert profile is not None
        each = PROFILED.calls_each
        await kind_round(target, payloads[kind, "calls"], each, [], profile / f"{kind}.txt")
    return KindRounds(cpu, latencies, chunks)


async def measure_kinds(pairs: int, profile: Path | None = None) -> KindRounds:
    """``--kinds``: one gateway pinned to one core, with an ``anthropic`` and an ``openai``
    provider, each on its fake (a process of its own, on the other cores)."""
    started = trio.current_time()
    cpus = pin_cores()
    fakes: dict[str, subprocess.Popen[str]] = {}
    urls: dict[str, str] = {}
    scripts = {"anthropic": ANTHROPIC_SCRIPT, "openai": UPSTREAM_SCRIPT}
    try:
        for kind in KINDS:
            fakes[kind], urls[kind] = await trio.to_thread.run_sync(start_upstream, scripts[kind])
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            target = await start_target("kinds", Path(tmp) / "kinds", kinds_config(urls), cpus)
            try:
                return await kinds_rounds(target, pairs, started, profile)
            finally:
                await trio.to_thread.run_sync(target.server.stop)
    finally:
        for proc in fakes.values():
            proc.kill()
            proc.wait(timeout=5)


def kinds_report(
    result: KindRounds, runtime_s: float, load: tuple[float, float], command: str
) -> str:
    count = len(result.cpu["calls"])
    chunks = result.chunks
    table = [
        "| measure | anthropic | openai | anthropic ÷ openai |",
        "|---|---|---|---|",
        paired_row(
            f"gateway CPU per non-streamed call, median of {count} rounds (ms)",
            result.cpu["calls"],
        ),
        paired_row(
            f"gateway CPU per short stream, median of {count} rounds (ms)", result.cpu["streams"]
        ),
    ]
    for mode, what in (("calls", "non-streamed call"), ("streams", "short stream to its end")):
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            anthropic, openai = (percentile(result.latencies[k, mode], q) for k in KINDS)
            table.append(
                f"| {what}, {name} over all rounds (ms) | {anthropic:.3f} | {openai:.3f} "
                f"| {anthropic / openai:.3f} |"
            )
    return "\n".join(
        [
            *table,
            "",
            run_line(command, runtime_s, load),
            "",
            f"One gateway pinned to one core with an `anthropic` and an `openai` provider, each "
            "on its fake (the tests' fakes, each a process of its own on the other core with "
            "this client), and a model on each at the same prices; a live key. Each pair is a "
            f"round of {CONCURRENCY} × {KINDS_CALLS_EACH} non-streamed calls (the same prompt, "
            f"16 words back) to each model in turn, then a round of {CONCURRENCY} × "
            f"{KINDS_STREAMS_EACH} short streams to each (anthropic {chunks['anthropic']}, "
            f"openai {chunks['openai']} `data:` chunks to the client); which kind goes first "
            "alternates. The CPU figure is the gateway process's CPU time over the round, per "
            "call; the ratio column is the median of the per-pair ratios and their range; "
            "latencies are each call's, whole, 16 callers at once.",
            "",
        ]
    )


@dataclass(frozen=True)
class ProxyRound:
    """``--portkey``: one side's round of 16 callers: non-streamed calls/s and the server's
    CPU seconds per call, then its CPU seconds per chunk of long streams; then one caller
    alone: the server's CPU seconds per non-streamed call."""

    calls_per_s: float
    cpu_per_call: float
    cpu_per_chunk: float
    chunks_per_stream: float
    cpu_per_call_alone: float


async def proxy_round(target: Target) -> ProxyRound:
    plain, long = (orjson.dumps({**b, "model": target.model}) for b in (BODY, LONG_STREAM))
    calls_per_s, cpu_per_call = await calls_at_once(target, plain, PORTKEY_CALLS_EACH)
    cpu_per_chunk, chunks_per_stream = await chunks_at_once(target, long, PORTKEY_STREAMS_EACH)
    call = partial(raw_call, payload=plain)
    _, cpu_alone, _ = await at_once(target, call, PORTKEY_CALLS_ALONE, callers=1)
    alone = cpu_alone / PORTKEY_CALLS_ALONE
    return ProxyRound(calls_per_s, cpu_per_call, cpu_per_chunk, chunks_per_stream, alone)


async def measure_portkey(pairs: int) -> list[tuple[ProxyRound, ProxyRound]]:
    """``--portkey``: this tree's gateway and Portkey (:mod:`bench.portkey`), both pinned
    to the same core, on the same fake upstream; a warm-up round each (connections to the
    upstream, V8's compiler), then pairs of rounds in turn (which goes first alternates):
    (svc-gateway, Portkey) per pair."""
    started = trio.current_time()
    script = await trio.to_thread.run_sync(portkey.install)
    cpus = pin_cores()
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    servers: list[Server] = []
    try:
        with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
            this = await start_target("this", Path(tmp) / "this", config_toml(upstream_url), cpus)
            servers.append(this.server)
            server = await portkey.start(script, Path(tmp) / "portkey", cpus)
            servers.append(server)
            route = portkey.route_headers(upstream_url)
            proxy = Target("portkey", server, UPSTREAM_KEY, UPSTREAM_MODEL, route)
            with trio.fail_after(PHASE_LIMIT_S):
                for target in (this, proxy):
                    await proxy_round(target)
            results = []
            for index in range(pairs):
                if trio.current_time() - started > PORTKEY_BUDGET_S:
                    print(f"out of time after {index} pairs", file=sys.stderr)
                    break
                with trio.fail_after(PHASE_LIMIT_S):
                    svc, other = partial(proxy_round, this), partial(proxy_round, proxy)
                    results.append(await in_turn(svc, other, swap=index % 2 == 1))
                elapsed = trio.current_time() - started
                print(f"pair {index + 1} done at {elapsed:.1f} s", file=sys.stderr)
            portkey.check_alone(server.proc.pid)
            return results
    finally:
        await stop_all(servers, upstream)


def portkey_report(
    pairs: list[tuple[ProxyRound, ProxyRound]],
    runtime_s: float,
    load: tuple[float, float],
    command: str,
) -> str:
    def paired(figure: Callable[[ProxyRound], float]) -> list[tuple[float, float]]:
        return [(figure(svc), figure(proxy)) for svc, proxy in pairs]

    svc_chunks, proxy_chunks = (
        statistics.median(pair[side].chunks_per_stream for pair in pairs) for side in (0, 1)
    )
    return "\n".join(
        [
            PORTKEY_SECTION,
            "",
            "| measure | svc-gateway (median) | Portkey (median) | svc ÷ Portkey: median of "
            "pairs (range) |",
            "|---|---|---|---|",
            paired_row(
                "server CPU per non-streamed call, 16 callers (ms)",
                paired(lambda r: r.cpu_per_call),
            ),
            paired_row(
                f"server CPU per chunk, {CHUNKS}-chunk streams, 16 callers (µs)",
                paired(lambda r: r.cpu_per_chunk),
                scale=1e6,
            ),
            paired_row(
                "calls/s, 16 callers, not streamed", paired(lambda r: r.calls_per_s), scale=1
            ),
            paired_row(
                f"server CPU per non-streamed call, 1 caller ({PORTKEY_CALLS_ALONE}, ms)",
                paired(lambda r: r.cpu_per_call_alone),
            ),
            "",
            run_line(command, runtime_s, load),
            "",
            f"{portkey.describe()}, a pure proxy: it routes each call by its headers "
            "(`x-portkey-provider: openai`, `x-portkey-custom-host`: the fake upstream) and "
            "keeps no accounts. svc-gateway (this tree) with a live key of an organisation with "
            "credits: it authenticates, admits, meters and settles each call. Both servers "
            "pinned to the same core, this client and the fake upstream on the other. After a "
            f"warm-up round each, {len(pairs)} pairs of rounds in turn (which goes first "
            f"alternates); a round is {CONCURRENCY} callers × {PORTKEY_CALLS_EACH} non-streamed "
            f"calls, then {CONCURRENCY} × {PORTKEY_STREAMS_EACH} streams of {svc_chunks:.0f} "
            f"(svc-gateway) / {proxy_chunks:.0f} (Portkey) `data:` chunks to the client, then "
            f"one caller alone sends {PORTKEY_CALLS_ALONE} non-streamed calls in a row. CPU is "
            "each server process's CPU time (user + system, all threads) over the phase; the "
            "ratio column is the median of the per-pair ratios and their range.",
            "",
        ]
    )


#: (label, figure, target ratio this ÷ base, whether lower is better)
ROWS: list[tuple[str, Callable[[Figures], float], str, bool]] = [
    ("CPU per non-streamed call, 16 callers (ms)", lambda f: f.cpu_ms_per_call, "≤ 0.50", True),
    ("CPU per non-streamed call, one caller (ms)", lambda f: f.cpu_ms_per_call_alone, "", True),
    (f"CPU per chunk, {CHUNKS}-chunk streams (µs)", lambda f: f.cpu_us_per_chunk, "≤ 0.35", True),
    (
        f"CPU per chunk, streams of a chunk every {PACE_S * 1000:g} ms (µs)",
        lambda f: f.cpu_us_per_paced_chunk,
        "≤ 0.85",
        True,
    ),
    ("added latency p50, one caller (ms)", lambda f: f.added_median_ms, "≤ 0.40", True),
    ("added latency p99, one caller (ms)", lambda f: f.added_p99_ms, "≤ 0.50", True),
    ("whole answer p50, one caller (ms)", lambda f: f.whole_median_ms, "", True),
    ("whole answer p99, one caller (ms)", lambda f: f.whole_p99_ms, "", True),
    ("direct upstream p50, one caller (ms)", lambda f: f.direct_median_ms, "", True),
    ("first chunk p50, one caller (ms)", lambda f: f.ttfc_median_ms, "", True),
    ("first chunk p99, one caller (ms)", lambda f: f.ttfc_p99_ms, "", True),
    ("calls/s, 16 callers, not streamed", lambda f: f.calls_per_s, "≥ 2", False),
    ("calls/s, 16 callers, streamed (16 words)", lambda f: f.streams_per_s, "≥ 2", False),
]


def report(
    rounds: list[Figures],
    rss: tuple[float, float],
    open_streams: int,
    runtime_s: float,
    load: tuple[float, float],
    command: str,
) -> str:
    table = ["| measure | median of rounds | range |", "|---|---|---|"]
    for label, figure, _, _ in ROWS:
        values = [figure(r) for r in rounds]
        table.append(
            f"| {label} | {statistics.median(values):.2f} | {min(values):.2f}–{max(values):.2f} |"
        )
    chunks = statistics.median(r.chunks_per_stream for r in rounds)
    table.append(
        f"| RSS idle / with {open_streams:,} open streams (MiB) | {rss[0]:.0f} / {rss[1]:.0f} | |"
    )
    return "\n".join(
        [
            SECTION,
            "",
            *table,
            "",
            run_line(command, runtime_s, load),
            "",
            f"{len(rounds)} rounds; see the docstring of `bench/live_upstream.py` for what a "
            "round measures. The gateway runs pinned to one core, this client and the fake "
            f"upstream on the other; long streams are {chunks:.0f} chunks each as the client "
            "receives them.",
            "",
        ]
    )


def against_report(
    result: Against, open_streams: int, runtime_s: float, load: tuple[float, float], command: str
) -> str:
    table = [
        f"| measure | {result.rev} (median) | this tree (median) | this ÷ {result.rev}: median "
        "of pairs (range) | target |",
        "|---|---|---|---|---|",
    ]
    for label, figure, target, _ in ROWS:
        base = [figure(b) for b, _ in result.pairs]
        this = [figure(t) for _, t in result.pairs]
        ratios = sorted(t / b for b, t in zip(base, this, strict=True) if b > 0)
        table.append(
            f"| {label} | {statistics.median(base):.3f} | {statistics.median(this):.3f} | "
            f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f}) | {target} |"
        )
    base_rss, this_rss = result.rss["base"], result.rss["this"]
    table.append(
        f"| RSS with {open_streams:,} open streams (MiB; idle before) | {base_rss[1]:.0f} "
        f"({base_rss[0]:.0f}) | {this_rss[1]:.0f} ({this_rss[0]:.0f}) | "
        f"{this_rss[1] / base_rss[1]:.2f} | ≤ 150 MiB |"
    )
    return "\n".join(
        [
            AGAINST_SECTION,
            "",
            *table,
            "",
            run_line(command, runtime_s, load),
            "",
            f"{len(result.pairs)} pairs of rounds, the two gateways taking turns (which goes "
            "first alternates); both pinned to one core, this client and the fake upstream on "
            "the other. Ratios are the medians of the per-pair ratios (this tree ÷ the base); "
            "RSS is measured once per side, after the pairs.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--short", action="store_true", help="one short round")
    parser.add_argument("--against", metavar="REV", help="alternate with REV, print ratios")
    parser.add_argument(
        "--pairs",
        type=int,
        help=f"pairs of rounds (--against: {PAIRS}, --kinds: {KINDS_PAIRS}, "
        f"--portkey: {PORTKEY_PAIRS})",
    )
    parser.add_argument(
        "--portkey", action="store_true", help="CPU per call and per chunk against Portkey"
    )
    parser.add_argument(
        "--kinds", action="store_true", help="CPU per call, anthropic against openai provider"
    )
    parser.add_argument(
        "--open-streams", type=int, default=OPEN_STREAMS, help="streams open for the RSS figure"
    )
    parser.add_argument(
        "--metrics-cost", action="store_true", help="CPU per call with metrics on vs off"
    )
    parser.add_argument(
        "--profile", metavar="DIR", type=Path, help="py-spy the 16-caller phases into DIR"
    )
    args = parser.parse_args()
    command = "python bench/live_upstream.py " + " ".join(sys.argv[1:])
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    if args.metrics_cost:
        pairs = trio.run(measure_cost)
        load = (load_before, os.getloadavg()[0])
        section = cost_report(pairs, time.monotonic() - started, load)
    elif args.kinds:
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
        kinds = trio.run(measure_kinds, args.pairs or KINDS_PAIRS, args.profile)
        load = (load_before, os.getloadavg()[0])
        print(kinds_report(kinds, time.monotonic() - started, load, command.strip()))
        for kind in KINDS if args.profile else ():
            print(profile_summary(args.profile / f"{kind}.txt"), end="\n\n")
        return
    elif args.portkey:
        proxy_pairs = trio.run(measure_portkey, args.pairs or PORTKEY_PAIRS)
        load = (load_before, os.getloadavg()[0])
        print(portkey_report(proxy_pairs, time.monotonic() - started, load, command.strip()))
        return
    elif args.against:
        count = args.pairs or PAIRS
        result = trio.run(measure_against, args.against, PAIRED, count, args.open_streams)
        load = (load_before, os.getloadavg()[0])
        section = against_report(
            result, args.open_streams, time.monotonic() - started, load, command.strip()
        )
    elif args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        trio.run(measure, PROFILED, 0, args.profile)
        for name in ("calls.txt", "chunks.txt"):
            print(profile_summary(args.profile / name), end="\n\n")
        return
    else:
        sizes = SHORT if args.short else Sizes()
        rounds, rss = trio.run(measure, sizes, args.open_streams)
        load = (load_before, os.getloadavg()[0])
        section = report(
            rounds, rss, args.open_streams, time.monotonic() - started, load, command.strip()
        )
    publish(section, write=not (args.no_write or args.short))


if __name__ == "__main__":
    main()
