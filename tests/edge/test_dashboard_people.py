"""Users in the dashboard (issue 33, point 1) and the Models page (point 2), over real
HTTP against an in-process gateway on both stores: invitations with a one-time password,
roles, disabling, the last owner, one's own password, the audit list; the models page
against ``/v1/models``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.store.dashboard import user_by_email
from tests.conftest import Gateway
from tests.edge.test_dashboard_auth import PASSWORD, admin_user, csrf_in, sign_in_status, signed_in

pytestmark = pytest.mark.both_stores

NEW_PASSWORD = "my very own passphrase"


@asynccontextmanager
async def owner(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, answer):
        assert answer.status_code == 303
        yield client


async def post(client: httpx.AsyncClient, path: str, **data: str) -> httpx.Response:
    csrf = csrf_in((await client.get("/dashboard/account")).text)
    return await client.post(path, data={"csrf_token": csrf, **data})


async def invite(client: httpx.AsyncClient, email: str, role: str) -> str:
    answer = await post(client, "/dashboard/users", email=email, role=role)
    assert answer.status_code == 200, answer.text
    found = re.search(r'id="password" class="mono" readonly value="([^"]+)"', answer.text)
    assert found is not None
    return found.group(1)


async def ids(gateway: Gateway) -> dict[str, str]:
    listed = await gateway.admin("GET", f"/admin/users?org_id={gateway.org_id}")
    return {u["email"]: u["id"] for u in listed.json()["data"]}


async def test_an_invited_user_signs_in_once_then_chooses_a_password(gateway: Gateway) -> None:
    async with owner(gateway) as client:
        one_time = await invite(client, "Admin@Example.com", "admin")
        assert len(one_time) == 24
        listing = (await client.get("/dashboard/users")).text
        assert "admin@example.com" in listing and one_time not in listing
        assert "one-time password not yet replaced" in listing
    stored = await gateway.runtime.store.read(user_by_email, "admin@example.com")
    assert stored is not None and stored["password_hash"].startswith("$argon2id$")
    assert one_time not in str(stored) and stored["password_temporary"] == 1
    async with signed_in(gateway, "admin@example.com", one_time) as (client, answer):
        assert answer.headers["location"] == "/dashboard/account"
        keys = await client.get("/dashboard/keys")  # every other page waits for a new password
        assert keys.status_code == 303 and keys.headers["location"] == "/dashboard/account"
        account = await client.get("/dashboard/account")
        assert "choose your own to continue" in account.text
        wrong = await post(
            client, "/dashboard/account/password",
            current="not it at all", new=NEW_PASSWORD, confirm=NEW_PASSWORD,
        )  # fmt: skip
        assert wrong.status_code == 400 and "not your current password" in wrong.text
        differ = await post(
            client, "/dashboard/account/password",
            current=one_time, new=NEW_PASSWORD, confirm=NEW_PASSWORD + "!",
        )  # fmt: skip
        assert differ.status_code == 400 and "differ" in differ.text
        done = await post(
            client, "/dashboard/account/password",
            current=one_time, new=NEW_PASSWORD, confirm=NEW_PASSWORD,
        )  # fmt: skip
        assert done.status_code == 303
        assert (await client.get("/dashboard/keys")).status_code == 200  # this session stays
    assert await sign_in_status(gateway, "admin@example.com", one_time) == 401
    assert await sign_in_status(gateway, "admin@example.com", NEW_PASSWORD) == 303


async def test_changing_ones_password_ends_the_other_sessions(gateway: Gateway) -> None:
    await admin_user(gateway, email="v@example.com", role="viewer", password=PASSWORD)
    async with signed_in(gateway, "v@example.com") as (other, _):
        async with signed_in(gateway, "v@example.com") as (client, _):
            changed = await post(
                client, "/dashboard/account/password",
                current=PASSWORD, new=NEW_PASSWORD, confirm=NEW_PASSWORD,
            )  # fmt: skip
            assert changed.status_code == 303
            assert (await client.get("/dashboard/keys")).status_code == 200
        assert (await other.get("/dashboard/keys")).headers["location"] == "/dashboard/login"


async def test_roles_disabling_and_the_last_owner(gateway: Gateway) -> None:
    async with owner(gateway) as client:
        await invite(client, "v@example.com", "viewer")
        known = await ids(gateway)
        me, viewer = known["o@example.com"], known["v@example.com"]
        # the only owner can neither step down nor be disabled
        for path, data in ((f"/dashboard/users/{me}/role", {"role": "admin"}),
                           (f"/dashboard/users/{me}/disable", {})):  # fmt: skip
            refused = await post(client, path, **data)
            assert refused.status_code == 409 and "at least one active owner" in refused.text
        promoted = await post(client, f"/dashboard/users/{viewer}/role", role="owner")
        assert promoted.status_code == 303
        assert "is now owner" in (await client.get(promoted.headers["location"])).text
        disabled = await post(client, f"/dashboard/users/{viewer}/disable")
        assert disabled.status_code == 303
        # a disabled owner does not count: this one is still the last active owner
        refused = await post(client, f"/dashboard/users/{me}/role", role="viewer")
        assert refused.status_code == 409
        await post(client, f"/dashboard/users/{viewer}/enable")
        bad = await post(client, f"/dashboard/users/{viewer}/role", role="root")
        assert bad.status_code == 400
        audit = (await client.get("/dashboard/audit")).text
        actions = re.findall(r'data-action="([\w.]+)"', audit)
        assert actions == [
            "user.enabled", "user.disabled", "user.role_changed", "user.invited",
        ]  # fmt: skip
        assert "o@example.com" in audit and "v@example.com" in audit and "to owner" in audit


async def test_a_disabled_users_session_ends_at_once(gateway: Gateway) -> None:
    async with owner(gateway) as client:
        await admin_user(gateway, email="a@example.com", role="admin", password=PASSWORD)
        admin_id = (await ids(gateway))["a@example.com"]
        async with signed_in(gateway, "a@example.com") as (admin, _):
            assert (await admin.get("/dashboard/keys")).status_code == 200
            assert (await post(client, f"/dashboard/users/{admin_id}/disable")).status_code == 303
            gone = await admin.get("/dashboard/keys")
            assert gone.status_code == 303 and gone.headers["location"] == "/dashboard/login"
        assert await sign_in_status(gateway, "a@example.com") == 401


async def test_who_may_see_and_change_users(gateway: Gateway) -> None:
    other_org = (await gateway.admin("POST", "/admin/orgs", {"name": "other"})).json()["id"]
    await admin_user(gateway, org_id=other_org, email="x@other.example", role="owner")
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    await admin_user(gateway, email="a@example.com", role="admin", password=PASSWORD)
    await admin_user(gateway, email="v@example.com", role="viewer", password=PASSWORD)
    known = await ids(gateway)
    theirs = (await gateway.admin("GET", f"/admin/users?org_id={other_org}")).json()["data"][0]
    async with signed_in(gateway, "v@example.com") as (viewer, _):
        assert (await viewer.get("/dashboard/users")).status_code == 403
        assert (await viewer.get("/dashboard/audit")).status_code == 403
        assert 'href="/dashboard/users"' not in (await viewer.get("/dashboard/keys")).text
        refused = await post(viewer, "/dashboard/users", email="n@example.com", role="owner")
        assert refused.status_code == 403
    async with signed_in(gateway, "a@example.com") as (admin, _):
        page = await admin.get("/dashboard/users")
        assert page.status_code == 200 and "v@example.com" in page.text
        assert "x@other.example" not in page.text and "Invite" not in page.text
        assert (await admin.get("/dashboard/audit")).status_code == 403
        for path in ("/dashboard/users", f"/dashboard/users/{known['v@example.com']}/role",
                     f"/dashboard/users/{known['o@example.com']}/disable"):  # fmt: skip
            answer = await post(admin, path, email="n@example.com", role="owner")
            assert answer.status_code == 403, path
    async with signed_in(gateway, "o@example.com") as (client, _):
        for action in ("disable", "role"):
            answer = await post(client, f"/dashboard/users/{theirs['id']}/{action}", role="viewer")
            assert answer.status_code == 404 and "other.example" not in answer.text
        taken = await post(client, "/dashboard/users", email="x@other.example", role="viewer")
        assert taken.status_code == 400 and "exists" in taken.text
        no_csrf = await client.post("/dashboard/users", data={"email": "n@example.com"})
        assert no_csrf.status_code == 403
    listed = (await gateway.admin("GET", f"/admin/users?org_id={other_org}")).json()["data"]
    assert listed[0]["status"] == "active" and listed[0]["role"] == "owner"
    listed = (await gateway.admin("GET", f"/admin/users?org_id={gateway.org_id}")).json()["data"]
    assert {u["email"]: u["role"] for u in listed} == {
        "o@example.com": "owner", "a@example.com": "admin", "v@example.com": "viewer",
    }  # fmt: skip


async def test_key_changes_are_in_the_audit_list(gateway: Gateway) -> None:
    key = await gateway.create_key(name="audited")
    async with owner(gateway) as client:
        assert (await post(client, f"/dashboard/keys/{key['id']}/disable")).status_code == 303
        audit = (await client.get("/dashboard/audit")).text
    assert re.findall(r'data-action="([\w.]+)"', audit) == ["key.disabled"]
    assert "audited" in audit and key["token"] not in audit


async def test_the_models_page_lists_what_v1_models_lists(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as api:
        listed = (await api.get("/v1/models")).json()["data"]
    assert listed
    async with owner(gateway) as client:
        page = (await client.get("/dashboard/models")).text
    shown = re.findall(r'<tr data-model-id="([^"]+)"', page)
    assert shown == [m["id"] for m in listed]
    for model in listed:
        row = page[page.index(f'data-model-id="{model["id"]}"') :].split("</tr>")[0]
        for price in model["pricing"].values():
            if price is not None:
                assert f"${price:g}" in row or f"${price}" in row, (model["id"], price)
