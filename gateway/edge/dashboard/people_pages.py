"""The People pages: an organisation's dashboard users and the audit list; a user's own
account (its password).

Who may do what: owners invite users (an email and a role; a one-time password shown
once, stored only as its argon2id hash), change roles, disable and re-enable users, and
read the audit list; admins see the users; viewers are refused both pages. Nobody can
leave the organisation without an active owner (the store checks it in the change's
transaction). Disabling a user ends its sessions at once. Every user changes its own
password on ``/dashboard/account`` (the current one required); its other sessions end.
"""

from __future__ import annotations

from typing import Any

from quart import Response, request

from gateway.edge.dashboard import audit, paging, passwords, users
from gateway.edge.dashboard.app_state import state
from gateway.edge.dashboard.web import (
    Refused,
    User,
    bp,
    checked_form,
    owners_only,
    page,
    page_user,
    see_other,
)
from gateway.edge.http import runtime
from gateway.errors import GatewayError
from gateway.store import dashboard as ops
from gateway.store import dashboard_people as people

AUDIT_PAGE = 100
NOTICES = {
    "role": "The role of {email} is now {role}.",
    "disabled": "{email} is disabled: signed out everywhere, and cannot sign in.",
    "active": "{email} can sign in again.",
}
LAST_OWNER = (
    "An organisation keeps at least one active owner: make another user an owner first, "
    "then change this one."
)


def _not_viewer(user: User) -> None:
    if not user.can_edit:
        raise Refused(
            403,
            "Viewers cannot see the users",
            "Your role is viewer. Ask an owner of your organisation who has access.",
        )


async def _users_page(
    user: User, status: int = 200, errors: dict[str, str] | None = None, **extra: Any
) -> Response:
    rows = await runtime().store.read(ops.list_users, user.org_id)
    notice = None
    kind, _, user_id = request.args.get("notice", "").partition(":")
    named = next((r for r in rows if r["id"] == user_id), None)
    if kind in NOTICES and named is not None:
        notice = NOTICES[kind].format(email=named["email"], role=named["role"])
    return await page(
        "users.html",
        status,
        nav="users",
        people=rows,
        roles=users.ROLES,
        errors=errors or {},
        notice=notice,
        values=extra.pop("values", {"role": "viewer"}),
        **extra,
    )


@bp.get("/users")
async def users_list() -> Response:
    user = await page_user()
    _not_viewer(user)
    return await _users_page(user)


@bp.post("/users")
async def invite() -> Response:
    user = await page_user()
    form = await checked_form(user)
    owners_only(user, "invite users")
    rt = runtime()
    body = {"email": form.get("email", ""), "role": form.get("role", "")}
    try:
        row, password = await users.create_user(rt, state(), user.org_id, body)
    except GatewayError as error:
        errors = {error.param or "form": error.message or ""}
        return await _users_page(user, 400, errors, values=body)
    await audit.record(user, "user.invited", row["email"], f"as {row['role']}")
    return await page("user_invited.html", nav="users", invited=row, password=password)


def _org_user_id(user_id: str) -> str:
    if not user_id.startswith("user_"):
        raise GatewayError("not_found", f"No user {user_id} in your organisation.")
    return user_id


async def _change(
    user: User, user_id: str, values: dict[str, Any], action: str, detail: str
) -> Response:
    rt = runtime()
    target = await rt.store.read(ops.get_user, _org_user_id(user_id))
    if target is None or target["org_id"] != user.org_id:
        raise GatewayError("not_found", f"No user {user_id} in your organisation.")
    row = audit.entry(user, action, target["email"], detail)
    end_sessions = values.get("status") == "disabled"
    outcome = await rt.store.write(
        people.change_user, user.org_id, target["id"], values, row, end_sessions
    )
    if outcome == people.NOT_FOUND:
        raise GatewayError("not_found", f"No user {user_id} in your organisation.")
    if outcome == people.LAST_OWNER:
        raise Refused(409, "The last owner stays", LAST_OWNER)
    if target["id"] == user.id and end_sessions:
        return see_other("/dashboard/login")
    kind = "role" if "role" in values else values["status"]
    return see_other(f"/dashboard/users?notice={kind}:{target['id']}")


@bp.post("/users/<user_id>/role")
async def change_role(user_id: str) -> Response:
    user = await page_user()
    form = await checked_form(user)
    owners_only(user, "change roles")
    role = form.get("role", "")
    if role not in users.ROLES:
        raise Refused(400, "No such role", f"A role is one of {', '.join(users.ROLES)}.")
    return await _change(user, user_id, {"role": role}, "user.role_changed", f"to {role}")


@bp.post("/users/<user_id>/<any(disable, enable):action>")
async def change_status(user_id: str, action: str) -> Response:
    user = await page_user()
    await checked_form(user)
    owners_only(user, f"{action} users")
    status = "disabled" if action == "disable" else "active"
    return await _change(user, user_id, {"status": status}, f"user.{action}d", "")


@bp.get("/audit")
async def audit_list() -> Response:
    user = await page_user()
    owners_only(user, "read the audit list")
    before = paging.cursor(request.args.get("before", ""))
    rows = await runtime().store.read(people.audit_rows, user.org_id, AUDIT_PAGE + 1, before)
    more = rows[AUDIT_PAGE - 1] if len(rows) > AUDIT_PAGE else None
    return await page(
        "audit.html",
        nav="audit",
        rows=rows[:AUDIT_PAGE],
        actions=audit.ACTIONS,
        older=paging.after(more, "created_at") if more else None,
    )


# -- one's own account -----------------------------------------------------------------------


@bp.get("/account")
async def account() -> Response:
    user = await page_user()
    row = await users.get_user(runtime(), user.id)
    done = request.args.get("notice") == "password"
    return await page("account.html", nav="account", me=row, errors={}, done=done)


@bp.post("/account/password")
async def change_password() -> Response:
    user = await page_user()
    form = await checked_form(user)
    rt, st = runtime(), state()
    row = await users.get_user(rt, user.id)
    errors: dict[str, str] = {}
    if not await st.hashing.verify(row["password_hash"], form.get("current", "")):
        errors["current"] = "This is not your current password."
    else:
        new = form.get("new", "")
        try:
            passwords.check_rules(new, "new")
            if new != form.get("confirm", ""):
                raise GatewayError("invalid_request", "The two new passwords differ.", "confirm")
            if new == form.get("current"):
                raise GatewayError("invalid_request", "Choose a password you did not use.", "new")
        except GatewayError as error:
            errors[error.param or "new"] = error.message or ""
    if errors:
        return await page("account.html", 400, nav="account", me=row, errors=errors, done=False)
    values = {
        "password_hash": await st.hashing.hash(form["new"]),
        "password_changed_at": rt.clock.now(),
        "password_temporary": 0,
    }
    entry = audit.entry(user, "user.password_changed", user.email)
    await rt.store.write(people.set_own_password, user.id, values, user.session_id, entry)
    return see_other("/dashboard/account?notice=password")
