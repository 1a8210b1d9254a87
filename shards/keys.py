"""Per-key accounts: the rate windows, the in-flight count and the spend windows.

One :data:`KeyState` per key, created by its shard when the key is first resolved
to a :class:`KeyRef` (or its spend loaded) and never shared between shards: an
``array("q")`` of ten signed 64-bit ints, read and written by the field positions
below (``key[DAY_POSTED]``).

Why an array and not an object with a slot per field: with 100,000 keys picked at
random, a key's state is out of the CPU caches whenever a call reaches it, and
every cache line it spans costs a miss. A slotted object spans two lines, and each
counter above 256 is an int object of its own somewhere else in the heap (five or
more lines per key); the array keeps all ten counters in one buffer of 80 bytes
and is not tracked by the garbage collector. An idle key, its ref included, costs
about 300 bytes.

Every counter stays within 64 bits by construction: a reservation is refused unless
posted + pending + cost fits in :data:`INT64_MAX` nano-USD on each window, so a key
without a spend cap meets that one (9.2 billion USD a day or month), and the token
window saturates there (every tpm limit is far below it).

A parent key's spend windows hold the whole family's spend (its own calls and its
sub-keys'), because that is what the parent's caps count; a sub-key's windows hold
its own spend only. Rate windows and the in-flight count are per key.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple, TypeAlias

__all__ = [
    "DAY",
    "DAY_PENDING",
    "DAY_POSTED",
    "INT64_MAX",
    "IN_FLIGHT",
    "MINUTE",
    "MONTH",
    "MONTH_PENDING",
    "MONTH_POSTED",
    "REQUESTS",
    "TOKENS",
    "KeyRef",
    "KeyState",
    "new_key_state",
    "over_cap",
    "resolve",
    "roll_minute",
    "roll_spend",
]

KeyState: TypeAlias = "array[int]"

#: the clock-minute window the rate counters belong to, and the counters
MINUTE, REQUESTS, TOKENS = 0, 1, 2
#: in-flight slots held (model calls only)
IN_FLIGHT = 3
#: the UTC-day window and its posted (settled) and pending (reserved) nano-USD
DAY, DAY_POSTED, DAY_PENDING = 4, 5, 6
#: the UTC-month window, likewise
MONTH, MONTH_POSTED, MONTH_PENDING = 7, 8, 9

#: a key that has seen nothing: no window open, nothing counted
_BLANK = array("q", [-1, 0, 0, 0, -1, 0, 0, -1, 0, 0])

#: the largest value a counter holds
INT64_MAX = 2**63 - 1


class KeyRef(NamedTuple):
    """A key resolved once: its shard and its state, which messages carry.

    Why messages do not name a key by its id: a call names its key in three
    messages (admit, reserve, settle), and a lookup by id in each of them (route by
    a checksum of the family id, then hash the key id into the shard's dict) reads
    the id strings, the dict's slot and entry, each a cache line of its own. With
    100,000 keys picked at random none of them is in the CPU caches when a call
    arrives, and each miss costs more than the rest of the lookup. The caller
    resolves a key once (:meth:`~shards.pool.ShardPool.key_ref`) and keeps the ref
    with its own record of the key; each message then carries the shard index and
    the state itself (not the ref: one object fewer to reach per step), so the
    pool routes by an int and the shard reaches the counters at once.
    ``bench/admission.py`` measures it.

    The state is a handle, not shared data: only the owning shard's actor reads or
    writes it (callers pass it on untouched, as they would a file descriptor). One
    ref per key id and pool, for the pool's lifetime: a key's state is never
    replaced, so a ref never goes stale.
    """

    key_id: str
    family_id: str
    #: the index of the owning shard in its pool (where messages are routed)
    shard: int
    #: the key's counters, read and written by the owning shard only
    state: KeyState


def new_key_state() -> KeyState:
    """A key that has seen nothing: no window open, nothing counted."""
    return array("q", _BLANK)


def roll_minute(key: KeyState, minute: int) -> None:
    """Open the clock-minute window ``minute`` of the rate counters if it is later."""
    if minute > key[MINUTE]:
        key[MINUTE] = minute
        key[REQUESTS] = 0
        key[TOKENS] = 0


def roll_spend(key: KeyState, day: int, month: int) -> None:
    """Open the day/month windows containing now, dropping older ones."""
    if day > key[DAY]:
        key[DAY] = day
        key[DAY_POSTED] = 0
        key[DAY_PENDING] = 0
    if month > key[MONTH]:
        key[MONTH] = month
        key[MONTH_POSTED] = 0
        key[MONTH_PENDING] = 0


def over_cap(key: KeyState, cost: int, usd_day: int | None, usd_month: int | None) -> str:
    """Name of the first spend cap that ``cost`` would break, or "" (no cap: 64 bits)."""
    if key[DAY_POSTED] + key[DAY_PENDING] + cost > (INT64_MAX if usd_day is None else usd_day):
        return "usd_day"
    month_cap = INT64_MAX if usd_month is None else usd_month
    if key[MONTH_POSTED] + key[MONTH_PENDING] + cost > month_cap:
        return "usd_month"
    return ""


def resolve(key: KeyState, day: int, month: int, reserved: int, posted: int) -> None:
    """Move ``reserved`` (made in the windows ``day`` and ``month``) out of pending and
    post ``posted``, per window."""
    if key[DAY] == day:
        key[DAY_PENDING] -= reserved
        key[DAY_POSTED] += posted
    if key[MONTH] == month:
        key[MONTH_PENDING] -= reserved
        key[MONTH_POSTED] += posted
