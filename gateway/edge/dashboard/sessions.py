"""Dashboard sessions and CSRF tokens: signed values, checked in constant time.

A session is a random token (256 bits) in a cookie, signed with the dashboard's
secret; the store keeps only its SHA-256 (the session id), with the user and an
absolute expiry, so signing out or disabling a user ends it at once. The cookie is
HttpOnly, SameSite=Strict, limited to ``/dashboard``, Secure when the request came over
HTTPS, and lives ``LIFETIME_S`` (the store's expiry is what counts).

CSRF: every state-changing form carries ``csrf_token``, an HMAC of the session id under
the secret; the sign-in form, before any session, an HMAC of a random nonce held in a
short-lived cookie of its own. A form without the right token is refused (403).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

COOKIE = "svc_dashboard"
LOGIN_COOKIE = "svc_dashboard_login"
COOKIE_PATH = "/dashboard"
LIFETIME_S = 8 * 3600
LOGIN_FORM_LIFETIME_S = 3600


def new_secret() -> str:
    """A fresh signing secret (256 bits, URL-safe text)."""
    return secrets.token_urlsafe(32)


def new_token() -> str:
    return secrets.token_urlsafe(32)


def session_id(token: str) -> str:
    """What the store keeps of a session token."""
    return hashlib.sha256(token.encode()).hexdigest()


def _mac(secret: str, purpose: str, value: str) -> str:
    digest = hmac.new(secret.encode(), f"{purpose}|{value}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign(secret: str, token: str) -> str:
    """The cookie value of a session token."""
    return f"{token}.{_mac(secret, 'session', token)}"


def unsign(secret: str, cookie: str | None) -> str | None:
    """The session token of a cookie value whose signature holds, else None."""
    if not cookie or "." not in cookie:
        return None
    token, _, mac = cookie.rpartition(".")
    if not token or not hmac.compare_digest(mac.encode(), _mac(secret, "session", token).encode()):
        return None
    return token


def csrf_token(secret: str, bound_to: str) -> str:
    """The CSRF token of a session id (or of a sign-in form's nonce)."""
    return _mac(secret, "csrf", bound_to)


def csrf_ok(secret: str, bound_to: str | None, given: str | None) -> bool:
    if not bound_to or not given:
        return False
    return hmac.compare_digest(given.encode(), csrf_token(secret, bound_to).encode())
