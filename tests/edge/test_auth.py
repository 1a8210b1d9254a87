"""Authentication: one uniform 401 for every kind of bad key, on every /v1 path."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from shards import FakeClock
from tests.conftest import Gateway

V1_PATHS = [
    ("GET", "/v1/key"),
    ("GET", "/v1/usage"),
    ("GET", "/v1/credits"),
    ("GET", "/v1/requests/req_0123"),
    ("GET", "/v1/keys"),
    ("POST", "/v1/keys"),
    ("PATCH", "/v1/keys/key_x"),
    ("DELETE", "/v1/keys/key_x"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/embeddings"),
]

EXPECTED_401 = {
    "error": {
        "message": "The API key is invalid, revoked or expired.",
        "type": "authentication_error",
        "code": "invalid_api_key",
        "param": None,
    }
}


async def _answer(gw: Gateway, headers: dict[str, str], method: str = "GET", path: str = "/v1/key"):
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        return await client.request(method, path, headers=headers, json={})


def _assert_401(response: httpx.Response) -> None:
    assert response.status_code == 401, response.text
    assert response.json() == EXPECTED_401
    assert re.fullmatch(r"req_[0-9a-f]+", response.headers["X-Request-Id"])
    assert "X-RateLimit-Limit-Requests" not in response.headers


async def _state_tokens(gw: Gateway) -> dict[str, str]:
    """A token in each bad state the spec lists."""
    revoked = await gw.create_key(name="revoked")
    disabled = await gw.create_key(name="disabled")
    expired = await gw.create_key(name="expired", expires_at="2020-01-01T00:00:00Z")
    assert (await gw.admin("POST", f"/admin/keys/{revoked['id']}/revoke")).status_code == 200
    assert (await gw.admin("POST", f"/admin/keys/{disabled['id']}/disable")).status_code == 200
    return {
        "revoked": revoked["token"],
        "disabled": disabled["token"],
        "expired": expired["token"],
    }


async def test_every_bad_credential_gets_the_same_401(gateway: Gateway) -> None:
    good = gateway.token
    unknown = "svc_test_aaaaaaaaaaaa_" + "A" * 32
    tampered = good[:-1] + ("B" if good[-1] != "B" else "C")
    cases = {
        "missing header": {},
        "basic scheme": {"Authorization": f"Basic {good}"},
        "no token": {"Authorization": "Bearer"},
        "malformed token": {"Authorization": "Bearer not-a-key"},
        "wrong mode prefix": {"Authorization": f"Bearer {good.replace('svc_test_', 'svc_live_')}"},
        "unknown key": {"Authorization": f"Bearer {unknown}"},
        "tampered secret": {"Authorization": f"Bearer {tampered}"},
    }
    for state, token in (await _state_tokens(gateway)).items():
        cases[state] = {"Authorization": f"Bearer {token}"}
    bodies = set()
    for name, headers in cases.items():
        response = await _answer(gateway, headers)
        _assert_401(response)
        bodies.add(response.content)
        assert name  # keeps the case name visible in a failing traceback
    assert len(bodies) == 1, "401 bodies must be byte-identical apart from the request id"


@pytest.mark.parametrize(("method", "path"), V1_PATHS)
async def test_401_holds_on_every_v1_path(gateway: Gateway, method: str, path: str) -> None:
    _assert_401(await _answer(gateway, {}, method, path))
    bad = {"Authorization": "Bearer svc_test_bbbbbbbbbbbb_" + "B" * 32}
    _assert_401(await _answer(gateway, bad, method, path))


async def test_sub_key_of_a_bad_parent_is_refused(gateway: Gateway) -> None:
    rt = gateway.runtime
    for action in ("disable", "revoke"):
        parent = await gateway.create_key(name=f"parent-{action}", keys_manage=True)
        parent_record = rt.keyring.get(parent["id"])
        assert parent_record is not None
        child, token = rt.keyring.build(
            org_id=parent_record.org_id,
            name="child",
            mode="sandbox",
            family_id=parent_record.family_id,
            parent_id=parent_record.id,
        )
        await rt.keyring.insert(child)
        ok = await _answer(gateway, {"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200, ok.text
        assert (await gateway.admin("POST", f"/admin/keys/{parent['id']}/{action}")).is_success
        _assert_401(await _answer(gateway, {"Authorization": f"Bearer {token}"}))


async def test_key_expires_by_the_clock(clocked_gateway: Gateway, clock: FakeClock) -> None:
    gw = clocked_gateway
    expiry = "2026-11-22T10:05:00Z"
    key = await gw.create_key(name="short", expires_at=expiry)
    headers = {"Authorization": f"Bearer {key['token']}"}
    response = await _answer(gw, headers)
    assert response.status_code == 200
    assert response.json()["expires_at"] == expiry
    clock.advance(5 * 60)
    _assert_401(await _answer(gw, headers))


async def test_revoke_cascades_to_sub_keys(gateway: Gateway) -> None:
    rt = gateway.runtime
    parent = await gateway.create_key(name="parent", keys_manage=True)
    record = rt.keyring.get(parent["id"])
    assert record is not None
    child, token = rt.keyring.build(
        org_id=record.org_id,
        name="child",
        mode="sandbox",
        family_id=record.family_id,
        parent_id=record.id,
    )
    await rt.keyring.insert(child)
    assert (await gateway.admin("POST", f"/admin/keys/{parent['id']}/revoke")).is_success
    stored = rt.keyring.get(child.id)
    assert stored is not None and stored.status == "revoked"
    _assert_401(await _answer(gateway, {"Authorization": f"Bearer {token}"}))


async def test_the_token_is_never_stored(gateway: Gateway) -> None:
    key = await gateway.create_key(name="secret")
    raw = Path(gateway.runtime.store.path)
    data = b"".join(p.read_bytes() for p in raw.parent.glob(raw.name + "*"))
    secret = key["token"].rsplit("_", 1)[1]
    assert secret.encode() not in data
