"""The dashboard's HTTP side: the blueprint, who is signed in, sign-in and sign-out, and
how refusals are shown (an HTML page with the status, never JSON, never data).

Every page needs a session (else a redirect to ``/dashboard/login``); every POST also
needs the form's ``csrf_token`` (403) and an owner or admin (403 for viewers). Ids of
another organisation are 404, as unknown ids are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from quart import Blueprint, Response, g, redirect, render_template, request
from werkzeug.datastructures import MultiDict

from gateway.edge.dashboard import format as fmt
from gateway.edge.dashboard import sessions
from gateway.edge.dashboard.app_state import state
from gateway.edge.dashboard.users import EDITORS, SignInRefused, sign_in
from gateway.edge.http import read_form, runtime
from gateway.errors import GatewayError
from gateway.store import dashboard as ops

bp = Blueprint(
    "dashboard",
    __name__,
    url_prefix="/dashboard",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)


@dataclass(frozen=True)
class User:
    """The signed-in user of this request."""

    id: str
    org_id: str
    email: str
    role: str
    session_id: str
    csrf: str
    #: signed in with a one-time password: every page but the account's asks for a new one
    must_change: bool = False

    @property
    def can_edit(self) -> bool:
        return self.role in EDITORS

    @property
    def is_owner(self) -> bool:
        return self.role == "owner"


class NeedsSignIn(Exception):
    """No valid session: pages redirect to the sign-in form."""


class NeedsNewPassword(Exception):
    """Signed in with a one-time password: pages redirect to the account page."""


#: the pages a user with a one-time password may open (to replace it, or to leave)
ACCOUNT_PATHS = ("/dashboard/account", "/dashboard/account/password", "/dashboard/logout")


class Refused(Exception):
    """A refusal shown as a page: ``status``, a title and what to do."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(title)
        self.status, self.title, self.message = status, title, message


def _secure() -> bool:
    """Whether the browser reached us over HTTPS (directly, or through a proxy that says
    so: the header can only make the cookie stricter)."""
    return request.scheme == "https" or request.headers.get("X-Forwarded-Proto") == "https"


async def current_user() -> User | None:
    if "dashboard_user" in g:
        return cast("User | None", g.dashboard_user)
    secret = await state().secret()
    token = sessions.unsign(secret, request.cookies.get(sessions.COOKIE))
    user = None
    if token is not None:
        sid = sessions.session_id(token)
        rt = runtime()
        row = await rt.store.read(ops.session_user, sid, rt.clock.now())
        if row is not None:
            user = User(
                id=row["id"],
                org_id=row["org_id"],
                email=row["email"],
                role=row["role"],
                session_id=sid,
                csrf=sessions.csrf_token(secret, sid),
                must_change=bool(row["password_temporary"]),
            )
    g.dashboard_user = user
    return user


async def page_user() -> User:
    user = await current_user()
    if user is None:
        raise NeedsSignIn
    if user.must_change and request.path not in ACCOUNT_PATHS:
        raise NeedsNewPassword
    return user


async def checked_form(user: User) -> MultiDict[str, str]:
    """The form of a state-changing POST once its CSRF token is checked."""
    form = await read_form()
    if not sessions.csrf_ok(await state().secret(), user.session_id, form.get("csrf_token")):
        raise _csrf_refusal()
    return form


async def form_user() -> tuple[User, MultiDict[str, str]]:
    """The user of a state-changing POST, and its form, once the CSRF token and the role
    are checked."""
    user = await page_user()
    form = await checked_form(user)
    if not user.can_edit:
        raise Refused(
            403,
            "Viewers cannot change anything",
            "Your role is viewer: you can see every page but not change keys. Ask an owner "
            "or an admin of your organisation.",
        )
    return user, form


def owners_only(user: User, what: str) -> None:
    """403 unless the user is an owner of its organisation."""
    if not user.is_owner:
        raise Refused(
            403,
            f"Only owners can {what}",
            f"Your role is {user.role}. Ask an owner of your organisation.",
        )


def _csrf_refusal() -> Refused:
    return Refused(
        403,
        "This form cannot be accepted",
        "It did not carry this dashboard's security token (CSRF check failed). Go back, "
        "reload the page and send the form again.",
    )


async def page(template: str, status: int = 200, **context: Any) -> Response:
    """Render a page with the signed-in user, the clock and the formatting helpers."""
    body = await render_template(
        template, user=g.get("dashboard_user"), now=runtime().clock.now(), fmt=fmt, **context
    )
    response = Response(body, status=status, content_type="text/html; charset=utf-8")
    response.headers["Cache-Control"] = "no-store"
    return response


def see_other(path: str) -> Response:
    return redirect(path, 303)  # type: ignore[return-value]  # quart annotates werkzeug's Response


@bp.after_request
async def _headers(response: Response) -> Response:
    # no framing, no outside resources: the pages load only their own CSS and JS
    response.headers.setdefault(
        "Content-Security-Policy",
        "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'",
    )
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    return response


@bp.errorhandler(NeedsSignIn)
async def _to_sign_in(_error: NeedsSignIn) -> Response:
    return see_other("/dashboard/login")


@bp.errorhandler(NeedsNewPassword)
async def _to_account(_error: NeedsNewPassword) -> Response:
    return see_other("/dashboard/account")


@bp.errorhandler(Refused)
async def _refused(error: Refused) -> Response:
    return await page("error.html", error.status, title=error.title, message=error.message)


@bp.errorhandler(GatewayError)
async def _gateway_error(error: GatewayError) -> Response:
    title = "Not found" if error.status == 404 else "This cannot be done"
    message = error.message or error.spec.message
    return await page("error.html", error.status, title=title, message=message, code=error.code)


# -- sign-in and sign-out ------------------------------------------------------------------


@bp.get("/")
async def home() -> Response:
    await page_user()
    return see_other("/dashboard/keys")


async def _login_form(status: int = 200, error: str | None = None, email: str = "") -> Response:
    """The sign-in form, with a fresh nonce cookie that its CSRF token is bound to."""
    nonce = sessions.new_token()
    response = await page(
        "login.html",
        status,
        error=error,
        email=email,
        csrf=sessions.csrf_token(await state().secret(), nonce),
    )
    response.set_cookie(
        sessions.LOGIN_COOKIE,
        nonce,
        max_age=sessions.LOGIN_FORM_LIFETIME_S,
        path=sessions.COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=_secure(),
    )
    return response


@bp.get("/login")
async def login_form() -> Response:
    if await current_user() is not None:
        return see_other("/dashboard/keys")
    return await _login_form()


@bp.post("/login")
async def login() -> Response:
    form = await read_form()
    secret = await state().secret()
    if not sessions.csrf_ok(
        secret, request.cookies.get(sessions.LOGIN_COOKIE), form.get("csrf_token")
    ):
        raise _csrf_refusal()
    rt = runtime()
    email = form.get("email", "")
    try:
        row = await sign_in(rt, state(), email, form.get("password", ""))
    except SignInRefused as refused:
        return await _login_form(429 if refused.locked else 401, refused.message, email)
    token = sessions.new_token()
    now = rt.clock.now()
    session = {
        "id": sessions.session_id(token),
        "user_id": row["id"],
        "created_at": now,
        "expires_at": now + sessions.LIFETIME_S,
    }
    await rt.store.write(ops.insert_session, session, now)
    response = see_other("/dashboard/account" if row["password_temporary"] else "/dashboard/keys")
    response.set_cookie(
        sessions.COOKIE,
        sessions.sign(secret, token),
        max_age=sessions.LIFETIME_S,
        path=sessions.COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=_secure(),
    )
    response.delete_cookie(sessions.LOGIN_COOKIE, path=sessions.COOKIE_PATH)
    return response


@bp.post("/logout")
async def logout() -> Response:
    user = await page_user()
    await checked_form(user)
    await runtime().store.write(ops.delete_session, user.session_id)
    response = see_other("/dashboard/login")
    response.delete_cookie(sessions.COOKIE, path=sessions.COOKIE_PATH)
    return response
