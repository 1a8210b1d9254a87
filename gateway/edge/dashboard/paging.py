"""Keyset pages of the dashboard's long lists (request records, the audit list): a page
after the previous page's last row, named by its ``(time, id)`` in the query string as
``<time>~<id>``, so a deep page costs what the first does."""

from __future__ import annotations

from typing import Any


def cursor(text: str) -> tuple[float, str] | None:
    """The ``(time, id)`` a ``before`` parameter names; anything else is the first page."""
    stamp, sep, row_id = text.partition("~")
    try:
        return (float(stamp), row_id) if sep and row_id else None
    except ValueError:
        return None


def after(row: dict[str, Any], time_column: str) -> str:
    """The ``before`` parameter of the page after ``row``."""
    return f"{row[time_column]!r}~{row['id']}"
