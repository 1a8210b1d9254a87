"""The in-memory key index: authentication lookups and every key lifecycle change.

All key records are loaded at start-up; a change (create, disable, revoke, rotate) is
written to the store first and then swapped into memory, so the running server
refuses a revoked key on its very next call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway import keys as k
from gateway.keys import KeyRecord
from gateway.store import Store, records


class Keyring:
    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock
        self._by_prefix: dict[str, KeyRecord] = {}
        self._by_id: dict[str, KeyRecord] = {}
        self._dirty_last_used: set[str] = set()

    # -- loading and lookups ---------------------------------------------------------------

    def load(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._put(KeyRecord.from_row(row))

    def _put(self, record: KeyRecord) -> None:
        self._by_prefix[record.prefix] = record
        self._by_id[record.id] = record

    def get(self, key_id: str) -> KeyRecord | None:
        return self._by_id.get(key_id)

    def all(self) -> list[KeyRecord]:
        return list(self._by_id.values())

    def children(self, key_id: str) -> list[KeyRecord]:
        return [r for r in self._by_id.values() if r.parent_id == key_id]

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
        dirty, self._dirty_last_used = self._dirty_last_used, set()
        for key_id in dirty:
            record = self._by_id.get(key_id)
            if record is not None:
                await self.store.write(
                    records.update_key, key_id, {"last_used_at": record.last_used_at}
                )

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
        record = KeyRecord(
            id=k.new_id("key"),
            org_id=org_id,
            family_id=family,
            prefix=prefix,
            fingerprint=k.fingerprint(token),
            name=name,
            mode=mode,
            parent_id=parent_id,
            created_at=self.clock(),
            **settings,
        )
        return record, token

    async def insert(self, record: KeyRecord) -> None:
        await self.store.write(records.insert_key, record.to_row())
        self._put(record)

    def insert_now(self, record: KeyRecord) -> None:
        """Synchronous insert for start-up bootstrap, before the writer runs."""
        self.store.call(records.insert_key, record.to_row())
        self._put(record)

    async def change(self, record: KeyRecord, **values: Any) -> KeyRecord:
        updated = record.with_changes(**values)
        row = updated.to_row()
        await self.store.write(records.update_key, record.id, {name: row[name] for name in values})
        self._put(updated)
        return updated

    async def revoke(self, record: KeyRecord) -> KeyRecord:
        """Revoke definitively, and every sub-key with it."""
        for child in self.children(record.id):
            if child.status != "revoked":
                await self.change(child, status="revoked")
        return await self.change(record, status="revoked")

    async def rotate(self, record: KeyRecord, grace_s: float) -> tuple[KeyRecord, str]:
        """A new key with the same settings and fresh counters; the old one expires later."""
        new, token = self.build(
            org_id=record.org_id,
            name=record.name,
            mode=record.mode,
            family_id=record.family_id,
            environment=record.environment,
            scopes=record.scopes,
            caps=record.caps,
            data_mode=record.data_mode,
            byok=record.byok,
            allowed_models=record.allowed_models,
            required_tags=record.required_tags,
            default_tags=record.default_tags,
            expires_at=record.expires_at,
        )
        await self.insert(new)
        for child in self.children(record.id):
            await self.change(child, parent_id=new.id)
        expiry = self.clock() + grace_s
        if record.expires_at is not None:
            expiry = min(expiry, record.expires_at)
        await self.change(record, expires_at=expiry, rotated_to=new.id)
        return new, token
