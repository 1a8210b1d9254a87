"""Per-key accounts: the rate windows, the in-flight count and the spend windows.

One :class:`KeyState` per key, created lazily by its shard on the first message
and never shared between shards. It is deliberately small (``__slots__``, ints
only, window indices shared between keys): an idle key costs a few hundred bytes.

A parent key's spend windows hold the whole family's spend (its own calls and its
sub-keys'), because that is what the parent's caps count; a sub-key's windows hold
its own spend only. Rate windows and the in-flight count are per key.
"""

from __future__ import annotations

from .messages import Reservation

__all__ = ["KeyState"]


class KeyState:
    """Mutable windows of one key. Idle, it costs about a hundred bytes."""

    __slots__ = (
        "day",
        "day_pending",
        "day_posted",
        "in_flight",
        "minute",
        "month",
        "month_pending",
        "month_posted",
        "requests",
        "tokens",
    )

    def __init__(self) -> None:
        self.minute = -1
        self.requests = 0
        self.tokens = 0
        self.in_flight = 0
        self.day = -1
        self.day_posted = 0
        self.day_pending = 0
        self.month = -1
        self.month_posted = 0
        self.month_pending = 0

    def roll_spend(self, day: int, month: int) -> None:
        """Open the day/month windows containing now, dropping older ones."""
        if day > self.day:
            self.day = day
            self.day_posted = 0
            self.day_pending = 0
        if month > self.month:
            self.month = month
            self.month_posted = 0
            self.month_pending = 0

    def over_cap(self, cost: int, usd_day: int | None, usd_month: int | None) -> str:
        """Name of the first spend cap that ``cost`` would break, or ""."""
        if usd_day is not None and self.day_posted + self.day_pending + cost > usd_day:
            return "usd_day"
        if usd_month is not None and self.month_posted + self.month_pending + cost > usd_month:
            return "usd_month"
        return ""

    def resolve(self, res: Reservation, reserved: int, posted: int) -> None:
        """Move ``reserved`` out of pending and post ``posted``, per window."""
        if self.day == res.day:
            self.day_pending -= reserved
            self.day_posted += posted
        if self.month == res.month:
            self.month_pending -= reserved
            self.month_posted += posted
