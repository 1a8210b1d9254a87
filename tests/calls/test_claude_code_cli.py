"""The real Claude Code CLI (npm ``@anthropic-ai/claude-code``) completes a one-shot prompt
through the gateway (issue 36's acceptance).

Inside a network namespace that holds only loopback (``unshare -rn``, then ``ip link set
lo up``), so the CLI can reach nothing but the gateway: ``svc-gateway serve`` on the
embedded default (a new database in a temporary directory: the demo organisation and its
sandbox key, the mock catalog), then ``claude -p "say hi"`` with the environment the
README's Claude Code section gives: ``ANTHROPIC_BASE_URL``, ``ANTHROPIC_AUTH_TOKEN`` (the
sandbox key), ``ANTHROPIC_MODEL`` (a mock catalog model), ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``
(the key's default max output tokens) and ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``.

Skipped, saying why, where ``claude``, ``unshare`` or ``ip`` is missing or user
namespaces are not allowed; ``.ci/run`` installs the pinned CLI so that it runs there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.tools import missing_tool

pytestmark = pytest.mark.processes

REPO = Path(__file__).resolve().parents[2]
#: the whole run, gateway start included
RUN_TIMEOUT_S = 240
#: inside the namespace: loopback up, the gateway started, then the CLI's one prompt
SCRIPT = r"""
set -u
ip link set lo up
"$PYTHON" -m gateway serve --json --port 0 > serve.json 2> serve.log &
gateway=$!
i=0
while [ ! -s serve.json ] && [ $i -lt 600 ] && kill -0 $gateway 2>/dev/null; do
  sleep 0.1; i=$((i + 1))
done
read_field() {
  "$PYTHON" -c "import json, sys; print(json.load(open('serve.json'))[sys.argv[1]])" "$1"
}
export ANTHROPIC_BASE_URL="$(read_field url)"
export ANTHROPIC_AUTH_TOKEN="$(read_field sandbox_key)"
timeout 180 "$CLAUDE" -p "say hi" > claude.out 2> claude.err
status=$?
kill $gateway
wait $gateway
exit $status
"""


def _unavailable() -> str | None:
    """Why the CLI cannot run here, or None."""
    for tool in ("claude", "unshare", "ip"):
        if shutil.which(tool) is None:
            missing_tool("claude", f"{tool} not found")
    probe = subprocess.run(
        ["unshare", "-rn", "true"], capture_output=True, text=True, timeout=30, check=False
    )
    if probe.returncode != 0:
        return f"unshare -rn is not allowed here: {probe.stderr.strip()}"
    return None


def run_in_namespace(
    tmp_path: Path, script: str, **extra: str
) -> tuple[subprocess.CompletedProcess[str], Callable[[str], str]]:
    """Run ``script`` in a loopback-only namespace in ``tmp_path`` (HOME inside it), with
    the gateway's Python and the CLI named in its environment; the run, and a reader of
    the files it left."""
    reason = _unavailable()
    if reason is not None:
        pytest.skip(reason)
    home = tmp_path / "home"
    home.mkdir()
    claude = shutil.which("claude")
    assert claude is not None
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(home),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "CLAUDE": claude,
        "ANTHROPIC_MODEL": "gpt-4o-mini",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": "4096",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        **extra,
    }
    run = subprocess.run(
        ["unshare", "-rn", "sh", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )

    def read(name: str) -> str:
        path = tmp_path / name
        return path.read_text() if path.exists() else ""

    return run, read


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_claude_code_completes_a_one_shot_prompt_through_the_gateway(tmp_path: Path) -> None:
    run, read = run_in_namespace(tmp_path, SCRIPT)
    said = read("claude.out")
    log = read("serve.log")
    details = f"rc={run.returncode} stderr={run.stderr}\nclaude: {said} {read('claude.err')}"
    assert run.returncode == 0, details
    assert "deterministic mock reply" in said, details
    assert "POST /v1/messages 200" in log, log
