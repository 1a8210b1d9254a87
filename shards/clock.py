"""Injectable wall clocks for admission windows.

Every window in :mod:`shards` (the clock minute of the rate limits, the UTC day and
month of the spend caps) is derived from one number: ``Clock.now()``, epoch seconds in
UTC. The shard actors never call :func:`time.time` themselves; the pool is handed a
clock, so tests can stand on 10:00:59 and step to 10:01:00 without sleeping.

This is the *wall* clock. Timeouts on shard round trips use trio's own clock
(``trio.current_time()``), so tests can drive the two independently: a
:class:`FakeClock` for windows, ``trio.testing.MockClock`` for deadlines.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "FakeClock", "NonDecreasingClock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """Anything that tells the current time as epoch seconds (UTC)."""

    def now(self) -> float: ...


class SystemClock:
    """The real wall clock (:func:`time.time`)."""

    __slots__ = ()

    def now(self) -> float:
        return time.time()


class FakeClock:
    """A settable, advanceable clock for tests.

    >>> clock = FakeClock.at(2026, 1, 31, 23, 59, 59)
    >>> clock.advance(1)
    >>> clock.isoformat()
    '2026-02-01T00:00:00+00:00'
    """

    __slots__ = ("_t",)

    def __init__(self, t: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self._t = float(t)

    @classmethod
    def at(
        cls,
        year: int,
        month: int,
        day: int,
        hour: int = 0,
        minute: int = 0,
        second: float = 0.0,
    ) -> FakeClock:
        """A clock standing on the given UTC date and time."""
        whole = int(second)
        base = datetime(year, month, day, hour, minute, whole, tzinfo=UTC)
        return cls(base.timestamp() + (second - whole))

    def now(self) -> float:
        return self._t

    def set(self, t: float) -> None:
        """Jump to epoch second ``t`` (forwards or backwards)."""
        self._t = float(t)

    def advance(self, seconds: float) -> None:
        """Move forwards by ``seconds`` (must not be negative)."""
        if seconds < 0:
            raise ValueError("a FakeClock only advances forwards; use set()")
        self._t += seconds

    def isoformat(self) -> str:
        """The current time as an ISO 8601 string in UTC (handy in test output)."""
        return datetime.fromtimestamp(self._t, UTC).isoformat()

    def __repr__(self) -> str:
        return f"FakeClock({self.isoformat()})"


class NonDecreasingClock:
    """Wraps a clock so that time never goes backwards (a high-water mark).

    The pool reads time only through one of these. If the wall clock is stepped
    back (NTP, an operator), windows hold where they were instead of reopening,
    and every account's window index is at most the current one, so a reservation
    always resolves against the window its pending amount was added to.
    """

    __slots__ = ("_clock", "_last")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last = float("-inf")

    @property
    def wrapped(self) -> Clock:
        return self._clock

    def now(self) -> float:
        t = self._clock.now()
        if t < self._last:
            return self._last
        self._last = t
        return t
