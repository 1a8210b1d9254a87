"""Benchmark of ``POST /mcp`` (issue 44): CPU per ``tools/call`` through the gateway
against the same call made directly to the upstream MCP server.

Run it from a clone::

    python bench/mcp_tools.py [--calls 400] [--rounds 4]

Two processes: an upstream MCP server built with the official SDK (``MCPServer``, its
Streamable HTTP app under uvicorn, a ``lookup`` tool priced 0.001 USD in the gateway), and
``svc-gateway serve`` (one worker, SQLite) fronting it. One caller on a kept-alive
connection sends 2026-07-28 ``tools/call`` requests (one POST each, no session), in rounds
that alternate: ``--calls`` straight to the upstream, then as many through the gateway
with a live key (admitted, reserved, recorded, settled, billed). Per round, from the
kernel's CPU clock of each process (``/proc/PID/stat``): the upstream's CPU per direct
call, the gateway's own CPU per call, and the upstream's per call when the gateway
asked; the ratio is the gateway's CPU per call over the upstream's per direct call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
ADMIN = "bench-admin"
UPSTREAM = """
import sys
from mcp.server.mcpserver import MCPServer
server = MCPServer("search")

@server.tool()
def lookup(query: str) -> str:
    \"\"\"Look a query up.\"\"\"
    return "results for " + query

server.run(transport="streamable-http", port=int(sys.argv[1]))
"""
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_up(url: str) -> None:
    for _ in range(300):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def call(client: httpx.Client, path: str, name: str) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": {"query": "trio"}, "_meta": META},
    }
    headers = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": name}
    answer = client.post(path, json=body, headers=headers)
    result = answer.json().get("result")
    if answer.status_code != 200 or result is None or result.get("isError"):
        raise SystemExit(f"{path} {name}: {answer.status_code} {answer.text[:300]}")


def run(calls: int, rounds: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-mcp-"))
    up_port, gw_port = free_port(), free_port()
    upstream = subprocess.Popen(
        [sys.executable, "-c", UPSTREAM, str(up_port)], stderr=subprocess.DEVNULL
    )
    config = work / "gateway.toml"
    config.write_text(
        f'[server]\nport = {gw_port}\nlog_level = "warning"\n\n[[mcp_servers]]\nname = "search"\n'
        f'url = "http://127.0.0.1:{up_port}/mcp"\nusd_per_call = 0.001\n'
    )
    env = {**os.environ, "SVC_ADMIN_TOKEN": ADMIN}
    gateway = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(config),
            "--db",
            str(work / "g.db"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        gw_url, up_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{up_port}"
        wait_up(gw_url + "/healthz")
        wait_up(up_url + "/mcp")
        admin = {"Authorization": f"Bearer {ADMIN}"}
        with httpx.Client(base_url=gw_url, headers=admin, timeout=10) as client:
            org = client.post("/admin/orgs", json={"name": "bench"}).json()["id"]
            client.post(f"/admin/orgs/{org}/credits", json={"add_usd": 1000})
            caps = {"rpm": 1_000_000, "max_in_flight": 100}
            made = client.post(
                "/admin/keys", json={"org_id": org, "name": "b", "mode": "live", "caps": caps}
            ).json()
        direct = httpx.Client(base_url=up_url, timeout=10)
        via = httpx.Client(
            base_url=gw_url, timeout=10, headers={"Authorization": f"Bearer {made['token']}"}
        )
        for _ in range(50):  # warm both paths (the gateway's upstream session, caches)
            call(direct, "/mcp", "lookup")
            call(via, "/mcp", "search__lookup")
        rows = []
        for n in range(rounds):
            sides = ["direct", "gateway"] if n % 2 == 0 else ["gateway", "direct"]
            got: dict[str, tuple[float, float, float]] = {}
            for side in sides:
                up0, gw0, t0 = cpu_s(upstream.pid), cpu_s(gateway.pid), time.perf_counter()
                for _ in range(calls):
                    if side == "direct":
                        call(direct, "/mcp", "lookup")
                    else:
                        call(via, "/mcp", "search__lookup")
                took = time.perf_counter() - t0
                up_ms = (cpu_s(upstream.pid) - up0) * 1000 / calls
                gw_ms = (cpu_s(gateway.pid) - gw0) * 1000 / calls
                got[side] = (up_ms, gw_ms, took * 1000 / calls)
            ratio = got["gateway"][1] / got["direct"][0]
            rows.append((got, ratio))
            print(
                f"round {n + 1} ({' then '.join(sides)}): upstream per direct call"
                f" {got['direct'][0]:.2f} ms CPU ({got['direct'][2]:.2f} ms wall);"
                f" gateway per call {got['gateway'][1]:.2f} ms CPU, upstream behind it"
                f" {got['gateway'][0]:.2f} ms ({got['gateway'][2]:.2f} ms wall);"
                f" ratio {ratio:.2f}",
                flush=True,
            )
        ratios = [ratio for _, ratio in rows]
        print(
            f"median ratio (gateway CPU / upstream CPU per call): {statistics.median(ratios):.2f}"
        )
    finally:
        gateway.terminate()
        upstream.terminate()
        gateway.wait(10)
        upstream.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    run(args.calls, args.rounds)


if __name__ == "__main__":
    main()
