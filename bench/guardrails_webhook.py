"""What an output ``webhook`` guardrail costs a stream: the time to first token and per
chunk, with a local webhook, against no guardrail.

Run it from a clone::

    python bench/guardrails_webhook.py            # prints a table, updates bench/RESULTS.md
    python bench/guardrails_webhook.py --no-write # prints only

Two ``svc-gateway serve`` processes on one core (the client, the fake OpenAI upstream
and the fake webhook, each a process of its own, on the other): the same config, one
with two output webhook guardrails on the fake webhook (it allows everything): one with
the default ``stream_chars = 200``, one with ``stream_chars = 1`` (a check per chunk: the
cost of one check). The sides take turns, the order swapped from pair to pair.

- **time to first token**: streams of 40 words at a model's pace (a chunk every 2 ms),
  from the request to the first chunk that carries text. With ``stream_chars = 200`` the
  first text leaves once the model wrote 200 characters and the webhook answered.
- **time per chunk**: streams of 200 chunks sent by the upstream at once, from the
  request to the end, over 200: what holding and checking add to each chunk.
- **CPU per chunk**: the gateway's CPU time over those streams, over 200.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.guardrails import LONG, guarded_key, main, pairs_of, ttft_round  # noqa: E402
from bench.live_upstream import (  # noqa: E402
    FAKE_SCRIPT,
    MODEL,
    Target,
    config_toml,
    cpu_seconds,
    paired_row,
    pin_cores,
    start_target,
    start_upstream,
)
from bench.streaming import run_line  # noqa: E402

SECTION = "## Guardrails: an output webhook on streams (issue 45)"
WEBHOOK_SCRIPT = FAKE_SCRIPT.format(module="fake_guardrail_webhook", cls="FakeWebhook", args="")
GUARDRAILS = """
[[guardrails]]
name = "hook"
kind = "webhook"
on = "output"
url = "{url}"

[[guardrails]]
name = "hook-each"
kind = "webhook"
on = "output"
url = "{url}"
stream_chars = 1
"""
PAIRS = 3
STREAMS = 3
CHUNKS = 200
Figures = dict[str, list[tuple[float, float]]]


async def stream_round(target: Target) -> tuple[float, float]:
    """(seconds, server CPU seconds) per chunk over :data:`STREAMS` streams of 200 chunks."""
    async with httpx.AsyncClient(base_url=target.url, headers=target.headers) as client:
        start, cpu = time.perf_counter(), cpu_seconds(target.pid)
        for _ in range(STREAMS):
            answer = await client.post("/chat/completions", content=LONG)
            if answer.status_code != 200 or "content_blocked" in answer.text:
                raise SystemExit(f"HTTP {answer.status_code}: {answer.text[:300]}")
        count = STREAMS * CHUNKS
        return (time.perf_counter() - start) / count, (cpu_seconds(target.pid) - cpu) / count


async def measure() -> Figures:
    cpus = pin_cores()
    upstream, url = start_upstream()
    webhook, hook_url = start_upstream(WEBHOOK_SCRIPT)
    with tempfile.TemporaryDirectory() as tmp:
        base = config_toml(url, metrics=False)
        none = await start_target("none", Path(tmp) / "none", base, cpus)
        config = base + GUARDRAILS.format(url=hook_url)
        hooked = await start_target("hooked", Path(tmp) / "hooked", config, cpus)
        each = Target("each", hooked.server, await guarded_key(hooked.server.url, ["hook-each"]))
        hooked.token = await guarded_key(hooked.server.url, ["hook"])
        try:
            with trio.fail_after(80):
                figures = {
                    "ttft": await pairs_of(none, hooked, ttft_round, PAIRS),
                    "ttft_each": await pairs_of(none, each, ttft_round, PAIRS),
                }
                for name, side in (("chunk", hooked), ("chunk_each", each)):
                    rounds = await pairs_of(none, side, stream_round, PAIRS)
                    figures[name] = [(a[0], b[0]) for a, b in rounds]
                    figures[f"cpu_{name}"] = [(a[1], b[1]) for a, b in rounds]
                return figures
        finally:
            none.server.stop()
            hooked.server.stop()
            upstream.kill()
            webhook.kill()


def report(figures: Figures, runtime_s: float, load: tuple[float, float]) -> str:
    def added(name: str, scale: float) -> float:
        return statistics.median(g - n for g, n in figures[name]) * scale

    return "\n".join(
        [
            SECTION,
            "",
            "| measure | with the webhook | none | webhook ÷ none (median of pairs) |",
            "|---|---|---|---|",
            paired_row("time to first token, `stream_chars = 200` (ms)", figures["ttft"]),
            paired_row("time to first token, `stream_chars = 1` (ms)", figures["ttft_each"]),
            paired_row(
                "time per chunk, `stream_chars = 200` (µs)", figures["chunk"], scale=1_000_000
            ),
            paired_row(
                "time per chunk, `stream_chars = 1` (µs)", figures["chunk_each"], scale=1_000_000
            ),
            paired_row(
                "gateway CPU per chunk, `stream_chars = 200` (µs)",
                figures["cpu_chunk"],
                scale=1_000_000,
            ),
            paired_row(
                "gateway CPU per chunk, `stream_chars = 1` (µs)",
                figures["cpu_chunk_each"],
                scale=1_000_000,
            ),
            "",
            f"Added time to first token: {added('ttft', 1000):.1f} ms with `stream_chars ="
            " 200` (the model writes 200 characters, then one check),"
            f" {added('ttft_each', 1000):.1f} ms with `stream_chars = 1` (one check)."
            " Added time per chunk:"
            f" {added('chunk', 1_000_000):.0f} µs and {added('chunk_each', 1_000_000):.0f} µs.",
            "",
            run_line("python bench/guardrails_webhook.py", runtime_s, load),
            f"Model `{MODEL}` on the fake OpenAI upstream, the fake webhook"
            f" (gateway/fakes/fake_guardrail_webhook.py) a process of its own; {PAIRS} pairs"
            f" of rounds of 12 paced streams (40 words, a chunk every 2 ms) and {STREAMS}"
            f" streams of {CHUNKS} chunks.",
        ]
    )


if __name__ == "__main__":
    main(__doc__ or "", measure, report)
