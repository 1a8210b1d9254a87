"""Scopes (403 scope_denied), 405 on every known path, 404 on unknown paths, request ids."""

from __future__ import annotations

import re

import pytest
from werkzeug.routing import Rule

from gateway.edge.app import create_app
from tests.conftest import ADMIN_TOKEN, Gateway

# path -> (allowed methods, scope that grants it)
KNOWN = {
    "/v1/models": (("GET",), "inference"),
    "/v1/chat/completions": (("POST",), "inference"),
    "/v1/responses": (("POST",), "inference"),
    "/v1/embeddings": (("POST",), "embeddings"),
    "/v1/usage": (("GET",), "usage:read"),
    "/v1/credits": (("GET",), "usage:read"),
    "/v1/requests/req_abc": (("GET",), "usage:read"),
    "/v1/key": (("GET",), None),
    "/v1/keys": (("GET", "POST"), "keys:manage"),
    "/v1/keys/key_abc": (("PATCH", "DELETE"), "keys:manage"),
}
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
ALL_SCOPES = ("inference", "embeddings", "usage:read", "keys:manage")


def _cases_405() -> list[tuple[str, str]]:
    return [
        (path, method)
        for path, (allowed, _) in KNOWN.items()
        for method in METHODS
        if method not in allowed
    ]


@pytest.mark.parametrize(("path", "method"), _cases_405())
async def test_other_methods_on_known_paths_are_405(
    gateway: Gateway, path: str, method: str
) -> None:
    async with gateway.client(gateway.token) as client:
        response = await client.request(method, path)
    assert response.status_code == 405, response.text
    assert response.json()["error"] == {
        "message": "This method is not allowed on this path.",
        "type": "invalid_request_error",
        "code": "method_not_allowed",
        "param": None,
    }
    assert re.fullmatch(r"req_[0-9a-f]+", response.headers["X-Request-Id"])
    # RFC 9110: a 405 names the methods the path takes
    assert response.headers["Allow"] == ", ".join(sorted(KNOWN[path][0]))


@pytest.mark.parametrize("path", [p for p, (allowed, _) in KNOWN.items() if "GET" in allowed])
async def test_head_is_another_method(gateway: Gateway, path: str) -> None:
    """The framework would answer HEAD on every GET route; the spec makes it a 405."""
    async with gateway.client(gateway.token) as client:
        response = await client.head(path)
    assert response.status_code == 405
    assert response.headers["Allow"] == ", ".join(sorted(KNOWN[path][0]))
    assert re.fullmatch(r"req_[0-9a-f]+", response.headers["X-Request-Id"])
    async with gateway.client(gateway.token) as client:
        assert (await client.head("/v1/nothing")).status_code == 404


@pytest.mark.parametrize(
    "path", ["/v1/nothing", "/v2/models", "/v1/keys/a/b", "/v1//models", "//v1/key"]
)
async def test_unknown_paths_are_404(gateway: Gateway, path: str) -> None:
    async with gateway.client(gateway.token) as client:
        response = await client.get(path)
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("not_found", "not_found_error")


async def test_the_root_points_to_the_catalog_the_dashboard_and_the_document(
    gateway: Gateway,
) -> None:
    async with gateway.client() as client:  # no key needed
        index = await client.get("/")
        assert index.status_code == 200
        links = index.json()["links"]
        assert links["dashboard"] == "/dashboard/" and links["models"] == "/v1/models"
        for link in links.values():  # each one is served
            assert (await client.get(link)).status_code in (200, 302, 303), link


def _scope_cases() -> list[tuple[str, str, str]]:
    return [
        (path, allowed[0], scope)
        for path, (allowed, scope) in KNOWN.items()
        if scope is not None
        for allowed in [allowed]
    ]


@pytest.mark.parametrize(("path", "method", "scope"), _scope_cases())
async def test_a_key_without_the_scope_gets_403(
    gateway: Gateway, path: str, method: str, scope: str
) -> None:
    others = [s for s in ALL_SCOPES if s != scope and s != "keys:manage"]
    key = await gateway.create_key(name="narrow", scopes=others)
    async with gateway.client(key["token"]) as client:
        response = await client.request(method, path, json={})
    assert response.status_code == 403, response.text
    assert response.json()["error"] == {
        "message": response.json()["error"]["message"],
        "type": "permission_error",
        "code": "scope_denied",
        "param": None,
    }
    assert scope in response.json()["error"]["message"]
    assert "X-RateLimit-Limit-Requests" not in response.headers


async def test_a_scope_refusal_counts_in_the_request_window(clocked_gateway: Gateway) -> None:
    gw = clocked_gateway
    key = await gw.create_key(name="embed-only", scopes=["embeddings"], caps={"rpm": 3})
    async with gw.client(key["token"]) as client:
        for _ in range(3):
            refused = await client.post("/v1/chat/completions", json={})
            assert refused.status_code == 403
        over = await client.get("/v1/key")
    assert over.status_code == 429, "three refused requests used up rpm 3"
    assert over.json()["error"]["code"] == "rate_limited"


async def test_two_authorization_headers_are_401(gateway: Gateway) -> None:
    async with gateway.client(None) as client:
        response = await client.get(
            "/v1/key",
            headers=[
                ("Authorization", f"Bearer {gateway.token}"),
                ("Authorization", "Bearer svc_test_other"),
            ],
        )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


async def test_key_read_needs_no_scope(gateway: Gateway) -> None:
    key = await gateway.create_key(name="embed-only", scopes=["embeddings"])
    async with gateway.client(key["token"]) as client:
        assert (await client.get("/v1/key")).status_code == 200
        models = await client.get("/v1/models")
    assert models.status_code == 403
    assert models.json()["error"]["code"] == "scope_denied"


async def test_request_ids_are_unique(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as client:
        ids = {(await client.get("/v1/key")).headers["X-Request-Id"] for _ in range(5)}
    assert len(ids) == 5


def _concrete(rule: str) -> str:
    """A path a rule matches: each variable becomes ``x`` (an ``any`` its first choice)."""
    path = re.sub(r"<any\(([^,)]+)[^>]*>", r"\1", rule)
    return re.sub(r"<[^>]+>", "x", path)


async def test_every_405_carries_allow(gateway: Gateway) -> None:
    """RFC 9110: a 405 names the path's methods, on every route of the app (admin and
    dashboard too): exactly the methods that are not answered 405 there."""
    routes: dict[str, set[str]] = {}
    for rule in gateway_rules(gateway):
        routes.setdefault(_concrete(rule.rule), set()).update((rule.methods or set()) - {"HEAD"})
    assert "/admin/keys/x/rotate" in routes
    async with gateway.client(ADMIN_TOKEN) as client:
        for path, declared in routes.items():
            answers = {m: await client.request(m, path) for m in (*METHODS, "HEAD")}
            served = {m for m, answer in answers.items() if answer.status_code != 405}
            assert declared <= served, (path, declared, served)
            for method, answer in answers.items():
                if answer.status_code == 405:
                    assert answer.headers["Allow"] == ", ".join(sorted(served)), (method, path)
            assert "HEAD" not in served, path


def gateway_rules(gateway: Gateway) -> list[Rule]:
    return [
        rule
        for rule in create_app(gateway.runtime).url_map.iter_rules()
        if "/static/" not in rule.rule
    ]
