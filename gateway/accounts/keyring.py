"""The in-memory key index: authentication lookups and every key lifecycle change.

All key records are loaded at start-up; a change (create, disable, revoke, rotate) is
written to the store first and then swapped into memory, so the running server
refuses a revoked key on its very next call. With several nodes, the changes of the
others come by the change poll (:meth:`load`), and a key made on another node may come
before it, by a lookup of its prefix (:meth:`learn`).

Lifecycle changes run one at a time (one lock) and always apply to the record as it is
*now*, not as a handler read it before an await: two concurrent changes never undo each
other, and a revoked key stays revoked (400 key_revoked for any later status change).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import trio

from gateway.accounts import key_record as k
from gateway.accounts.key_record import KeyRecord
from gateway.errors import GatewayError
from gateway.store import Store, StoreError, records
from shards import KeyRef

#: the settings a rotated key takes over from the key it replaces
_ROTATED = (
    *("org_id", "name", "mode", "family_id", "status", "environment", "scopes", "caps"),
    *("data_mode", "byok", "allowed_models", "required_tags", "default_tags", "expires_at"),
    "guardrails",
    "allowed_tools",
)


class Keyring:
    def __init__(
        self,
        store: Store,
        key_ref: Callable[[str, str], KeyRef],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        #: resolves a key in the shard pool (``ShardPool.key_ref``): every record is
        #: born with its ref, and ``with_changes`` carries it on
        self.key_ref = key_ref
        self.clock = clock
        self._by_prefix: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._dirty_last_used: set[str] = set()
        self._lifecycle = trio.Lock()

    # -- loading and lookups ---------------------------------------------------------------

    def load(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._put(self._from_row(row))

    def learn(self, rows: list[dict[str, Any]]) -> None:
        """Load the keys of ``rows`` this keyring does not hold (a key another node made,
        met before the change poll brought it: :mod:`gateway.accounts.key_lookup`). A held record
        stays: the poll keeps it fresh, and a change made here since the rows were read
        must not be undone by them."""
        for row in rows:
            if row["id"] not in self._by_id:
                self._put(self._from_row(row))

    def _from_row(self, row: dict[str, Any]) -> KeyRecord:
        record = KeyRecord.from_row(row)
        return record.with_changes(shard_ref=self.key_ref(record.id, record.family_id))

    def _put(self, record: KeyRecord) -> None:
        self._by_prefix[record.prefix] = record
        self._by_id[record.id] = record

    def holds(self, prefix: str) -> bool:
        return prefix in self._by_prefix

    def get(self, key_id: str) -> KeyRecord | None:
        return self._by_id.get(key_id)

    def all(self) -> list[KeyRecord]:
        return list(self._by_id.values())

    def children(self, key_id: str) -> list[KeyRecord]:
        return [r for r in self._by_id.values() if r.parent_id == key_id]

    def successor(self, record: KeyRecord) -> KeyRecord:
        """The newest key of ``record``'s rotations (itself if never rotated)."""
        while record.rotated_to is not None and record.rotated_to in self._by_id:
            record = self._by_id[record.rotated_to]
        return record

    def authenticate(self, token: str) -> KeyRecord | None:
        """The valid key of ``token``, or None for every kind of failure alike."""
        parsed = k.parse_token(token)
        record = self._by_prefix.get(parsed[1]) if parsed else None
        matches = k.fingerprint_matches(token, record.fingerprint if record else None)
        if record is None or not matches or parsed is None or parsed[0] != record.mode:
            return None
        if not self.is_valid(record):
            return None
        return record

    def is_valid(self, record: KeyRecord) -> bool:
        now = self.clock()
        if record.effective_status(now) != "active":
            return False
        if record.parent_id is not None:
            parent = self._by_id.get(record.parent_id)
            if parent is None or parent.effective_status(now) != "active":
                return False
        return True

    def touch(self, record: KeyRecord) -> KeyRecord:
        """Note a use; :meth:`flush_last_used` writes it out in the background."""
        touched = record.with_changes(last_used_at=self.clock())
        self._put(touched)
        self._dirty_last_used.add(record.id)
        return touched

    async def flush_last_used(self) -> None:
        """Write the noted uses; a store that is unavailable keeps them for the next flush."""
        dirty, self._dirty_last_used = self._dirty_last_used, set()
        for key_id in dirty:
            record = self._by_id.get(key_id)
            if record is None:
                continue
            try:
                await self.store.write(
                    records.update_key, key_id, {"last_used_at": record.last_used_at}
                )
            except StoreError:
                self._dirty_last_used.add(key_id)

    # -- lifecycle ---------------------------------------------------------------------------

    def build(
        self,
        *,
        org_id: str,
        name: str,
        mode: str,
        family_id: str | None = None,
        parent_id: str | None = None,
        **settings: Any,
    ) -> tuple[KeyRecord, str]:
        family = family_id or k.new_family_code()
        prefix = k.new_prefix(family)
        while prefix in self._by_prefix:
            prefix = k.new_prefix(family)
        token = k.new_token(mode, prefix)
        key_id = k.new_id("key")
        record = KeyRecord(
            id=key_id,
            org_id=org_id,
            family_id=family,
            prefix=prefix,
            fingerprint=k.fingerprint(token),
            name=name,
            mode=mode,
            parent_id=parent_id,
            created_at=self.clock(),
            shard_ref=self.key_ref(key_id, family),
            **settings,
        )
        return record, token

    async def insert(self, record: KeyRecord) -> None:
        async with self._lifecycle:
            await self._insert(record)

    async def insert_child(self, record: KeyRecord) -> KeyRecord:
        """Insert a sub-key under its parent as the parent is *now*.

        A parent rotated meanwhile hands the sub-key to its successor; a parent that is
        no longer valid (revoked while the request ran, say) refuses it with the uniform
        401, so no sub-key is ever left behind under a dead parent.
        """
        assert record.parent_id is not None
        async with self._lifecycle:
            parent = self.successor(self._by_id[record.parent_id])
            if not self.is_valid(parent):
                raise GatewayError("invalid_api_key")
            child = record.with_changes(parent_id=parent.id)
            await self._insert(child)
            return child

    async def _insert(self, record: KeyRecord) -> None:
        await self.store.write(records.insert_key, record.to_row())
        self._put(record)

    def insert_now(self, record: KeyRecord) -> None:
        """Synchronous insert for start-up bootstrap, before the writer runs."""
        self.store.call(records.insert_key, record.to_row())
        self._put(record)

    async def change(self, record: KeyRecord, **values: Any) -> KeyRecord:
        async with self._lifecycle:
            return await self._apply(record.id, **values)

    async def _apply(self, key_id: str, **values: Any) -> KeyRecord:
        """Write ``values`` onto the key's current record; the caller holds the lock."""
        current = self._by_id[key_id]
        if current.status == "revoked" and values.get("status", "revoked") != "revoked":
            raise GatewayError("key_revoked", "The key is revoked; it cannot be changed.")
        row = current.with_changes(**values).to_row()
        await self.store.write(records.update_key, key_id, {name: row[name] for name in values})
        # re-read after the write: a touch (last_used_at) may have landed meanwhile
        updated = self._by_id[key_id].with_changes(**values)
        self._put(updated)
        return updated

    async def revoke(self, record: KeyRecord) -> KeyRecord:
        """Revoke definitively, and every sub-key with it (idempotent)."""
        async with self._lifecycle:
            for child in self.children(record.id):
                if child.status != "revoked":
                    await self._apply(child.id, status="revoked")
            return await self._apply(record.id, status="revoked")

    async def rotate(self, record: KeyRecord, grace_s: float) -> tuple[KeyRecord, str]:
        """A new key with the same settings and fresh counters; the old one expires later.

        The old key's sub-keys move under the new key (so their spend is reserved against
        it); the old key keeps working, with its own counters, for ``grace_s`` at most.
        """
        async with self._lifecycle:
            current = self._by_id[record.id]
            if current.status == "revoked":
                raise GatewayError("key_revoked", "A revoked key cannot be rotated.")
            if current.rotated_to is not None:
                raise GatewayError(
                    "invalid_request",
                    f"This key was already rotated to {current.rotated_to}; rotate that one.",
                )
            new, token = self.build(**{name: getattr(current, name) for name in _ROTATED})
            expiry = self.clock() + grace_s
            if current.expires_at is not None:
                expiry = min(expiry, current.expires_at)
            children = self.children(current.id)
            old_values = {"expires_at": expiry, "rotated_to": new.id}
            await self.store.write(
                records.rotate_key,
                new.to_row(),
                current.id,
                {name: current.with_changes(**old_values).to_row()[name] for name in old_values},
                [child.id for child in children],
            )
            self._put(new)
            for child in children:  # re-read: a touch (last_used_at) may have landed meanwhile
                self._put(self._by_id[child.id].with_changes(parent_id=new.id))
            self._put(self._by_id[current.id].with_changes(**old_values))
            return new, token
