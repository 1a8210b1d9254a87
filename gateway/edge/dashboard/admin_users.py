"""The operator's side of dashboard users, in the admin API (bearer SVC_ADMIN_TOKEN):

    POST /admin/users                         {org_id, email, role, password?} -> 201
    GET  /admin/users?org_id=                 list
    POST /admin/users/{id}/disable | enable   the user
    POST /admin/users/{id}/reset-password     {password?} -> the user, password?

A password left out is generated and answered once (``password``); one given is never
echoed. The CLI's ``user`` verbs call these.
"""

from __future__ import annotations

from quart import Quart, Response

from gateway.edge.dashboard import users
from gateway.edge.dashboard.app_state import state
from gateway.edge.http import json_response, read_json_object, runtime
from gateway.edge.routes.admin import (
    add_routes,
    authorize_admin,
    authorized_create,
    authorized_org_filter,
    list_response,
)
from gateway.errors import GatewayError
from gateway.store import dashboard as ops


def _with_password(view: dict[str, object], password: str | None) -> dict[str, object]:
    if password is not None:
        view["password"] = password
    return view


async def create_user() -> Response:
    body, org = await authorized_create()
    row, password = await users.create_user(runtime(), state(), org.id, body)
    return json_response(_with_password(users.user_view(row), password), 201)


async def list_users() -> Response:
    rows = await runtime().store.read(ops.list_users, await authorized_org_filter())
    return list_response([users.user_view(row) for row in rows])


async def change_user(user_id: str, action: str) -> Response:
    authorize_admin()
    status = "disabled" if action == "disable" else "active"
    row = await users.set_status(runtime(), user_id, status)
    return json_response(users.user_view(row))


async def reset_password(user_id: str) -> Response:
    authorize_admin()
    body = await read_json_object(empty_ok=True)
    if unknown := sorted(set(body) - {"password"}):
        raise GatewayError("invalid_request", f"Unknown field {unknown[0]!r}.", unknown[0])
    row, password = await users.reset_password(runtime(), state(), user_id, body.get("password"))
    return json_response(_with_password(users.user_view(row), password))


def register(app: Quart) -> None:
    add_routes(
        app,
        (
            ("POST", "/admin/users", create_user),
            ("GET", "/admin/users", list_users),
            ("POST", "/admin/users/<path:user_id>/<any(disable, enable):action>", change_user),
            ("POST", "/admin/users/<path:user_id>/reset-password", reset_password),
        ),
    )
