"""Benchmark of the response cache: the server's CPU per call for a hit, for a miss, and
for the same miss with the cache off.

    python bench/cache.py              # 6 rounds of 300 calls a side (~40 s)
    python bench/cache.py --rounds 3 --calls 200

Two ``svc-gateway serve`` processes on new SQLite files, the demo catalog's mock
provider (answers made in the process: the CPU of a call is the gateway's own), one
``[cache] enabled = true``, the other without ``[cache]``; a sandbox key on each with
no reachable limit. Each round runs the three sides in a rotating order, each side
``--calls`` calls one after another on one warm connection, and reads the server's CPU
clock (user + system, all threads) before and after:

- hit: the same body (temperature 0) again and again, stored before the rounds;
- miss, cache on: a new body every call (its text numbered), so each is looked up,
  claimed, called and stored;
- miss, cache off: the same new bodies on the server without the cache.

It prints the median CPU per call of each side over the rounds, hit ÷ miss, and the
median of the rounds' (miss on ÷ miss off) ratios: the added CPU of a miss (the
target: ≤ 5 %). The machine is shared: rotating the order puts a burst of other load
on every side alike.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.live_upstream import cpu_seconds
from tests.support.procs import ADMIN_TOKEN, Server, base_env, start_server

CACHE_ON = "[cache]\nenabled = true\nmax_entries = 1000000\n"
CACHE_OFF = "[server]\nmetrics = true\n"
SIDES = ("hit", "miss_on", "miss_off")


def body(text: str) -> bytes:
    return orjson.dumps(
        {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 16,
            "temperature": 0,
        }
    )


def start(workdir: Path, config_text: str) -> Server:
    workdir.mkdir()
    config = workdir / "gateway.toml"
    config.write_text(config_text)
    return start_server(workdir, "--config", str(config), env=base_env())


def sandbox_key(url: str) -> str:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=url, headers=admin) as client:
        org = client.post("/admin/orgs", json={"name": "bench"})
        org.raise_for_status()
        key = client.post(
            "/admin/keys",
            json={
                "org_id": org.json()["id"],
                "name": "bench",
                "mode": "sandbox",
                "caps": {"rpm": 10_000_000, "max_in_flight": 100},
            },
        )
        key.raise_for_status()
        return str(key.json()["token"])


def per_call_us(client: httpx.Client, pid: int, payloads: list[bytes], expect: str) -> float:
    start = cpu_seconds(pid)
    for payload in payloads:
        response = client.post("/v1/chat/completions", content=payload)
        assert response.status_code == 200, response.text
        assert response.headers.get("X-Svc-Cache", "bypass") == expect, response.headers
    return (cpu_seconds(pid) - start) / len(payloads) * 1e6


def run(rounds: int, calls: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        on = start(Path(tmp) / "on", CACHE_ON)
        off = start(Path(tmp) / "off", CACHE_OFF)
        try:
            clients = {}
            for name, server in (("on", on), ("off", off)):
                headers = {
                    "Authorization": f"Bearer {sandbox_key(server.url)}",
                    "Content-Type": "application/json",
                }
                clients[name] = httpx.Client(base_url=server.url, headers=headers, timeout=30)
            same = body("the same question, again")
            clients["on"].post("/v1/chat/completions", content=same).raise_for_status()
            clients["off"].post("/v1/chat/completions", content=same).raise_for_status()
            figures: dict[str, list[float]] = {side: [] for side in SIDES}
            ratios: list[float] = []
            for n in range(rounds):
                order = SIDES[n % 3 :] + SIDES[: n % 3]
                fresh = [body(f"question {n}.{i}") for i in range(calls)]
                for side in order:
                    if side == "hit":
                        us = per_call_us(clients["on"], on.proc.pid, [same] * calls, "hit")
                    elif side == "miss_on":
                        us = per_call_us(clients["on"], on.proc.pid, fresh, "miss")
                    else:
                        us = per_call_us(clients["off"], off.proc.pid, fresh, "bypass")
                    figures[side].append(us)
                ratios.append(figures["miss_on"][-1] / figures["miss_off"][-1])
            for client in clients.values():
                client.close()
        finally:
            on.stop()
            off.stop()
    medians = {side: statistics.median(values) for side, values in figures.items()}
    return {
        "medians": medians,
        "rounds": figures,
        "hit_over_miss": medians["hit"] / medians["miss_on"],
        "added": statistics.median(ratios) - 1,
        "ratios": ratios,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    started = time.monotonic()
    result = run(args.rounds, args.calls)
    medians = result["medians"]
    assert isinstance(medians, dict)
    print(f"CPU per call (µs, median of {args.rounds} rounds of {args.calls} calls):")
    for side in SIDES:
        print(f"  {side:9} {medians[side]:8.0f}")
    print(f"hit ÷ miss: {result['hit_over_miss']:.2f}")
    print(f"added CPU of a miss, cache on vs off: {result['added'] * 100:+.1f} %")
    ratios = result["ratios"]
    assert isinstance(ratios, list)
    print("rounds (miss on ÷ miss off): " + ", ".join(f"{r:.3f}" for r in ratios))
    print(f"runtime: {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
