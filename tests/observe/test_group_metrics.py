"""GET /metrics under ``serve --workers 2``: every scrape is the whole group's.

One ``python -m gateway serve --workers 2`` process on a new SQLite file, its demo
sandbox key; each call and each scrape on a connection of its own, so the kernel spreads
them over both workers.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import httpx
import pytest
import trio

from tests.cluster.test_cluster import ROOMY, admin, org_id
from tests.observe.test_metrics import Samples, parse, value
from tests.support.procs import Server, start_server
from tests.support.waiting import until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(90)]

CALLS = 100
SCRAPES = 10
CHAT_OK = {"endpoint": "chat", "status": "200", "code": "ok"}
STARTED = re.compile(r"worker (\S+) started \(pid (\d+)\)")


async def sandbox_key(server: Server) -> str:
    """A sandbox key of a new organisation, with room for every call of the test."""
    made = await admin(
        server,
        "POST",
        "/admin/keys",
        org_id=await org_id(server),
        name="metrics",
        mode="sandbox",
        scopes=["inference"],
        caps=ROOMY,
    )
    return str(made["token"])


async def call(server: Server, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=20) as http:
        response = await http.post(
            "/v1/chat/completions",
            json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert response.status_code == 200, response.text


async def scrape(server: Server) -> Samples:
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as http:
        response = await http.get("/metrics")
    assert response.status_code == 200, response.text
    return parse(response.text)


def counters(samples: Samples) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of every counter and histogram (the series that never go down)."""
    return {
        key: v
        for key, v in samples.items()
        if key[0].endswith(("_total", "_count", "_sum", "_bucket"))
    }


async def test_a_hundred_calls_then_every_scrape_counts_a_hundred_and_kill_9_loses_none(
    tmp_path: Path,
) -> None:
    server = await trio.to_thread.run_sync(
        lambda: start_server(tmp_path, "--workers", "2", db=tmp_path / "g.db")
    )
    try:
        token = await sandbox_key(server)
        model = (await scrape(server)).keys()
        assert not any(name.startswith("process_") for name, _ in model)
        async with trio.open_nursery() as nursery:
            for _ in range(10):

                async def ten() -> None:
                    for _ in range(CALLS // 10):
                        await call(server, token)

                nursery.start_soon(ten)
        for _ in range(SCRAPES):
            samples = await scrape(server)
            assert value(samples, "svc_requests_total", **CHAT_OK) == CALLS
            assert value(samples, "svc_request_duration_seconds_count", endpoint="chat") == CALLS
            assert value(samples, "svc_calls_in_flight") == 0
            assert value(samples, "svc_build_info", version=_version(samples)) == 1
        before = counters(await scrape(server))
        (victim,) = [int(pid) for node, pid in STARTED.findall(server.stderr()) if node[-1] == "1"]
        os.kill(victim, signal.SIGKILL)
        await until(lambda: len(STARTED.findall(server.stderr())) > 2, within=30, every=0.1)
        for _ in range(SCRAPES):
            after = counters(await scrape(server))
            went_down = {
                k: (v, after.get(k, 0.0)) for k, v in before.items() if after.get(k, 0.0) < v
            }
            assert not went_down, went_down
            assert value(after, "svc_requests_total", **CHAT_OK) == CALLS
        await call(server, token)
        assert value(await scrape(server), "svc_requests_total", **CHAT_OK) == CALLS + 1
    finally:
        assert await trio.to_thread.run_sync(server.stop) == 0, server.stderr()


def _version(samples: Samples) -> str:
    (labels,) = [labels for name, labels in samples if name == "svc_build_info"]
    return dict(labels)["version"]
