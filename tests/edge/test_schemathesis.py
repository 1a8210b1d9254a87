"""Schemathesis against ``/openapi.json`` of a real server: the document and the server agree.

:func:`test_an_auditor_run_finds_nothing` runs the ``schemathesis`` command as an auditor
would: the URL of a fresh server's ``/openapi.json`` and a key, nothing else — its default
checks (every one: no 5xx; status, content type, headers and body as documented; a
request the document forbids refused; a request it allows accepted, or refused only with
401/403/404/409/429; ...) over all its phases (examples, coverage, fuzzing, stateful),
seeded and bounded (``EXAMPLES`` per operation; ``FUZZ_EXAMPLES`` in the environment
raises it for a long run by hand). Every failed check is read from the run's cassette,
and the run must have none but those :func:`accepted` names: refusals the spec fixes that
no OpenAPI document can describe (docs/DECISIONS.md, "OpenAPI against the server").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from schemathesis import Case

from gateway.accounts.catalog import Catalog
from gateway.config.settings import default_config
from gateway.edge.openapi_served import served_document, server_facts
from tests.support.procs import ADMIN_TOKEN as PROCS_ADMIN_TOKEN
from tests.support.procs import Server, start_server

pytestmark = pytest.mark.processes

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "15"))
SEED = 18
CHAT_MODELS = [m.id for m in default_config().models if m.kind == "chat"]


def accepted(check: str, status: int, error: dict[str, Any]) -> bool:
    """The failures a run may hold, each for a reason no document can change:

    - an ``Idempotency-Key`` sent again with another body: the spec answers 422
      idempotency_key_reused, and a document cannot tie a header's value to the body of
      an earlier request (schemathesis's coverage phase sends one key with many bodies);
    - a change of a sub-key revoked earlier in the run: the spec answers 400
      key_revoked, and a document cannot say which ids were revoked (the stateful phase
      draws one listed id for a DELETE, then for a PATCH)."""
    if check != "positive_data_acceptance":
        return False
    return (status, error.get("code")) in ((422, "idempotency_key_reused"), (400, "key_revoked"))


def read_run(cassette: Path) -> tuple[list[str], set[str]]:
    """Every failed check of a run (not one per operation, as the command prints them)
    but the accepted ones, and the phases that sent requests."""
    run = yaml.load(cassette.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    found, phases = [], set()
    for step in run["http_interactions"]:
        phases.add(step["phase"]["name"])
        failed = [c["name"] for c in step.get("checks") or [] if c["status"] == "FAILURE"]
        if not failed:
            continue
        request, answer = step["request"], step.get("response") or {}
        status = int((answer.get("status") or {}).get("code", 0))
        text = (answer.get("body") or {}).get("string") or ""
        try:
            error = json.loads(text).get("error") or {}
        except (ValueError, AttributeError):
            error = {}
        for check in failed:
            if not accepted(check, status, error):
                found.append(f"{check}: {request['method']} {request['uri']} -> {status} {text}")
    return found, phases


def calls_by_model(server: Server, token: str) -> dict[str, int]:
    """The key's recorded calls by model (GET /v1/usage): calls that reached the model."""
    with httpx.Client(base_url=server.url) as client:
        usage = client.get(
            "/v1/usage",
            params={"group_by": "model"},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
    return {row["group"]: row["requests"] for row in usage["data"]}


def run_key(server: Server) -> str:
    """A sandbox key of the demo organisation with every scope and a request rate a run
    cannot reach (a 429 would hide the answer the document is checked against)."""
    admin = {"Authorization": f"Bearer {PROCS_ADMIN_TOKEN}"}
    with httpx.Client(base_url=server.url, headers=admin) as client:
        org_id = client.get("/admin/orgs").json()["data"][0]["id"]
        body = {"org_id": org_id, "name": "st", "mode": "sandbox", "keys_manage": True}
        key = client.post("/admin/keys", json={**body, "caps": {"rpm": 1_000_000}})
    assert key.status_code == 201, key.text
    return str(key.json()["token"])


@pytest.mark.timeout(240)
def test_an_auditor_run_finds_nothing(tmp_path: Path) -> None:
    """The command with the document alone, against a fresh server: no failure but the
    :func:`accepted` ones, and the document's example bodies reach the mock."""
    server = start_server(tmp_path)
    try:
        token = run_key(server)
        cassette = tmp_path / "run.yaml"
        command = [
            str(Path(sys.executable).with_name("schemathesis")), "run",
            f"{server.url}/openapi.json",
            "--header", f"Authorization: Bearer {token}",
            "--max-examples", str(EXAMPLES), "--seed", str(SEED), "--workers", "1",
            "--report", "vcr", "--report-vcr-path", str(cassette),
        ]  # fmt: skip
        run = subprocess.run(
            command, cwd=tmp_path, capture_output=True, text=True, timeout=220, check=False
        )
        assert cassette.exists(), run.stdout[-4000:] + run.stderr[-2000:]
        failures, phases = read_run(cassette)
        assert failures == [], run.stdout[-3000:]
        assert phases == {"examples", "coverage", "fuzzing", "stateful"}, run.stdout[-3000:]
        served = calls_by_model(server, token)
        # a record exists only for a call that reached the model: the mock served these
        assert served.get("gpt-4o-mini", 0) >= 2, served  # chat completions and responses
        assert served.get("text-embedding-3-small", 0) >= 1, served
        assert server.proc.poll() is None, server.stderr()
    finally:
        server.stop()


# The document as the server serves it without a key (test_fuzzed_calls_reached_the_mock
# checks /openapi.json is this very document), loaded at collection.
SERVED = served_document(server_facts(Catalog(default_config()), ()))
schema = schemathesis.openapi.from_dict(
    SERVED,
    config=schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {"max-examples": EXAMPLES, "database": "none"},
            "suppress-health-check": ["all"],
        }
    ),
)


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Half the chat bodies that name a schema-valid model name a served one instead."""
    model = body.get("model") if isinstance(body, dict) else None
    if context.operation.path != "/v1/chat/completions" or not isinstance(model, str):
        return st.just(body)
    return st.just(body) | st.sampled_from(CHAT_MODELS).map(lambda m: {**body, "model": m})


def test_fuzzed_calls_reached_the_mock(fuzz_server: Server, fuzz_token: str) -> None:
    """Generated chat completions steered to the served models are served by the model,
    not only refused: only a call that reached the model leaves a record."""
    assert fuzz_server.get("/openapi.json").json() == SERVED
    operation = schema["/v1/chat/completions"]["POST"]
    answers: Counter[int] = Counter()

    @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=True)
    @given(case=operation.as_strategy())
    def call(case: Case) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {fuzz_token}"}
        answers[case.call(base_url=fuzz_server.url, timeout=30).status_code] += 1

    call()
    assert answers[200] > 0, answers
    assert not [status for status in answers if status >= 500], answers
    reached = calls_by_model(fuzz_server, fuzz_token)
    assert any(reached.get(model, 0) > 0 for model in CHAT_MODELS), reached
    assert fuzz_server.proc.poll() is None, fuzz_server.stderr()
