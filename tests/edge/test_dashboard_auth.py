"""The dashboard's session, password and lock-out code, then the same rules over real HTTP.

Unit tests of pure parts (signing, CSRF, argon2 hashing, the throttle on an injected clock,
formatting, the chart), and an in-process gateway on a loopback port (tests/conftest.py)
for the admin API's users, the cookie's attributes and what a session may do. The users,
sessions and secrets live in the store: the module runs on both stores.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import date, timedelta
from typing import Any

import httpx
import pytest

from gateway.edge.dashboard import passwords, sessions
from gateway.edge.dashboard.chart import bar_chart
from gateway.edge.dashboard.format import relative
from gateway.edge.dashboard.throttle import LOCK_S, MAX_FAILURES, WINDOW_S, LoginThrottle
from gateway.errors import GatewayError
from tests.conftest import Gateway

pytestmark = pytest.mark.both_stores

SECRET = sessions.new_secret()
PASSWORD = "a long enough passphrase"

# -- sessions and CSRF ---------------------------------------------------------------------


def test_a_signed_session_reads_back_and_a_tampered_one_does_not() -> None:
    token = sessions.new_token()
    cookie = sessions.sign(SECRET, token)
    assert sessions.unsign(SECRET, cookie) == token
    other = sessions.new_token()
    forged = f"{other}.{cookie.rpartition('.')[2]}"  # another token, the old signature
    for bad in (forged, token, "", None, f"{token}.", f".{cookie}", cookie + "x"):
        assert sessions.unsign(SECRET, bad) is None, bad
    assert sessions.unsign(sessions.new_secret(), cookie) is None  # another deployment


def test_the_store_keeps_a_hash_of_the_session_token() -> None:
    token = sessions.new_token()
    assert len(token) >= 43  # 256 bits
    sid = sessions.session_id(token)
    assert re.fullmatch(r"[0-9a-f]{64}", sid) and token not in sid


def test_csrf_tokens_are_bound_to_their_session() -> None:
    one, two = sessions.session_id("a"), sessions.session_id("b")
    token = sessions.csrf_token(SECRET, one)
    assert sessions.csrf_ok(SECRET, one, token)
    assert not sessions.csrf_ok(SECRET, two, token)
    assert not sessions.csrf_ok(sessions.new_secret(), one, token)
    for given in (None, "", token[:-1], token + "A"):
        assert not sessions.csrf_ok(SECRET, one, given)
    assert not sessions.csrf_ok(SECRET, None, token)


# -- passwords -----------------------------------------------------------------------------


def test_passwords_are_argon2id_with_the_chosen_parameters() -> None:
    stored = passwords.hash_now(PASSWORD)
    assert stored.startswith("$argon2id$v=19$m=65536,t=3,p=4$")
    assert PASSWORD not in stored
    assert passwords.hash_now(PASSWORD) != stored  # salted
    assert passwords.verify_now(stored, PASSWORD)
    assert not passwords.verify_now(stored, PASSWORD + " ")
    assert not passwords.verify_now(None, PASSWORD)  # no such user: the dummy, and False
    assert not passwords.verify_now("not a hash", PASSWORD)
    assert not passwords.needs_rehash(stored)
    weaker = passwords.PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1)
    assert passwords.needs_rehash(weaker.hash(PASSWORD))


@pytest.mark.parametrize(
    ("password", "ok"),
    [("x" * 11, False), ("x" * 12, True), ("x" * 1024, True), ("x" * 1025, False), (None, False),
     (123456789012, False)],
)  # fmt: skip
def test_password_rules(password: Any, ok: bool) -> None:
    if ok:
        assert passwords.check_rules(password) == password
    else:
        with pytest.raises(GatewayError) as refused:
            passwords.check_rules(password)
        assert refused.value.param == "password" and refused.value.status == 400


def test_generated_passwords_are_long_and_fresh() -> None:
    made = {passwords.new_password() for _ in range(50)}
    assert len(made) == 50 and all(len(p) == 24 for p in made)


async def test_hashing_runs_off_the_event_loop() -> None:
    hashing = passwords.Hashing()
    stored = await hashing.hash(PASSWORD)
    assert await hashing.verify(stored, PASSWORD)
    assert not await hashing.verify(stored, "wrong password!")


# -- lock-out ------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_fifth_failure_locks_and_the_lock_ends() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(MAX_FAILURES - 1):
        assert throttle.failure("a@x.example") == 0
        assert throttle.locked_for("a@x.example") == 0
    assert throttle.failure("a@x.example") == LOCK_S
    assert throttle.locked_for("a@x.example") == LOCK_S
    assert throttle.locked_for("b@x.example") == 0  # per email
    clock.now += LOCK_S - 1
    assert throttle.locked_for("a@x.example") == 1
    clock.now += 1
    assert throttle.locked_for("a@x.example") == 0
    assert throttle.failure("a@x.example") == 0  # a fresh count after the lock


def test_failures_outside_the_window_do_not_add_up() -> None:
    clock = Clock()
    throttle = LoginThrottle(clock)
    for _ in range(MAX_FAILURES - 1):
        throttle.failure("a@x.example")
    clock.now += WINDOW_S + 1
    assert throttle.failure("a@x.example") == 0


def test_a_success_clears_and_memory_is_bounded() -> None:
    throttle = LoginThrottle(Clock(), capacity=3)
    for _ in range(MAX_FAILURES - 1):
        throttle.failure("a@x.example")
    throttle.clear("a@x.example")
    assert throttle.failure("a@x.example") == 0
    for name in "bcd":
        throttle.failure(f"{name}@x.example")
    assert len(throttle._entries) == 3 and "a@x.example" not in throttle._entries


# -- formatting and the chart --------------------------------------------------------------


@pytest.mark.parametrize(
    ("delta", "text"),
    [(-5, "just now"), (-90, "2 minutes ago"), (3 * 3600, "in 3 hours"),
     (86400 - 60, "in 24 hours"), (-40 * 86400, "1 month ago")],
)  # fmt: skip
def test_relative_hints(delta: float, text: str) -> None:
    assert relative(1_000_000 + delta, 1_000_000) == text


def test_the_chart_stacks_groups_and_folds_the_small_ones() -> None:
    days = [date(2026, 11, 1) + timedelta(days=i) for i in range(30)]
    points = {("2026-11-03", f"key{i}"): float(i + 1) for i in range(9)}
    svg, legend = bar_chart(days, points, "spend <by key>")
    assert [s.name for s in legend][:2] == ["key8", "key7"] and legend[-1].name == "other"
    assert legend[-1].total == 1 + 2 + 3  # the three smallest
    assert svg.count("<rect") == 7 and "spend &lt;by key&gt;" in svg
    assert "<title>2026-11-03 · key8: $9.0000</title>" in svg
    empty, none = bar_chart(days, {}, "nothing")
    assert none == [] and "<rect" not in empty


# -- over HTTP: the admin API's users and the sessions -------------------------------------


async def admin_user(gw: Gateway, **body: Any) -> httpx.Response:
    body.setdefault("org_id", gw.org_id)
    return await gw.admin("POST", "/admin/users", body)


@asynccontextmanager
async def signed_in(
    gw: Gateway, email: str, password: str = PASSWORD, **headers: str
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.Response]]:
    """A client after a sign-in (a session if it succeeded), and the sign-in's answer."""
    async with gw.client(follow_redirects=False) as client:
        form = await client.get("/dashboard/login", headers=headers)
        data = {"email": email, "password": password, "csrf_token": csrf_in(form.text)}
        yield client, await client.post("/dashboard/login", data=data, headers=headers)


async def sign_in_status(gw: Gateway, email: str, password: str = PASSWORD) -> int:
    async with signed_in(gw, email, password) as (_client, answer):
        return int(answer.status_code)


def csrf_in(page: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert found is not None
    return found.group(1)


async def test_admin_users_create_list_and_refuse(gateway: Gateway) -> None:
    made = await admin_user(gateway, email=" Owner@Example.COM ", role="owner")
    assert made.status_code == 201
    user = made.json()
    assert user["email"] == "owner@example.com" and user["role"] == "owner"
    assert len(user["password"]) == 24 and "password_hash" not in user
    given = await admin_user(gateway, email="v@example.com", role="viewer", password=PASSWORD)
    assert given.status_code == 201 and "password" not in given.json()
    listed = (await gateway.admin("GET", f"/admin/users?org_id={gateway.org_id}")).json()
    assert [u["email"] for u in listed["data"]] == ["owner@example.com", "v@example.com"]
    for body, param in (
        ({"email": "owner@example.com", "role": "admin"}, "email"),  # taken
        ({"email": "nobody", "role": "admin"}, "email"),
        ({"email": "a@example.com", "role": "root"}, "role"),
        ({"email": "a@example.com", "role": "admin", "password": "short"}, "password"),
        ({"email": "a@example.com", "role": "admin", "extra": 1}, "extra"),
    ):
        refused = await admin_user(gateway, **body)
        assert refused.status_code == 400, body
        assert refused.json()["error"]["param"] == param
    unknown_org = await admin_user(gateway, org_id="org_nope", email="z@example.com", role="admin")
    assert unknown_org.status_code == 404
    assert (await gateway.admin("POST", "/admin/users/user_nope/disable")).status_code == 404
    async with gateway.client() as anonymous:
        assert (await anonymous.get("/admin/users")).status_code in (401, 404)


async def test_cookie_attributes_and_secure_over_https(gateway: Gateway) -> None:
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, answer):
        assert answer.status_code == 303 and answer.headers["location"] == "/dashboard/keys"
        cookie = next(
            c for c in answer.headers.get_list("set-cookie") if c.startswith("svc_dashboard=")
        )
        for part in ("HttpOnly", "SameSite=Strict", "Path=/dashboard", "Max-Age=28800"):
            assert part in cookie
        assert "Secure" not in cookie
        keys = await client.get("/dashboard/keys")
        assert keys.status_code == 200 and "o@example.com" in keys.text
        assert "default-src 'self'" in keys.headers["content-security-policy"]
    async with signed_in(gateway, "o@example.com", **{"X-Forwarded-Proto": "https"}) as (
        client,
        answer,
    ):
        assert all("Secure" in c for c in answer.headers.get_list("set-cookie"))


async def test_the_login_form_needs_its_csrf_token(gateway: Gateway) -> None:
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with gateway.client(follow_redirects=False) as client:
        data = {"email": "o@example.com", "password": PASSWORD}
        answer = await client.post("/dashboard/login", data=data)
        assert answer.status_code == 403 and "CSRF" in answer.text
        assert "svc_dashboard=" not in answer.headers.get("set-cookie", "")


async def test_disabling_or_resetting_a_user_ends_its_sessions(gateway: Gateway) -> None:
    user = await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    user_id = user.json()["id"]
    async with signed_in(gateway, "o@example.com") as (client, _):
        assert (await client.get("/dashboard/keys")).status_code == 200
        disabled = await gateway.admin("POST", f"/admin/users/{user_id}/disable")
        assert disabled.json()["status"] == "disabled"
        assert (await client.get("/dashboard/keys")).headers["location"] == "/dashboard/login"
    assert (
        await sign_in_status(gateway, "o@example.com") == 401
    )  # a disabled user cannot sign in, and is not told why
    await gateway.admin("POST", f"/admin/users/{user_id}/enable")
    async with signed_in(gateway, "o@example.com") as (client, answer):
        assert answer.status_code == 303
        reset = await gateway.admin("POST", f"/admin/users/{user_id}/reset-password")
        new_password = reset.json()["password"]
        assert (await client.get("/dashboard/keys")).status_code == 303
    assert await sign_in_status(gateway, "o@example.com") == 401
    async with signed_in(gateway, "o@example.com", new_password) as (client, answer):
        assert answer.status_code == 303


async def test_every_page_and_action_refuses_another_organisations_ids(gateway: Gateway) -> None:
    other = (await gateway.admin("POST", "/admin/orgs", {"name": "other"})).json()["id"]
    theirs = await gateway.create_key(org_id=other, name="their-key")
    await admin_user(gateway, email="o@example.com", role="owner", password=PASSWORD)
    async with signed_in(gateway, "o@example.com") as (client, _):
        csrf = csrf_in((await client.get("/dashboard/keys")).text)
        key_paths = [f"/dashboard/keys/{theirs['id']}/{page}" for page in ("caps", "revoke")]
        for path in (*key_paths, "/dashboard/requests/req_000000000000000000000000"):
            page = await client.get(path)
            assert page.status_code == 404 and "their-key" not in page.text, path
        for action in ("rotate", "revoke", "disable", "enable", "caps"):
            data = {"csrf_token": csrf, "caps.rpm": "1"}
            answer = await client.post(f"/dashboard/keys/{theirs['id']}/{action}", data=data)
            assert answer.status_code == 404 and "their-key" not in answer.text, action
        listing = await client.get(f"/dashboard/requests?key_id={theirs['id']}")
        assert listing.status_code == 200 and "their-key" not in listing.text
    key = gateway.runtime.keyring.get(theirs["id"])
    assert key is not None and key.status == "active" and key.caps.rpm == 60


async def test_viewers_are_refused_every_change(gateway: Gateway) -> None:
    mine = await gateway.create_key(name="mine")
    await admin_user(gateway, email="v@example.com", role="viewer", password=PASSWORD)
    async with signed_in(gateway, "v@example.com") as (client, _):
        keys = await client.get("/dashboard/keys")
        assert "mine" in keys.text and "Create key" not in keys.text and "Rotate" not in keys.text
        csrf = csrf_in(keys.text)
        for path in ("/dashboard/keys", *(f"/dashboard/keys/{mine['id']}/{a}" for a in
                     ("rotate", "revoke", "disable", "enable", "caps"))):  # fmt: skip
            answer = await client.post(path, data={"csrf_token": csrf, "name": "x"})
            assert answer.status_code == 403, path
        # viewers still sign out
        assert (
            await client.post("/dashboard/logout", data={"csrf_token": csrf})
        ).status_code == 303
    key = gateway.runtime.keyring.get(mine["id"])
    assert key is not None and key.status == "active" and key.rotated_to is None


async def test_admin_patch_caps_follows_the_sub_key_rules(gateway: Gateway) -> None:
    parent = await gateway.create_key(caps={"usd_day": 10}, keys_manage=True)
    async with gateway.client(parent["token"]) as client:
        child = (await client.post("/v1/keys", json={"name": "child"})).json()
    caps = f"/admin/keys/{child['id']}/caps"
    over = await gateway.admin("PATCH", caps, {"usd_day": 11})
    assert over.status_code == 400 and over.json()["error"]["code"] == "child_exceeds_parent"
    ok = await gateway.admin("PATCH", caps, {"usd_day": 4})
    assert ok.status_code == 200 and ok.json()["caps"]["usd_day"] == 4
    root = f"/admin/keys/{parent['id']}/caps"
    assert (await gateway.admin("PATCH", root, {"usd_day": None})).json()["caps"]["usd_day"] is None
    for body in ({"name": "x"}, {"rpm": None}, {"rpm": 0}, [5]):
        refused = await gateway.admin("PATCH", root, body)
        assert refused.status_code == 400, body
    assert (await gateway.admin("PATCH", "/admin/keys/key_nope/caps", {})).status_code == 404
