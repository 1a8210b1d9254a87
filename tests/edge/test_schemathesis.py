"""Schemathesis against ``/openapi.json`` of a real server: the document and the server agree.

One test per documented operation, cases drawn by schemathesis from the served document
(its examples, coverage and fuzzing phases, schema-valid and schema-invalid requests),
seeded and bounded (``EXAMPLES`` per operation; ``FUZZ_EXAMPLES`` in the environment
raises it for a long run by hand). Every answer is checked:

- no 5xx (not_a_server_error);
- status, content type, headers and body as documented (the conformance checks; a
  streamed call's ``text/event-stream`` included);
- a request the document forbids is refused (negative_data_rejection): the document is
  no stricter than the server;
- a request the document allows is refused only for a reason of state
  (:data:`STATE_REFUSALS`): the document is no looser than the server.

Bodies are steered toward the served catalog (the document cannot name a deployment's
models), so that valid calls reach the mock provider: ``test_fuzzed_calls_reached_the_mock``
draws chat completions the same way and proves some did.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st
from schemathesis import Case, CheckContext, Response
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.config.settings import default_config
from gateway.edge.openapi import served_document
from tests.support.procs import ADMIN_TOKEN as PROCS_ADMIN_TOKEN
from tests.support.procs import Server

pytestmark = pytest.mark.processes

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "15"))
SEED = 18
CHAT_MODELS = [m.id for m in default_config().models if m.kind == "chat"]
EMBEDDING_MODELS = [m.id for m in default_config().models if m.kind == "embedding"]
#: operations whose bodies name a model, and the served models to steer them to
STEERED = {
    "/v1/chat/completions": CHAT_MODELS,
    "/v1/responses": CHAT_MODELS,
    "/v1/embeddings": EMBEDDING_MODELS,
}

#: why a schema-valid request may still be refused: the server's state, which no schema
#: can say (the catalog, the calling key's limits, the ids that exist). By code, with the
#: params it may name (None: any).
STATE_REFUSALS: dict[str, frozenset[str] | None] = {
    "max_tokens_exceeds_key_limit": None,  # a budget above the key's 64
    "model_lacks_vision": None,  # capabilities of the model named
    "model_lacks_tools": None,
    "model_lacks_structured_output": None,
    "web_search_unavailable": None,
    "model_not_allowed": None,  # /v1/embeddings: not the one served embedding model
    "child_exceeds_parent": None,  # a sub-key beyond the calling key
    "model_not_in_catalog": None,
    "key_revoked": None,  # a sub-key revoked earlier in the run
    "idempotency_key_reused": None,  # an Idempotency-Key used with another body
    "invalid_request": frozenset(
        {
            "after",  # not one of the caller's sub-keys
            "end",  # before start
            "expires_at",  # in the past
            "mode",  # sub-key settings that must be the parent's
            "environment",
            "byok",
            "dimensions",  # above the model's
            "model",  # an embedding model on a chat endpoint
            "guardrails",  # a name the server's config does not define
        }
    ),
}
#: tags are counted across the header and both body maps: each holds 16, not all three
TAGS_PER_CALL = "tags are allowed per call."


def _sent(body: Any, param: str | None) -> Any:
    """The value of ``param`` (``caps.rpm`` is nested) in the body, or None."""
    for name in (param or "").split("."):
        body = body.get(name) if isinstance(body, dict) else None
    return body


def _holds_float(value: Any) -> bool:
    if isinstance(value, list):
        return any(map(_holds_float, value))
    return isinstance(value, float)


def state_refusal_only(ctx: CheckContext, response: Response, case: Case) -> bool | None:
    """A schema-valid request refused with 400 or 422 names a reason of state.

    One more refusal is no reason of state: JSON Schema's ``integer`` admits ``10.0``,
    which this server refuses where it reads an integer (docs/DECISIONS.md, "Integers are
    written as integers"); the document says so in words, as no keyword can."""
    if case.meta is None or not case.meta.generation.mode.is_positive:
        return None
    if response.status_code not in (400, 422):
        return None
    error = response.json()["error"]
    allowed = STATE_REFUSALS.get(error["code"], frozenset())
    by_state = allowed is None or error["param"] in allowed
    if error["code"] == "invalid_tags" and error["message"].endswith(TAGS_PER_CALL):
        by_state = True
    if error["code"] == "invalid_request" and _holds_float(_sent(case.body, error["param"])):
        by_state = True
    assert by_state, f"schema-valid request refused as malformed: {error}"
    return True


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
    state_refusal_only,
]


# The document as the server serves it (test_openapi.py checks /openapi.json is this very
# document), loaded at collection: the cases are drawn before any server runs.
SERVED = served_document((model.id, model.kind) for model in default_config().models)
schema = schemathesis.openapi.from_dict(
    SERVED,
    config=schemathesis.Config.from_dict(
        {
            "seed": SEED,
            "generation": {
                "mode": "all",
                "max-examples": EXAMPLES,
                "database": "none",
                # a query parameter the document does not name is ignored, as by most
                # HTTP APIs: no "violation" to send
                "allow-extra-parameters": False,
            },
            "suppress-health-check": ["all"],
        }
    ),
)


@schema.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Half the bodies that name a schema-valid model (a non-empty string) name a served
    one instead: that keeps a valid body valid, and an invalid one invalid."""
    models = STEERED.get(context.operation.path)
    model = body.get("model") if isinstance(body, dict) else None
    if not models or not isinstance(model, str) or not model:
        return st.just(body)
    return st.just(body) | st.sampled_from(models).map(lambda m: {**body, "model": m})


#: the bearer credential of generated cases: the run's key goes in at call time (cases
#: are drawn before the server runs)
THE_KEY = "Bearer <the run's key>"


@schema.auth(retry_on=[])
class FuzzKey:
    """The document's bearer credential: every case carries the run's key, except those
    that test its absence (schemathesis leaves them alone)."""

    def get(self, case: Case, ctx: Any) -> str:
        return THE_KEY

    def set(self, case: Case, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": data}


@pytest.fixture(scope="module")
def served(fuzz_server: Server) -> str:
    """The server's URL, once its /openapi.json is the document the cases come from."""
    assert fuzz_server.get("/openapi.json").json() == SERVED
    return fuzz_server.url


@pytest.mark.timeout(300)
@schema.parametrize()
def test_the_server_answers_as_documented(case: Case, served: str, fuzz_token: str) -> None:
    if case.headers and case.headers.get("Authorization") == THE_KEY:
        case.headers["Authorization"] = f"Bearer {fuzz_token}"
    case.call_and_validate(base_url=served, checks=CHECKS, timeout=30)


def calls_by_model(server: Server, token: str) -> dict[str, int]:
    """The key's recorded calls by model (GET /v1/usage): calls that reached the model."""
    with httpx.Client(base_url=server.url) as client:
        usage = client.get(
            "/v1/usage",
            params={"group_by": "model"},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
    return {row["group"]: row["requests"] for row in usage["data"]}


def test_fuzzed_calls_reached_the_mock(served: str, fuzz_server: Server, fuzz_token: str) -> None:
    """Generated chat completions (the cases above draw the same way) are served by the
    model, not only refused: only a call that reached the model leaves a record. Its own
    cases, so that it holds on whichever test worker runs it."""
    operation = schema["/v1/chat/completions"]["POST"]
    answers: Counter[int] = Counter()

    @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=True)
    @given(case=operation.as_strategy())
    def call(case: Case) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {fuzz_token}"}
        answers[case.call(base_url=served, timeout=30).status_code] += 1

    call()
    assert answers[200] > 0, answers
    assert not [status for status in answers if status >= 500], answers
    reached = calls_by_model(fuzz_server, fuzz_token)
    assert any(reached.get(model, 0) > 0 for model in CHAT_MODELS), reached
    assert fuzz_server.proc.poll() is None, fuzz_server.stderr()


def test_schemathesis_with_the_document_alone_reaches_the_mock(
    fuzz_server: Server, tmp_path: Path
) -> None:
    """The ``schemathesis`` command, given only ``/openapi.json`` and a sandbox key (no
    hooks, no steering): the document's example bodies name served models, so model
    calls reach the mock and answer 200, and nothing answers a 5xx."""
    admin = {"Authorization": f"Bearer {PROCS_ADMIN_TOKEN}"}
    with httpx.Client(base_url=fuzz_server.url, headers=admin) as client:
        org_id = client.get("/admin/orgs").json()["data"][0]["id"]
        body = {"org_id": org_id, "name": "st", "mode": "sandbox", "keys_manage": True}
        key = client.post("/admin/keys", json={**body, "caps": {"rpm": 100_000}}).json()
    command = [
        str(Path(sys.executable).with_name("schemathesis")), "run",
        f"{fuzz_server.url}/openapi.json",
        "--header", f"Authorization: Bearer {key['token']}",
        "--phases", "examples", "--checks", "not_a_server_error", "--workers", "1",
        "--seed", str(SEED),
    ]  # fmt: skip
    run = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    served = calls_by_model(fuzz_server, key["token"])
    # a record exists only for a call that reached the model: the mock served these
    assert served.get("gpt-4o-mini", 0) >= 2, served  # chat completions and responses
    assert served.get("text-embedding-3-small", 0) >= 1, served
