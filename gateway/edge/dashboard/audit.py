"""The audit list: who changed what, when, in an organisation's dashboard.

Changes to users (invitations, roles, disabling, passwords) are recorded in the same
transaction as the change (:mod:`gateway.store.dashboard_people`); changes to keys are
recorded right after the key action commits (a key action is the admin API's code, which
knows nothing of dashboard users), so a crash between the two can lose a key's entry,
never a user's. Entries never hold a token or a password.
"""

from __future__ import annotations

from typing import Any

from gateway.accounts.key_record import new_id
from gateway.edge.dashboard.web import User
from gateway.edge.http import runtime
from gateway.store import dashboard_people as people

#: how the audit list names each action
ACTIONS = {
    "user.invited": "invited",
    "user.role_changed": "changed the role of",
    "user.disabled": "disabled",
    "user.enabled": "re-enabled",
    "user.password_changed": "changed the password of",
    "key.created": "created key",
    "key.rotated": "rotated key",
    "key.disabled": "disabled key",
    "key.enabled": "enabled key",
    "key.revoked": "revoked key",
    "key.caps_changed": "changed the caps of key",
}


def entry(user: User, action: str, target: str, detail: str = "") -> dict[str, Any]:
    """An audit row: ``user`` did ``action`` to ``target`` (an email, a key's name)."""
    assert action in ACTIONS, action
    return {
        "id": new_id("audit"),
        "org_id": user.org_id,
        "created_at": runtime().clock.now(),
        "actor_id": user.id,
        "actor_email": user.email,
        "action": action,
        "target": target,
        "detail": detail,
    }


async def record(user: User, action: str, target: str, detail: str = "") -> None:
    """Record an action that was committed on its own (a key's)."""
    await runtime().store.write(people.insert_audit, entry(user, action, target, detail))
