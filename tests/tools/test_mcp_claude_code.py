"""The real Claude Code CLI lists and calls a tool through the gateway's ``/mcp``.

As tests/calls/test_claude_code_cli.py runs it: inside a network namespace holding only
loopback (``unshare -rn``), ``svc-gateway serve`` on the embedded default (the demo
organisation's sandbox key, the mock catalog, the built-in ``mock`` MCP server). Claude
Code is set up as the README says (``claude mcp add --transport http ... --header
"Authorization: Bearer ..."``); ``claude mcp list`` connects and lists the tools; then a
one-shot prompt with no built-in tools: the mock model calls the first tool it is offered
(``mcp__svc__mock__add``, the gateway's ``mock__add``), Claude Code calls it over
``/mcp``, and the gateway records the call (``endpoint: mcp``).

Skipped, saying why, where ``claude``, ``unshare`` or ``ip`` is missing or user namespaces
are not allowed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.calls.test_claude_code_cli import run_in_namespace
from tests.conftest import query_db

pytestmark = pytest.mark.processes

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
URL="$(read_field url)"
KEY="$(read_field sandbox_key)"
export ANTHROPIC_BASE_URL="$URL"
export ANTHROPIC_AUTH_TOKEN="$KEY"
"$CLAUDE" mcp add --transport http svc "$URL/mcp" --header "Authorization: Bearer $KEY" \
  > add.out 2>&1
timeout 60 "$CLAUDE" mcp list > list.out 2>&1
timeout 180 "$CLAUDE" -p "Use the svc tool." --tools "" \
  --allowedTools "mcp__svc" --output-format stream-json --verbose \
  > claude.out 2> claude.err
status=$?
kill $gateway
wait $gateway
exit $status
"""


@pytest.mark.timeout(270)
def test_claude_code_lists_and_calls_a_tool_through_the_gateway(tmp_path: Path) -> None:
    run, read = run_in_namespace(tmp_path, SCRIPT)
    listed, said, log = read("list.out"), read("claude.out"), read("serve.log")
    details = (
        f"rc={run.returncode} stderr={run.stderr}\nadd: {read('add.out')}\nlist: {listed}\n"
        f"claude: {said[-3000:]} {read('claude.err')[-2000:]}\nlog: {log[-3000:]}"
    )
    assert run.returncode == 0, details
    assert "svc" in listed and "Connected" in listed, details
    assert '"permission_denials":[]' in said, details
    calls = query_db(
        str(tmp_path / "svc-gateway.db"),
        "SELECT model, status FROM requests WHERE endpoint = 'mcp'",
    )
    # the mock model calls the first tool Claude Code offers it, a tool of the mock server
    assert len(calls) == 1, details
    assert f"mcp__svc__{calls[0]['model']}" in said, details
    assert all(row["status"] == "succeeded" for row in calls), details
