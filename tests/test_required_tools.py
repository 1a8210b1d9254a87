"""Tests that need a tool from outside Python (tests/support/tools.py): skipped naming it
on a developer's machine, failed naming it under ``CI`` or ``SVC_REQUIRE_ALL=1``; and
``.ci/run`` installs every one of them when run as root."""

from __future__ import annotations

import re

import pytest

from tests.support.procs import REPO_ROOT
from tests.support.tools import TOOLS, missing_tool

#: what .ci/run installs for each tool (a Debian package, or the npm package)
INSTALLED_AS = {
    "postgresql": "postgresql",
    "chromium": "chromium",
    "haproxy": "haproxy",
    "claude": "@anthropic-ai/claude-code",
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_missing_tool_skips_naming_it_outside_ci(
    tool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SVC_REQUIRE_ALL", raising=False)
    with pytest.raises(pytest.skip.Exception, match=rf"^{tool} is missing.*not tested"):
        missing_tool(tool)


@pytest.mark.parametrize(("name", "value"), [("CI", "true"), ("SVC_REQUIRE_ALL", "1")])
@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_a_missing_tool_fails_naming_it_where_every_tool_is_required(
    tool: str, name: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("SVC_REQUIRE_ALL", raising=False)
    monkeypatch.setenv(name, value)
    with pytest.raises(pytest.fail.Exception, match=rf"^{tool} is missing"):
        missing_tool(tool)


def test_ci_installs_every_tool_as_root() -> None:
    script = (REPO_ROOT / ".ci" / "run").read_text()
    assert set(INSTALLED_AS) == set(TOOLS)
    for tool, package in INSTALLED_AS.items():
        assert re.search(rf"(apt-get|npm) install [^\n]*{re.escape(package)}", script), tool
