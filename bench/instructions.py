"""Instructions per call and per relayed chunk, this tree against a revision (issue 34).

Run it from a clone (valgrind installed: ``apt-get install valgrind``)::

    python bench/instructions.py --against 9088f64            # 2 rounds of each tree
    python bench/instructions.py --against 9088f64 --rounds 3 --calls-each 10
    python bench/instructions.py --callers 10,1 --rounds 1    # this tree alone (issue 49)
    python bench/instructions.py --against /tmp/base-tree     # a tree run with this Python

Why: CPU time on a shared virtual machine moves by up to 2× within minutes (see
bench/RESULTS.md), so a ratio of CPU seconds needs many alternating pairs and still
spans ±10 %. The instructions a process executes do not depend on how fast the machine
runs them: counted by valgrind's callgrind (``Ir``), the same work gives the same count
to about 1 %, and a change of a few percent shows in one round. It is a proxy of CPU
time, not the same thing: it weighs every instruction alike (a cache miss or a system
call's time in the kernel is not counted), so the bench's CPU-time figures
(``bench/live_upstream.py --against``) stay the ones the issue names; this one says which
way and how far the code moved.

What runs: the live-call bench's parts (``bench/live_upstream.py``): its fake upstream,
and each gateway as a ``svc-gateway serve`` process of its tree with the same config,
started under ``valgrind --tool=callgrind --instr-atstart=no`` (counting off: start-up
and warm-up are not counted). Per round and tree: a warm-up, then counting on
(``callgrind_control -i on``) for 16 callers × ``--calls-each`` non-streamed calls, a
dump, the same for 16 × ``--streams-each`` long streams (200 chunks), a dump. Every
thread of the gateway process counts (the store's writer too). The trees take turns
(REV, this, REV, this, ...); figures are the medians over the rounds, the ratio this ÷
REV. Under valgrind a gateway runs some 50× slower, so calls queue more than at full
speed; both trees meet the same load.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import live_upstream as live  # noqa: E402
from bench import streaming  # noqa: E402

#: a gateway under valgrind starts some 10× slower
streaming.START_TIMEOUT_S = 600.0
#: streams at a model's pace, slow enough for a gateway under valgrind to keep up (each
#: upstream read holds one chunk: the figure is the cost of a relayed batch of one)
PACED_CALLERS, PACED_EACH, PACED_CHUNKS, PACED_DELAY_S = 2, 3, 50, 0.02
PACED = {
    **live.BODY,
    "max_tokens": PACED_CHUNKS,
    "stream": True,
    "messages": [{"role": "user", "content": f"Pace. [[fault chunk_delay={PACED_DELAY_S}]]"}],
}


def under_callgrind(python: str, out: Path) -> str:
    """An executable that runs ``python`` under callgrind, counting off, dumps to ``out``."""
    wrapper = Path(tempfile.mkdtemp(prefix="svc-ir-")) / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec valgrind -q --tool=callgrind --instr-atstart=no --callgrind-out-file={out}"
        f' {python} "$@"\n'
    )
    wrapper.chmod(0o755)
    return str(wrapper)


def dumped_ir(out: Path) -> int:
    """The instructions of the dumps of ``out`` (``totals:``; ``summary:`` miscounts across
    a toggle of the counting), and the dumps removed."""
    total = 0
    for name in glob.glob(f"{out}.*"):
        with open(name) as dump:
            total += sum(int(line.split()[1]) for line in dump if line.startswith("totals:"))
        os.remove(name)
    return total


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, stdout=subprocess.DEVNULL)


async def counted(
    target: live.Target, out: Path, kind: str, each: int, callers: int = live.CONCURRENCY
) -> float:
    """Instructions per call (``calls``) or per chunk the clients received (``chunks``),
    ``callers`` at once, ``each`` apiece."""
    body = {"calls": live.BODY, "chunks": live.LONG_STREAM, "paced": PACED}[kind]
    payload = orjson.dumps(body)
    work = live.raw_call if kind == "calls" else live.raw_chunks
    await live.at_once(target, partial(work, payload=payload), 1, callers=callers)  # warm
    dumped_ir(out)
    pid = str(target.pid)
    await trio.to_thread.run_sync(control, "-i", "on", pid)
    _, _, results = await live.at_once(
        target, partial(work, payload=payload), each, callers=callers
    )
    await trio.to_thread.run_sync(control, "-d", pid)
    await trio.to_thread.run_sync(control, "-i", "off", pid)
    units = callers * each if kind == "calls" else sum(results)
    return dumped_ir(out) / units


async def one_round(
    name: str, tree: Path, python: str, upstream_url: str, args: argparse.Namespace
) -> tuple[float, ...]:
    """Per call at each of ``args.callers`` (``args.calls`` calls in all), then per chunk
    (the first of ``args.callers`` streaming at once)."""
    work = Path(tempfile.mkdtemp(prefix="svc-ir-"))
    out = work / "callgrind.out"
    target = await live.start_target(
        name, work / "gw", live.config_toml(upstream_url), None, tree, under_callgrind(python, out)
    )
    figures: list[float] = []
    try:
        for callers in args.callers:
            each = args.calls_each if args.calls is None else -(-args.calls // callers)
            figures.append(await counted(target, out, "calls", each, callers))
        figures.append(await counted(target, out, "chunks", args.streams_each, args.callers[0]))
        figures.append(await counted(target, out, "paced", PACED_EACH, PACED_CALLERS))
    finally:
        target.server.stop()
        shutil.rmtree(work, ignore_errors=True)
    calls = ", ".join(
        f"{figure:,.0f} per call at {callers}"
        for figure, callers in zip(figures[:-2], args.callers, strict=True)
    )
    print(
        f"{name}: {calls}, {figures[-2]:,.0f} per chunk, {figures[-1]:,.0f} per paced chunk",
        flush=True,
    )
    return tuple(figures)


async def run(args: argparse.Namespace) -> None:
    sides = {"this tree": (live.ROOT, sys.executable)}
    if args.against is not None and Path(args.against).is_dir():
        sides = {args.against: (Path(args.against), sys.executable), **sides}
    elif args.against is not None:
        sides = {args.against: live.build_revision(args.against), **sides}
    figures: dict[str, list[tuple[float, ...]]] = {name: [] for name in sides}
    upstream, url = live.start_upstream()
    try:
        for _ in range(args.rounds):
            for name, (tree, python) in sides.items():
                figures[name].append(await one_round(name, tree, python, url, args))
    finally:
        upstream.kill()
    medians = {
        name: tuple(statistics.median(f[i] for f in rows) for i in range(len(rows[0])))
        for name, rows in figures.items()
    }
    if args.against is None:
        print(f"\nthis tree, medians of {args.rounds} rounds: {medians['this tree']}")
        return
    base, this = medians[args.against], medians["this tree"]
    names = [f"per non-streamed call, {n} callers" for n in args.callers]
    rows = "".join(
        f"| {label} | {b:,.0f} | {t:,.0f} | {t / b:.3f} |\n"
        for label, b, t in zip(
            [*names, "per relayed chunk (bursts)", "per paced chunk"], base, this, strict=True
        )
    )
    print(
        f"\ninstructions (callgrind Ir), medians of {args.rounds} rounds:\n"
        f"| | {args.against} | this tree | this ÷ {args.against} |\n|---|---|---|---|\n{rows}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--against",
        metavar="REV",
        help="the base revision, or a directory of a source tree (none: this tree alone)",
    )
    parser.add_argument(
        "--callers",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[live.CONCURRENCY],
        help="callers at once, a comma-separated list: a per-call figure each (16)",
    )
    parser.add_argument(
        "--calls", type=int, help="non-streamed calls in all per figure (else --calls-each)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of each tree (2)")
    parser.add_argument("--calls-each", type=int, default=10, help="calls per caller (10)")
    parser.add_argument("--streams-each", type=int, default=2, help="streams per caller (2)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("this bench needs valgrind (apt-get install valgrind)")
    trio.run(run, args)


if __name__ == "__main__":
    main()
