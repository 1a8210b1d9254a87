"""The organisation dashboard under ``/dashboard/``: owners, admins and viewers of an
organisation sign in with a password and see (viewers) or manage (owners, admins) its
keys, usage, request records and credits in a browser.

- :mod:`~gateway.edge.dashboard.users`, :mod:`~gateway.edge.dashboard.passwords`: users and their
  argon2id passwords; :mod:`~gateway.edge.dashboard.admin_users`: the operator's
  ``/admin/users`` API (the CLI's ``user`` verbs);
- :mod:`~gateway.edge.dashboard.sessions`, :mod:`~gateway.edge.dashboard.throttle`: signed session
  cookies, CSRF tokens, the sign-in lock-out;
- :mod:`~gateway.edge.dashboard.web`: the blueprint, sign-in, refusals as pages;
  :mod:`~gateway.edge.dashboard.keys_pages`, :mod:`~gateway.edge.dashboard.models_pages`,
  :mod:`~gateway.edge.dashboard.people_pages` (users, the audit list, one's account) and
  :mod:`~gateway.edge.dashboard.report_pages`: the pages, server-rendered from
  ``templates/`` with ``static/`` CSS and a small script; :mod:`~gateway.edge.dashboard.audit`
  the audit list's entries; :mod:`~gateway.edge.dashboard.time_range` a page's dates.
"""

from __future__ import annotations

from quart import Quart

from gateway.edge.dashboard import admin_users, keys_pages, models_pages, people_pages, report_pages
from gateway.edge.dashboard.app_state import EXTENSION, DashboardState
from gateway.edge.dashboard.throttle import LoginThrottle
from gateway.edge.dashboard.web import bp

# the page modules add their routes to the blueprint when imported
PAGES = (keys_pages, models_pages, people_pages, report_pages)


def register(app: Quart) -> None:
    rt = app.config["RUNTIME"]
    app.extensions[EXTENSION] = DashboardState(throttle=LoginThrottle(rt.clock.now))
    app.register_blueprint(bp)
    admin_users.register(app)


__all__ = ["PAGES", "register"]
