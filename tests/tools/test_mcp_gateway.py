"""POST /mcp: the official ``mcp`` client in both protocol revisions, against a real gateway
fronting MCP servers built with the SDK (served on loopback, port 0, in the test's nursery).

What is checked, as the issue's acceptance lists it: both revisions list and call; per-key
tool lists (``allowed_tools``, ``org_blocked_tools``) and the check again at tools/call;
admission, reservation and settlement of a priced tool (records with ``endpoint: mcp``,
credits debited for live keys, sandbox never billed); refusals as JSON-RPC errors whose
``data`` is the error object; upstream failures as ``isError`` results naming the server;
the caller's key never reaches an upstream; protocol faults with the protocol's codes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import trio
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from gateway.config.mcp_servers import McpServerConfig
from tests.conftest import Gateway, make_config, start_gateway
from tests.support.fake_mcp import SearchState, garbage_app, serve_asgi, start_search
from tests.support.waiting import until

MODES = ["legacy", "2026-07-28"]
PRICE = 0.01
OPERATOR_SECRET = "operator-secret-of-search"


@asynccontextmanager
async def mcp_client(gw: Gateway, token: str, mode: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
        transport = streamable_http_client(gw.url + "/mcp", http_client=http)
        async with Client(transport, mode=mode) as client:
            yield client


async def rpc(
    gw: Gateway, token: str, method: str, params: dict[str, Any] | None = None, **headers: str
) -> httpx.Response:
    """One 2026-07-28 request, as the wire has it: the version in _meta and in headers."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": method,
        "params": {**(params or {}), "_meta": meta},
    }
    sent = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": method}
    if method == "tools/call":
        sent["Mcp-Name"] = str((params or {}).get("name"))
    sent.update(headers)
    async with gw.client(token) as client:
        return await client.post("/mcp", json=body, headers=sent)


async def tools_gateway(
    nursery: trio.Nursery, tmp_path: Path, *servers: McpServerConfig, **policy: Any
) -> Gateway:
    config = replace(make_config(tmp_path), mcp_servers=servers)
    return await start_gateway(nursery, config)


def search_config(url: str, **fields: Any) -> McpServerConfig:
    fields.setdefault("usd_per_call", PRICE)
    fields.setdefault("timeout_s", 5.0)
    return McpServerConfig(name="search", url=url, **fields)


@pytest.fixture
async def gw(
    nursery: trio.Nursery, tmp_path: Path, search: tuple[SearchState, str], monkeypatch: Any
) -> AsyncIterator[Gateway]:
    monkeypatch.setenv("SEARCH_TOKEN", f"Bearer {OPERATOR_SECRET}")
    config = search_config(search[1], headers_env={"Authorization": "SEARCH_TOKEN"})
    gateway = await tools_gateway(nursery, tmp_path, config)
    yield gateway
    gateway.stop.set()


async def live_key(gw: Gateway, **body: Any) -> str:
    return str((await gw.create_key(mode="live", **body))["token"])


async def record_of(gw: Gateway, token: str, response: httpx.Response) -> dict[str, Any]:
    async with gw.client(token) as client:
        found = await client.get(f"/v1/requests/{response.headers['X-Request-Id']}")
    assert found.status_code == 200, found.text
    return dict(found.json())


def refusal(response: httpx.Response) -> dict[str, Any]:
    error = response.json()["error"]
    assert error["code"] == -32080, error
    return dict(error["data"])


# -- both revisions, the official client ---------------------------------------------------


@pytest.mark.parametrize("mode", [*MODES, "auto"])
async def test_sandbox_key_lists_and_calls_the_mock_in_each_revision(
    gw: Gateway, mode: str
) -> None:
    async with mcp_client(gw, gw.token, mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else "2026-07-28")
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == ["mock__echo", "mock__add", "mock__digest"]
        result = await client.call_tool("mock__add", {"a": 2, "b": 3})
        assert not result.is_error
        assert result.structured_content == {"result": 5.0}


@pytest.mark.parametrize("mode", MODES)
async def test_live_key_calls_a_priced_upstream_tool(
    gw: Gateway, search: tuple[SearchState, str], mode: str
) -> None:
    token = await live_key(gw)
    async with mcp_client(gw, token, mode) as client:
        listed = await client.list_tools()
        names = [t.name for t in listed.tools]
        assert names[:4] == ["search__lookup", "search__broken", "search__hang", "search__whoami"]
        result = await client.call_tool("search__lookup", {"query": "trio"})
        assert result.content[0].text == "results for trio"  # type: ignore[union-attr]
        # the upstream saw the operator's credential, never the caller's key
        whoami = await client.call_tool("search__whoami", {})
        assert whoami.content[0].text == f"Bearer {OPERATOR_SECRET}"  # type: ignore[union-attr]
    assert all(token not in str(h) for h in search[0].headers)
    assert search[0].calls == {"lookup": 1, "whoami": 1}


async def test_a_call_is_recorded_settled_and_billed(gw: Gateway) -> None:
    token = await live_key(gw)
    async with gw.client(token) as client:
        before = (await client.get("/v1/credits")).json()["balance_usd"]
    response = await rpc(
        gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
    )
    assert response.status_code == 200, response.text
    assert response.json()["result"]["content"][0]["text"] == "results for a"
    record = await record_of(gw, token, response)
    assert record["endpoint"] == "mcp"
    assert record["model"] == "search__lookup"
    assert record["provider"] == "search"
    assert record["status"] == "succeeded"
    assert record["cost"]["settled_usd"] == PRICE
    assert record["cost"]["billed_usd"] == PRICE
    async with gw.client(token) as client:
        after = (await client.get("/v1/credits")).json()["balance_usd"]
        usage = (await client.get("/v1/usage", params={"group_by": "model"})).json()
    assert round(before - after, 9) == PRICE
    assert [row["group"] for row in usage["data"]] == ["search__lookup"]


async def test_sandbox_calls_are_recorded_never_billed(gw: Gateway) -> None:
    response = await rpc(
        gw, gw.token, "tools/call", {"name": "mock__echo", "arguments": {"text": "x"}}
    )
    record = await record_of(gw, gw.token, response)
    assert (record["model"], record["provider"]) == ("mock__echo", "mock")
    assert record["cost"]["settled_usd"] > 0
    assert record["cost"]["billed_usd"] == 0


async def test_an_is_error_result_is_answered_and_priced(gw: Gateway) -> None:
    token = await live_key(gw)
    response = await rpc(
        gw, token, "tools/call", {"name": "search__broken", "arguments": {"query": "q"}}
    )
    result = response.json()["result"]
    assert result["isError"] is True
    record = await record_of(gw, token, response)
    assert record["cost"]["billed_usd"] == PRICE


# -- who may call what ---------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
async def test_allowed_tools_narrow_the_list_and_the_calls(gw: Gateway, mode: str) -> None:
    token = await live_key(gw, allowed_tools=["search__lookup", "search__whoami"])
    async with mcp_client(gw, token, mode) as client:
        listed = await client.list_tools()
        assert [t.name for t in listed.tools] == ["search__lookup", "search__whoami"]
        with pytest.raises(MCPError) as refused:
            await client.call_tool("search__broken", {"query": "q"})
    data = refused.value.error.data
    assert data["code"] == "tool_not_allowed"
    assert "allowed_tools" in data["message"]


async def test_org_blocked_tools_win_over_the_key(gw: Gateway) -> None:
    token = await live_key(gw, allowed_tools=["search__*"])
    policy = {"org_blocked_tools": ["search__hang"]}
    answer = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/policy", policy)
    assert answer.status_code == 200, answer.text
    listed = (await rpc(gw, token, "tools/list")).json()["result"]["tools"]
    assert "search__hang" not in [t["name"] for t in listed]
    response = await rpc(gw, token, "tools/call", {"name": "search__hang", "arguments": {}})
    assert response.status_code == 403
    data = refusal(response)
    assert data["code"] == "tool_not_allowed"
    assert data["svc"]["policy"]["decisions"][0]["rule"] == "org_blocked_tools: search__hang"


async def test_a_sub_key_narrows_tools_never_widens(gw: Gateway) -> None:
    parent = await gw.create_key(mode="live", allowed_tools=["search__lookup"], keys_manage=True)
    async with gw.client(parent["token"]) as client:
        wider = await client.post("/v1/keys", json={"name": "c", "allowed_tools": ["search__*"]})
        narrow = await client.post(
            "/v1/keys", json={"name": "c", "allowed_tools": ["search__lookup"]}
        )
        inherited = await client.post("/v1/keys", json={"name": "c"})
    assert wider.status_code == 400
    assert wider.json()["error"]["code"] == "child_exceeds_parent"
    assert narrow.status_code == 201, narrow.text
    assert inherited.json()["allowed_tools"] == ["search__lookup"]


async def test_a_sandbox_key_reaches_only_the_mock(gw: Gateway) -> None:
    response = await rpc(
        gw, gw.token, "tools/call", {"name": "search__lookup", "arguments": {"query": "q"}}
    )
    assert response.status_code == 404
    assert refusal(response)["code"] == "tool_not_found"


async def test_bad_tool_patterns_are_refused(gw: Gateway) -> None:
    answer = await gw.admin(
        "POST", "/admin/keys", {"org_id": gw.org_id, "name": "k", "allowed_tools": ["lookup"]}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "allowed_tools"


# -- refusals: JSON-RPC errors whose data is the error object -------------------------------


async def test_an_invalid_key_is_the_uniform_401(gw: Gateway) -> None:
    response = await rpc(gw, "sk-svc-nothing", "tools/list")
    assert response.status_code == 401
    assert refusal(response)["code"] == "invalid_api_key"
    with pytest.raises((MCPError, BaseExceptionGroup)) as refused:
        async with mcp_client(gw, "sk-svc-nothing", "2026-07-28") as client:
            await client.list_tools()
    leaf = refused.value
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    assert isinstance(leaf, MCPError)
    assert leaf.error.data["code"] == "invalid_api_key"


async def test_a_key_without_the_inference_scope_is_refused(gw: Gateway) -> None:
    token = (await gw.create_key(scopes=["usage:read"]))["token"]
    response = await rpc(gw, token, "tools/list")
    assert response.status_code == 403
    assert refusal(response)["code"] == "scope_denied"


async def test_a_call_past_the_daily_cap_is_refused_unrecorded(gw: Gateway) -> None:
    token = await live_key(gw, caps={"usd_day": 0.015})
    first = await rpc(
        gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
    )
    assert "result" in first.json()
    second = await rpc(
        gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "b"}}
    )
    assert second.status_code == 402
    data = refusal(second)
    assert data["code"] == "key_cap_exceeded"
    assert data["type"] == "insufficient_quota" or data["type"]
    async with gw.client(token) as client:
        missing = await client.get(f"/v1/requests/{second.headers['X-Request-Id']}")
    assert missing.status_code == 404


async def test_rate_limited_says_when_to_retry(gw: Gateway) -> None:
    token = await live_key(gw, caps={"rpm": 1})
    await rpc(gw, token, "tools/list")
    response = await rpc(
        gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
    )
    assert response.status_code == 429
    data = refusal(response)
    assert data["code"] == "rate_limited"
    assert data["retry_after"] >= 1
    assert int(response.headers["Retry-After"]) >= 1


async def test_a_tool_list_the_upstream_says_changed_is_listed_again(gw: Gateway) -> None:
    """The upstream's tool list is cached for a minute, but the change it announces (on
    the subscriptions/listen stream the gateway keeps open) drops it: the new tool is
    listed within seconds (the event travels beside the call's answer, not in it)."""
    token = await live_key(gw)
    async with mcp_client(gw, token, "2026-07-28") as client:

        async def names() -> list[str]:
            return [t.name for t in (await client.list_tools()).tools]

        before = await names()
        assert "search__grow" in before and "search__extra" not in before
        grown = await client.call_tool("search__grow", {})
        assert grown.content[0].text == "grown"  # type: ignore[union-attr]

        async def extra_listed() -> bool:
            return "search__extra" in await names()

        await until(extra_listed, within=5.0)
        assert await names() == [*before, "search__extra"]


async def test_every_admitted_answer_carries_the_rate_limit_headers(gw: Gateway) -> None:
    token = await live_key(gw, caps={"rpm": 5})
    listed = await rpc(gw, token, "tools/list")
    called = await rpc(
        gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
    )
    for n, response in enumerate((listed, called), start=1):
        assert response.status_code == 200, response.text
        assert response.headers["X-RateLimit-Limit-Requests"] == "5"
        assert response.headers["X-RateLimit-Remaining-Requests"] == str(5 - n)


async def test_insufficient_credits(gw: Gateway, nursery: trio.Nursery) -> None:
    answer = await gw.admin("POST", "/admin/orgs", {"name": "poor", "credits_usd": 0.005})
    org_id = answer.json()["id"]
    token = (await gw.create_key(org_id=org_id, mode="live"))["token"]
    response = await rpc(
        gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
    )
    assert refusal(response)["code"] == "insufficient_credits"


# -- upstream failures: isError results naming the server -----------------------------------


async def test_a_hung_upstream_times_out_as_an_error_result(
    nursery: trio.Nursery, tmp_path: Path, search: tuple[SearchState, str]
) -> None:
    gw = await tools_gateway(nursery, tmp_path, search_config(search[1], timeout_s=0.5))
    token = await live_key(gw)
    with trio.fail_after(10):
        response = await rpc(gw, token, "tools/call", {"name": "search__hang", "arguments": {}})
    result = response.json()["result"]
    assert result["isError"] is True
    assert "'search'" in result["content"][0]["text"]
    record = await record_of(gw, token, response)
    assert record["status"] == "failed"
    # it may have done the work: the price counts against the caps, nothing is billed
    assert (record["cost"]["settled_usd"], record["cost"]["billed_usd"]) == (PRICE, 0)
    search[0].release.set()
    gw.stop.set()


async def test_an_unreachable_upstream_is_an_error_result_costing_nothing(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.socket.socket() as probe:  # a port nothing listens on
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gw = await tools_gateway(nursery, tmp_path, search_config(f"http://127.0.0.1:{port}/mcp"))
    token = await live_key(gw)
    with trio.fail_after(10):
        listed = (await rpc(gw, token, "tools/list")).json()["result"]["tools"]
        response = await rpc(
            gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
        )
    assert listed == []
    result = response.json()["result"]
    assert result["isError"] is True
    assert "'search' is unreachable" in result["content"][0]["text"]
    record = await record_of(gw, token, response)
    assert (record["cost"]["settled_usd"], record["cost"]["billed_usd"]) == (0, 0)
    gw.stop.set()


async def test_a_garbage_upstream_is_an_error_result(nursery: trio.Nursery, tmp_path: Path) -> None:
    binds: Any = await nursery.start(serve_asgi, garbage_app)
    gw = await tools_gateway(nursery, tmp_path, search_config(f"{binds[0]}/mcp"))
    token = await live_key(gw)
    with trio.fail_after(15):
        response = await rpc(
            gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}}
        )
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["isError"] is True
    assert "'search'" in result["content"][0]["text"]
    gw.stop.set()


# -- the protocol's own faults -------------------------------------------------------------


async def post_raw(gw: Gateway, content: bytes, **headers: str) -> httpx.Response:
    async with gw.client(gw.token) as client:
        return await client.post(
            "/mcp", content=content, headers={"Content-Type": "application/json", **headers}
        )


@pytest.mark.parametrize(
    ("content", "code", "status"),
    [
        (b"{not json", -32700, 400),
        (b"[]", -32600, 400),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600, 400),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "resources/list"}', -32601, 404),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "nothing/here"}', -32601, 404),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}}',
            -32602,
            400,
        ),
    ],
)
async def test_malformed_messages_get_protocol_codes(
    gw: Gateway, content: bytes, code: int, status: int
) -> None:
    response = await post_raw(gw, content)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


async def test_an_oversized_body_is_413_invalid_request(gw: Gateway) -> None:
    response = await post_raw(gw, b'{"x": "' + b"a" * (11 * 1024 * 1024) + b'"}')
    assert response.status_code == 413
    assert response.json()["error"]["code"] == -32600


async def test_headers_that_disagree_with_the_body_are_refused(gw: Gateway) -> None:
    response = await rpc(
        gw,
        gw.token,
        "tools/call",
        {"name": "mock__echo", "arguments": {"text": "x"}},
        **{"Mcp-Name": "mock__add"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32020


async def test_notifications_are_accepted(gw: Gateway) -> None:
    response = await post_raw(gw, b'{"jsonrpc": "2.0", "method": "notifications/initialized"}')
    assert response.status_code == 202


async def test_a_session_belongs_to_the_key_that_opened_it(gw: Gateway) -> None:
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    async with gw.client(gw.token) as client:
        opened = await client.post("/mcp", json=init)
    session = opened.headers["Mcp-Session-Id"]
    other = (await gw.create_key())["token"]
    ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
    async with gw.client(gw.token) as client:
        mine = await client.post("/mcp", json=ping, headers={"Mcp-Session-Id": session})
    async with gw.client(other) as client:
        theirs = await client.post("/mcp", json=ping, headers={"Mcp-Session-Id": session})
    assert mine.status_code == 200
    assert theirs.status_code == 404


async def test_get_is_405_and_delete_ends_nothing(gw: Gateway) -> None:
    async with gw.client(gw.token) as client:
        assert (await client.get("/mcp")).status_code == 405
        assert (await client.delete("/mcp")).status_code == 200


# -- tags, data mode, metrics ----------------------------------------------------------------


async def test_tags_go_on_the_record_and_required_tags_are_checked(gw: Gateway) -> None:
    token = await live_key(gw, required_tags={"team": ""})
    call = {"name": "search__lookup", "arguments": {"query": "a"}}
    missing = await rpc(gw, token, "tools/call", call)
    assert refusal(missing)["code"] == "missing_tags"
    tagged = await rpc(gw, token, "tools/call", call, **{"X-Svc-Tags": "team=search"})
    assert (await record_of(gw, token, tagged))["tags"] == {"team": "search"}


async def test_a_zero_retention_key_reaches_only_servers_that_keep_nothing(gw: Gateway) -> None:
    token = await live_key(gw, data_mode="zero_retention")
    assert (await rpc(gw, token, "tools/list")).json()["result"]["tools"] == []
    response = await rpc(gw, token, "tools/call", {"name": "search__lookup", "arguments": {}})
    assert refusal(response)["code"] == "tool_not_found"


async def test_tool_calls_are_counted_by_server_tool_and_outcome(gw: Gateway) -> None:
    token = await live_key(gw)
    await rpc(gw, token, "tools/call", {"name": "search__lookup", "arguments": {"query": "a"}})
    await rpc(gw, token, "tools/call", {"name": "search__broken", "arguments": {"query": "a"}})
    async with gw.client() as client:
        text = (await client.get("/metrics")).text
    assert 'svc_tool_calls_total{code="ok",server="search",tool="lookup"} 1.0' in text
    assert 'svc_tool_calls_total{code="tool_error",server="search",tool="broken"} 1.0' in text
    assert 'svc_requests_total{code="ok",endpoint="mcp",status="200"}' in text


async def test_an_upstream_killed_mid_call_is_an_error_result(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    state = SearchState()
    upstream = trio.CancelScope()

    async def serve_until_killed(*, task_status: trio.TaskStatus[str]) -> None:
        with upstream:
            async with trio.open_nursery() as inner:
                task_status.started(await start_search(inner, state))

    url = await nursery.start(serve_until_killed)
    gw = await tools_gateway(nursery, tmp_path, search_config(url))
    token = await live_key(gw)
    answer: dict[str, Any] = {}

    async def call() -> None:
        response = await rpc(gw, token, "tools/call", {"name": "search__hang", "arguments": {}})
        answer.update(response.json(), request_id=response.headers["X-Request-Id"])

    with trio.fail_after(15):
        async with trio.open_nursery() as calls:
            calls.start_soon(call)
            await state.hanging.wait()
            upstream.cancel()  # the server and its connections go away mid-call
    result = answer["result"]
    assert result["isError"] is True
    assert "'search'" in result["content"][0]["text"]
    assert "did not answer within" not in result["content"][0]["text"]  # not a timeout
    async with gw.client(token) as client:
        record = (await client.get(f"/v1/requests/{answer['request_id']}")).json()
    # it may have done the work: counted against the caps, never billed
    assert (record["cost"]["settled_usd"], record["cost"]["billed_usd"]) == (PRICE, 0)
    gw.stop.set()
