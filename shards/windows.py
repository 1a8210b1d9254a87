"""Window arithmetic: which clock minute, UTC day and UTC month an instant falls in.

Windows are plain integers so that key state stays small and comparisons are cheap:

- minute window ``floor(t / 60)``: 10:00:59 and 10:01:00 are different windows
  (the spec's "clock minutes");
- day window ``floor(t / 86400)``: days since 1970-01-01 UTC, so it rolls over at
  midnight UTC (POSIX time has no leap seconds, every day is 86,400 s);
- month window ``year * 12 + (month - 1)`` of the UTC date, rolling over on the 1st.

A state object stores the window index its counters belong to and resets the
counters lazily when it next sees a later index (see :mod:`shards.state`).

The ``*_resets_at`` helpers give the epoch second at which the window containing
``t`` ends, for ``resets_at`` fields and the ``X-RateLimit-Reset-Requests`` header.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime
from functools import lru_cache

__all__ = [
    "DAY_S",
    "MINUTE_S",
    "day_resets_at",
    "day_window",
    "minute_resets_at",
    "minute_window",
    "month_of_day",
    "month_resets_at",
    "month_window",
    "seconds_until_minute_reset",
]

MINUTE_S = 60
DAY_S = 86_400
_EPOCH_ORDINAL = date(1970, 1, 1).toordinal()


def minute_window(t: float) -> int:
    """The clock-minute window of epoch second ``t``."""
    return int(t // MINUTE_S)


def day_window(t: float) -> int:
    """The UTC-day window of ``t`` (days since 1970-01-01)."""
    return int(t // DAY_S)


@lru_cache(maxsize=64)
def month_of_day(day: int) -> int:
    """The month window (``year * 12 + month - 1``) that day window ``day`` lies in.

    Cached: a process sees a handful of distinct days, and the date arithmetic
    would otherwise dominate a reservation.
    """
    d = date.fromordinal(_EPOCH_ORDINAL + day)
    return d.year * 12 + d.month - 1


def month_window(t: float) -> int:
    """The UTC-month window of ``t``."""
    return month_of_day(day_window(t))


def minute_resets_at(t: float) -> int:
    """Epoch second at which the clock minute containing ``t`` ends."""
    return (minute_window(t) + 1) * MINUTE_S


def day_resets_at(t: float) -> int:
    """Epoch second of the next midnight UTC after ``t``."""
    return (day_window(t) + 1) * DAY_S


def month_resets_at(t: float) -> int:
    """Epoch second of 00:00 UTC on the first day of the month after ``t``'s."""
    year, month0 = divmod(month_window(t) + 1, 12)
    return int(datetime(year, month0 + 1, 1, tzinfo=UTC).timestamp())


def seconds_until_minute_reset(t: float) -> int:
    """Whole seconds until the minute window resets: rounded up, at least 1.

    This is the ``Retry-After`` of a per-key rate limit ("the rest of the current
    minute") and the value of ``X-RateLimit-Reset-Requests``.
    """
    return max(1, math.ceil(minute_resets_at(t) - t))
