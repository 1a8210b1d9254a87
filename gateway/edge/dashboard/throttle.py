"""Sign-in lock-out: after ``MAX_FAILURES`` wrong passwords for one email within
``WINDOW_S``, that email is locked for ``LOCK_S``; a right password clears the count.

Counted per email address as typed (lower-cased), known or not, so a locked answer does
not tell whether the account exists. Held in memory (one server per database), bounded:
the oldest entries go first when ``CAPACITY`` is reached. A restart clears it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_FAILURES = 5
WINDOW_S = 15 * 60.0
LOCK_S = 15 * 60.0
CAPACITY = 10_000


@dataclass
class _Entry:
    failures: int
    first_at: float
    locked_until: float = 0.0


class LoginThrottle:
    def __init__(self, clock: Callable[[], float], capacity: int = CAPACITY) -> None:
        self._clock = clock
        self._capacity = capacity
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def locked_for(self, email: str) -> float:
        """Seconds until ``email`` may try again (0: it may now)."""
        entry = self._entries.get(email)
        if entry is None:
            return 0.0
        return max(0.0, entry.locked_until - self._clock())

    def failure(self, email: str) -> float:
        """Count a wrong password; answer the lock's length if this one locks."""
        now = self._clock()
        entry = self._entries.get(email)
        if entry is None or now - entry.first_at > WINDOW_S or entry.locked_until:
            entry = _Entry(failures=0, first_at=now)
        entry.failures += 1
        if entry.failures >= MAX_FAILURES:
            entry.locked_until = now + LOCK_S
        self._entries[email] = entry
        self._entries.move_to_end(email)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)
        return LOCK_S if entry.locked_until else 0.0

    def clear(self, email: str) -> None:
        """A right password, or an operator's reset."""
        self._entries.pop(email, None)
