"""API keys: token shape, fingerprints, the key record and its public view.

Token: ``svc_live_<prefix>_<secret>`` or ``svc_test_<prefix>_<secret>``. The prefix is
``<family6><id6>`` in lowercase base36: the first six characters are the key *family*
code, shared by a root key, its rotations and its sub-keys, so a parent and its children
always land in one shard (and a balancer could route a family by that part alone). The
secret is 32 base62 characters from :mod:`secrets` (about 190 bits).

Only ``sha256(token)`` is stored; tokens are compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import string
import threading
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from typing import Any

from shards import KeyRef

SCOPES = ("inference", "embeddings", "usage:read", "keys:manage")
DATA_MODES = ("standard", "zero_retention", "confidential")
ENVIRONMENTS = ("production", "staging", "development", "test")
#: the public status of a key: ``active`` or why it no longer authenticates
KEY_STATUSES = ("active", "disabled", "revoked", "expired")
MODES = {"live": "svc_live_", "sandbox": "svc_test_"}

_BASE36 = string.digits + string.ascii_lowercase
_BASE62 = string.digits + string.ascii_letters
TOKEN_RE = re.compile(r"^svc_(live|test)_([a-z0-9]{12})_([A-Za-z0-9]{32})$")
_DUMMY_FINGERPRINT = hashlib.sha256(b"svc-gateway-dummy").hexdigest()


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def new_family_code() -> str:
    return _random(_BASE36, 6)


def new_prefix(family_id: str) -> str:
    return family_id + _random(_BASE36, 6)


def new_token(mode: str, prefix: str) -> str:
    return f"{MODES[mode]}{prefix}_{_random(_BASE62, 32)}"


def fingerprint(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """(mode, prefix) of a well-formed token, else None."""
    match = TOKEN_RE.match(token)
    if match is None:
        return None
    return ("live" if match.group(1) == "live" else "sandbox"), match.group(2)


def fingerprint_matches(token: str, expected: str | None) -> bool:
    """Constant-time check; an unknown prefix is compared against a dummy all the same."""
    return hmac.compare_digest(fingerprint(token), expected or _DUMMY_FINGERPRINT) and (
        expected is not None
    )


@dataclass(frozen=True, slots=True)
class Caps:
    usd_day: float | None = None
    usd_month: float | None = None
    rpm: int = 60
    tpm: int | None = None
    max_in_flight: int = 20
    max_output_tokens: int = 4096

    def public(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Caps:
        return cls(**{k: data[k] for k in cls.__slots__ if k in data})


CAP_FIELDS = ("usd_day", "usd_month", "rpm", "tpm", "max_in_flight", "max_output_tokens")


#: the fields that :meth:`KeyRecord.to_row` and :meth:`KeyRecord.from_row` convert (the
#: shard reference is never stored); the other fields are columns stored as they are
_CONVERTED = frozenset(
    {
        *("scopes", "caps", "byok", "allowed_models", "required_tags", "default_tags"),
        *("guardrails", "shard_ref", "allowed_tools"),
    }
)


@dataclass(frozen=True, slots=True)
class KeyRecord:
    id: str
    org_id: str
    family_id: str
    prefix: str
    fingerprint: str
    name: str
    mode: str
    environment: str = "development"
    status: str = "active"
    scopes: tuple[str, ...] = ("inference", "embeddings", "usage:read")
    caps: Caps = field(default_factory=Caps)
    data_mode: str = "standard"
    byok: bool = False
    allowed_models: tuple[str, ...] | None = None
    required_tags: dict[str, str] = field(default_factory=dict)
    default_tags: dict[str, str] = field(default_factory=dict)
    expires_at: float | None = None
    created_at: float = 0.0
    last_used_at: float | None = None
    parent_id: str | None = None
    rotated_to: str | None = None
    #: guardrails this key adds to its organisation's and its ancestors' (names)
    guardrails: tuple[str, ...] = ()
    #: MCP tool patterns this key may call (gateway/accounts/tool_rules.py); None: every tool
    allowed_tools: tuple[str, ...] | None = None
    #: the key resolved in the shard pool (never stored): admission messages carry it,
    #: see :class:`shards.KeyRef`; the keyring sets it when the record is born
    shard_ref: KeyRef | None = field(default=None, compare=False, repr=False)

    def effective_status(self, now: float) -> str:
        if self.status in ("revoked", "disabled", "expired"):
            return self.status
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return "active"

    def with_changes(self, **changes: Any) -> KeyRecord:
        return replace(self, **changes)

    def to_row(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in _STORED_AS_IS}
        allowed = self.allowed_models
        row.update(
            scopes=list(self.scopes),
            caps=self.caps.public(),
            byok=int(self.byok),
            allowed_models=list(allowed) if allowed is not None else None,
            allowed_tools=list(self.allowed_tools) if self.allowed_tools is not None else None,
            required_tags=self.required_tags,
            default_tags=self.default_tags,
            guardrails=list(self.guardrails) or None,
        )
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> KeyRecord:
        allowed = row.get("allowed_models")
        # a column the record may hold as None may be missing from the row
        stored: dict[str, Any] = {
            f.name: row.get(f.name) if f.default is None else row[f.name] for f in _STORED_AS_IS
        }
        return cls(
            **stored,
            scopes=tuple(row["scopes"]),
            caps=Caps.from_dict(row["caps"]),
            byok=bool(row["byok"]),
            allowed_models=tuple(allowed) if allowed is not None else None,
            allowed_tools=tuple(tools) if (tools := row.get("allowed_tools")) is not None else None,
            required_tags=row.get("required_tags") or {},
            default_tags=row.get("default_tags") or {},
            guardrails=tuple(row.get("guardrails") or ()),
        )

    def public(self, now: float) -> dict[str, Any]:
        """The public fields of the spec; never the token or its fingerprint."""
        return {
            "object": "api_key",
            "id": self.id,
            "name": self.name,
            "prefix": self.prefix,
            "status": self.effective_status(now),
            "mode": self.mode,
            "environment": self.environment,
            "data_mode": self.data_mode,
            "scopes": list(self.scopes),
            "allowed_model_keys": list(self.allowed_models)
            if self.allowed_models is not None
            else None,
            "allowed_tools": list(self.allowed_tools) if self.allowed_tools is not None else None,
            "caps": self.caps.public(),
            "required_tags": dict(self.required_tags),
            "default_tags": dict(self.default_tags),
            "guardrails": list(self.guardrails),
            "expires_at": iso(self.expires_at),
            "last_used_at": iso(self.last_used_at),
            "created_at": iso(self.created_at),
            "byok": self.byok,
            "parent_id": self.parent_id,
            "org_id": self.org_id,
        }


_STORED_AS_IS = tuple(f for f in fields(KeyRecord) if f.name not in _CONVERTED)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def parse_iso(text: str) -> float:
    """Epoch seconds of an ISO 8601 timestamp; a naive one is taken as UTC.

    ValueError also for a moment that exists only in its own offset (9999-12-31T23:59
    at -23:59 is in year 10000 in UTC): it could not be written back by :func:`iso`.
    """
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise ValueError(f"{text} is out of range in UTC") from None
    return moment.timestamp()


ID_BYTES = 12


class _RandomBytes:
    """Bytes of the operating system's random source, read 4 KiB at a time: a call makes
    several ids, and a ``getrandom`` system call for each was 2 % of a call's CPU. A
    forked worker starts with an empty buffer, so no two processes hand out the same
    bytes."""

    SIZE = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer = b""
        self._at = 0
        os.register_at_fork(after_in_child=self._drop)

    def take(self, count: int) -> bytes:
        with self._lock:
            at = self._at
            if at + count > len(self._buffer):
                self._buffer, at = os.urandom(self.SIZE), 0
            self._at = at + count
            return self._buffer[at : at + count]

    def _drop(self) -> None:
        self._lock = threading.Lock()
        self._buffer, self._at = b"", 0


_random_bytes = _RandomBytes()


def new_id(kind: str) -> str:
    return f"{kind}_{_random_bytes.take(ID_BYTES).hex()}"


def id_pattern(kind: str) -> str:
    """The regular expression of every id :func:`new_id` makes for ``kind``."""
    return f"^{kind}_[0-9a-f]{{{2 * ID_BYTES}}}$"


def key_ref(record: KeyRecord) -> KeyRef:
    """The key as the shards name it (the keyring resolves every record it makes)."""
    ref = record.shard_ref
    if ref is None:
        raise RuntimeError(f"key {record.id} was never resolved in the shard pool")
    return ref
