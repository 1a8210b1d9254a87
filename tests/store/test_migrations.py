"""Schema migrations on a real SQLite file: an older database is brought up to date."""

from __future__ import annotations

from pathlib import Path

from sqlite_utils import Database

from gateway.store.migrations import MIGRATIONS, migrate


def test_an_old_database_gets_the_later_migrations_and_keeps_its_rows(tmp_path: Path) -> None:
    db = Database(tmp_path / "old.db")
    db["schema_migrations"].create({"version": int, "applied_at": float}, pk="version")
    with db.conn:
        MIGRATIONS[0].sqlite(db)
        db["schema_migrations"].insert({"version": 1, "applied_at": 0.0})
    db["orgs"].insert({"id": "org_1", "name": "acme"})
    for key_id, parent in (("key_parent", None), ("key_child", "key_parent")):
        db["keys"].insert(
            {
                "id": key_id,
                "org_id": "org_1",
                "parent_id": parent,
                "prefix": key_id,
                "fingerprint": key_id,
            }
        )
    db["requests"].insert_all(
        [
            {"id": "req_a", "key_id": "key_child", "settled_usd_nanos": 5},
            {"id": "req_b", "key_id": "key_parent", "settled_usd_nanos": 7},
        ]
    )

    assert migrate(db) == len(MIGRATIONS)
    assert migrate(db) == len(MIGRATIONS)  # a second run changes nothing
    versions = [row["version"] for row in db.query("SELECT version FROM schema_migrations")]
    assert versions == list(range(1, len(MIGRATIONS) + 1))
    rows = {row["id"]: row for row in db["requests"].rows}
    # requests written before the parent was recorded get their key's parent
    assert rows["req_a"]["parent_id"] == "key_parent"
    assert rows["req_b"]["parent_id"] is None
    assert {"webhooks", "webhook_events"} <= set(db.table_names())
