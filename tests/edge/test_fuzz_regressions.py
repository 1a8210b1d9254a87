"""Bugs the fuzzing run found, each kept as a test of its own."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
import trio

from tests.conftest import Gateway, make_config, start_gateway


async def test_embeddings_dimensions_above_the_models_are_400_not_a_crash(
    gateway: Gateway,
) -> None:
    """dimensions = 2**40 once made the mock allocate terabytes (a 500, MemoryError)."""
    body = {"model": "text-embedding-3-small", "input": "x", "dimensions": 2**40}
    async with gateway.client(gateway.token) as client:
        response = await client.post("/v1/embeddings", json=body)
        served = await client.post("/v1/embeddings", json={**body, "dimensions": 1536})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "dimensions")
    assert served.status_code == 200, served.text


MALFORMED_SCHEMAS = [
    {"type": "array", "minItems": "many"},
    {"type": "array", "minItems": 2**40, "maxItems": 2**41},
    {"type": "string", "minLength": 2**40},
    {"type": "object", "properties": ["a", "b"]},
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": "x"}}},
    {"type": "array", "prefixItems": {"0": {}}},
    {"$ref": "#/nowhere"},
    {"type": "object", "required": "a"},
    {"allOf": [{"properties": [1]}, {"required": 7}]},
    {"type": "array", "items": {"type": "string", "minLength": 2**40}, "minItems": 2**40},
    {"type": "array", "minItems": 2**40, "items": {"type": "array", "minItems": 2**40}},
]


@pytest.mark.parametrize("schema", MALFORMED_SCHEMAS, ids=range(len(MALFORMED_SCHEMAS)))
async def test_odd_json_schemas_never_crash_or_stall_the_mock(
    gateway: Gateway, schema: dict
) -> None:
    """Structured output asks the mock for a value of the given schema: odd or huge
    schemas get an answer (or a 4xx), never a 500 and never a stalled server."""
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "response_format": response_format,
    }
    with trio.fail_after(10):
        async with gateway.client(gateway.token) as client:
            response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code in (200, 400), response.text


async def test_answers_that_skip_the_body_keep_the_connection_usable(gateway: Gateway) -> None:
    """A 401 or 405 decided from the headers alone used to leave the request body unread
    on the kept-alive connection, and now and then hypercorn stalled the next request on
    it (the fuzzing run saw 30 s client timeouts). Many such requests on one connection,
    sent by the synchronous client as the fuzzing run does."""
    bodies = [b'"0"', b"data: ", b"{}", b"[null]", b'{"model": null, "input": ""}', b""]
    calls = [
        ("post", "/v1/models"),
        ("patch", "/v1/models"),
        ("put", "/v1/keys/0"),
        ("post", "/v1/responses"),
        ("get", "/v1/keys/x"),
        ("delete", "/v1/chat/completions"),
    ]

    def run() -> list[float]:
        slow = []
        headers = {"Content-Type": "application/json"}
        with httpx.Client(base_url=gateway.url, timeout=2.0) as client:
            for i in range(1500):
                method, path = calls[i % len(calls)]
                body = bodies[(i // len(calls)) % len(bodies)]
                start = time.monotonic()
                try:
                    response = client.request(method, path, content=body, headers=headers)
                    assert response.status_code in (401, 405), response.text
                except httpx.TimeoutException:
                    slow.append(time.monotonic() - start)
                    break
        return slow

    with trio.fail_after(60):
        assert await trio.to_thread.run_sync(run) == []


async def test_a_body_over_the_limit_closes_its_connection(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The 413 for a body over the limit is answered without reading that body, so the
    connection cannot be reused: the answer says Connection: close. Without it the
    client kept the connection and its next call on it hung until its own timeout."""
    gw = await start_gateway(nursery, make_config(tmp_path, max_body_bytes=1000))

    def run() -> list[tuple[int, str | None, int | str]]:
        seen = []
        headers = {"Authorization": f"Bearer {gw.token}", "Content-Type": "application/json"}
        with httpx.Client(base_url=gw.url, headers=headers, timeout=2.0) as client:
            for _ in range(12):
                big = client.post("/v1/chat/completions", content=b" " * 1001)
                try:
                    after: int | str = client.get("/v1/key").status_code
                except httpx.TimeoutException as exc:
                    after = repr(exc)
                seen.append((big.status_code, big.headers.get("Connection"), after))
        return seen

    with trio.fail_after(60):
        seen = await trio.to_thread.run_sync(run)
    gw.stop.set()
    assert set(seen) == {(413, "close", 200)}, seen
