"""The layering rules of docs/ARCHITECTURE.md, read from the source's import statements.

- ``shards/`` imports nothing from ``gateway/`` (it decides admissions for any front end);
- only ``gateway/store/`` imports a database driver (sqlite, psycopg): nothing above the
  store knows which backend it runs on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", sources("shards"), ids=lambda p: p.name)
def test_shards_import_nothing_from_gateway(path: Path) -> None:
    bad = {m for m in imported_modules(path) if m == "gateway" or m.startswith("gateway.")}
    assert not bad, f"{path.name} imports {bad}"


DRIVERS = {"sqlite3", "sqlite_utils", "psycopg", "psycopg_binary", "asyncpg"}


def test_only_the_store_imports_a_database_driver() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for package in ("gateway", "shards")
        for path in sources(package)
        if "store" not in path.relative_to(ROOT).parts
        and {m.split(".")[0] for m in imported_modules(path)} & DRIVERS
    ]
    assert offenders == []


def test_the_rules_see_real_imports() -> None:
    """The scanner itself: it finds the imports it is meant to police."""
    assert {"sqlite_utils", "psycopg"} <= {
        m.split(".")[0] for p in sources("gateway/store") for m in imported_modules(p)
    }
    assert "shards" in imported_modules(ROOT / "gateway" / "runtime.py")
