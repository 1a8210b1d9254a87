"""Numbered schema migrations. Append a new function; never edit an applied one."""

from __future__ import annotations

import time
from collections.abc import Callable

from sqlite_utils import Database


def _m001_initial(db: Database) -> None:
    db["orgs"].create(
        {
            "id": str,
            "name": str,
            "residency": str,
            "policy": str,
            "created_at": float,
        },
        pk="id",
    )
    db["keys"].create(
        {
            "id": str,
            "org_id": str,
            "parent_id": str,
            "family_id": str,
            "prefix": str,
            "fingerprint": str,
            "name": str,
            "mode": str,
            "environment": str,
            "status": str,
            "scopes": str,
            "caps": str,
            "data_mode": str,
            "byok": int,
            "allowed_models": str,
            "required_tags": str,
            "default_tags": str,
            "expires_at": float,
            "created_at": float,
            "last_used_at": float,
            "rotated_to": str,
        },
        pk="id",
        foreign_keys=[("org_id", "orgs", "id")],
    )
    db["keys"].create_index(["prefix"], unique=True)
    db["keys"].create_index(["org_id"])
    db["keys"].create_index(["parent_id"])
    db["provider_credentials"].create(
        {"org_id": str, "provider": str, "api_key_env": str, "created_at": float},
        pk=("org_id", "provider"),
    )
    db["requests"].create(
        {
            "id": str,
            "key_id": str,
            "org_id": str,
            "created": float,
            "day": str,
            "month": str,
            "endpoint": str,
            "model": str,
            "provider": str,
            "status": str,
            "http_status": int,
            "stream": int,
            "tags": str,
            "usage": str,
            "estimated_usd_nanos": int,
            "reserved_usd_nanos": int,
            "settled_usd_nanos": int,
            "billed_usd_nanos": int,
            "latency_ms": float,
            "error_code": str,
            "mode": str,
        },
        pk="id",
    )
    db["requests"].create_index(["key_id", "day"])
    db["requests"].create_index(["org_id", "day"])
    db["idempotency"].create(
        {
            "key_id": str,
            "idem_key": str,
            "body_hash": str,
            "request_id": str,
            "state": str,
            "stream": int,
            "status": int,
            "headers": str,
            "body": bytes,
            "created_at": float,
        },
        pk=("key_id", "idem_key"),
    )
    db["credit_ledger"].create(
        {
            "id": int,
            "org_id": str,
            "amount_nanos": int,
            "kind": str,
            "request_id": str,
            "created_at": float,
        },
        pk="id",
    )
    db["credit_ledger"].create_index(["org_id"])


def _m002_webhooks(db: Database) -> None:
    """Spend-alert webhooks: one endpoint per organisation, and the outbox of events."""
    db["webhooks"].create(
        {"org_id": str, "url": str, "secret": str, "created_at": float}, pk="org_id"
    )
    db["webhook_events"].create(
        {
            "id": str,
            "org_id": str,
            "payload": str,
            "created_at": float,
            "attempts": int,
            "next_attempt_at": float,
            "delivered_at": float,
            "given_up": int,
            "last_error": str,
        },
        pk="id",
        defaults={"attempts": 0, "given_up": 0},
    )
    db["webhook_events"].create_index(["delivered_at", "next_attempt_at"])


def _m003_request_parent(db: Database) -> None:
    """Each request names the parent its spend was reserved on.

    A rotation moves sub-keys under the new key: the start-up rebuild must give a
    sub-key's earlier spend to the parent that counted it then. Rows written before this
    migration get the parent their key has now (the best that is known).
    """
    db["requests"].add_column("parent_id", str)
    db.execute(
        "UPDATE requests"
        " SET parent_id = (SELECT parent_id FROM keys WHERE keys.id = requests.key_id)"
    )


def _m004_dashboard(db: Database) -> None:
    """The organisation dashboard: its users, their sessions, and the signing secret.

    Passwords are stored only as argon2id hashes and sessions only as the SHA-256 of
    their token (as API keys are)."""
    db["dashboard_users"].create(
        {
            "id": str,
            "org_id": str,
            "email": str,
            "role": str,
            "password_hash": str,
            "status": str,
            "created_at": float,
            "password_changed_at": float,
            "last_login_at": float,
        },
        pk="id",
        foreign_keys=[("org_id", "orgs", "id")],
    )
    db["dashboard_users"].create_index(["email"], unique=True)
    db["dashboard_users"].create_index(["org_id"])
    db["dashboard_sessions"].create(
        {"id": str, "user_id": str, "created_at": float, "expires_at": float},
        pk="id",
        foreign_keys=[("user_id", "dashboard_users", "id")],
    )
    db["dashboard_sessions"].create_index(["user_id"])
    db["dashboard_secrets"].create({"name": str, "value": str, "created_at": float}, pk="name")
    db["requests"].create_index(["org_id", "created"])


def _m005_request_trace(db: Database) -> None:
    """Each request names the W3C trace it belongs to (the ``traceparent`` trace id),
    so that a call can be followed from the client to the provider. Earlier rows: none."""
    db["requests"].add_column("trace_id", str)


def _m006_pending_requests(db: Database) -> None:
    """Start-up recovery finds the ``pending`` rows a crash left without a table scan."""
    db.execute("CREATE INDEX requests_pending ON requests (id) WHERE status = 'pending'")


MIGRATIONS: tuple[Callable[[Database], None], ...] = (
    _m001_initial,
    _m002_webhooks,
    _m003_request_parent,
    _m004_dashboard,
    _m005_request_trace,
    _m006_pending_requests,
)


def migrate(db: Database) -> int:
    """Apply every migration not yet applied, each in its own transaction; return the version."""
    if "schema_migrations" not in db.table_names():
        db["schema_migrations"].create({"version": int, "applied_at": float}, pk="version")
    rows = db.query("select max(version) as v from schema_migrations")
    current = next(iter(rows))["v"] or 0
    for version, step in enumerate(MIGRATIONS, start=1):
        if version <= current:
            continue
        with db.conn:
            step(db)
            db["schema_migrations"].insert({"version": version, "applied_at": time.time()})
    return len(MIGRATIONS)
