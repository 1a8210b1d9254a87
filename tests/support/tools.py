"""Tools from outside Python that some tests need (PostgreSQL's programs, chromium, haproxy,
Node and the Claude Code CLI), and what a test does when one is missing.

On a developer's machine the test is skipped, its reason naming the tool, what goes
untested and how to get it (pytest's ``-ra`` lists every reason at the end of the run).
Wherever every test must run — ``CI`` set, or ``SVC_REQUIRE_ALL=1`` — it fails instead,
naming the tool: ``.ci/run`` installs them all when run as root (README, "Two commands").
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

#: what a missing tool leaves untested, and how to get it (Debian's packages)
TOOLS = {
    "postgresql": ("the PostgreSQL store", "apt-get install postgresql"),
    "chromium": ("the dashboard in a browser", "apt-get install chromium"),
    "haproxy": ("deploy/haproxy.cfg before three nodes", "apt-get install haproxy"),
    "claude": (
        "the Claude Code CLI through the gateway",
        "apt-get install nodejs npm; npm install -g @anthropic-ai/claude-code",
    ),
}


def every_tool_required(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    """Whether a missing tool fails the test (``CI`` set, or ``SVC_REQUIRE_ALL=1``)."""
    return bool(environ.get("CI")) or environ.get("SVC_REQUIRE_ALL") == "1"


def missing_tool(tool: str, detail: str = "", *, module: bool = False) -> NoReturn:
    """Skip the test (or, with ``module``, the whole module) because ``tool`` (a key of
    :data:`TOOLS`) is missing; fail naming it where every tool is required."""
    untested, how = TOOLS[tool]
    message = f"{tool} is missing{f' ({detail})' if detail else ''}: {untested} not tested"
    if every_tool_required():
        pytest.fail(f"{message}; CI or SVC_REQUIRE_ALL=1 requires it ({how})", pytrace=False)
    pytest.skip(
        f"{message} ({how}; SVC_REQUIRE_ALL=1 makes this a failure)", allow_module_level=module
    )
