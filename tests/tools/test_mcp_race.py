"""A priced tool raced against a daily cap: 200 tools/call at once never pass it.

The gateway in-process on a real SQLite file; the tool is the search server's ``hang``
(priced 0.01 USD), which holds every admitted call until the race is decided, so every
admitted call is reserved (pending) at the same instant the refused ones are refused.
The books after: exactly K calls admitted, settled spend within the cap, billed equal to
the ledger's debits, no pending row.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.conftest import query_db
from tests.support.fake_mcp import SearchState
from tests.support.waiting import until
from tests.tools.test_mcp_gateway import (
    PRICE,
    live_key,
    search_config,
    tools_gateway,
)

CALLS = 200
K = 50
CAP_USD = (K + 0.5) * PRICE


def tools_call(name: str) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": meta},
    }


async def race(url: str, token: str, name: str, released: trio.Event) -> Counter[str]:
    """CALLS tools/call at once; the outcome of each: ok, or the refusal's code."""
    outcomes: Counter[str] = Counter()
    headers = {
        "Authorization": f"Bearer {token}",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": name,
    }
    limits = httpx.Limits(max_connections=CALLS)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=30, limits=limits
    ) as client:

        async def one() -> None:
            answer = (await client.post("/mcp", json=tools_call(name))).json()
            if "result" in answer:
                outcomes["error result" if answer["result"].get("isError") else "ok"] += 1
            else:
                outcomes[answer["error"]["data"]["code"]] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(CALLS):
                nursery.start_soon(one)
            await released.wait()
    return outcomes


async def test_200_calls_of_a_priced_tool_never_pass_a_daily_cap(
    nursery: trio.Nursery, tmp_path: Path, search: tuple[SearchState, str]
) -> None:
    state, url = search
    gw = await tools_gateway(nursery, tmp_path, search_config(url, timeout_s=30.0))
    token = await live_key(gw, caps={"usd_day": CAP_USD, "rpm": 1000, "max_in_flight": 1000})
    released = trio.Event()

    async def release_once_decided() -> None:
        # every admitted call is at the upstream before any is answered
        await until(lambda: state.calls.get("hang", 0) == K, within=20)
        state.release.set()
        released.set()

    nursery.start_soon(release_once_decided)
    with trio.fail_after(30):
        outcomes = await race(gw.url, token, "search__hang", released)
    assert outcomes == {"ok": K, "key_cap_exceeded": CALLS - K}
    assert state.calls["hang"] == K
    await gw.aclose()
    db = gw.runtime.config.server.db
    (books,) = query_db(
        db,
        "SELECT COUNT(*) AS calls, SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END) AS pending,"
        " SUM(settled_usd_nanos) AS settled, SUM(billed_usd_nanos) AS billed FROM requests",
    )
    (ledger,) = query_db(
        db, "SELECT -SUM(amount_nanos) AS debited FROM credit_ledger WHERE amount_nanos < 0"
    )
    assert (books["calls"], books["pending"]) == (K, 0)
    assert books["settled"] == books["billed"] == K * PRICE * 1e9
    assert books["settled"] <= CAP_USD * 1e9
    assert ledger["debited"] == books["billed"]
