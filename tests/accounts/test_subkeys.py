"""/v1/keys: creating sub-keys through the API, every creation rule, and who sees what.

Rows of the refusal table mirror the spec's sub-key rules (POST /v1/keys sub-key body,
Authentication 10, the 400 table): one row per rule, code and param asserted. Every
call goes through the real server with real HTTP.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from shards import FakeClock
from tests.conftest import Gateway

pytestmark = pytest.mark.both_stores

# A parent with a limit on every setting a sub-key can narrow.
PARENT_CAPS = {
    "usd_day": 5,
    "usd_month": 50,
    "rpm": 30,
    "tpm": 10_000,
    "max_in_flight": 4,
    "max_output_tokens": 1000,
}
PARENT = {
    "name": "parent",
    "keys_manage": True,
    "scopes": ["inference", "usage:read"],
    "caps": PARENT_CAPS,
    "allowed_models": ["gpt-4o-mini", "gpt-4o"],
    "data_mode": "zero_retention",
    "required_tags": {"team": "core", "app": ""},
    "default_tags": {"cost_center": "42"},
    "expires_at": "2027-01-01T00:00:00Z",
}


async def make_parent(gw: Gateway, **settings: Any) -> dict[str, Any]:
    return await gw.create_key(**{"name": "parent", "keys_manage": True, **settings})


async def post_sub_key(gw: Gateway, token: str, body: Any) -> httpx.Response:
    async with gw.client(token) as client:
        return await client.post("/v1/keys", json=body)


async def create_sub_key(gw: Gateway, token: str, **body: Any) -> dict[str, Any]:
    body.setdefault("name", "child")
    response = await post_sub_key(gw, token, body)
    assert response.status_code == 201, response.text
    return response.json()


def assert_error(response: httpx.Response, status: int, code: str, param: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param), error


async def chat(
    gw: Gateway, token: str, headers: dict[str, str] | None = None, **body: Any
) -> httpx.Response:
    payload = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16,
        **body,
    }
    async with gw.client(token) as client:
        return await client.post("/v1/chat/completions", json=payload, headers=headers or {})


async def key_read(gw: Gateway, token: str) -> dict[str, Any]:
    async with gw.client(token) as client:
        response = await client.get("/v1/key")
    assert response.status_code == 200, response.text
    return response.json()


# -- creation refusals ---------------------------------------------------------------------

TOO_HIGH = {"usd_day": 5.01, "usd_month": 51, "rpm": 31, "tpm": 10_001}
TOO_HIGH |= {"max_in_flight": 5, "max_output_tokens": 1001}

# (case, body, code, param); the parent is PARENT
REFUSALS: list[tuple[str, Any, str, str | None]] = [
    ("body not an object", ["name"], "invalid_request", None),
    ("unknown field", {"name": "c", "keys_manage": True}, "invalid_request", "keys_manage"),
    ("name missing", {}, "invalid_request", "name"),
    ("name empty", {"name": "  "}, "invalid_request", "name"),
    ("name not a string", {"name": 5}, "invalid_request", "name"),
    ("name over 200", {"name": "n" * 201}, "invalid_request", "name"),
    ("mode changed", {"name": "c", "mode": "live"}, "invalid_request", "mode"),
    ("environment changed", {"name": "c", "environment": "production"},
     "invalid_request", "environment"),
    ("byok changed", {"name": "c", "byok": True}, "invalid_request", "byok"),
    ("byok as a number", {"name": "c", "byok": 0}, "invalid_request", "byok"),
    ("scopes not a list", {"name": "c", "scopes": "inference"}, "invalid_request", "scopes"),
    ("scope keys:manage", {"name": "c", "scopes": ["inference", "keys:manage"]},
     "invalid_request", "scopes"),
    ("scope unknown", {"name": "c", "scopes": ["admin"]}, "invalid_request", "scopes"),
    ("scope the parent lacks", {"name": "c", "scopes": ["embeddings"]},
     "child_exceeds_parent", "scopes"),
    ("caps not an object", {"name": "c", "caps": [1]}, "invalid_request", "caps"),
    ("caps unknown field", {"name": "c", "caps": {"rpd": 1}}, "invalid_request", "caps.rpd"),
    ("caps negative", {"name": "c", "caps": {"rpm": -1}}, "invalid_request", "caps.rpm"),
    ("caps not a number", {"name": "c", "caps": {"usd_day": "1"}},
     "invalid_request", "caps.usd_day"),
    ("caps rpm unlimited", {"name": "c", "caps": {"rpm": None}}, "invalid_request", "caps.rpm"),
    *[
        (f"caps.{field} above the parent's", {"name": "c", "caps": {field: value}},
         "child_exceeds_parent", f"caps.{field}")
        for field, value in TOO_HIGH.items()
    ],
    ("usd_day unlimited under a limited parent", {"name": "c", "caps": {"usd_day": None}},
     "child_exceeds_parent", "caps.usd_day"),
    ("tpm unlimited under a limited parent", {"name": "c", "caps": {"tpm": None}},
     "child_exceeds_parent", "caps.tpm"),
    ("data mode unknown", {"name": "c", "data_mode": "secret"}, "invalid_request", "data_mode"),
    ("data mode looser", {"name": "c", "data_mode": "standard"},
     "child_exceeds_parent", "data_mode"),
    ("allowed_models not a list", {"name": "c", "allowed_models": "gpt-4o"},
     "invalid_request", "allowed_models"),
    ("allowed_models empty", {"name": "c", "allowed_models": []},
     "invalid_request", "allowed_models"),
    ("model outside the catalog", {"name": "c", "allowed_models": ["gpt-4o-mini", "nope"]},
     "model_not_in_catalog", "allowed_models"),
    ("model outside the parent's list", {"name": "c", "allowed_models": ["text-embedding-3-small"]},
     "child_exceeds_parent", "allowed_models"),
    ("required tag value the parent pins", {"name": "c", "required_tags": {"team": "other"}},
     "child_exceeds_parent", "required_tags"),
    ("required tag key malformed", {"name": "c", "required_tags": {"a b": ""}},
     "invalid_request", "required_tags"),
    ("default_tags not an object", {"name": "c", "default_tags": ["x"]},
     "invalid_request", "default_tags"),
    ("default tag value not a string", {"name": "c", "default_tags": {"x": 1}},
     "invalid_request", "default_tags"),
    ("expires_at not ISO 8601", {"name": "c", "expires_at": "next week"},
     "invalid_request", "expires_at"),
    ("expires_at a number", {"name": "c", "expires_at": 1_800_000_000},
     "invalid_request", "expires_at"),
    ("expires_at past year 9999 in UTC", {"name": "c", "expires_at": "9999-12-31T23:59:59-23:59"},
     "invalid_request", "expires_at"),
    ("expires_at before year 1 in UTC", {"name": "c", "expires_at": "0001-01-01T00:00:00+23:59"},
     "invalid_request", "expires_at"),
    ("expires_at after the parent's", {"name": "c", "expires_at": "2027-01-01T00:00:01Z"},
     "child_exceeds_parent", "expires_at"),
    ("no expiry under an expiring parent", {"name": "c", "expires_at": None},
     "child_exceeds_parent", "expires_at"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "code", "param"), [row[1:] for row in REFUSALS], ids=[row[0] for row in REFUSALS]
)
async def test_creation_refusals(
    clocked_gateway: Gateway, body: Any, code: str, param: str | None
) -> None:
    gw = clocked_gateway
    parent = await make_parent(gw, **PARENT)
    response = await post_sub_key(gw, parent["token"], body)
    assert_error(response, 400, code, param)
    assert "X-RateLimit-Limit-Requests" in response.headers
    assert gw.runtime.keyring.children(parent["id"]) == []


async def test_an_expiry_already_past_makes_an_expired_sub_key(clocked_gateway: Gateway) -> None:
    """The clock reads 2026-11-22 10:00:30: a sub-key expiring at 10:00 is created (a
    document cannot say "in the future"), expired at once; its token is refused."""
    gw = clocked_gateway
    parent = await make_parent(gw, **PARENT)
    child = await create_sub_key(gw, parent["token"], name="c", expires_at="2026-11-22T10:00:00Z")
    assert (child["status"], child["expires_at"]) == ("expired", "2026-11-22T10:00:00Z")
    async with gw.client(child["token"]) as client:
        assert (await client.get("/v1/key")).status_code == 401


async def test_malformed_json_is_invalid_request(gateway: Gateway) -> None:
    parent = await make_parent(gateway)
    async with gateway.client(parent["token"]) as client:
        response = await client.post(
            "/v1/keys", content=b"{name", headers={"Content-Type": "application/json"}
        )
    assert_error(response, 400, "invalid_request", None)


async def test_model_hidden_by_the_organisation_is_not_in_its_catalog(gateway: Gateway) -> None:
    policy = {"org_api_models": ["gpt-4o-mini"]}
    assert (await gateway.admin("PUT", f"/admin/orgs/{gateway.org_id}/policy", policy)).is_success
    parent = await make_parent(gateway)
    response = await post_sub_key(
        gateway, parent["token"], {"name": "c", "allowed_models": ["gpt-4o"]}
    )
    assert_error(response, 400, "model_not_in_catalog", "allowed_models")
    await create_sub_key(gateway, parent["token"], allowed_models=["gpt-4o-mini"])


# -- what a sub-key gets ---------------------------------------------------------------------


async def test_settings_left_out_are_the_parents(clocked_gateway: Gateway) -> None:
    gw = clocked_gateway
    parent = await make_parent(gw, **PARENT)
    child = await create_sub_key(gw, parent["token"], name="child")
    assert child["token"].startswith("svc_test_")
    assert child["prefix"] == child["token"].split("_")[2]
    assert child["prefix"][:6] == parent["prefix"][:6]  # same family, same shard
    assert child["parent_id"] == parent["id"]
    assert (child["status"], child["name"]) == ("active", "child")
    same = ("mode", "environment", "byok", "data_mode", "caps", "allowed_model_keys")
    same += ("required_tags", "default_tags", "expires_at", "org_id")
    assert {f: child[f] for f in same} == {f: parent[f] for f in same}
    assert child["scopes"] == ["inference", "usage:read"]  # never keys:manage


async def test_settings_narrowed_and_merged(clocked_gateway: Gateway) -> None:
    gw = clocked_gateway
    parent = await make_parent(gw, **PARENT)
    child = await create_sub_key(
        gw,
        parent["token"],
        name="n" * 200,
        mode="sandbox",
        environment="development",
        byok=False,
        scopes=["inference"],
        caps={"usd_day": 1.5, "rpm": 10, "max_output_tokens": 64},
        data_mode="confidential",
        allowed_models=["gpt-4o-mini"],
        required_tags={"app": "web", "env": ""},
        default_tags={"cost_center": "7", "ui": "v2"},
        expires_at="2026-12-01T00:00:00Z",
    )
    assert child["scopes"] == ["inference"]
    assert child["caps"] == {**PARENT_CAPS, "usd_day": 1.5, "rpm": 10, "max_output_tokens": 64}
    assert child["data_mode"] == "confidential"
    assert child["allowed_model_keys"] == ["gpt-4o-mini"]
    assert child["required_tags"] == {"team": "core", "app": "web", "env": ""}
    assert child["default_tags"] == {"cost_center": "7", "ui": "v2"}
    assert child["expires_at"] == "2026-12-01T00:00:00Z"


async def test_caps_the_parent_leaves_unlimited_can_be_anything(gateway: Gateway) -> None:
    parent = await make_parent(gateway)  # usd_day, usd_month, tpm unlimited
    child = await create_sub_key(
        gateway, parent["token"], caps={"usd_day": 10_000, "usd_month": None, "tpm": 10**9}
    )
    assert child["caps"]["usd_day"] == 10_000
    assert child["caps"]["usd_month"] is None
    assert child["caps"]["tpm"] == 10**9
    assert child["expires_at"] is None


async def test_one_level_only(gateway: Gateway) -> None:
    parent = await make_parent(gateway)
    child = await create_sub_key(gateway, parent["token"])
    assert "keys:manage" not in child["scopes"]
    async with gateway.client(child["token"]) as client:
        for method, path in (("POST", "/v1/keys"), ("GET", "/v1/keys")):
            response = await client.request(method, path, json={"name": "grandchild"})
            assert_error(response, 403, "scope_denied", None)


# -- a sub-key at work -------------------------------------------------------------------------


async def test_sub_key_calls_models_within_its_settings(gateway: Gateway) -> None:
    parent = await make_parent(gateway)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as client:
        created = await client.post(
            "/v1/keys",
            headers={"Authorization": f"Bearer {parent['token']}"},
            json={
                "name": "web",
                "scopes": ["inference"],
                "allowed_models": ["gpt-4o-mini"],
                "caps": {"max_output_tokens": 32},
                "required_tags": {"team": ""},
            },
        )
    assert created.status_code == 201, created.text
    token = created.json()["token"]
    tagged = {"X-Svc-Tags": "team=web"}

    ok = await chat(gateway, token, tagged)
    assert ok.status_code == 200, ok.text
    assert ok.json()["choices"][0]["message"]["content"]

    other = await chat(gateway, token, tagged, model="gpt-4o")
    assert_error(other, 403, "model_not_allowed", "model")
    assert other.json()["svc"]["policy"]["decisions"] == [
        {"rule": "key_allowed_models", "verdict": "deny"}
    ]
    assert_error(
        await chat(gateway, token, tagged, max_tokens=33),
        400,
        "max_tokens_exceeds_key_limit",
        "max_tokens",
    )
    assert_error(await chat(gateway, token), 400, "missing_tags", None)
    async with gateway.client(token) as client:
        embed = await client.post(
            "/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"}
        )
    assert_error(embed, 403, "scope_denied", None)


async def test_spend_is_shared_with_the_parent(gateway: Gateway) -> None:
    parent = await make_parent(gateway, caps={"usd_day": 10})
    child = await create_sub_key(gateway, parent["token"], caps={"usd_day": 1})
    assert (await chat(gateway, child["token"])).status_code == 200
    mine = (await key_read(gateway, child["token"]))["usage"]["day"]
    theirs = (await key_read(gateway, parent["token"]))["usage"]["day"]
    assert mine["spent_usd"] > 0
    assert theirs["spent_usd"] == mine["spent_usd"]
    assert theirs["remaining_usd"] == pytest.approx(10 - mine["spent_usd"])
    assert (await key_read(gateway, parent["token"]))["sub_key_count"] == 1


# -- who sees what -----------------------------------------------------------------------------


async def test_other_keys_are_not_found(gateway: Gateway) -> None:
    mine = await make_parent(gateway, name="mine")
    theirs = await make_parent(gateway, name="theirs")
    their_child = await create_sub_key(gateway, theirs["token"])
    org = await gateway.admin("POST", "/admin/orgs", {"name": "elsewhere"})
    far = await gateway.create_key(org_id=org.json()["id"], name="far", keys_manage=True)
    far_child = await create_sub_key(gateway, far["token"])
    strangers = [their_child["id"], theirs["id"], far_child["id"], mine["id"], "key_nope"]
    async with gateway.client(mine["token"]) as client:
        for key_id in strangers:
            patched = await client.patch(f"/v1/keys/{key_id}", json={"disabled": True})
            assert_error(patched, 404, "not_found", "key_id")
            assert_error(await client.delete(f"/v1/keys/{key_id}"), 404, "not_found", "key_id")
        listed = await client.get("/v1/keys")
    assert listed.json() == {"object": "list", "data": [], "has_more": False}
    for child in (their_child, far_child):
        assert (await key_read(gateway, child["token"]))["status"] == "active"


async def test_list_pages_oldest_first(gateway: Gateway) -> None:
    parent = await make_parent(gateway)
    created = [(await create_sub_key(gateway, parent["token"], name=f"c{i}")) for i in range(5)]
    async with gateway.client(parent["token"]) as client:
        first = await client.get("/v1/keys", params={"limit": 2})
        assert first.status_code == 200, first.text
        assert "X-RateLimit-Remaining-Requests" in first.headers
        seen, page = [], first.json()
        while True:
            seen += page["data"]
            if not page["has_more"]:
                break
            after = page["data"][-1]["id"]
            page = (await client.get("/v1/keys", params={"limit": 2, "after": after})).json()
        everything = (await client.get("/v1/keys")).json()
        for limit in ("0", "101", "two", "-1", "²"):
            bad = await client.get("/v1/keys", params={"limit": limit})
            assert_error(bad, 400, "invalid_request", "limit")
        bad_after = await client.get("/v1/keys", params={"after": parent["id"]})
        assert_error(bad_after, 404, "not_found", "after")  # none of its sub-keys
    assert [k["id"] for k in seen] == [k["id"] for k in created]
    assert [k["name"] for k in seen] == ["c0", "c1", "c2", "c3", "c4"]
    assert everything["has_more"] is False and len(everything["data"]) == 5
    assert all("token" not in k and "fingerprint" not in k for k in seen)
    assert first.json()["has_more"] is True and len(first.json()["data"]) == 2


async def test_list_has_more_at_the_exact_limit(clocked_gateway: Gateway, clock: FakeClock) -> None:
    gw = clocked_gateway
    parent = await make_parent(gw)
    for i in range(3):
        await create_sub_key(gw, parent["token"], name=f"c{i}")
        clock.advance(1)
    async with gw.client(parent["token"]) as client:
        page = (await client.get("/v1/keys", params={"limit": 3})).json()
    assert (len(page["data"]), page["has_more"]) == (3, False)
    assert [k["name"] for k in page["data"]] == ["c0", "c1", "c2"]
