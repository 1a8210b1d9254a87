"""W3C traceparent: kept or started, sent to the provider, in the request record."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.fakes.fake_upstream import FakeUpstream
from gateway.observe.tracing import from_headers
from tests.calls.test_live_settlement import UPSTREAM_KEY, body_for, live_config
from tests.conftest import Gateway, start_gateway

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
VALID = f"00-{TRACE}-{PARENT}-01"
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "garbage",
        f"00-{TRACE.upper()}-{PARENT}-01",  # upper-case hex is not allowed
        f"00-{'0' * 32}-{PARENT}-01",  # all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # all-zero parent id
        f"ff-{TRACE}-{PARENT}-01",  # version ff is invalid
        f"00-{TRACE}-{PARENT}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE}-{PARENT}",
    ],
)
def test_an_absent_or_malformed_traceparent_starts_a_new_trace(header: str | None) -> None:
    trace = from_headers(header, "vendor=x")
    assert trace.trace_id != TRACE and re.fullmatch(r"[0-9a-f]{32}", trace.trace_id)
    assert trace.flags == "00"
    assert trace.tracestate is None  # never kept without a valid traceparent
    assert TRACEPARENT.fullmatch(trace.traceparent())


@pytest.mark.parametrize(
    ("header", "flags"),
    [
        (VALID, "01"),
        (f" {VALID} ", "01"),
        (f"00-{TRACE}-{PARENT}-00", "00"),
        (f"01-{TRACE}-{PARENT}-01-a-future-field", "01"),  # a later version: its first four
    ],
)
def test_a_valid_traceparent_keeps_its_trace_with_a_new_parent(header: str, flags: str) -> None:
    trace = from_headers(header, "vendor=x")
    assert (trace.trace_id, trace.flags, trace.tracestate) == (TRACE, flags, "vendor=x")
    assert trace.span_id != PARENT
    assert trace.traceparent() == f"00-{TRACE}-{trace.span_id}-{flags}"


@pytest.fixture
async def live(
    nursery: trio.Nursery, tmp_path: Path, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    monkeypatch.setenv("FAKE_UPSTREAM_KEY", UPSTREAM_KEY)
    gw = await start_gateway(nursery, live_config(tmp_path, upstream))
    key = await gw.create_key(name="live", mode="live")
    yield gw, key["token"]
    gw.stop.set()


async def record(gw: Gateway, token: str, request_id: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        response = await client.get(f"/v1/requests/{request_id}")
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("stream", [False, True])
async def test_the_trace_reaches_the_provider_and_the_record(
    live: tuple[Gateway, str], upstream: FakeUpstream, stream: bool
) -> None:
    gw, token = live
    headers = {"traceparent": VALID, "tracestate": "congo=t61rcWkgMzE"}
    async with gw.client(token) as client:
        response = await client.post(
            "/v1/chat/completions", json=body_for("hi", stream=stream), headers=headers
        )
    assert response.status_code == 200, response.text
    sent = upstream.headers[-1]
    match = TRACEPARENT.fullmatch(sent["traceparent"])
    assert match is not None
    assert match.group(1) == TRACE and match.group(2) != PARENT and match.group(3) == "01"
    assert sent["tracestate"] == "congo=t61rcWkgMzE"
    row = await record(gw, token, response.headers["X-Request-Id"])
    assert row["trace_id"] == TRACE


async def test_without_a_traceparent_a_new_trace_is_sent_and_recorded(
    live: tuple[Gateway, str], upstream: FakeUpstream
) -> None:
    gw, token = live
    ids = []
    for header in ({}, {"traceparent": "00-nonsense"}):
        async with gw.client(token) as client:
            response = await client.post(
                "/v1/embeddings", json={"model": "live-embed", "input": "x"}, headers=header
            )
        assert response.status_code == 200, response.text
        match = TRACEPARENT.fullmatch(upstream.headers[-1]["traceparent"])
        assert match is not None and match.group(3) == "00"
        assert "tracestate" not in upstream.headers[-1]
        row = await record(gw, token, response.headers["X-Request-Id"])
        assert row["trace_id"] == match.group(1)
        ids.append(row["trace_id"])
    assert len(set(ids)) == 2
