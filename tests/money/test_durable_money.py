"""Durable money against real processes (DESIGN.md "Durable money").

The gateway runs as ``python -m gateway serve`` (tests/support/procs.py) on a real SQLite file,
live keys call the fake upstream (gateway/fakes/fake_upstream.py, a real server in this test's
trio loop), and the process is killed with SIGKILL mid-load, then restarted on the same
file; or stopped with SIGTERM while streams are open. Every wait is on an event of the
fake upstream or of the clients, bounded by ``trio.fail_after``.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import db_for, query_db, start_gateway
from tests.support.procs import ADMIN_TOKEN, Server, base_env, start_server

MAX_TOKENS = 50
OUT_PRICE = 15.0  # USD per million output tokens; input is free
#: the worst case of every call: the output ceiling at the output price, in nano-USD
WORST_CASE = MAX_TOKENS * round(OUT_PRICE * 1000)
#: the daily cap of the killed key admits exactly this many worst-case calls
K = 6
CLIENTS = 4
CONFIG = """
[server]
request_timeout_s = 30

[[providers]]
name = "upstream"
kind = "openai"
base_url = "{url}"
api_key_env = "FAKE_UPSTREAM_KEY"

[[models]]
id = "live-chat"
provider = "upstream"
upstream_id = "up-chat"
input_usd_per_mtok = 0.0
output_usd_per_mtok = {price}
"""
MARKER = re.compile(r"\bcall (c\d{4})\b")

pytestmark = [pytest.mark.processes, pytest.mark.both_stores, pytest.mark.timeout(120)]


def nanos(usd: float) -> int:
    return round(usd * 1_000_000_000)


async def start(tmp_path: Path, upstream: FakeUpstream, **env: str) -> Server:
    config = tmp_path / "gateway.toml"
    config.write_text(CONFIG.format(url=upstream.url, price=OUT_PRICE))
    run = partial(
        start_server,
        tmp_path,
        "--config",
        str(config),
        db=db_for(tmp_path, "g.db"),
        # on PostgreSQL every start is the same node with a short lease: a restart after
        # SIGKILL waits the dead registration out, then recovers its rows before serving
        env=base_env(
            FAKE_UPSTREAM_KEY="sk-upstream",
            SVC_CLUSTER_NODE_ID="durable",
            SVC_CLUSTER_LEASE_S="2",
            **env,
        ),
    )
    return await trio.to_thread.run_sync(run)


async def kill(server: Server) -> None:
    await trio.to_thread.run_sync(server.kill)


async def live_key(server: Server, **caps: float) -> str:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    async with httpx.AsyncClient(base_url=server.url, headers=admin) as client:
        # a config file starts with no demo organisation: the operator makes one
        org = await client.post("/admin/orgs", json={"name": "acme", "credits_usd": 100})
        assert org.status_code == 201, org.text
        org_id = org.json()["id"]
        body = {
            "org_id": org_id,
            "name": "live",
            "mode": "live",
            "scopes": ["inference", "usage:read"],
            "caps": caps,
        }
        made = await client.post("/admin/keys", json=body)
        assert made.status_code == 201, made.text
        return str(made.json()["token"])


def chat_body(marker: str, faults: str, *, stream: bool) -> dict[str, Any]:
    content = f"call {marker} [[fault {faults}]]"
    return {
        "model": "live-chat",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": MAX_TOKENS,
        "stream": stream,
    }


def received_markers(upstream: FakeUpstream) -> list[str]:
    found = []
    for body in upstream.bodies:
        for message in body.get("messages") or []:
            if match := MARKER.search(str(message.get("content"))):
                found.append(match.group(1))
    return found


async def check_books(server: Server, token: str, upstream: FakeUpstream) -> int:
    """The invariants after a restart, with nothing in flight; returns the settled total."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
        usage = (await client.get("/v1/usage", params={"group_by": "tag:call"})).json()
        key = (await client.get("/v1/key")).json()
        credits = (await client.get("/v1/credits")).json()
    settled = nanos(usage["totals"]["settled_usd"])
    day = key["usage"]["day"]
    # what the records settled == what the key's day window holds == what its cap counts
    assert settled == nanos(day["spent_usd"]), (usage["totals"], day)
    assert nanos(day["limit_usd"]) - settled == nanos(day["remaining_usd"]), day
    assert day["reserved_usd"] == 0, day
    # credits moved == what was billed
    assert nanos(credits["used_usd"]) == nanos(usage["totals"]["cost_usd"]), credits
    assert credits["reserved_usd"] == 0, credits
    # every call the upstream received has a record (one record per call)
    records = {row["group"]: row["requests"] for row in usage["data"]}
    received = received_markers(upstream)
    assert len(received) == len(set(received))
    missing = set(received) - set(records)
    assert not missing, f"calls served upstream without a record: {sorted(missing)}"
    assert all(count == 1 for count in records.values()), records
    return settled


def calls_reached(upstream: FakeUpstream, count: int) -> bool:
    return upstream.calls >= count


async def first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return as soon as one of ``waits`` returns."""
    async with trio.open_nursery() as race:
        for wait in waits:

            async def run(wait: Callable[[], Awaitable[object]] = wait) -> None:
                await wait()
                race.cancel_scope.cancel()

            race.start_soon(run)


async def steady_client(
    server: Server, token: str, client_no: int, round_no: int, refused: trio.Event
) -> None:
    """Calls one after another, streamed and not in turn, until refused or cut off."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as client:
        for n in range(100):
            marker = f"c{round_no}{client_no}{n:02d}"
            stream = n % 2 == 0
            faults = "chunk_delay=0.05" if stream else "delay=0.2"
            body = chat_body(marker, faults, stream=stream)
            tagged = {"X-Svc-Tags": f"call={marker}"}
            try:
                async with client.stream(
                    "POST", "/v1/chat/completions", json=body, headers=tagged
                ) as response:
                    await response.aread()
            except httpx.TransportError:
                return  # the gateway was killed
            if response.status_code != 200:
                assert response.status_code in (402, 429), response.text
                refused.set()
                return


async def test_kill_9_under_load_five_times_keeps_the_books(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    cap = K * WORST_CASE
    server = await start(tmp_path, upstream)
    token = await live_key(server, usd_day=cap / 1e9)
    settled_totals = []
    for round_no in range(5):
        refused = trio.Event()
        enough = upstream.calls + CLIENTS
        with trio.fail_after(20):
            async with trio.open_nursery() as clients:
                for client_no in range(CLIENTS):
                    clients.start_soon(steady_client, server, token, client_no, round_no, refused)
                # kill mid-way: calls have reached the upstream and some are in flight,
                # or the cap refuses every new call
                await first_of(
                    partial(upstream.wait_until, partial(calls_reached, upstream, enough)),
                    refused.wait,
                )
                await kill(server)
        server = await start(tmp_path, upstream)
        settled = await check_books(server, token, upstream)
        assert settled <= cap, f"round {round_no}: settled {settled} > cap {cap}"
        settled_totals.append(settled)
    await trio.to_thread.run_sync(server.stop)
    # the kills did cost: calls cut in flight counted their full reservation
    assert settled_totals[-1] > 0
    assert len(set(received_markers(upstream))) >= CLIENTS


async def test_an_idempotent_call_cut_by_a_crash_is_not_called_twice(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = await start(tmp_path, upstream)
    token = await live_key(server, usd_day=1.0)
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "crash-1"}
    headers["X-Svc-Tags"] = "call=c9000"
    body = chat_body("c9000", "hold", stream=False)

    async def original() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            with pytest.raises(httpx.TransportError):
                await client.post("/v1/chat/completions", json=body)

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(original)
            await upstream.wait_until(lambda: upstream.calls == 1)
            await kill(server)
    server = await start(tmp_path, upstream)
    try:
        async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
            retry = await client.post("/v1/chat/completions", json=body)
            assert retry.status_code == 409, retry.text
            error = retry.json()["error"]
            assert error["code"] == "idempotency_conflict"
            original_id = re.search(r"request (req_\w+)", error["message"])
            assert original_id is not None, error
            record = (await client.get(f"/v1/requests/{original_id.group(1)}")).json()
        assert record["status"] == "interrupted"
        assert record["error"] == {"code": "service_unavailable"}
        assert record["cost"]["settled_usd"] == record["cost"]["reserved_usd"] > 0
        assert record["cost"]["billed_usd"] == 0
        assert upstream.calls == 1  # never a second provider call
        await check_books(server, token, upstream)
    finally:
        await trio.to_thread.run_sync(server.stop)


def sse_data(raw: bytes) -> list[Any]:
    """The ``data:`` payloads of an event stream, ``[DONE]`` as the string."""
    out: list[Any] = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else orjson.loads(payload))
    return out


async def test_sigterm_ends_open_streams_in_band_and_leaves_nothing_pending(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = await start(tmp_path, upstream, SVC_SERVER_SHUTDOWN_GRACE_S="1.5")
    token = await live_key(server, usd_day=1.0)
    headers = {"Authorization": f"Bearer {token}"}
    answers: dict[str, tuple[int, bytes]] = {}

    async def call(name: str, path: str, body: dict[str, Any]) -> None:
        async with (
            httpx.AsyncClient(base_url=server.url, headers=headers, timeout=20) as client,
            client.stream("POST", path, json=body) as response,
        ):
            answers[name] = (response.status_code, await response.aread())

    finishing = chat_body("c8001", "chunk_delay=0.1", stream=True)  # ends within the grace
    stalled = chat_body("c8002", "stall_after=2", stream=True)  # still open at the deadline
    responses = {"model": "live-chat", "input": "call c8003 [[fault stall_after=2]]"}
    responses |= {"stream": True, "max_output_tokens": MAX_TOKENS}
    held = chat_body("c8004", "hold", stream=False)  # never answered upstream
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "finishing", "/v1/chat/completions", finishing)
            nursery.start_soon(call, "stalled", "/v1/chat/completions", stalled)
            nursery.start_soon(call, "responses", "/v1/responses", responses)
            nursery.start_soon(call, "held", "/v1/chat/completions", held)
            await upstream.wait_until(lambda: upstream.open == 4)
            server.proc.send_signal(signal.SIGTERM)
            status = await trio.to_thread.run_sync(server.proc.wait)
    await trio.to_thread.run_sync(server.stop)
    assert status == 0, server.stderr()

    code, raw = answers["finishing"]
    data = sse_data(raw)
    assert code == 200 and data[-1] == "[DONE]"
    assert not any(isinstance(item, dict) and "error" in item for item in data), data
    code, raw = answers["stalled"]
    data = sse_data(raw)
    assert code == 200 and data[-1] == "[DONE]", data
    assert data[-2]["error"]["code"] == "service_unavailable", data
    code, raw = answers["responses"]
    events = sse_data(raw)
    assert code == 200 and events[-1]["type"] == "response.failed", events
    assert events[-1]["response"]["error"]["code"] == "service_unavailable"
    code, raw = answers["held"]
    assert code == 503 and orjson.loads(raw)["error"]["code"] == "service_unavailable"

    db = db_for(tmp_path, "g.db")
    counts = query_db(db, "SELECT status, COUNT(*) AS n FROM requests GROUP BY status")
    rows = {row["status"]: row["n"] for row in counts}
    cut = query_db(
        db,
        "SELECT status, error_code, http_status FROM requests WHERE stream = 1"
        " AND error_code IS NOT NULL",
    )
    assert "pending" not in rows, rows
    assert rows == {"succeeded": 1, "failed": 3}, rows
    assert [tuple(row.values()) for row in cut] == [("failed", "service_unavailable", 200)] * 2


async def test_a_call_in_flight_reads_as_pending_until_settled(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: the pending row as the reads show it, then its settlement over it."""
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, live_config(tmp_path, upstream))
    made = await gw.create_key(name="live", mode="live", scopes=["inference", "usage:read"])
    body = {**body_for("call c7001 [[fault stall_after=1]]"), "stream": True}
    with trio.fail_after(10):
        async with (
            gw.client(made["token"]) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            request_id = response.headers["X-Request-Id"]
            record = (await client.get(f"/v1/requests/{request_id}")).json()
            usage = (await client.get("/v1/usage")).json()
            key = (await client.get("/v1/key")).json()
        assert record["status"] == "pending" and record["http_status"] is None, record
        assert record["cost"]["reserved_usd"] > 0 and record["cost"]["settled_usd"] == 0
        assert usage["totals"]["requests"] == 0  # counted once settled
        assert key["usage"]["day"]["reserved_usd"] == record["cost"]["reserved_usd"]
        # the client left: the pump settles over the same row
        await gw.runtime.inflight.wait_settled()
        async with gw.client(made["token"]) as client:
            record = (await client.get(f"/v1/requests/{request_id}")).json()
            usage = (await client.get("/v1/usage")).json()
    assert record["status"] == "cancelled", record
    assert record["cost"]["settled_usd"] == record["cost"]["reserved_usd"]
    assert usage["totals"]["requests"] == 1
    gw.stop.set()
