"""Dashboard users: owners, admins and viewers of one organisation.

Created, listed, disabled and given new passwords by the operator (``/admin/users``,
``svc-gateway user ...``) or by an owner in the dashboard
(:mod:`~gateway.edge.dashboard.people_pages`); they sign in at ``/dashboard/login``. A
generated password is a one-time one: its user must choose a new one before any page.
One email is one user of one organisation (it is what a user signs in with). Disabling a
user or resetting its password ends its sessions at once.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from gateway.accounts.key_record import iso, new_id
from gateway.edge.dashboard import passwords
from gateway.edge.dashboard.app_state import DashboardState
from gateway.errors import GatewayError
from gateway.store import dashboard as ops

if TYPE_CHECKING:
    from gateway.serving.runtime import Runtime

ROLES = ("owner", "admin", "viewer")
#: the roles that may change things; viewers see everything and change nothing
EDITORS = ("owner", "admin")
STATUSES = ("active", "disabled")
MAX_EMAIL = 254
_EMAIL = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s.]+")


class SignInRefused(Exception):
    """A sign-in that did not succeed: ``locked`` says whether the email is locked out."""

    def __init__(self, message: str, *, locked: bool) -> None:
        super().__init__(message)
        self.message = message
        self.locked = locked


def normal_email(value: object) -> str:
    """An email address as stored and compared: trimmed, lower-cased."""
    return value.strip().lower() if isinstance(value, str) else ""


def check_email(value: object) -> str:
    email = normal_email(value)
    if not _EMAIL.fullmatch(email) or len(email) > MAX_EMAIL:
        raise GatewayError("invalid_request", "email must be an email address.", "email")
    return email


def check_role(value: object) -> str:
    if value not in ROLES:
        raise GatewayError("invalid_request", f"role must be one of {', '.join(ROLES)}.", "role")
    return str(value)


def user_view(row: dict[str, Any]) -> dict[str, Any]:
    """The public fields of a user (never its password hash)."""
    return {
        "object": "dashboard_user",
        "id": row["id"],
        "org_id": row["org_id"],
        "email": row["email"],
        "role": row["role"],
        "status": row["status"],
        "created_at": iso(row["created_at"]),
        "last_login_at": iso(row.get("last_login_at")),
    }


async def _password(st: DashboardState, given: object) -> tuple[str, str | None]:
    """The hash of the given password, or of a new one (then also returned, to show once)."""
    generated = None
    if given is None:
        generated = passwords.new_password()
        password = generated
    else:
        password = passwords.check_rules(given)
    return await st.hashing.hash(password), generated


async def create_user(
    rt: Runtime, st: DashboardState, org_id: str, body: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """A new user; the generated password when none was given (shown once)."""
    if unknown := sorted(set(body) - {"org_id", "email", "role", "password"}):
        raise GatewayError("invalid_request", f"Unknown field {unknown[0]!r}.", unknown[0])
    email, role = check_email(body.get("email")), check_role(body.get("role"))
    password_hash, generated = await _password(st, body.get("password"))
    now = rt.clock.now()
    row = {
        "id": new_id("user"),
        "org_id": org_id,
        "email": email,
        "role": role,
        "password_hash": password_hash,
        "status": "active",
        "created_at": now,
        "password_changed_at": now,
        "last_login_at": None,
        # a generated password is a one-time one: the user replaces it on first sign-in
        "password_temporary": int(generated is not None),
    }
    if not await rt.store.write(ops.insert_user, row):
        raise GatewayError("invalid_request", f"A user with email {email} exists.", "email")
    return row, generated


async def get_user(rt: Runtime, user_id: str) -> dict[str, Any]:
    row = await rt.store.read(ops.get_user, user_id)
    if row is None:
        raise GatewayError("not_found", f"No user {user_id}.")
    return row


async def set_status(rt: Runtime, user_id: str, status: str) -> dict[str, Any]:
    """Disable (signing the user out everywhere) or re-enable a user."""
    row = await get_user(rt, user_id)
    end_sessions = status == "disabled"
    await rt.store.write(ops.update_user, row["id"], {"status": status}, end_sessions)
    return {**row, "status": status}


async def reset_password(
    rt: Runtime, st: DashboardState, user_id: str, given: object
) -> tuple[dict[str, Any], str | None]:
    """A new password (given, or generated and returned once); sessions end, and a
    lock-out of the email is lifted."""
    row = await get_user(rt, user_id)
    password_hash, generated = await _password(st, given)
    values = {
        "password_hash": password_hash,
        "password_changed_at": rt.clock.now(),
        "password_temporary": int(generated is not None),
    }
    await rt.store.write(ops.update_user, row["id"], values, True)  # end its sessions
    st.throttle.clear(row["email"])
    return row, generated


async def sign_in(
    rt: Runtime, st: DashboardState, email_given: object, password: str
) -> dict[str, Any]:
    """The user whose email and password these are, or :class:`SignInRefused`."""
    email = normal_email(email_given)
    if wait := st.throttle.locked_for(email):
        raise SignInRefused(_locked_message(wait), locked=True)
    row = await rt.store.read(ops.user_by_email, email) if email else None
    stored = row["password_hash"] if row is not None else None
    good = await st.hashing.verify(stored, password)
    if not good or row is None or row["status"] != "active":
        if locked := st.throttle.failure(email):
            raise SignInRefused(_locked_message(locked), locked=True)
        raise SignInRefused("The email or password is not right.", locked=False)
    st.throttle.clear(email)
    values: dict[str, Any] = {"last_login_at": rt.clock.now()}
    if passwords.needs_rehash(row["password_hash"]):
        values["password_hash"] = await st.hashing.hash(password)
    await rt.store.write(ops.update_user, row["id"], values)
    return row


def _locked_message(seconds: float) -> str:
    minutes = max(1, round(seconds / 60))
    return (
        "Too many failed sign-ins for this email: it is locked for "
        f"{minutes} minute{'s' if minutes != 1 else ''}. Try again later, or ask the "
        "operator to reset the password."
    )
