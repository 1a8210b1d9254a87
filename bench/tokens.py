"""Benchmark of a reservation's prompt count (issue 47): CPU per call with exact
counting (a model's ``tokenizer = "o200k"`` or ``"cl100k"``) against the byte bound
(``"bytes"``), for a 2 KB and a 100 KB prompt.

Run it from a clone::

    python bench/tokens.py            # 2 KB and 100 KB, 12 alternating rounds each

What is timed is step 7 of a call as the walk runs it: the parsed chat call's prompt
bound for the model (:func:`gateway.calls.tokens.prompt_bound`: every string of the
messages counted, plus the template's tokens), the body parsed once outside the timed
part. The prompt is technical Markdown and prose mixed with code (the repository's own
docs, cut to size), in one user message after a short system message. Rounds alternate
the sides (bytes, o200k, cl100k, in a rotating order), each round a batch of calls
timed with the process's CPU clock; the figure is the median of the rounds' CPU per
call, and the spread their min..max. The vocabularies are loaded before the first
round (as the gateway loads them at start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gateway.calls.parse.chat import parse_chat
from gateway.calls.tokens import exact_counter, preload, prompt_bound
from gateway.config.settings import ModelConfig

SIDES = ("bytes", "o200k", "cl100k")
SIZES = {"2 KB": 2_000, "100 KB": 100_000}
#: calls per round, by prompt size (each round about 0.1-0.5 s)
BATCH = {"2 KB": 400, "100 KB": 20}
ROOT = Path(__file__).resolve().parent.parent


def prompt(size: int) -> str:
    """``size`` bytes of the repository's docs and code, repeated as needed."""
    sources = [ROOT / "docs" / "ARCHITECTURE.md", ROOT / "gateway" / "calls" / "pipeline.py"]
    text = "\n\n".join(path.read_text() for path in sources)
    while len(text.encode()) < size:
        text += text
    return text.encode()[:size].decode(errors="ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    base = ModelConfig("bench", "mock", "bench")
    models = {side: replace(base, tokenizer=side) for side in SIDES}
    preload(models.values())
    print("| prompt | side | prompt tokens reserved | CPU per call, median (µs) | min..max |")
    print("|---|---|---|---|---|")
    for label, size in SIZES.items():
        text = prompt(size)
        body = {
            "model": "bench",
            "messages": [
                {"role": "system", "content": "You are a careful reviewer."},
                {"role": "user", "content": text},
            ],
            "max_tokens": 16,
        }
        call = parse_chat(body, 16)
        per_call: dict[str, list[float]] = {side: [] for side in SIDES}
        batch = BATCH[label]
        for round_no in range(args.rounds):
            order = SIDES[round_no % 3 :] + SIDES[: round_no % 3]
            for side in order:
                model = models[side]
                start = time.process_time()
                for _ in range(batch):
                    prompt_bound(call, model)
                per_call[side].append((time.process_time() - start) / batch * 1e6)
        exact = exact_counter("o200k")(text)
        for side in SIDES:
            times = per_call[side]
            reserved = prompt_bound(call, models[side])
            print(
                f"| {label} ({exact:,} o200k tokens) | {side} | {reserved:,} |"
                f" {statistics.median(times):,.1f} | {min(times):,.1f}..{max(times):,.1f} |"
            )
    print(f"\nload average (1 min) after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
