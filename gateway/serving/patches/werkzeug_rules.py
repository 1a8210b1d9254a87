"""Werkzeug's URL rules with their URL builders compiled on first use.

Werkzeug 3.1.9's ``Rule.compile`` (run for every route when an app is built) compiles
two URL-building functions per rule from a generated AST (``Rule._compile_builder``):
about 20 ms of an app's start for our ~60 routes, and so of every worker's start and of
every in-process test's server. The gateway builds URLs only in the dashboard's
templates (``url_for`` of two static files), so each builder is compiled when it is
first called and kept. A mixin: the app's ``url_rule_class`` (Flask's and Quart's
documented point for a rule class of one's own) is Quart's rule with it in front
(``gateway/edge/app.py`` ``create_app``, given it by ``gateway/serving/server.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from werkzeug.routing import Rule

#: the upstream code this module was reviewed against (see gateway/serving/patches/):
#: qualified name → (version, SHA-256 of its source)
REVIEWED: dict[str, tuple[str, str]] = {
    # overridden: returns a function that compiles the real builder on its first call
    "werkzeug.routing.rules.Rule._compile_builder": (
        "3.1.9",
        "a0ec55cf067ff5d56185fecc0df5b3c7b5c3aaf6013adf01f1162842f3dcc07b",
    ),
    # binds both builders with ``__get__(self, None)`` and calls them with keywords only
    # (``Rule.build``): the lazy function keeps that calling convention
    "werkzeug.routing.rules.Rule.compile": (
        "3.1.9",
        "96edc39424f37ba35cf60d382d15cf3f3a66fad72a0887b7f9a26dbad00599c7",
    ),
}

Builder = Callable[..., tuple[str, str]]


class LazyBuilders(Rule):
    """A rule whose two URL builders are compiled when first called."""

    def _compile_builder(self, append_unknown: bool = True) -> Builder:
        compiled: list[Builder] = []
        compile_builder = super()._compile_builder

        def build(rule: Rule, **values: Any) -> tuple[str, str]:
            if not compiled:
                compiled.append(compile_builder(append_unknown))
            return compiled[0](rule, **values)

        return build
