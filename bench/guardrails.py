"""What guardrails cost: ``pii`` (redact) and ``secrets`` (deny) on both directions,
against none, on two gateways that take turns.

Run it from a clone::

    python bench/guardrails.py            # prints a table, updates bench/RESULTS.md
    python bench/guardrails.py --no-write # prints only

Two ``svc-gateway serve`` processes on one core (the client and the fake OpenAI upstream,
a process of its own, on the other): the same config, one with the two ``[[guardrails]]``
named in its organisation's policy. Each side is measured in rounds, the sides taking
turns (the order swapped from pair to pair, so that a burst of the machine's other load
meets both sides of a pair); each figure is the median of the per-pair ratios.

- **CPU per call**: the server's CPU time (its process CPU clock) over a round of
  non-streamed chat calls whose prompt is 2 KB of prose (no match: the common case; the
  detectors run over all of it, and over the answer).
- **CPU per chunk**: the same over streams of 200 chunks (every chunk passes the window).
- **time to first token**: streamed calls at a model's pace (a chunk every 2 ms), from
  the request to the first chunk that carries text: the window holds back the longest
  text before a match can be seen (72 characters for ``pii``), so the first text leaves
  once the model wrote that much more.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import httpx
import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live_upstream import (  # noqa: E402
    BODY,
    MODEL,
    Target,
    config_toml,
    cpu_seconds,
    in_turn,
    paired_row,
    pin_cores,
    start_target,
    start_upstream,
)
from bench.streaming import ADMIN_TOKEN, publish, run_line, wants_write  # noqa: E402

T = TypeVar("T")
SECTION = "## Guardrails: pii + secrets on both directions against none (issue 45)"
GUARDRAILS = """
[[guardrails]]
name = "pii"
kind = "pii"
on = "both"
action = "redact"

[[guardrails]]
name = "secrets"
kind = "secrets"
on = "both"
action = "deny"
"""
PAIRS = 6
CALLS = 120
STREAMS = 12
TTFT_STREAMS = 12
#: about 2 KB of prose with numbers in it (dates, amounts, versions): no match
PROMPT = (
    "Our gateway handled 1,240 requests on 2026-11-27 between 09:00 and 17:30; version "
    "3.2.1 of the client retried 14 of them after a 503. Please summarise what the "
    "operators should check first, in order, and why each step matters for the budget. "
) * 8
PLAIN = orjson.dumps({**BODY, "messages": [{"role": "user", "content": PROMPT[:2048]}]})
LONG = orjson.dumps({**BODY, "max_tokens": 200, "stream": True})
PACED = orjson.dumps(
    {
        **BODY,
        "max_tokens": 40,
        "stream": True,
        "messages": [{"role": "user", "content": "Tell me. [[fault chunk_delay=0.002]]"}],
    }
)


async def guarded_key(url: str, guardrails: list[str]) -> str:
    """A live key of a new organisation whose policy names ``guardrails``."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=admin) as client:
        org = await client.post("/admin/orgs", json={"name": "bench", "credits_usd": 100_000})
        org.raise_for_status()
        org_id = org.json()["id"]
        policy = await client.put(f"/admin/orgs/{org_id}/policy", json={"guardrails": guardrails})
        policy.raise_for_status()
        body = {"org_id": org_id, "name": "bench", "mode": "live", "caps": {"rpm": 10_000_000}}
        response = await client.post("/admin/keys", json=body)
        response.raise_for_status()
        return str(response.json()["token"])


async def cpu_round(target: Target, payload: bytes, count: int) -> float:
    """The server's CPU seconds per call over ``count`` calls (each read to its end)."""
    async with httpx.AsyncClient(base_url=target.url, headers=target.headers) as client:
        (await client.post("/chat/completions", content=payload)).raise_for_status()
        start = cpu_seconds(target.pid)
        for _ in range(count):
            answer = await client.post("/chat/completions", content=payload)
            if answer.status_code != 200:
                raise SystemExit(f"HTTP {answer.status_code}: {answer.text[:300]}")
        return (cpu_seconds(target.pid) - start) / count


async def ttft_round(target: Target) -> float:
    """The median time to the first chunk that carries text, in seconds."""
    times = []
    async with httpx.AsyncClient(base_url=target.url, headers=target.headers) as client:
        for _ in range(TTFT_STREAMS):
            start = time.perf_counter()
            first = None
            async with client.stream("POST", "/chat/completions", content=PACED) as answer:
                async for line in answer.aiter_lines():
                    if first is None and '"content":"' in line and '"content":""' not in line:
                        first = time.perf_counter() - start
            assert first is not None
            times.append(first)
    return statistics.median(times)


async def pairs_of(
    none: Target, guarded: Target, measure: Callable[[Target], Awaitable[T]], pairs: int = PAIRS
) -> list[tuple[T, T]]:
    """(guarded, none) figures of ``pairs`` pairs of rounds, taking turns."""
    return [
        await in_turn(lambda: measure(guarded), lambda: measure(none), swap=bool(i % 2))
        for i in range(pairs)
    ]


async def measure() -> dict[str, list[tuple[float, float]]]:
    cpus = pin_cores()
    upstream, url = start_upstream()
    with tempfile.TemporaryDirectory() as tmp:
        base = config_toml(url, metrics=False)
        none = await start_target("none", Path(tmp) / "none", base, cpus)
        guarded = await start_target("guarded", Path(tmp) / "guarded", base + GUARDRAILS, cpus)
        guarded.token = await guarded_key(guarded.server.url, ["pii", "secrets"])
        try:
            with trio.fail_after(170):
                return {
                    "call": await pairs_of(none, guarded, lambda t: cpu_round(t, PLAIN, CALLS)),
                    "chunk": await pairs_of(none, guarded, lambda t: cpu_round(t, LONG, STREAMS)),
                    "ttft": await pairs_of(none, guarded, ttft_round),
                }
        finally:
            none.server.stop()
            guarded.server.stop()
            upstream.kill()


def report(
    figures: dict[str, list[tuple[float, float]]], runtime_s: float, load: tuple[float, float]
) -> str:
    chunk = [(g / 200, n / 200) for g, n in figures["chunk"]]
    ttft = figures["ttft"]
    added = statistics.median(g - n for g, n in ttft) * 1000
    return "\n".join(
        [
            SECTION,
            "",
            "| measure | pii + secrets, both | none | guarded ÷ none (median of pairs) |",
            "|---|---|---|---|",
            paired_row("CPU per call, 2 KB prompt (ms)", figures["call"]),
            paired_row("CPU per streamed chunk (µs)", chunk, scale=1_000_000),
            paired_row("time to first token, a chunk every 2 ms (ms)", ttft),
            "",
            f"Added time to first token: {added:.1f} ms (median of the pairs' differences):"
            " the window holds back the last 72 characters until the model has written"
            " them, so the first text leaves ~72 characters later (about 18 tokens; at 50"
            " tokens/s, ~0.35 s). Target: at most 15 % more CPU per call for a 2 KB prompt.",
            "",
            run_line("python bench/guardrails.py", runtime_s, load),
            f"Model `{MODEL}` on the fake OpenAI upstream; {PAIRS} pairs of rounds of"
            f" {CALLS} calls, {STREAMS} streams of 200 chunks, {TTFT_STREAMS} paced streams.",
        ]
    )


Figures = dict[str, list[tuple[float, float]]]


def main(
    doc: str = __doc__ or "",
    take: Callable[[], Awaitable[Figures]] = measure,
    write_up: Callable[[Figures, float, tuple[float, float]], str] = report,
) -> None:
    """Measure (``take``), write the section up and publish it (this bench's by default)."""
    write = wants_write(doc)
    load_before = os.getloadavg()[0]
    started = time.monotonic()
    figures = trio.run(take)
    runtime_s = time.monotonic() - started
    publish(write_up(figures, runtime_s, (load_before, os.getloadavg()[0])), write)


if __name__ == "__main__":
    main()
