"""The public catalog's per-IP limit (GET /v1/models without a key).

Clock-minute windows like every other limit here. The table is cleared when the
minute rolls over, so it never holds more than one minute's worth of addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PublicVerdict:
    allowed: bool
    limit: int
    remaining: int
    retry_after: int


class PublicCatalogLimiter:
    def __init__(self, per_minute: int, now: Callable[[], float]) -> None:
        self.per_minute = per_minute
        self._now = now
        self._minute = -1
        self._counts: dict[str, int] = {}

    def hit(self, address: str) -> PublicVerdict:
        now = self._now()
        minute = int(now // 60)
        if minute != self._minute:
            self._minute = minute
            self._counts = {}
        count = self._counts.get(address, 0) + 1
        self._counts[address] = count
        retry_after = max(1, 60 - int(now % 60))
        return PublicVerdict(
            allowed=count <= self.per_minute,
            limit=self.per_minute,
            remaining=max(0, self.per_minute - count),
            retry_after=retry_after,
        )
