"""The dashboard's per-application state: the sign-in throttle, the password hashing
limiter and the signing secret (read from the store once, on first use)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from quart import current_app

from gateway.edge.dashboard.passwords import Hashing
from gateway.edge.dashboard.sessions import new_secret
from gateway.edge.dashboard.throttle import LoginThrottle
from gateway.edge.http import runtime
from gateway.store import dashboard as ops

EXTENSION = "svc_dashboard"


@dataclass
class DashboardState:
    throttle: LoginThrottle
    hashing: Hashing = field(default_factory=Hashing)
    _secret: str | None = None

    async def secret(self) -> str:
        """The signing secret: made and stored on first use, then the stored one.

        Kept in the store (not derived from the admin token, which the dashboard must
        never depend on) so sessions survive a restart; the store keeps sessions only as
        hashes, so a reader of the database still cannot make a valid cookie."""
        if self._secret is None:
            rt = runtime()
            self._secret = await rt.store.write(ops.signing_secret, new_secret(), rt.clock.now())
        return self._secret


def state() -> DashboardState:
    return cast(DashboardState, current_app.extensions[EXTENSION])
