"""Store operations: each a function ``op(conn, *args)`` run by :class:`gateway.store.Store`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.store import claims
from gateway.store import sql as sq
from gateway.store.sql import CLAIMS, KEY_ROWS, ORG_ROWS, OWN_ROWS, Conn, locks

# -- organisations -------------------------------------------------------------------------


def create_org(conn: Conn, org: dict[str, Any]) -> dict[str, Any]:
    sq.insert(conn, "orgs", org)
    return org


def list_orgs(conn: Conn) -> list[dict[str, Any]]:
    return sq.select(conn, "orgs", "ORDER BY created_at")


@locks(lambda org_id, policy: (ORG_ROWS, org_id))
def set_org_policy(conn: Conn, org_id: str, policy: dict[str, Any]) -> int:
    return sq.update(conn, "orgs", {"id": org_id}, {"policy": policy})


def set_provider_credential(conn: Conn, row: dict[str, Any]) -> None:
    sq.upsert(conn, "provider_credentials", row)


def list_provider_credentials(conn: Conn) -> list[dict[str, Any]]:
    return sq.select(conn, "provider_credentials")


# -- credit ledger -------------------------------------------------------------------------


def add_ledger_row(conn: Conn, row: dict[str, Any]) -> None:
    sq.insert(conn, "credit_ledger", row)


def org_balances(conn: Conn) -> dict[str, dict[str, int]]:
    """Per organisation: purchased and used nano-USD (used is positive)."""
    rows = sq.query(
        conn,
        "SELECT org_id,"
        " SUM(CASE WHEN amount_nanos > 0 THEN amount_nanos ELSE 0 END) AS purchased,"
        " -SUM(CASE WHEN amount_nanos < 0 THEN amount_nanos ELSE 0 END) AS used"
        " FROM credit_ledger GROUP BY org_id",
    )
    return {r["org_id"]: {"purchased": r["purchased"] or 0, "used": r["used"] or 0} for r in rows}


# -- keys ----------------------------------------------------------------------------------


def insert_key(conn: Conn, key: dict[str, Any]) -> None:
    sq.insert(conn, "keys", key)


@locks(lambda key_id, values: (KEY_ROWS, key_id))
def update_key(conn: Conn, key_id: str, values: dict[str, Any]) -> int:
    return sq.update(conn, "keys", {"id": key_id}, values)


@locks(lambda new_key, old_id, *_: (KEY_ROWS, old_id))
def rotate_key(
    conn: Conn,
    new_key: dict[str, Any],
    old_id: str,
    old_values: dict[str, Any],
    child_ids: list[str],
) -> None:
    """A rotation, all or nothing: the new key, the old one's expiry and link to it, and
    its sub-keys moved under the new key."""
    insert_key(conn, new_key)
    update_key(conn, old_id, old_values)
    for child_id in child_ids:
        update_key(conn, child_id, {"parent_id": new_key["id"]})


def all_keys(conn: Conn) -> list[dict[str, Any]]:
    return sq.select(conn, "keys", "ORDER BY created_at, id")


def keys_by_prefixes(conn: Conn, prefixes: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """The keys of ``prefixes`` found (one indexed read for them all), each as a list:
    the key first, then what its validity and its successor need: its parent and the
    keys it was rotated to, in order. A prefix of no key is absent."""
    marks = ", ".join("?" * len(prefixes))
    keys = sq.select(conn, "keys", f"WHERE prefix IN ({marks})", prefixes)
    return {key["prefix"]: _with_kin(conn, key) for key in keys}


def _with_kin(conn: Conn, key: dict[str, Any]) -> list[dict[str, Any]]:
    found = [key]
    if key["parent_id"] is not None and (parent := _key(conn, key["parent_id"])) is not None:
        found.append(parent)
    successor = key["rotated_to"]
    while successor is not None and (row := _key(conn, successor)) is not None:
        found.append(row)
        successor = row["rotated_to"]
    return found


def _key(conn: Conn, key_id: str) -> dict[str, Any] | None:
    return sq.select_one(conn, "keys", "WHERE id = ?", (key_id,))


# -- request records -----------------------------------------------------------------------

#: the cache members of a record's stored ``usage``, flat so SQL can sum them
CACHE_USAGE = ("cached_input_tokens", "cache_write_tokens")


def usage_row(
    prompt: int, completion: int, total: int, cached: int, written: int
) -> dict[str, int]:
    """A record's ``usage`` as stored: OpenAI's three counts (what records had before
    cache tokens were priced) and the two cache counts, parts of ``prompt_tokens``."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "cached_input_tokens": cached,
        "cache_write_tokens": written,
    }


def usage_view(stored: dict[str, Any] | None) -> dict[str, int] | None:
    """A record's ``usage`` as GET /v1/requests/{id} shows it: ``input_tokens`` (every
    input token), ``output_tokens``, ``cached_input_tokens`` and ``cache_write_tokens``
    (parts of the input), and OpenAI's three names kept beside them. A record stored
    before cache counts were (no cache members) shows them as 0."""
    if stored is None:
        return None
    prompt = int(stored.get("prompt_tokens") or 0)
    completion = int(stored.get("completion_tokens") or 0)
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        **{name: int(stored.get(name) or 0) for name in CACHE_USAGE},
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": int(stored.get("total_tokens") or prompt + completion),
    }


def get_request(conn: Conn, request_id: str, key_id: str, *others: str) -> dict[str, Any] | None:
    """The record of a request made with ``key_id`` or one of ``others`` (a parent reads
    its sub-keys' records, as its usage counts their calls)."""
    marks = ", ".join("?" for _ in (key_id, *others))
    where = f"WHERE id = ? AND key_id IN ({marks})"
    return sq.select_one(conn, "requests", where, (request_id, key_id, *others))


def settled_spend(conn: Conn, day: str, month: str) -> list[dict[str, Any]]:
    """Settled nano-USD per key, and the parent it was reserved on, for one day and one
    month (start-up rebuild)."""
    return sq.query(
        conn,
        "SELECT key_id, parent_id,"
        " SUM(CASE WHEN day = ? THEN settled_usd_nanos ELSE 0 END) AS day_nanos,"
        " SUM(settled_usd_nanos) AS month_nanos"
        " FROM requests WHERE month = ? GROUP BY key_id, parent_id",
        (day, month),
    )


def key_windows(conn: Conn, key_id: str, day: str, month: str) -> dict[str, int]:
    """A key's day and month spend as the records hold it (its family's, for a parent):
    settled, and reserved by calls in flight (several nodes: every node's)."""
    return sq.query(
        conn,
        "SELECT"
        " COALESCE(SUM(CASE WHEN day = ? AND status != 'pending' THEN settled_usd_nanos"
        " ELSE 0 END), 0) AS day_spent,"
        " COALESCE(SUM(CASE WHEN day = ? AND status = 'pending' THEN reserved_usd_nanos"
        " ELSE 0 END), 0) AS day_reserved,"
        " COALESCE(SUM(CASE WHEN status != 'pending' THEN settled_usd_nanos ELSE 0 END), 0)"
        " AS month_spent,"
        " COALESCE(SUM(CASE WHEN status = 'pending' THEN reserved_usd_nanos ELSE 0 END), 0)"
        " AS month_reserved"
        " FROM requests WHERE (key_id = ? OR parent_id = ?) AND month = ?",
        (day, day, key_id, key_id, month),
    )[0]


#: the status of a request row while its call is in flight (before it is settled)
PENDING = "pending"
#: the status recovery gives a pending row whose process is gone
INTERRUPTED = "interrupted"


def _open_call_place(record: dict[str, Any], claim: dict[str, Any] | None) -> tuple[Any, ...]:
    return (CLAIMS, claim["key_id"], claim["idem_key"]) if claim else (OWN_ROWS,)


@locks(_open_call_place)
def open_call(
    conn: Conn, record: dict[str, Any], claim: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A call about to reach its provider: with an Idempotency-Key, the key's claim,
    and its ``pending`` request row: one transaction.

    Returns None when the call may go on, or the claim that holds its Idempotency-Key
    for another attempt (on this node or another): then nothing is written, and the
    call is a repeat of that one (:func:`gateway.store.claims.claim`).
    """
    if claim is not None:
        held = claims.claim(conn, claim)
        if held is not None:
            return held
    sq.insert(conn, "requests", record)
    return None


def settle_call(
    conn: Conn,
    request_id: str,
    values: dict[str, Any],
    ledger: dict[str, Any] | None,
    claim: tuple[str, str] | None,
    outcome: dict[str, Any] | None,
    leases: tuple[str, list[tuple[str, int]]] | None = None,
) -> None:
    """A call's settlement: its row's final state, its credit debit when it was billed,
    and the outcome of its Idempotency-Key ``claim`` (None: dropped): one transaction.

    With ``leases`` (several nodes: the node's id and what the settlement posts out of
    each of its leases): the posted amounts leave the node's leases, and a row that is
    no longer pending (a live node recovered it: this node was taken for dead) is left
    as recovery settled it, its debit and claim outcome dropped.
    """
    if leases is not None:
        if not sq.update(conn, "requests", {"id": request_id, "status": PENDING}, values):
            return
        leave_leases(conn, *leases)
    else:
        sq.update(conn, "requests", {"id": request_id}, values)
    if ledger is not None:
        sq.insert(conn, "credit_ledger", ledger)
    if claim is not None:
        claims.settle(conn, *claim, request_id, outcome)


def raise_reservation(conn: Conn, request_id: str, reserved_nanos: int) -> None:
    """A pending call's reservation topped up (a fallback model dearer than the one it
    reserved for): its row holds the new total, so that recovery after a crash counts
    it (:func:`recover_pending`)."""
    conn.execute(
        f"UPDATE requests SET reserved_usd_nanos = ? WHERE id = ? AND status = '{PENDING}'",
        (reserved_nanos, request_id),
    )


def leave_leases(conn: Conn, node_id: str, amounts: list[tuple[str, int]]) -> None:
    """Take ``amounts`` out of the node's leases (posted by a settlement, or given back),
    in the order of their limit ids."""
    for limit_id, amount in sorted(amounts):
        conn.execute(
            "UPDATE leases SET amount = amount - ? WHERE limit_id = ? AND node_id = ?",
            (amount, limit_id, node_id),
        )


def recover_pending(conn: Conn, only: str = "", params: tuple[Any, ...] = ()) -> dict[str, int]:
    """Settle every ``pending`` row (its process is gone) by the settlement table's row
    "anything else without reported usage": the full reservation counts against the
    caps of the call's day and month, nothing is billed (no ledger row); the record says
    ``interrupted``, ``service_unavailable``. Their Idempotency-Key claims say so too.

    With ``only`` (an SQL condition, and its ``params``): only the rows it selects (the
    rows a dead node left, when several nodes share the database).

    Returns how many rows, and the nano-USD they now count.
    """
    # the literal 'pending' (not a bound parameter) lets SQLite use the partial index
    where = f"status = '{PENDING}'" + (f" AND {only}" if only else "")
    found = sq.query(
        conn,
        "SELECT COUNT(*) AS calls, COALESCE(SUM(reserved_usd_nanos), 0) AS nanos"
        f" FROM requests WHERE {where}",
        params,
    )[0]
    if only:
        claims.interrupt_running(conn, f"SELECT id FROM requests WHERE {where}", params)
    else:
        claims.interrupt_running(conn)
    conn.execute(
        f"UPDATE requests SET status = '{INTERRUPTED}', error_code = 'service_unavailable',"
        " http_status = 503, settled_usd_nanos = reserved_usd_nanos, billed_usd_nanos = 0"
        f" WHERE {where}",
        params,
    )
    return {"calls": found["calls"], "nanos": found["nanos"]}


def org_billed(conn: Conn, month: str) -> dict[str, int]:
    """Billed nano-USD per organisation in one month (start-up rebuild of budgets)."""
    rows = sq.query(
        conn,
        "SELECT org_id, SUM(billed_usd_nanos) AS billed FROM requests WHERE month = ?"
        " GROUP BY org_id",
        (month,),
    )
    return {row["org_id"]: row["billed"] or 0 for row in rows}


def usage_rows(
    conn: Conn,
    key_ids: list[str],
    start: str,
    end: str,
    group: str | None,
    by_day: bool = False,
) -> list[dict[str, Any]]:
    """Totals of the settled requests of ``key_ids`` between two days (inclusive), grouped
    (a call in flight counts once it is settled).

    ``group`` is a column name (day, model, key_id) or ``tag:<name>``; None for one total.
    ``by_day`` also splits each group by day (a ``day`` column): the dashboard's chart.
    """
    dialect = conn.dialect
    params: list[Any] = []
    if group is None:
        select = "NULL AS grp"
    elif group.startswith("tag:"):
        select = f"{dialect.bytewise(dialect.json_text('tags'))} AS grp"
        params.append(group[4:])
    else:
        select = f"{group} AS grp"
    marks = ", ".join("?" for _ in key_ids)
    params += [*key_ids, start, end]
    days = "day, " if by_day else ""
    members = {"input_tokens": "prompt_tokens", "output_tokens": "completion_tokens"}
    members |= {name: name for name in CACHE_USAGE}
    sums = "".join(
        f" SUM(COALESCE({dialect.json_int('usage', member)}, 0)) AS {name},"
        for name, member in members.items()
    )
    return sq.query(
        conn,
        f"SELECT {days}{select}, COUNT(*) AS requests,{sums}"
        " SUM(billed_usd_nanos) AS billed, SUM(settled_usd_nanos) AS settled"
        f" FROM requests WHERE key_id IN ({marks}) AND day BETWEEN ? AND ?"
        f" AND status != '{PENDING}'"
        f" GROUP BY {days}grp ORDER BY {days}grp NULLS FIRST",
        params,
    )
