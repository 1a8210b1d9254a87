"""The key lifecycle of the spec's "States and transitions" table, one test per row.

Disable and re-enable (PATCH), revoke (DELETE, and the dashboard's revoke cascading to
sub-keys), expiry by the injected clock, a call in progress finishing and being billed
while its key is revoked, and rotation: old and new keys both valid, sub-keys moving
under the new key with it sharing their spend, the old key expiring after the window.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import orjson
import psycopg
import pytest
import trio

from gateway.errors import GatewayError
from gateway.providers.mock import MockProvider
from gateway.store import records
from shards import FakeClock
from tests.accounts.test_subkeys import (
    assert_error,
    chat,
    create_sub_key,
    key_read,
    make_parent,
)
from tests.conftest import Gateway, make_config, start_gateway

pytestmark = pytest.mark.both_stores

DAY = 24 * 3600


async def patch(gw: Gateway, token: str, key_id: str, body: Any) -> httpx.Response:
    async with gw.client(token) as client:
        return await client.patch(f"/v1/keys/{key_id}", json=body)


async def delete(gw: Gateway, token: str, key_id: str) -> httpx.Response:
    async with gw.client(token) as client:
        return await client.delete(f"/v1/keys/{key_id}")


async def status_code_of(gw: Gateway, token: str) -> int:
    async with gw.client(token) as client:
        return (await client.get("/v1/key")).status_code


async def family(gw: Gateway, **parent: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    owner = await make_parent(gw, **parent)
    return owner, await create_sub_key(gw, owner["token"])


# -- disable, re-enable, revoke ----------------------------------------------------------------


async def test_disable_and_re_enable(gateway: Gateway) -> None:
    parent, child = await family(gateway)
    off = await patch(gateway, parent["token"], child["id"], {"disabled": True})
    assert off.status_code == 200, off.text
    assert (off.json()["id"], off.json()["status"]) == (child["id"], "disabled")
    assert "X-RateLimit-Limit-Requests" in off.headers
    assert await status_code_of(gateway, child["token"]) == 401
    assert_error(await chat(gateway, child["token"]), 401, "invalid_api_key", None)
    on = await patch(gateway, parent["token"], child["id"], {"disabled": False})
    assert (on.status_code, on.json()["status"]) == (200, "active")
    assert (await chat(gateway, child["token"])).status_code == 200


async def test_patch_body_rules(gateway: Gateway) -> None:
    parent, child = await family(gateway)
    for body, param in (
        ({}, "disabled"),
        ({"disabled": "yes"}, "disabled"),
        ({"disabled": 1}, "disabled"),
        ({"disabled": True, "name": "x"}, "name"),
        ([True], None),
    ):
        response = await patch(gateway, parent["token"], child["id"], body)
        assert_error(response, 400, "invalid_request", param)
    assert (await key_read(gateway, child["token"]))["status"] == "active"


async def test_delete_revokes_definitively(gateway: Gateway) -> None:
    parent, child = await family(gateway)
    response = await delete(gateway, parent["token"], child["id"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["id"], body["status"], body["deleted"]) == (child["id"], "revoked", True)
    assert "token" not in body
    assert_error(await chat(gateway, child["token"]), 401, "invalid_api_key", None)
    for disabled in (True, False):
        refused = await patch(gateway, parent["token"], child["id"], {"disabled": disabled})
        assert_error(refused, 400, "key_revoked", None)
    again = await delete(gateway, parent["token"], child["id"])
    assert (again.status_code, again.json()["status"]) == (200, "revoked")
    async with gateway.client(parent["token"]) as client:
        listed = (await client.get("/v1/keys")).json()["data"]
    assert [(k["id"], k["status"]) for k in listed] == [(child["id"], "revoked")]


async def test_a_stale_change_cannot_undo_a_revocation(gateway: Gateway) -> None:
    """An enable that read the key before a concurrent revoke must not revive it."""
    parent, child = await family(gateway)
    keyring = gateway.runtime.keyring
    stale = keyring.get(child["id"])
    assert stale is not None
    assert (await delete(gateway, parent["token"], child["id"])).status_code == 200
    with pytest.raises(GatewayError) as refused:
        await keyring.change(stale, status="active")
    assert refused.value.code == "key_revoked"
    assert await status_code_of(gateway, child["token"]) == 401


async def test_dashboard_revoke_cascades_on_the_very_next_call(gateway: Gateway) -> None:
    parent, child = await family(gateway)
    other = await create_sub_key(gateway, parent["token"], name="other")
    assert (await chat(gateway, child["token"])).status_code == 200
    assert (await gateway.admin("POST", f"/admin/keys/{parent['id']}/revoke")).is_success
    for token in (parent["token"], child["token"], other["token"]):
        assert_error(await chat(gateway, token), 401, "invalid_api_key", None)
    for key in (child, other):
        stored = gateway.runtime.keyring.get(key["id"])
        assert stored is not None and stored.status == "revoked"


async def test_a_disabled_parent_suspends_its_sub_keys(gateway: Gateway) -> None:
    parent, child = await family(gateway)
    assert (await gateway.admin("POST", f"/admin/keys/{parent['id']}/disable")).is_success
    assert_error(await chat(gateway, child["token"]), 401, "invalid_api_key", None)
    assert (await gateway.admin("POST", f"/admin/keys/{parent['id']}/enable")).is_success
    assert (await chat(gateway, child["token"])).status_code == 200


async def test_expiry_of_the_sub_key_and_of_its_parent(
    clocked_gateway: Gateway, clock: FakeClock
) -> None:
    gw = clocked_gateway
    parent = await make_parent(gw, expires_at="2026-11-22T12:00:00Z")
    short = await create_sub_key(
        gw, parent["token"], name="short", expires_at="2026-11-22T11:00:00Z"
    )
    long = await create_sub_key(gw, parent["token"], name="long")
    assert long["expires_at"] == "2026-11-22T12:00:00Z"
    clock.advance(3600)  # 11:00:30
    assert await status_code_of(gw, short["token"]) == 401
    assert await status_code_of(gw, long["token"]) == 200
    async with gw.client(parent["token"]) as client:
        listed = {k["name"]: k["status"] for k in (await client.get("/v1/keys")).json()["data"]}
    assert listed == {"short": "expired", "long": "active"}
    clock.advance(3600)  # 12:00:30: the parent is expired, and so its sub-key
    assert await status_code_of(gw, long["token"]) == 401


async def test_a_call_in_progress_finishes_and_is_billed(gateway: Gateway) -> None:
    gateway.runtime.mock = MockProvider.for_models(gateway.runtime.config.models, chunk_delay=0.05)
    parent, child = await family(gateway)
    body = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "tell me a long story"}],
        "max_tokens": 40,
        "stream": True,
    }
    events: list[bytes] = []
    with trio.fail_after(30):
        async with (
            gateway.client(child["token"]) as client,
            client.stream("POST", "/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line.removeprefix("data: ").encode())
                if len(events) == 1:
                    revoked = await delete(gateway, parent["token"], child["id"])
                    assert revoked.status_code == 200
                    assert_error(await chat(gateway, child["token"]), 401, "invalid_api_key", None)
    assert events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert not any("error" in chunk for chunk in chunks)
    assert len(chunks) > 3
    spent = (await key_read(gateway, parent["token"]))["usage"]["day"]
    assert spent["spent_usd"] > 0 and spent["reserved_usd"] == 0


# -- rotation ----------------------------------------------------------------------------------


async def rotate(gw: Gateway, key_id: str) -> httpx.Response:
    return await gw.admin("POST", f"/admin/keys/{key_id}/rotate")


async def test_rotation(clocked_gateway: Gateway, clock: FakeClock) -> None:
    gw = clocked_gateway
    old, child = await family(gw, caps={"usd_day": 10, "rpm": 40}, default_tags={"a": "b"})
    assert (await chat(gw, child["token"])).status_code == 200
    spent_before = (await key_read(gw, old["token"]))["usage"]["day"]["spent_usd"]
    assert spent_before > 0

    response = await rotate(gw, old["id"])
    assert response.status_code == 201, response.text
    new = response.json()
    assert new["token"] != old["token"] and new["id"] != old["id"]
    assert new["prefix"][:6] == old["prefix"][:6]
    same = ("name", "mode", "environment", "scopes", "caps", "data_mode", "byok")
    same += ("allowed_model_keys", "required_tags", "default_tags", "org_id")
    assert {f: new[f] for f in same} == {f: old[f] for f in same}
    assert new["expires_at"] is None

    # both work; the new one has fresh counters; the old one expires in a day
    old_view, new_view = await key_read(gw, old["token"]), await key_read(gw, new["token"])
    assert old_view["expires_at"] == "2026-11-23T10:00:30Z"
    assert old_view["usage"]["day"]["spent_usd"] == spent_before
    assert new_view["usage"]["day"]["spent_usd"] == 0
    assert (old_view["sub_key_count"], new_view["sub_key_count"]) == (0, 1)

    # the sub-key moved under the new key, and shares its spend from now on
    assert (await key_read(gw, child["token"]))["parent_id"] == new["id"]
    assert (await chat(gw, child["token"], max_tokens=8)).status_code == 200
    child_day = (await key_read(gw, child["token"]))["usage"]["day"]["spent_usd"]
    new_day = (await key_read(gw, new["token"]))["usage"]["day"]["spent_usd"]
    assert 0 < new_day < child_day
    assert (await key_read(gw, old["token"]))["usage"]["day"]["spent_usd"] == spent_before

    # during the window each key has its own counters
    assert (await chat(gw, old["token"], max_tokens=4)).status_code == 200
    assert (await key_read(gw, new["token"]))["usage"]["day"]["spent_usd"] == new_day

    # the window ends: the old key is expired, the new key and the sub-key work on
    clock.advance(DAY - 1)
    assert await status_code_of(gw, old["token"]) == 200
    clock.advance(1)
    assert_error(await chat(gw, old["token"]), 401, "invalid_api_key", None)
    assert (await chat(gw, new["token"])).status_code == 200
    assert (await chat(gw, child["token"])).status_code == 200


async def test_a_restart_gives_spend_to_the_parent_of_its_time(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A sub-key's spend before a rotation counted on the old parent, after it on the new
    one; the start-up rebuild from the request records gives each the same figures."""
    config = make_config(tmp_path)
    gw = await start_gateway(nursery, config)
    old, child = await family(gw, caps={"usd_day": 10, "usd_month": 100})
    assert (await chat(gw, child["token"])).status_code == 200
    new = (await rotate(gw, old["id"])).json()
    assert (await chat(gw, child["token"], max_tokens=8)).status_code == 200

    async def usage(gw: Gateway) -> list[tuple[float, float]]:
        views = [await key_read(gw, k["token"]) for k in (old, new, child)]
        return [(v["usage"]["day"]["spent_usd"], v["usage"]["month"]["spent_usd"]) for v in views]

    before = await usage(gw)
    (old_day, _), (new_day, _), (child_day, _) = before
    assert 0 < old_day < child_day and 0 < new_day < child_day
    assert old_day + new_day == pytest.approx(child_day)
    await gw.aclose()
    again = await start_gateway(nursery, config)
    try:
        assert await usage(again) == before
    finally:
        again.stop.set()


async def test_a_rotation_is_written_all_or_nothing(gateway: Gateway) -> None:
    """The store operation of a rotation fails as a whole: here the new key's row clashes
    with an existing prefix (unique), after which nothing of the rotation is on disk."""
    old, child = await family(gateway)
    store = gateway.runtime.store
    before = {row["id"]: row for row in await store.read(records.all_keys)}
    clash = {**before[child["id"]], "id": "key_clash", "parent_id": None}  # same prefix
    with pytest.raises((sqlite3.IntegrityError, psycopg.errors.UniqueViolation)):
        await store.write(
            records.rotate_key, clash, old["id"], {"rotated_to": "key_clash"}, [child["id"]]
        )
    assert {row["id"]: row for row in await store.read(records.all_keys)} == before


async def test_the_old_key_manages_the_moved_sub_keys(gateway: Gateway) -> None:
    old, child = await family(gateway)
    new = (await rotate(gateway, old["id"])).json()
    async with gateway.client(old["token"]) as client:
        listed = (await client.get("/v1/keys")).json()["data"]
    assert [k["id"] for k in listed] == [child["id"]]
    late = await create_sub_key(gateway, old["token"], name="late")
    assert late["parent_id"] == new["id"]
    off = await patch(gateway, old["token"], child["id"], {"disabled": True})
    assert off.json()["status"] == "disabled"
    on = await patch(gateway, new["token"], child["id"], {"disabled": False})
    assert on.json()["status"] == "active"


async def test_rotation_refusals_and_status(gateway: Gateway) -> None:
    old, child = await family(gateway)
    assert (await rotate(gateway, old["id"])).status_code == 201
    assert_error(await rotate(gateway, old["id"]), 400, "invalid_request", None)
    assert_error(await rotate(gateway, child["id"]), 400, "invalid_request", None)
    revoked = await make_parent(gateway, name="revoked")
    assert (await gateway.admin("POST", f"/admin/keys/{revoked['id']}/revoke")).is_success
    assert_error(await rotate(gateway, revoked["id"]), 400, "key_revoked", None)
    disabled = await make_parent(gateway, name="disabled")
    assert (await gateway.admin("POST", f"/admin/keys/{disabled['id']}/disable")).is_success
    rotated = await rotate(gateway, disabled["id"])
    assert (rotated.status_code, rotated.json()["status"]) == (201, "disabled")
    assert await status_code_of(gateway, rotated.json()["token"]) == 401


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("keys_manage", "no"),
        ("byok", "yes"),
        ("byok", 1),
        ("expires_at", "9999-12-31T23:59:59-23:59"),
        ("parent_id", "key_abc"),  # a field of sub-keys: refused, not a root key
        ("allowed_model", ["gpt-4o-mini"]),  # a typo: refused, not an unrestricted key
    ],
)
async def test_admin_key_fields_of_the_wrong_kind_are_400(
    gateway: Gateway, field: str, value: object
) -> None:
    body = {"org_id": gateway.org_id, "name": "odd", "mode": "sandbox", field: value}
    response = await gateway.admin("POST", "/admin/keys", body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field
    listing = await gateway.admin("GET", f"/admin/keys?org_id={gateway.org_id}")
    assert listing.status_code == 200 and all(k["name"] != "odd" for k in listing.json()["data"])
