"""Benchmark of several nodes on one PostgreSQL: one node against three, lease refills,
and how close to a daily cap a key spends when its traffic is spread over the nodes.

Run it from a clone, no install needed (PostgreSQL 15's binaries must be on the machine)::

    python bench/cluster.py            # prints a table, updates bench/RESULTS.md
    python bench/cluster.py --no-write # prints only

One run: the fake upstream of the tests (answers at once), a throwaway PostgreSQL cluster
(default durability), then

- one ``svc-gateway serve`` node, then three on one database: live calls, 16 at once,
  round-robin over the nodes, after a warm-up (leases warm): calls/s, the CPU each call
  costs the gateway processes (all nodes together) and the database server;
- the database side of one lease refill (``gateway/store/node_leases.py``'s ``refill`` in its
  own transaction, as a node runs it), one at a time on one connection;
- a key with a daily cap of 100 worst-case calls, called 16 at once round-robin over the
  three nodes until every node refuses: what it spent, as a share of the cap.

Short: about a minute on 2 cores.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live_upstream import BODY, UPSTREAM_KEY, config_toml, live_key, start_upstream  # noqa: E402
from bench.stores import cpu_s, postgres_pids, run_on_postgres  # noqa: E402
from bench.streaming import (  # noqa: E402
    ADMIN_TOKEN,
    Server,
    percentile,
    run_line,
    start_server,
)
from gateway.store import Store  # noqa: E402
from gateway.store import node_leases as ops  # noqa: E402
from shards import LeaseNeed  # noqa: E402
from tests.support.pg_cluster import Cluster  # noqa: E402

SECTION = "## Several nodes on one PostgreSQL"
CONCURRENCY = 16
CALLS_EACH = 40
REFILLS = 300
CAP_CALLS = 100
#: about the worst case of BODY: its output ceiling at the bench catalog's output price
#: (the estimated prompt at the input price adds a little)
PRICE_OUT_PER_MTOK = 0.60


async def throughput(
    urls: list[str], token: str, gateway_pids: list[int], db_pids: list[int]
) -> tuple[float, float, float]:
    """calls/s, gateway CPU ms per call (all nodes), database CPU ms per call."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    payload = orjson.dumps(BODY)
    clients = [httpx.AsyncClient(base_url=url, headers=headers, timeout=30.0) for url in urls]
    try:

        async def worker(w: int, calls: int) -> None:
            for i in range(calls):
                client = clients[(w + i) % len(clients)]
                response = await client.post("/v1/chat/completions", content=payload)
                if response.status_code != 200:
                    raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")

        async with trio.open_nursery() as nursery:  # warm-up: connections and leases
            for w in range(CONCURRENCY):
                nursery.start_soon(worker, w, 4)
        before = cpu_s(gateway_pids), cpu_s(db_pids)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(CONCURRENCY):
                nursery.start_soon(worker, w, CALLS_EACH)
        elapsed = time.perf_counter() - start
    finally:
        for client in clients:
            await client.aclose()
    done = CONCURRENCY * CALLS_EACH
    return (
        done / elapsed,
        (cpu_s(gateway_pids) - before[0]) / done * 1000,
        (cpu_s(db_pids) - before[1]) / done * 1000,
    )


async def seen_by(urls: list[str], token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    for url in urls:
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            while (await client.get("/v1/key")).status_code != 200:
                await trio.sleep(0.05)


async def capped_key(url: str, cap_usd: float) -> str:
    """A live key of a new organisation with ample credits and a daily cap."""
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=url, headers=admin) as client:
        org = await client.post("/admin/orgs", json={"name": "capped", "credits_usd": 1000})
        org.raise_for_status()
        caps = {"usd_day": cap_usd, "rpm": 10_000_000, "max_in_flight": 1000}
        body = {"org_id": org.json()["id"], "name": "capped", "mode": "live", "caps": caps}
        response = await client.post("/admin/keys", json=body)
        response.raise_for_status()
        return str(response.json()["token"])


async def spend_to_cap(urls: list[str], token: str) -> tuple[float, int]:
    """Calls until every node refuses; returns spent / cap and the calls served."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    payload = orjson.dumps(BODY)
    served = 0
    async with httpx.AsyncClient(headers=headers, timeout=30.0) as client:

        async def worker(w: int) -> None:
            nonlocal served
            refused_in_a_row = 0
            for i in range(10_000):
                url = urls[(w + i) % len(urls)]
                response = await client.post(f"{url}/v1/chat/completions", content=payload)
                if response.status_code == 200:
                    served += 1
                    refused_in_a_row = 0
                elif response.status_code == 402:
                    refused_in_a_row += 1
                    if refused_in_a_row >= 3 * len(urls):
                        return
                else:
                    raise SystemExit(f"HTTP {response.status_code}: {response.text[:300]}")

        async with trio.open_nursery() as nursery:
            for w in range(CONCURRENCY):
                nursery.start_soon(worker, w)
        day = (await client.get(f"{urls[0]}/v1/key")).json()["usage"]["day"]
    return day["spent_usd"] / day["limit_usd"], served


def refill_ms(db: str) -> tuple[float, float]:
    """The median time of one refill transaction (a new limit each time)."""
    store = Store(db)
    try:
        epoch = store.call(ops.register, "bench-node", 30.0).epoch
        times = []
        for i in range(REFILLS):
            need = LeaseNeed("d", f"key_{i}", 20_000, 1_000, 1_000_000)
            start = time.perf_counter()
            store.call(ops.refill, "bench-node", epoch, need)
            times.append((time.perf_counter() - start) * 1000)
    finally:
        store.close()
    return statistics.median(times), percentile(times, 0.99)


async def measure(cluster: Cluster) -> dict[str, object]:
    upstream, upstream_url = await trio.to_thread.run_sync(start_upstream)
    figures: dict[str, object] = {}
    try:
        for n_nodes in (1, 3):
            name = f"bench_nodes_{n_nodes}"
            await trio.to_thread.run_sync(cluster.psql, f"CREATE DATABASE {name}")
            with tempfile.TemporaryDirectory(prefix="svc-bench-") as tmp:
                servers: list[Server] = []
                try:
                    for n in range(n_nodes):
                        work = Path(tmp) / f"n{n}"
                        work.mkdir()
                        config = work / "gateway.toml"
                        config.write_text(config_toml(upstream_url))
                        args = ("--config", str(config), "--db", cluster.url(name))
                        env = {"BENCH_UPSTREAM_KEY": UPSTREAM_KEY, "SVC_CLUSTER_NODE_ID": f"n{n}"}
                        servers.append(
                            await trio.to_thread.run_sync(
                                lambda work=work, args=args, env=env: start_server(work, args, env)
                            )
                        )
                    urls = [server.url for server in servers]
                    token = await live_key(urls[0])
                    await seen_by(urls, token)
                    pids = [server.proc.pid for server in servers]
                    figures[f"nodes_{n_nodes}"] = await throughput(
                        urls, token, pids, postgres_pids(cluster)
                    )
                    if n_nodes == 3:
                        worst = BODY["max_tokens"] * PRICE_OUT_PER_MTOK / 1e6
                        capped = await capped_key(urls[0], CAP_CALLS * worst)
                        await seen_by(urls, capped)
                        figures["cap"] = await spend_to_cap(urls, capped)
                finally:
                    for server in servers:
                        await trio.to_thread.run_sync(server.stop)
        await trio.to_thread.run_sync(cluster.psql, "CREATE DATABASE bench_refill")
        figures["refill"] = await trio.to_thread.run_sync(refill_ms, cluster.url("bench_refill"))
    finally:
        upstream.kill()
        upstream.wait(timeout=5)
    return figures


def report(figures: dict[str, object], runtime_s: float, load: tuple[float, float]) -> str:
    one, three = figures["nodes_1"], figures["nodes_3"]
    refill_median, refill_p99 = figures["refill"]  # type: ignore[misc]
    share, served = figures["cap"]  # type: ignore[misc]
    assert isinstance(one, tuple) and isinstance(three, tuple)
    return "\n".join(
        [
            SECTION,
            "",
            "| measure | one node | three nodes |",
            "|---|---|---|",
            f"| live calls/s, {CONCURRENCY} at once (round-robin) | {one[0]:,.0f} | "
            f"{three[0]:,.0f} |",
            f"| gateway CPU per call, all nodes (ms) | {one[1]:.2f} | {three[1]:.2f} |",
            f"| database server CPU per call (ms) | {one[2]:.2f} | {three[2]:.2f} |",
            "",
            f"- A lease refill (one transaction: the node's check, an advisory lock, the "
            f"headroom in one statement, the lease upsert), one at a time: median "
            f"{refill_median:.2f} ms, p99 {refill_p99:.2f} ms.",
            f"- A daily cap of {CAP_CALLS} worst-case calls, {CONCURRENCY} clients "
            f"round-robin over three nodes until every node refuses: {served} calls served, "
            f"{share:.1%} of the cap spent (the rest: headroom that cannot cover one more "
            "worst case, and what calls settled below their reservation left).",
            "",
            run_line("python bench/cluster.py", runtime_s, load),
            "",
            "The fake upstream answers at once; PostgreSQL 15 is a throwaway cluster on "
            "loopback with its default durability. Every node, the client, the upstream and "
            "the database share the machine's 2 cores, so three nodes cannot be faster than "
            "one here: the table shows what several nodes cost (CPU per call, the database's "
            "share), not the scaling they buy on separate machines. With warm leases a call "
            "makes no more database round trips than on one server (its pending row and "
            "its settlement, the lease's share riding in the settlement's transaction); a "
            "refill runs when a lease runs dry: for a key's rpm and slots once per minute "
            "per node, for spend every share of the headroom.",
            "",
        ]
    )


if __name__ == "__main__":
    run_on_postgres(__doc__, measure, report)
