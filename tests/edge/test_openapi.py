"""The OpenAPI document: valid 3.1, true to the app's routes, complete on error codes."""

from __future__ import annotations

import re
from typing import Any

import httpx
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from gateway.accounts.key_fields import MODEL_LIST_ALIAS
from gateway.accounts.subkey_rules import FIELDS as SUB_KEY_FIELDS
from gateway.calls.parse.chat import CHAT_FIELDS
from gateway.calls.parse.responses import RESPONSES_FIELDS
from gateway.calls.parse.tags import parse_header
from gateway.edge.app import create_app
from gateway.edge.openapi import ALSO_AT, MCP_ONLY_CODES, document
from gateway.edge.openapi_served import served_document, server_facts
from gateway.edge.request_schemas import TAGS_HEADER
from gateway.errors import CATALOG
from tests.conftest import Gateway

HIDDEN_METHODS = {"HEAD", "OPTIONS"}


def app_routes(gw: Gateway) -> set[tuple[str, str]]:
    """(method, OpenAPI-style path) of every /v1 route the running app serves."""
    app = create_app(gw.runtime)
    routes = set()
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/"):
            continue
        path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule)  # <path:model_id>
        for method in (rule.methods or set()) - HIDDEN_METHODS:
            routes.add((method.lower(), path))
    return routes


def documented() -> set[tuple[str, str]]:
    return {(m, p) for p, ops in document()["paths"].items() for m in ops}


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(document())
    validate(document("gpt-4o-mini", "text-embedding-3-small"))  # with its examples
    assert document()["openapi"] == "3.1.0"


async def test_every_route_is_described_and_every_description_is_a_route(
    gateway: Gateway,
) -> None:
    routes = app_routes(gateway)
    assert len(routes) >= 12
    assert routes == documented()


def test_every_error_code_of_the_catalog_is_documented() -> None:
    doc = document()
    listed: set[str] = set()
    for path, operations in doc["paths"].items():
        for op in operations.values():
            for status, answer in op["responses"].items():
                if status.startswith("2"):
                    continue
                codes = answer["content"]["application/json"]["x-error-codes"]
                assert all(
                    str(CATALOG[c].status) == status or (c, int(status)) in ALSO_AT.get(path, ())
                    for c in codes
                ), (status, codes)
                listed.update(codes)
    assert set(
        doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    ) == set(CATALOG)
    # internal_error is the one answer to a bug; every other code is reachable somewhere
    # (the MCP tool codes on /mcp, which the document leaves to the MCP specification)
    assert set(CATALOG) <= listed | {"internal_error", *MCP_ONLY_CODES}


async def test_served_without_a_key(gateway: Gateway) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    assert response.json() == served_document(server_facts(gateway.runtime.catalog, ()))
    # the examples name models the server serves
    paths = response.json()["paths"]
    chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat["example"]["model"] == "gpt-4o-mini"
    embeddings = paths["/v1/embeddings"]["post"]["requestBody"]["content"]["application/json"]
    assert embeddings["example"]["model"] == "text-embedding-3-small"


async def test_the_public_catalog_limit_is_described_as_served(gateway: Gateway) -> None:
    """Without a key, GET /v1/models answers its 429 in plain text with per-IP headers:
    the document says so (the one answer outside the error shape)."""
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        answers = [await client.get("/v1/models") for _ in range(61)]
    refused = answers[-1]
    assert [a.status_code for a in answers] == [200] * 60 + [429]
    documented = document()["paths"]["/v1/models"]["get"]["responses"]
    for answer, status in ((answers[0], "200"), (refused, "429")):
        assert {"X-RateLimit-Limit", "X-RateLimit-Remaining"} <= set(documented[status]["headers"])
        assert {"x-ratelimit-limit", "x-ratelimit-remaining"} <= set(answer.headers)
    assert refused.headers["content-type"].startswith("text/plain")
    assert "text/plain" in documented["429"]["content"]
    assert "Retry-After" in documented["429"]["headers"] and "retry-after" in refused.headers


def test_the_retry_hint_is_described_per_status() -> None:
    """x-should-retry is a constant where every code of a status agrees, else both."""
    chat = document()["paths"]["/v1/chat/completions"]["post"]["responses"]
    hint = {s: chat[s]["headers"]["x-should-retry"]["schema"] for s in chat if s != "200"}
    assert hint["400"] == hint["501"] == hint["504"] == {"const": "false"}
    assert hint["429"] == {"const": "true"}
    assert hint["409"] == hint["503"] == {"type": "string", "enum": ["false", "true"]}
    assert "x-should-retry" not in chat["200"]["headers"]


def test_one_model_is_described_like_the_list() -> None:
    paths = document()["paths"]
    one, every = paths["/v1/models/{model_id}"]["get"], paths["/v1/models"]["get"]
    assert one["security"] == every["security"] == [{}, {"bearer": []}]
    assert one["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Model"
    }
    assert one["responses"]["404"]["content"]["application/json"]["x-error-codes"] == [
        "model_not_found"
    ]
    assert {"X-RateLimit-Limit", "X-RateLimit-Remaining"} <= set(one["responses"]["404"]["headers"])


def test_closed_request_schemas_list_exactly_the_fields_the_parsers_accept() -> None:
    """A closed schema (additionalProperties false) that leaves out a field the server
    accepts would tell a client its valid request is invalid."""
    schemas = document()["components"]["schemas"]
    tables = {
        "ChatCompletionRequest": CHAT_FIELDS,
        "ResponsesRequest": RESPONSES_FIELDS,
        # the model list's older name is read too (gateway/accounts/key_fields.py)
        "SubKeyCreate": {*SUB_KEY_FIELDS, MODEL_LIST_ALIAS},
    }
    for name, table in tables.items():
        assert schemas[name]["additionalProperties"] is False
        assert set(schemas[name]["properties"]) == set(table), name


@settings(max_examples=300, database=None, deadline=None)
@given(st.from_regex(TAGS_HEADER["schema"]["pattern"], fullmatch=True))
def test_every_tag_header_the_document_allows_is_read(header: str) -> None:
    """The pattern is no looser than the parser (tests/edge/test_schemathesis.py checks the
    other way, against the server): every value it matches parses, none is refused."""
    tags = parse_header(header)
    assert len(tags) <= 16


def _body(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return dict(doc["components"]["schemas"][name]["properties"])


async def test_the_document_names_the_served_models(gateway: Gateway) -> None:
    """/v1/embeddings takes the one served embedding model, up to its dimensions; the chat
    endpoints refuse embedding models: the document says both, and the server agrees."""
    async with gateway.client(gateway.token) as client:
        doc = (await client.get("/openapi.json")).json()
        dims = [
            (await client.post("/v1/embeddings", json=body)).status_code
            for body in (
                {"model": "text-embedding-3-small", "input": "a", "dimensions": 1536},
                {"model": "text-embedding-3-small", "input": "a", "dimensions": 1537},
            )
        ]
        wrong_kind = await client.post(
            "/v1/responses", json={"model": "text-embedding-3-small", "input": "a"}
        )
    embeddings = _body(doc, "EmbeddingsRequest")
    assert embeddings["model"] == {"enum": ["text-embedding-3-small"]}
    assert embeddings["dimensions"]["maximum"] == 1536 and dims == [200, 400]
    for name in ("ChatCompletionRequest", "ResponsesRequest", "MessagesRequest"):
        assert _body(doc, name)["model"]["not"] == {"enum": ["text-embedding-3-small"]}
    assert wrong_kind.status_code == 400
    validate(doc)


async def test_the_document_fetched_with_a_key_is_that_keys(gateway: Gateway) -> None:
    """A key's output budget and its sub-keys' bounds are in the document it fetches (and
    agree with the server at the bound); a token that is not a key gets the server's."""
    parent = await gateway.admin(
        "POST",
        "/admin/keys",
        {
            "org_id": gateway.org_id,
            "name": "p",
            "mode": "sandbox",
            "keys_manage": True,
            "caps": {"rpm": 100, "usd_day": 5, "max_output_tokens": 50},
            "allowed_tools": ["srv__*", "other__t"],
        },
    )
    assert parent.status_code == 201, parent.text
    token = parent.json()["token"]
    async with gateway.client(token) as client:
        doc = (await client.get("/openapi.json")).json()
        prompt = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "a"}]}
        budgets = [
            (
                await client.post("/v1/messages/count_tokens", json={**prompt, "max_tokens": n})
            ).status_code
            for n in (50, 51)
        ]
        rpm = [
            (await client.post("/v1/keys", json={"name": "c", "caps": {"rpm": n}})).status_code
            for n in (100, 101)
        ]
        tool_lists = (["srv__x", "other__t"], ["srv__*"], ["srv__x__*"], ["other__u"])
        tools = [
            (await client.post("/v1/keys", json={"name": "t", "allowed_tools": t})).status_code
            for t in tool_lists
        ]
    async with gateway.client("svc_test_not_a_key") as client:
        anyone = (await client.get("/openapi.json")).json()
    for name, field in (
        ("ChatCompletionRequest", "max_tokens"),
        ("ChatCompletionRequest", "max_completion_tokens"),
        ("ResponsesRequest", "max_output_tokens"),
        ("MessagesRequest", "max_tokens"),
        ("CountTokensRequest", "max_tokens"),
    ):
        assert _body(doc, name)[field]["maximum"] == 50, (name, field)
    assert budgets == [200, 400] and rpm == [201, 400]
    sub_key = _body(doc, "SubKeyCreate")
    assert sub_key["mode"]["enum"] == ["sandbox"] and sub_key["byok"]["const"] is False
    caps = sub_key["caps"]["properties"]
    assert caps["rpm"]["maximum"] == 100 and caps["usd_day"]["type"] == "number"
    assert sub_key["guardrails"]["maxItems"] == 0  # the server configures none
    # the document's tool lists agree with the server's answers, item by item
    allowed = Draft202012Validator(sub_key["allowed_tools"])
    assert [allowed.is_valid(t) for t in tool_lists] == [True, True, False, False]
    assert tools == [201, 201, 400, 400]
    assert anyone == served_document(server_facts(gateway.runtime.catalog, ()))
    assert _body(anyone, "MessagesRequest")["max_tokens"]["maximum"] > 50
    validate(doc)
