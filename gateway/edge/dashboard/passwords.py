"""Dashboard passwords: argon2id hashes (argon2-cffi), checked off the event loop.

Parameters: RFC 9106's second recommended profile (argon2id, 64 MiB of memory, 3
passes, 4 lanes, 16-byte salt, 32-byte tag), about half a second a hash on a busy
two-core machine. They are named here rather than taken from the library's defaults,
so an upgrade cannot change them unnoticed; a stored hash made with other parameters
is re-hashed at the user's next sign-in (:func:`needs_rehash`).

Hashing is memory-hard on purpose, so it runs on a worker thread and at most
``CONCURRENT_HASHES`` at a time (a burst of sign-ins cannot take the server's memory).
An unknown email is checked against a dummy hash, so both paths take the same time.
Passwords are never logged, stored or echoed: only their hashes are kept.
"""

from __future__ import annotations

import secrets
from functools import cache

import trio
from argon2 import PasswordHasher, Type
from argon2.exceptions import InvalidHashError, VerificationError

from gateway.errors import GatewayError

HASHER = PasswordHasher(
    time_cost=3, memory_cost=64 * 1024, parallelism=4, hash_len=32, salt_len=16, type=Type.ID
)
CONCURRENT_HASHES = 2
MIN_LENGTH = 12
MAX_LENGTH = 1024


def check_rules(password: object, param: str = "password") -> str:
    """A password a user may choose: 12 to 1,024 characters (no other rule: length is what
    makes a password strong, and a passphrase must be welcome)."""
    if not isinstance(password, str) or not MIN_LENGTH <= len(password) <= MAX_LENGTH:
        raise GatewayError(
            "invalid_request",
            f"The password must be {MIN_LENGTH} to {MAX_LENGTH} characters long.",
            param=param,
        )
    return password


def new_password() -> str:
    """A one-time password for a new user or a reset: 24 URL-safe characters (144 bits)."""
    return secrets.token_urlsafe(18)


@cache
def _dummy_hash() -> str:
    return HASHER.hash(secrets.token_urlsafe(18))


def hash_now(password: str) -> str:
    """Synchronous hash (worker threads and tests)."""
    return HASHER.hash(password)


def verify_now(stored: str | None, password: str) -> bool:
    """Synchronous check in constant time; ``stored`` None (no such user) is always False
    after the same work."""
    try:
        HASHER.verify(stored or _dummy_hash(), password)  # raises unless it matches
    except (VerificationError, InvalidHashError):
        return False
    return stored is not None


def needs_rehash(stored: str) -> bool:
    return HASHER.check_needs_rehash(stored)


class Hashing:
    """Hashes and checks on worker threads, at most ``CONCURRENT_HASHES`` at once."""

    def __init__(self) -> None:
        self._limiter = trio.CapacityLimiter(CONCURRENT_HASHES)

    async def hash(self, password: str) -> str:
        return await trio.to_thread.run_sync(hash_now, password, limiter=self._limiter)

    async def verify(self, stored: str | None, password: str) -> bool:
        return await trio.to_thread.run_sync(verify_now, stored, password, limiter=self._limiter)
