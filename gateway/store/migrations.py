"""Numbered schema migrations, one version on both backends.

Each :class:`Migration` says its step twice: over sqlite-utils for SQLite, and as
PostgreSQL statements (BIGINT nano-USD, DOUBLE PRECISION epoch seconds as on SQLite,
JSONB for the JSON columns that queries look into, byte-wise ``"C"`` collation on the
text columns that order answers, so both backends sort alike). Append a new one; never
edit an applied one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlite_utils import Database

from gateway.store.sql import Conn


def _m001_initial(db: Database) -> None:
    db.table("orgs").create(
        {
            "id": str,
            "name": str,
            "residency": str,
            "policy": str,
            "created_at": float,
        },
        pk="id",
    )
    db.table("keys").create(
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
    db.table("keys").create_index(["prefix"], unique=True)
    db.table("keys").create_index(["org_id"])
    db.table("keys").create_index(["parent_id"])
    db.table("provider_credentials").create(
        {"org_id": str, "provider": str, "api_key_env": str, "created_at": float},
        pk=("org_id", "provider"),
    )
    db.table("requests").create(
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
    db.table("requests").create_index(["key_id", "day"])
    db.table("requests").create_index(["org_id", "day"])
    db.table("idempotency").create(
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
    db.table("credit_ledger").create(
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
    db.table("credit_ledger").create_index(["org_id"])


def _m002_webhooks(db: Database) -> None:
    """Spend-alert webhooks: one endpoint per organisation, and the outbox of events."""
    db.table("webhooks").create(
        {"org_id": str, "url": str, "secret": str, "created_at": float}, pk="org_id"
    )
    db.table("webhook_events").create(
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
    db.table("webhook_events").create_index(["delivered_at", "next_attempt_at"])


def _m003_request_parent(db: Database) -> None:
    """Each request names the parent its spend was reserved on.

    A rotation moves sub-keys under the new key: the start-up rebuild must give a
    sub-key's earlier spend to the parent that counted it then. Rows written before this
    migration get the parent their key has now (the best that is known).
    """
    db.table("requests").add_column("parent_id", str)
    db.execute(
        "UPDATE requests"
        " SET parent_id = (SELECT parent_id FROM keys WHERE keys.id = requests.key_id)"
    )


def _m004_dashboard(db: Database) -> None:
    """The organisation dashboard: its users, their sessions, and the signing secret.

    Passwords are stored only as argon2id hashes and sessions only as the SHA-256 of
    their token (as API keys are)."""
    db.table("dashboard_users").create(
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
    db.table("dashboard_users").create_index(["email"], unique=True)
    db.table("dashboard_users").create_index(["org_id"])
    db.table("dashboard_sessions").create(
        {"id": str, "user_id": str, "created_at": float, "expires_at": float},
        pk="id",
        foreign_keys=[("user_id", "dashboard_users", "id")],
    )
    db.table("dashboard_sessions").create_index(["user_id"])
    db.table("dashboard_secrets").create(
        {"name": str, "value": str, "created_at": float}, pk="name"
    )
    db.table("requests").create_index(["org_id", "created"])


def _m005_request_trace(db: Database) -> None:
    """Each request names the W3C trace it belongs to (the ``traceparent`` trace id),
    so that a call can be followed from the client to the provider. Earlier rows: none."""
    db.table("requests").add_column("trace_id", str)


def _m006_pending_requests(db: Database) -> None:
    """Start-up recovery finds the ``pending`` rows a crash left without a table scan."""
    db.execute("CREATE INDEX requests_pending ON requests (id) WHERE status = 'pending'")


def _m007_cluster(db: Database) -> None:
    """Several nodes (PostgreSQL only; the tables exist on SQLite too, unused): the node
    that wrote a request row, the live nodes, the leases of shared limits and the
    change counter (see ``gateway/store/node_leases.py``)."""
    db.table("requests").add_column("node_id", str)
    db.table("cluster_nodes").create(
        {"node_id": str, "epoch": int, "started_at": float, "expires_at": float}, pk="node_id"
    )
    db.table("leases").create(
        {"limit_id": str, "node_id": str, "amount": int, "window_end": float},
        pk=("limit_id", "node_id"),
    )
    db.table("cluster_version").create({"id": int, "version": int}, pk="id")
    db.table("model_switches").create(
        {"model_id": str, "enabled": int, "changed_at": float}, pk="model_id"
    )


def _m008_dashboard_people(db: Database) -> None:
    """The dashboard's second round: users invited by an owner (a one-time password the
    user must replace: ``password_temporary``), the audit list of changes, and the request
    list's keyset pages (newest first, ``(created, id)``) under its filters: an
    organisation's records, a key's, a model's, a status's. The organisation's index
    gains ``id`` (the tie-breaker of two records of one instant) and replaces the
    ``(org_id, created)`` one."""
    db.execute(
        "ALTER TABLE dashboard_users ADD COLUMN password_temporary INTEGER NOT NULL DEFAULT 0"
    )
    db.table("dashboard_audit").create(
        {
            "id": str,
            "org_id": str,
            "created_at": float,
            "actor_id": str,
            "actor_email": str,
            "action": str,
            "target": str,
            "detail": str,
        },
        pk="id",
    )
    for statement in _REQUEST_PAGES:
        db.execute(statement)
    db.execute("CREATE INDEX dashboard_audit_org ON dashboard_audit (org_id, created_at, id)")


#: the request list's indexes (both backends): each equality filter, then the page order
_REQUEST_PAGES = (
    "DROP INDEX idx_requests_org_id_created",
    "CREATE INDEX requests_org_pages ON requests (org_id, created, id)",
    "CREATE INDEX requests_key_pages ON requests (key_id, created, id)",
    "CREATE INDEX requests_model_pages ON requests (org_id, model, created, id)",
    "CREATE INDEX requests_status_pages ON requests (org_id, status, created, id)",
)


#: the columns of a key whose change other nodes must see (as PostgreSQL's keys_changed)
_KEY_CHANGES = (
    "status, caps, scopes, allowed_models, required_tags, default_tags, data_mode, byok,"
    " expires_at, rotated_to, parent_id, fingerprint"
)


def _m009_sqlite_change_counter(db: Database) -> None:
    """The change counter on SQLite too, for ``serve --workers`` (several nodes on one
    file): PostgreSQL's triggers of migration 7, row by row (SQLite has no statement
    triggers), bumping a row made here."""
    db.execute("INSERT OR IGNORE INTO cluster_version (id, version) VALUES (1, 0)")
    bump = "BEGIN UPDATE cluster_version SET version = version + 1 WHERE id = 1; END"
    events = {
        "keys": ("INSERT", "DELETE", f"UPDATE OF {_KEY_CHANGES}"),
        "orgs": ("INSERT", "UPDATE", "DELETE"),
        "provider_credentials": ("INSERT", "UPDATE", "DELETE"),
        "model_switches": ("INSERT", "UPDATE", "DELETE"),
    }
    for table, kinds in events.items():
        for kind in kinds:
            name = f"{table}_{kind.split()[0].lower()}_bumps"
            db.execute(f"CREATE TRIGGER {name} AFTER {kind} ON {table} FOR EACH ROW {bump}")
    db.execute(
        "CREATE TRIGGER credits_added_bumps AFTER INSERT ON credit_ledger"
        f" FOR EACH ROW WHEN NEW.amount_nanos > 0 {bump}"
    )


_PG_001 = (
    """CREATE TABLE orgs (
        id TEXT COLLATE "C" PRIMARY KEY, name TEXT, residency TEXT, policy TEXT,
        created_at DOUBLE PRECISION)""",
    """CREATE TABLE keys (
        id TEXT COLLATE "C" PRIMARY KEY, org_id TEXT REFERENCES orgs (id), parent_id TEXT,
        family_id TEXT, prefix TEXT, fingerprint TEXT, name TEXT, mode TEXT,
        environment TEXT, status TEXT, scopes TEXT, caps TEXT, data_mode TEXT,
        byok INTEGER, allowed_models TEXT, required_tags TEXT, default_tags TEXT,
        expires_at DOUBLE PRECISION, created_at DOUBLE PRECISION,
        last_used_at DOUBLE PRECISION, rotated_to TEXT)""",
    "CREATE UNIQUE INDEX idx_keys_prefix ON keys (prefix)",
    "CREATE INDEX idx_keys_org_id ON keys (org_id)",
    "CREATE INDEX idx_keys_parent_id ON keys (parent_id)",
    """CREATE TABLE provider_credentials (
        org_id TEXT, provider TEXT, api_key_env TEXT, created_at DOUBLE PRECISION,
        PRIMARY KEY (org_id, provider))""",
    """CREATE TABLE requests (
        id TEXT COLLATE "C" PRIMARY KEY, key_id TEXT COLLATE "C", org_id TEXT,
        created DOUBLE PRECISION, day TEXT COLLATE "C", month TEXT, endpoint TEXT,
        model TEXT COLLATE "C", provider TEXT, status TEXT, http_status INTEGER,
        stream INTEGER, tags JSONB, usage JSONB, estimated_usd_nanos BIGINT,
        reserved_usd_nanos BIGINT, settled_usd_nanos BIGINT, billed_usd_nanos BIGINT,
        latency_ms DOUBLE PRECISION, error_code TEXT, mode TEXT)""",
    "CREATE INDEX idx_requests_key_id_day ON requests (key_id, day)",
    "CREATE INDEX idx_requests_org_id_day ON requests (org_id, day)",
    """CREATE TABLE idempotency (
        key_id TEXT, idem_key TEXT, body_hash TEXT, request_id TEXT, state TEXT,
        stream INTEGER, status INTEGER, headers TEXT, body BYTEA,
        created_at DOUBLE PRECISION, PRIMARY KEY (key_id, idem_key))""",
    """CREATE TABLE credit_ledger (
        id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY, org_id TEXT,
        amount_nanos BIGINT, kind TEXT, request_id TEXT, created_at DOUBLE PRECISION)""",
    "CREATE INDEX idx_credit_ledger_org_id ON credit_ledger (org_id)",
)

_PG_002 = (
    """CREATE TABLE webhooks (
        org_id TEXT PRIMARY KEY, url TEXT, secret TEXT, created_at DOUBLE PRECISION)""",
    """CREATE TABLE webhook_events (
        id TEXT PRIMARY KEY, org_id TEXT, payload TEXT, created_at DOUBLE PRECISION,
        attempts INTEGER DEFAULT 0, next_attempt_at DOUBLE PRECISION,
        delivered_at DOUBLE PRECISION, given_up INTEGER DEFAULT 0, last_error TEXT)""",
    "CREATE INDEX idx_webhook_events ON webhook_events (delivered_at, next_attempt_at)",
)

_PG_003 = (
    "ALTER TABLE requests ADD COLUMN parent_id TEXT",
    "UPDATE requests SET parent_id = (SELECT parent_id FROM keys WHERE keys.id = requests.key_id)",
)

_PG_004 = (
    """CREATE TABLE dashboard_users (
        id TEXT COLLATE "C" PRIMARY KEY, org_id TEXT REFERENCES orgs (id), email TEXT,
        role TEXT, password_hash TEXT, status TEXT, created_at DOUBLE PRECISION,
        password_changed_at DOUBLE PRECISION, last_login_at DOUBLE PRECISION)""",
    "CREATE UNIQUE INDEX idx_dashboard_users_email ON dashboard_users (email)",
    "CREATE INDEX idx_dashboard_users_org_id ON dashboard_users (org_id)",
    """CREATE TABLE dashboard_sessions (
        id TEXT PRIMARY KEY, user_id TEXT REFERENCES dashboard_users (id),
        created_at DOUBLE PRECISION, expires_at DOUBLE PRECISION)""",
    "CREATE INDEX idx_dashboard_sessions_user_id ON dashboard_sessions (user_id)",
    """CREATE TABLE dashboard_secrets (
        name TEXT PRIMARY KEY, value TEXT, created_at DOUBLE PRECISION)""",
    "CREATE INDEX idx_requests_org_id_created ON requests (org_id, created)",
)

_PG_005 = ("ALTER TABLE requests ADD COLUMN trace_id TEXT",)

_PG_006 = ("CREATE INDEX requests_pending ON requests (id) WHERE status = 'pending'",)

#: what a change to keys, organisations, credits added, provider credentials or a model's
#: switch bumps: the counter every node polls (settlement debits and last-use times do not)
_PG_BUMP = """CREATE FUNCTION cluster_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO cluster_version (id, version) VALUES (1, 1)
        ON CONFLICT (id) DO UPDATE SET version = cluster_version.version + 1;
        RETURN NULL;
    END $$"""

_PG_007 = (
    "ALTER TABLE requests ADD COLUMN node_id TEXT",
    "CREATE INDEX requests_node_pending ON requests (node_id) WHERE status = 'pending'",
    "CREATE INDEX requests_parent_id_day ON requests (parent_id, day)",
    "CREATE INDEX requests_key_id_month ON requests (key_id, month)",
    "CREATE INDEX requests_parent_id_month ON requests (parent_id, month)",
    "CREATE INDEX requests_org_id_month ON requests (org_id, month)",
    """CREATE TABLE cluster_nodes (
        node_id TEXT PRIMARY KEY, epoch BIGINT, started_at DOUBLE PRECISION,
        expires_at DOUBLE PRECISION)""",
    """CREATE TABLE leases (
        limit_id TEXT, node_id TEXT, amount BIGINT, window_end DOUBLE PRECISION,
        PRIMARY KEY (limit_id, node_id))""",
    "CREATE INDEX leases_node_id ON leases (node_id)",
    "CREATE TABLE cluster_version (id INTEGER PRIMARY KEY, version BIGINT)",
    """CREATE TABLE model_switches (
        model_id TEXT PRIMARY KEY, enabled INTEGER, changed_at DOUBLE PRECISION)""",
    _PG_BUMP,
    """CREATE TRIGGER keys_changed AFTER INSERT OR DELETE OR UPDATE OF status, caps,
        scopes, allowed_models, required_tags, default_tags, data_mode, byok, expires_at,
        rotated_to, parent_id, fingerprint ON keys
        FOR EACH STATEMENT EXECUTE FUNCTION cluster_bump()""",
    """CREATE TRIGGER orgs_changed AFTER INSERT OR UPDATE OR DELETE ON orgs
        FOR EACH STATEMENT EXECUTE FUNCTION cluster_bump()""",
    """CREATE TRIGGER credits_added AFTER INSERT ON credit_ledger
        FOR EACH ROW WHEN (NEW.amount_nanos > 0) EXECUTE FUNCTION cluster_bump()""",
    """CREATE TRIGGER provider_credentials_changed AFTER INSERT OR UPDATE OR DELETE
        ON provider_credentials FOR EACH STATEMENT EXECUTE FUNCTION cluster_bump()""",
    """CREATE TRIGGER model_switched AFTER INSERT OR UPDATE OR DELETE ON model_switches
        FOR EACH STATEMENT EXECUTE FUNCTION cluster_bump()""",
)


_PG_008 = (
    "ALTER TABLE dashboard_users ADD COLUMN password_temporary INTEGER NOT NULL DEFAULT 0",
    """CREATE TABLE dashboard_audit (
        id TEXT COLLATE "C" PRIMARY KEY, org_id TEXT, created_at DOUBLE PRECISION,
        actor_id TEXT, actor_email TEXT, action TEXT, target TEXT, detail TEXT)""",
    *_REQUEST_PAGES,
    "CREATE INDEX dashboard_audit_org ON dashboard_audit (org_id, created_at, id)",
)


def _m010_request_attempts(db: Database) -> None:
    """Each request lists its provider attempts (routing: deployments, retries,
    fallbacks), a JSON list. Earlier rows: none (one attempt, the row's provider)."""
    db.table("requests").add_column("attempts", str)


_PG_010 = ("ALTER TABLE requests ADD COLUMN attempts TEXT",)

#: the response cache (gateway/store/cache_entries.py): its rows, and on each request
#: record whether the cache served it (hit, miss, bypass), the original it was served
#: from and what it saved
_CACHE = (
    """CREATE TABLE cache_entries (
        cache_key TEXT PRIMARY KEY, org_id TEXT, state TEXT, owner TEXT,
        created_at DOUBLE PRECISION, expires_at DOUBLE PRECISION, request_id TEXT,
        cost_nanos BIGINT, entry TEXT)""",
    "CREATE INDEX cache_entries_org ON cache_entries (org_id)",
    "CREATE INDEX cache_entries_created ON cache_entries (created_at)",
    "ALTER TABLE requests ADD COLUMN cache TEXT",
    "ALTER TABLE requests ADD COLUMN cache_of TEXT",
    "ALTER TABLE requests ADD COLUMN saved_usd_nanos BIGINT",
)


def _m011_response_cache(db: Database) -> None:
    for statement in _CACHE:
        db.execute(statement)


def _m012_guardrails(db: Database) -> None:
    """Each request names the guardrails that redacted, flagged or denied in it (a JSON
    list of name, direction, verdict; never the matched text), and each key the
    guardrails it adds to its organisation's (a JSON list of names). Earlier rows: none."""
    db.table("requests").add_column("guardrails", str)
    db.table("keys").add_column("guardrails", str)


_PG_012 = (
    "ALTER TABLE requests ADD COLUMN guardrails TEXT",
    "ALTER TABLE keys ADD COLUMN guardrails TEXT",
)


def _m013_refusal_counts(db: Database) -> None:
    """Refused calls, counted by key, error code and UTC day (no record per refusal): each
    node adds to rows of its own (``node_id``), so that two nodes never wait on one row."""
    db.execute(
        """CREATE TABLE refusal_counts (
            key_id TEXT NOT NULL, code TEXT NOT NULL, day TEXT NOT NULL,
            node_id TEXT NOT NULL, org_id TEXT NOT NULL, count INTEGER NOT NULL,
            PRIMARY KEY (key_id, code, day, node_id))"""
    )
    db.execute("CREATE INDEX refusal_counts_org_day ON refusal_counts (org_id, day)")


_PG_013 = (
    """CREATE TABLE refusal_counts (
        key_id TEXT NOT NULL, code TEXT NOT NULL, day TEXT NOT NULL,
        node_id TEXT NOT NULL, org_id TEXT NOT NULL, count BIGINT NOT NULL,
        PRIMARY KEY (key_id, code, day, node_id))""",
    "CREATE INDEX refusal_counts_org_day ON refusal_counts (org_id, day)",
)


def _m014_mcp_allowed_tools(db: Database) -> None:
    """MCP: a key's ``allowed_tools`` (tool patterns, a JSON list; NULL: every tool)."""
    db.table("keys").add_column("allowed_tools", str)


_PG_014 = ("ALTER TABLE keys ADD COLUMN allowed_tools TEXT",)


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema version: its step on SQLite and its statements on PostgreSQL."""

    sqlite: Callable[[Database], None]
    postgres: tuple[str, ...]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(_m001_initial, _PG_001),
    Migration(_m002_webhooks, _PG_002),
    Migration(_m003_request_parent, _PG_003),
    Migration(_m004_dashboard, _PG_004),
    Migration(_m005_request_trace, _PG_005),
    Migration(_m006_pending_requests, _PG_006),
    Migration(_m007_cluster, _PG_007),
    Migration(_m008_dashboard_people, _PG_008),
    Migration(_m009_sqlite_change_counter, ()),  # PostgreSQL's came with migration 7
    Migration(_m010_request_attempts, _PG_010),
    Migration(_m011_response_cache, _CACHE),
    Migration(_m012_guardrails, _PG_012),
    Migration(_m013_refusal_counts, _PG_013),
    Migration(_m014_mcp_allowed_tools, _PG_014),
)


def migrate_postgres(conn: Conn) -> int:
    """Apply on PostgreSQL every migration not yet applied, each in its own transaction.

    The caller holds the migration lock (:mod:`gateway.store.postgres`)."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations"
        " (version INTEGER PRIMARY KEY, applied_at DOUBLE PRECISION)",
        (),
    )
    row = conn.execute("SELECT MAX(version) AS v FROM schema_migrations", ()).fetchall()[0]
    current = row["v"] or 0
    for version, step in enumerate(MIGRATIONS, start=1):
        if version <= current:
            continue
        conn.execute("BEGIN", ())
        try:
            for statement in step.postgres:
                conn.execute(statement, ())
            conn.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
                (version, time.time()),
            )
        except BaseException:
            conn.execute("ROLLBACK", ())
            raise
        conn.execute("COMMIT", ())
    return len(MIGRATIONS)


def migrate(db: Database) -> int:
    """Apply on SQLite every migration not yet applied, each in its own transaction; return
    the version."""
    if "schema_migrations" not in db.table_names():
        db.table("schema_migrations").create({"version": int, "applied_at": float}, pk="version")
    rows = db.query("select max(version) as v from schema_migrations")
    current = next(iter(rows))["v"] or 0
    for version, step in enumerate(MIGRATIONS, start=1):
        if version <= current:
            continue
        with db.conn:
            step.sqlite(db)
            db.table("schema_migrations").insert({"version": version, "applied_at": time.time()})
    return len(MIGRATIONS)
