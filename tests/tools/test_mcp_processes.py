"""MCP upstreams and the gateway as processes: stdio supervision, no orphans, kill -9.

- a stdio server (tests/support/stdio_mcp_server.py, built with the SDK) is started once,
  started again when it dies (a call that kills it is an ``isError`` result), and ended
  with the gateway: after a graceful stop, and after a kill -9 of the gateway process
  (the launcher, gateway/tools/orphan_guard.py, sees its parent gone);
- a kill -9 of the gateway in the middle of a tools/call leaves the call recorded by the
  next start (``interrupted``: the price counts against the caps, nothing billed), never
  billed twice.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from gateway.config.mcp_servers import McpServerConfig
from tests.conftest import make_config, query_db, start_gateway
from tests.support.fake_mcp import SearchState, start_search
from tests.support.procs import ADMIN_TOKEN, Server, start_server
from tests.support.waiting import until
from tests.tools.test_mcp_gateway import PRICE, rpc

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]

STDIO_SERVER = str(Path(__file__).parent.parent / "support" / "stdio_mcp_server.py")
STDIO = McpServerConfig(name="local", command=(sys.executable, STDIO_SERVER), timeout_s=10.0)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stdio_pid(answer: dict[str, Any]) -> int | None:
    result = answer.get("result") or {}
    if result.get("isError"):
        return None
    return int(result["structuredContent"]["result"])


async def test_a_stdio_server_is_restarted_when_it_dies_and_ends_with_the_gateway(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    gw = await start_gateway(nursery, replace(make_config(tmp_path), mcp_servers=(STDIO,)))
    token = (await gw.create_key(mode="live"))["token"]
    call = {"name": "local__pid", "arguments": {}}
    first = stdio_pid((await rpc(gw, token, "tools/call", call)).json())
    assert first is not None and alive(first)
    crashed = (await rpc(gw, token, "tools/call", {"name": "local__crash", "arguments": {}})).json()
    assert crashed["result"]["isError"] is True
    assert "'local'" in crashed["result"]["content"][0]["text"]

    async def restarted() -> int | None:
        return stdio_pid((await rpc(gw, token, "tools/call", call)).json())

    second = await until(restarted, within=20, every=0.2)
    assert second != first and alive(second)
    await gw.aclose()
    await until(lambda: not alive(second), within=10, every=0.1)


def stdio_config(tmp_path: Path, *tables: str) -> Path:
    config = tmp_path / "gateway.toml"
    config.write_text("\n".join(tables))
    return config


STDIO_TABLE = f"""
[[mcp_servers]]
name = "local"
command = [{sys.executable!r}, {STDIO_SERVER!r}]
"""


async def admin(server: Server, path: str, **body: Any) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as client:
        response = await client.post(path, json=body)
    assert response.status_code in (200, 201), response.text
    return dict(response.json())


async def live_token(server: Server) -> str:
    """A live key of a new organisation with credits (a config file makes no demo data)."""
    org = (await admin(server, "/admin/orgs", name="acme"))["id"]
    await admin(server, f"/admin/orgs/{org}/credits", add_usd=100)
    return str((await admin(server, "/admin/keys", org_id=org, name="k", mode="live"))["token"])


async def call_on(server: Server, token: str, name: str) -> httpx.Response:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": meta},
    }
    headers = {
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
        return await client.post("/mcp", json=body)


async def test_no_stdio_server_outlives_a_kill_9_of_the_gateway(tmp_path: Path) -> None:
    config = stdio_config(tmp_path, STDIO_TABLE)
    server = await trio.to_thread.run_sync(lambda: start_server(tmp_path, "--config", str(config)))
    try:
        token = await live_token(server)
        pid = stdio_pid((await call_on(server, token, "local__pid")).json())
        assert pid is not None and alive(pid)
    finally:
        await trio.to_thread.run_sync(server.kill)  # SIGKILL
    await until(lambda: not alive(pid), within=10, every=0.1)


async def test_a_kill_9_mid_call_leaves_the_call_recorded_never_billed_twice(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    state = SearchState()
    url = await start_search(nursery, state)
    table = f'[[mcp_servers]]\nname = "search"\nurl = "{url}"\nusd_per_call = {PRICE}\n'
    config = stdio_config(tmp_path, table)
    db = tmp_path / "g.db"
    server = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path, "--config", str(config), db=db)
    )
    token = await live_token(server)

    async def hang() -> None:
        with pytest.raises(httpx.TransportError):
            await call_on(server, token, "search__hang")

    async with trio.open_nursery() as calls:
        calls.start_soon(hang)
        with trio.fail_after(20):
            await state.hanging.wait()
        await trio.to_thread.run_sync(server.kill)  # SIGKILL
    state.release.set()
    (pending,) = query_db(str(db), "SELECT status, model FROM requests")
    assert (pending["status"], pending["model"]) == ("pending", "search__hang")
    # the next start settles what the crash left, before it answers its first call
    again = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path, "--config", str(config), db=db)
    )
    assert await trio.to_thread.run_sync(again.stop) == 0
    (row,) = query_db(
        str(db), "SELECT status, settled_usd_nanos, billed_usd_nanos, error_code FROM requests"
    )
    assert row["status"] == "interrupted"
    assert (row["settled_usd_nanos"], row["billed_usd_nanos"]) == (PRICE * 1e9, 0)
    debits = query_db(str(db), "SELECT amount_nanos FROM credit_ledger WHERE amount_nanos < 0")
    assert debits == []
    assert state.calls == {"hang": 1}
