"""``svc-gateway db copy``: every row of one database into another, empty one.

Both databases are opened as stores (so both are migrated to the same version first),
the source is read in one transaction and the target written in one: a copy is whole
or absent. Every table is copied (not only the ones named today), in the order of the
foreign keys. Values move as the drivers give them: JSON columns as their text, bytes
as bytes, so nothing is re-encoded on the way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.store import Store, StoreError, is_postgres
from gateway.store import sql as sq
from gateway.store.sql import Conn

#: tables whose rows others refer to come first (foreign keys: keys and dashboard users
#: name their organisation, dashboard sessions their user)
FIRST = ("orgs", "keys", "dashboard_users")
#: each database's own: its migrations, and the change counter its triggers bump (on a
#: new target the copied rows have bumped it already)
NOT_COPIED = frozenset({"schema_migrations", "cluster_version"})


def _read_all(conn: Conn, tables: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {table: sq.query(conn, f"SELECT * FROM {table}") for table in tables}


def _count_rows(conn: Conn, tables: list[str]) -> dict[str, int]:
    return {t: sq.query(conn, f"SELECT COUNT(*) AS n FROM {t}")[0]["n"] for t in tables}


def _write_all(conn: Conn, rows: dict[str, list[dict[str, Any]]], store: Store) -> None:
    for table, table_rows in rows.items():
        for row in table_rows:
            marks = ", ".join("?" for _ in row)
            conn.execute(
                f"INSERT INTO {table} ({', '.join(row)}) VALUES ({marks})", tuple(row.values())
            )
        store.backend.after_copy(conn, table)


def copy_database(source: str, target: str) -> dict[str, Any]:
    """Copy ``source`` into ``target`` (refused unless every table of it is empty);
    returns the database names and the rows copied per table."""
    if not is_postgres(source) and not Path(source).is_file():
        raise StoreError(f"no database at {source}")
    src = Store(source)
    try:
        dst = Store(target)
        try:
            tables = _ordered(src.call(src.backend.tables))
            missing = sorted(set(tables) - set(dst.call(dst.backend.tables)))
            if missing:
                raise StoreError(f"the target {dst.name} has no table {', '.join(missing)}")
            filled = {t: n for t, n in dst.call(_count_rows, tables).items() if n}
            if filled:
                detail = ", ".join(f"{t}: {n} rows" for t, n in sorted(filled.items()))
                raise StoreError(f"the target {dst.name} is not empty ({detail}); nothing copied")
            rows = src.call(_read_all, tables)
            dst.call(_write_all, rows, dst)
            return {
                "from": src.name,
                "to": dst.name,
                "tables": {table: len(table_rows) for table, table_rows in rows.items()},
            }
        finally:
            dst.close()
    finally:
        src.close()


def _ordered(tables: list[str]) -> list[str]:
    rest = sorted(t for t in tables if t not in FIRST and t not in NOT_COPIED)
    return [t for t in FIRST if t in tables] + rest
