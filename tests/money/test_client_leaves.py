"""A client that leaves a non-streamed call mid-way (issue 29, point 3).

One ``python -m gateway serve`` process (tests/support/procs.py) on a SQLite file, logging JSON;
a live key calls the fake upstream (gateway/fakes/fake_upstream.py), which holds the call
(``[[fault hold]]``) and counts a held call whose connection the gateway closed
(``abandoned``). The client is a raw socket, closed once the upstream holds the call.

- With an Idempotency-Key the call runs on to its end: one provider call, billed on its
  usage, its answer stored; a retry while it runs is the 409 in progress, a retry once
  it is done replays the original answer.
- Without one the upstream call is cut, and the record says the client left (cancelled,
  499, ``client_closed``), settled by the spec's row "anything else without reported
  usage": the full reservation counts against the caps, nothing is billed.
"""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio

from gateway.fakes.fake_upstream import WORDS, FakeUpstream
from tests.conftest import db_for
from tests.money.test_durable_money import chat_body, live_key, nanos, start
from tests.support.procs import Server
from tests.support.waiting import until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(60)]

CHAT = "/v1/chat/completions"
#: how long a call must still be running after its client left. Time is the subject
#: here: the gateway learns of the close within milliseconds (its server reads the
#: socket while the handler runs), and nothing outside it changes when it does not cut.
STILL_RUNNING_S = 1.0


async def json_server(tmp_path: Path, upstream: FakeUpstream) -> Server:
    return await start(tmp_path, upstream, SVC_SERVER_LOG_FORMAT="json")


async def leave_mid_call(
    server: Server, token: str, body: dict[str, Any], upstream: FakeUpstream, idem: str = ""
) -> None:
    """POST ``body`` on a raw connection and close it once the upstream holds the call."""
    payload = orjson.dumps(body)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
    )
    if idem:
        head += f"Idempotency-Key: {idem}\r\n"
    calls = upstream.calls
    sock = await trio.open_tcp_stream("127.0.0.1", server.port)
    try:
        await sock.send_all(f"{head}\r\n".encode() + payload)
        await upstream.received(calls + 1)
    finally:
        await sock.aclose()


async def post(
    server: Server, token: str, body: dict[str, Any], idem: str | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"}
    if idem is not None:
        headers["Idempotency-Key"] = idem
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=10) as client:
        return await client.post(CHAT, json=body)


async def get(server: Server, token: str, path: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers) as client:
        response = await client.get(path)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def retry_while_held(
    server: Server, token: str, body: dict[str, Any], idem: str, upstream: FakeUpstream
) -> httpx.Response:
    """A retry while the original call is held upstream: its answer. A retry that
    reaches the upstream itself (a second provider call for one key) fails the test
    at once instead of waiting on the hold."""
    got: list[httpx.Response] = []

    async def send() -> None:
        got.append(await post(server, token, body, idem))
        upstream._notify()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await upstream.wait_until(lambda: bool(got) or upstream.calls > 1)
        nursery.cancel_scope.cancel()
    assert upstream.calls == 1, "the retry called the upstream: two provider calls, one key"
    return got[0]


async def settled_record(server: Server, token: str, request_id: str) -> dict[str, Any]:
    """The call's record once it is no longer pending (bounded)."""

    async def settled() -> dict[str, Any] | None:
        record = await get(server, token, f"/v1/requests/{request_id}")
        return record if record["status"] != "pending" else None

    return await until(settled, within=10)


def only_request_id(tmp_path: Path) -> str:
    """The id of the one request record of the test's database (read-only: the server
    holds it). Its pending row is written before the provider is asked."""
    uri = f"file:{db_for(tmp_path, 'g.db')}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True)) as conn:
        (row,) = conn.execute("SELECT id FROM requests").fetchall()
    return str(row[0])


def error_code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def test_an_idempotent_call_runs_on_when_its_client_leaves(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = await json_server(tmp_path, upstream)
    try:
        token = await live_key(server, usd_day=1.0)
        body = chat_body("c1001", "hold", stream=False)
        with trio.fail_after(30):
            await leave_mid_call(server, token, body, upstream, idem="leave-1")
            # retried at once: the original is still running
            first = await retry_while_held(server, token, body, "leave-1", upstream)
            assert first.status_code == 409, first.text
            assert error_code(first) == "idempotency_conflict"
            named = re.search(r"request (req_\w+)", first.json()["error"]["message"])
            assert named is not None, first.text
            original = named.group(1)
            # a while later it still runs: the gateway did not cut the upstream call
            with trio.move_on_after(STILL_RUNNING_S):
                await upstream.wait_until(lambda: upstream.abandoned > 0)
            assert upstream.abandoned == 0, "the call was cut when its client left"
            later = await retry_while_held(server, token, body, "leave-1", upstream)
            assert later.status_code == 409, later.text
            assert error_code(later) == "idempotency_conflict"

            upstream.release.set()
            record = await settled_record(server, token, original)
            replay = await post(server, token, body, "leave-1")
            again = await post(server, token, body, "leave-1")
        assert replay.status_code == 200, replay.text
        assert replay.headers["X-Request-Id"] == original
        assert replay.json()["svc"]["request_id"] == original
        assert replay.json()["choices"][0]["message"]["content"].split()[0] == WORDS[0]
        assert again.json() == replay.json()
        assert again.headers["X-Request-Id"] == original
        assert upstream.calls == upstream.served == 1
        # one record, succeeded and billed on the usage the provider reported
        assert record["status"] == "succeeded", record
        assert record["usage"] is not None, record
        cost = record["cost"]
        assert 0 < cost["billed_usd"] == cost["settled_usd"] < cost["reserved_usd"], cost
        usage = await get(server, token, "/v1/usage")
        credits = await get(server, token, "/v1/credits")
        key = await get(server, token, "/v1/key")
        assert usage["totals"]["requests"] == 1, usage["totals"]
        assert nanos(credits["used_usd"]) == nanos(cost["billed_usd"]), credits
        assert nanos(key["usage"]["day"]["spent_usd"]) == nanos(cost["settled_usd"])
    finally:
        upstream.release.set()
        await trio.to_thread.run_sync(server.stop)


async def test_a_call_without_a_key_is_cut_and_recorded_as_the_client_leaving(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = await json_server(tmp_path, upstream)
    try:
        token = await live_key(server, usd_day=1.0)
        credits_before = await get(server, token, "/v1/credits")
        with trio.fail_after(20):
            await leave_mid_call(server, token, chat_body("c2001", "hold", stream=False), upstream)
            request_id = only_request_id(tmp_path)
            await upstream.wait_until(lambda: upstream.abandoned == 1)  # the call was cut
            record = await settled_record(server, token, request_id)
        assert upstream.calls == 1 and upstream.served == 0
        assert (record["status"], record["http_status"]) == ("cancelled", 499), record
        assert record["error"] == {"code": "client_closed"}, record
        assert record["usage"] is None, record
        # anything else without reported usage: the full reservation, nothing billed
        cost = record["cost"]
        assert cost["settled_usd"] == cost["reserved_usd"] == cost["estimated_usd"] > 0, cost
        assert cost["billed_usd"] == 0, cost
        credits = await get(server, token, "/v1/credits")
        assert credits["used_usd"] == credits_before["used_usd"], (credits_before, credits)
        assert credits["balance_usd"] == credits_before["balance_usd"]
        assert credits["reserved_usd"] == 0, credits
        day = (await get(server, token, "/v1/key"))["usage"]["day"]
        assert nanos(day["spent_usd"]) == nanos(cost["settled_usd"]), day
        assert day["reserved_usd"] == 0, day
    finally:
        upstream.release.set()
        await trio.to_thread.run_sync(server.stop)


async def test_the_log_line_of_a_call_whose_client_left_names_it(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    server = await json_server(tmp_path, upstream)
    try:
        token = await live_key(server, usd_day=1.0)
        key = await get(server, token, "/v1/key")
        with trio.fail_after(20):
            await leave_mid_call(server, token, chat_body("c3001", "hold", stream=False), upstream)
            request_id = only_request_id(tmp_path)
            lines = await until(lambda: chat_lines(server), within=20)  # once it settled
    finally:
        upstream.release.set()
        await trio.to_thread.run_sync(server.stop)
    assert len(lines) == 1, lines
    (line,) = lines
    assert (line["status"], line["code"]) == (499, "client_closed"), line
    assert line["request_id"] == request_id, line
    assert (line["key_id"], line["org_id"]) == (key["id"], key["org_id"]), line
    assert line["model"] == "live-chat" and line["stream"] is False, line


def chat_lines(server: Server) -> list[dict[str, Any]]:
    """The ``request`` lines of chat completions the server has logged so far."""
    log = server.stderr()
    found = []
    for text in log[: log.rfind("\n") + 1].splitlines():  # whole lines only
        if not text.strip():
            continue
        line = json.loads(text)
        if line.get("event") == "request" and line.get("path") == CHAT:
            found.append(line)
    return found
