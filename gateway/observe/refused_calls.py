"""Refused calls an owner can see: counts by key, error code and UTC day.

A call refused with a key the gateway knows (a 4xx or 5xx answered before any model call
was admitted: a cap, a rate limit, a policy, a scope, a bad body) leaves no request
record. It is counted here instead, in memory, at the cost of a dictionary update on
the request's path; :meth:`RefusalCounts.flush` (every ``FLUSH_S`` seconds, and once
more at a graceful stop) adds the counts to the store in one batch
(:mod:`gateway.store.refusal_counts`). Read by ``GET /v1/usage`` (``refusals``) and the
dashboard's Usage and key pages, a few seconds behind at most.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from gateway.store import Store, StoreError
from gateway.store.refusal_counts import add_refusals

#: how often the counts are written out
FLUSH_S = 2.0
#: the answers that are not refusals of the caller: it left (499)
NOT_COUNTED = frozenset({"client_closed"})


class RefusalCounts:
    """The counts not yet in the store, by (key id, code, day) and with the key's
    organisation."""

    def __init__(self, store: Store, now: Callable[[], float], node_id: str | None) -> None:
        self.store = store
        self.now = now
        self.node_id = node_id or ""
        self._pending: dict[tuple[str, str, str, str], int] = {}

    def note(self, key_id: str, org_id: str, code: str) -> None:
        """One refused call of ``key_id`` with ``code`` (now)."""
        if code in NOT_COUNTED:
            return
        day = datetime.fromtimestamp(self.now(), UTC).date().isoformat()
        slot = (key_id, code, day, org_id)
        self._pending[slot] = self._pending.get(slot, 0) + 1

    async def flush(self) -> None:
        """Add the pending counts to the store; kept for the next flush if it is down."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        additions = [
            (key_id, code, day, self.node_id, org_id, count)
            for (key_id, code, day, org_id), count in pending.items()
        ]
        try:
            await self.store.write(add_refusals, additions)
        except StoreError:
            for slot, count in pending.items():
                self._pending[slot] = self._pending.get(slot, 0) + count
