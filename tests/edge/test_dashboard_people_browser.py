"""The dashboard's second round in a real browser (issue 33, point 5): people, models and
time ranges, as an owner, an admin and a viewer would use them. The same server, browser
and screenshots as tests/edge/test_dashboard_browser.py (its fixtures, imported)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest

from tests.edge import test_dashboard_browser as first_round
from tests.edge.test_dashboard_browser import Site, ask, shot, sign_in

pytestmark = pytest.mark.browser

# the first round's fixtures: its server with two organisations, the browser, new pages
site, browser, new_page = first_round.site, first_round.browser, first_round.new_page

NEW_PASSWORD = "a passphrase of my own choosing"


def invite(page: Any, email: str, role: str) -> str:
    """Invite from the Users page; answer the one-time password shown once."""
    page.goto("/dashboard/users")
    page.get_by_label("Email of the person to invite").fill(email)
    page.get_by_label("Role", exact=True).select_option(role)
    page.get_by_role("button", name="Invite").click()
    page.get_by_text("it is shown only once").wait_for()
    return str(page.locator("#password").input_value())


def choose_password(page: Any, current: str) -> None:
    page.get_by_label("Current password").fill(current)
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    page.get_by_text("Your password is changed").wait_for()


def audit_actions(page: Any) -> list[str]:
    page.goto("/dashboard/audit")
    return [str(a) for a in page.locator("tr[data-action]").evaluate_all(
        "rows => rows.map(r => r.dataset.action)"
    )]  # fmt: skip


def test_people_invited_sign_in_change_roles_and_are_disabled(site: Site, new_page: Any) -> None:
    owner = new_page()
    sign_in(owner, site.emails["owner_a"])
    one_time = {}
    for role in ("admin", "viewer"):
        one_time[role] = invite(owner, f"new-{role}@acme.example", role)
        if role == "admin":
            shot(owner, "user-invited")
    owner.goto("/dashboard/users")
    assert owner.get_by_text("one-time password not yet replaced").count() == 2
    shot(owner, "users")

    people = {}
    for role in ("admin", "viewer"):
        page = new_page()
        sign_in(page, f"new-{role}@acme.example", one_time[role])
        assert page.url.endswith("/dashboard/account")  # the one-time password must go first
        assert page.get_by_text("choose your own to continue").is_visible()
        page.goto("/dashboard/keys")
        assert page.url.endswith("/dashboard/account")
        if role == "admin":
            shot(page, "account-first-sign-in")
        choose_password(page, one_time[role])
        page.goto("/dashboard/keys")
        assert page.url.endswith("/dashboard/keys")
        people[role] = page
    assert sign_in(new_page(), "new-viewer@acme.example", one_time["viewer"]).status == 401

    # a viewer is refused the users page; an admin sees it without the owner's controls
    viewer, admin = people["viewer"], people["admin"]
    assert viewer.goto("/dashboard/users").status == 403
    assert viewer.get_by_role("link", name="Users").count() == 0
    assert admin.goto("/dashboard/users").status == 200
    assert admin.get_by_role("button", name="Invite").count() == 0

    # the owner makes the viewer an admin, then disables the first admin: its session ends
    owner.goto("/dashboard/users")
    owner.get_by_label("Role of new-viewer@acme.example", exact=True).select_option("admin")
    owner.get_by_role("button", name="Change the role of new-viewer@acme.example").click()
    assert "is now admin" in owner.get_by_role("status").inner_text()
    owner.get_by_role("button", name="Disable new-admin@acme.example").click()
    assert "is disabled" in owner.get_by_role("status").inner_text()
    admin.goto("/dashboard/keys")
    assert admin.url.endswith("/dashboard/login")  # at once, on its very next page
    viewer.goto("/dashboard/users")  # the former viewer, an admin now
    assert viewer.get_by_role("heading", name="Users").is_visible()

    actions = audit_actions(owner)
    shot(owner, "audit")
    assert actions[:6] == [
        "user.disabled", "user.role_changed", "user.password_changed",
        "user.password_changed", "user.invited", "user.invited",
    ]  # fmt: skip
    assert owner.get_by_text("new-viewer@acme.example").first.is_visible()


def test_the_last_owner_cannot_remove_themself(site: Site, new_page: Any) -> None:
    page = new_page()
    sign_in(page, site.emails["owner_b"])
    page.goto("/dashboard/users")
    email = site.emails["owner_b"]
    page.get_by_label(f"Role of {email}", exact=True).select_option("viewer")
    with page.expect_navigation() as nav:
        page.get_by_role("button", name=f"Change the role of {email}").click()
    assert nav.value.status == 409
    assert "at least one active owner" in page.inner_text("main")
    shot(page, "last-owner")
    page.goto("/dashboard/users")
    with page.expect_navigation() as nav:
        page.get_by_role("button", name=f"Disable {email}").click()
    assert nav.value.status == 409
    page.goto("/dashboard/users")
    assert page.locator("tr", has_text=email).locator(".badge.role-owner").is_visible()


def test_the_models_page_matches_v1_models(site: Site, new_page: Any) -> None:
    listed = site.server.get("/v1/models", site.b_key["token"]).json()["data"]
    page = new_page()
    sign_in(page, site.emails["owner_b"])
    page.get_by_role("link", name="Models").click()
    shown = page.locator("tr[data-model-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.modelId)"
    )
    assert shown == [m["id"] for m in listed] and shown
    for model in listed:
        row = page.locator(f'tr[data-model-id="{model["id"]}"]').inner_text()
        for price in model["pricing"].values():
            if price is not None:
                assert f"${price:g}" in row, (model["id"], price, row)
    shot(page, "models")


def test_usage_for_a_custom_range_matches_v1_usage(site: Site, new_page: Any) -> None:
    token = site.b_key["token"]
    for content in ("one", "two", "three"):
        ask(site, token, f"custom range {content}")
    today = datetime.now(UTC).date().isoformat()
    page = new_page()
    sign_in(page, site.emails["owner_b"])
    page.goto("/dashboard/usage")
    page.get_by_label("Dates").select_option("custom")
    page.get_by_label("From (custom)").fill(today)
    page.get_by_label("To (custom, included)").fill(today)
    page.get_by_label("Group by", exact=True).select_option("model")
    page.get_by_role("button", name="Show").click()
    shot(page, "usage-range")
    usage = site.server.get(f"/v1/usage?start={today}&end={today}&group_by=model", token).json()
    foot = page.locator("tfoot .amount").evaluate_all("spans => spans.map(s => s.title)")
    exact = [f"${usage['totals'][f]:.9f}".rstrip("0").rstrip(".") + " exactly"
             for f in ("settled_usd", "cost_usd")]  # fmt: skip
    assert foot == exact
    assert page.locator("tfoot").inner_text().split()[1] == str(usage["totals"]["requests"])

    page.goto("/dashboard/requests")
    page.get_by_label("Dates").select_option("today")
    page.get_by_role("button", name="Filter").click()
    rows = page.locator("table.requests tbody tr")
    assert rows.count() == usage["totals"]["requests"]
    shot(page, "requests-range")
    assert re.search(r"range=today", page.url)
