"""Policy rules, spend controls, data modes and model resolution, through the real server.

One table row per policy rule and per code (issue 6): each row sets up an organisation's
policy document (through the admin API, as `svc-gateway org policy` does), a key, and
one call, and asserts the status, `error.code`, `error.type`, `error.param`, the `svc`
block (decisions and request id) and that a refusal before the model leaves no record.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config.settings import ModelConfig, ProviderConfig
from tests.conftest import Gateway, make_config, start_gateway

ALL_CAPS = ("tools", "structured_output", "vision", "web_search")


def model(model_id: str, provider: str = "mock", **settings: Any) -> ModelConfig:
    base = ModelConfig(model_id, provider, model_id, input_usd_per_mtok=1.0)
    return replace(base, output_usd_per_mtok=2.0, **settings)


MODELS = (
    model("m-chat", capabilities=ALL_CAPS, zero_retention_available=True, aliases=("solo", "fast")),
    model("m-nozdr"),
    model("m-nosearch", capabilities=("tools",)),
    replace(model("m-unpriced"), input_usd_per_mtok=None, output_usd_per_mtok=None),
    model("m-off", enabled=False),
    model("u-chat", "upstream", capabilities=ALL_CAPS, byok_available=True, aliases=("fast",)),
    model("emb", kind="embedding", zero_retention_available=True),
)


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Gateway]:
    base = make_config(tmp_path)
    upstream = ProviderConfig(
        name="upstream", kind="openai", base_url="http://127.0.0.1:9/v1", residency=("us",)
    )
    config = replace(base, providers=(*base.providers, upstream), models=MODELS)
    gateway = await start_gateway(nursery, config)
    yield gateway
    gateway.stop.set()


@dataclass
class Case:
    name: str
    status: int
    code: str
    param: str | None = None
    policy: dict[str, Any] = field(default_factory=dict)
    key: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    residency: str | None = None
    decisions: list[str] | None = None  # rules in svc.policy.decisions; None: no svc block
    endpoint: str = "/v1/chat/completions"
    # refused at the reservation step: its worst-case tokens count in the key's minute
    reached_reservation: bool = False


def chat(model_id: str = "m-chat", **extra: Any) -> dict[str, Any]:
    return {
        "model": model_id,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 16,
        **extra,
    }


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
SCHEMA = {"name": "s", "schema": {"type": "object"}}

CASES = [
    Case(
        "contract_blocked_models",
        403,
        "model_not_allowed",
        "model",
        policy={"contract_blocked_models": ["m-chat"]},
        decisions=["contract_blocked_models"],
    ),
    Case(
        "contract_allowed_models",
        403,
        "model_not_allowed",
        "model",
        policy={"contract_allowed_models": ["m-nozdr"]},
        decisions=["contract_allowed_models"],
    ),
    Case(
        "contract_allowed_providers",
        403,
        "model_not_allowed",
        "model",
        policy={"contract_allowed_providers": ["upstream"]},
        decisions=["contract_allowed_providers"],
    ),
    Case(
        "residency",
        403,
        "model_not_allowed",
        "model",
        residency="eu",
        body=chat("u-chat"),
        decisions=["residency"],
    ),
    Case(
        "org_api_restriction",
        403,
        "model_not_allowed",
        "model",
        policy={"org_api_models": ["m-nozdr"]},
        decisions=["org_api_restriction"],
    ),
    Case(
        "org_api_disabled",
        403,
        "model_not_allowed",
        "model",
        policy={"org_api_disabled_kinds": ["chat"]},
        decisions=["org_api_disabled"],
    ),
    Case(
        "key_allowed_models",
        403,
        "model_not_allowed",
        "model",
        key={"allowed_models": ["m-nozdr"]},
        decisions=["key_allowed_models"],
    ),
    Case(
        "every denying rule is listed",
        403,
        "model_not_allowed",
        "model",
        policy={"contract_blocked_models": ["m-chat"], "org_api_models": ["m-nozdr"]},
        key={"allowed_models": ["m-nozdr"]},
        decisions=["contract_blocked_models", "org_api_restriction", "key_allowed_models"],
    ),
    Case(
        "embeddings obey the rules too",
        403,
        "model_not_allowed",
        "model",
        policy={"org_api_disabled_kinds": ["embedding"]},
        body={"model": "emb", "input": "hello"},
        endpoint="/v1/embeddings",
        decisions=["org_api_disabled"],
    ),
    Case(
        "unknown model",
        404,
        "model_not_found",
        "model",
        body=chat("no-such-model"),
        decisions=["unknown_model"],
    ),
    Case(
        "unknown model on responses",
        404,
        "model_not_found",
        "model",
        body={"model": "no-such-model", "input": "hello"},
        endpoint="/v1/responses",
        decisions=["unknown_model"],
    ),
    Case("model_ambiguous", 403, "model_ambiguous", "model", body=chat("fast")),
    Case("model_unavailable (switched off)", 503, "model_unavailable", "model", body=chat("m-off")),
    Case("model_not_priced", 403, "model_not_priced", "model", body=chat("m-unpriced")),
    Case(
        "contract_max_cost_per_request",
        402,
        "max_cost_per_request",
        policy={"max_cost_per_request_usd": 0.00001},
        decisions=["contract_max_cost_per_request"],
    ),
    Case(
        "entitlement_denied: streaming",
        403,
        "entitlement_denied",
        policy={"entitlements": {"streaming": False}},
        body=chat(stream=True),
    ),
    Case(
        "entitlement_denied: responses",
        403,
        "entitlement_denied",
        policy={"entitlements": {"responses": False}},
        body={"model": "m-chat", "input": "hello"},
        endpoint="/v1/responses",
    ),
    Case(
        "entitlement_denied: embeddings",
        403,
        "entitlement_denied",
        policy={"entitlements": {"embeddings": False}},
        body={"model": "emb", "input": "hello"},
        endpoint="/v1/embeddings",
    ),
    Case(
        "entitlement_denied: tools",
        403,
        "entitlement_denied",
        policy={"entitlements": {"tools": False}},
        body=chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ),
    Case(
        "entitlement_denied: chat_completions",
        403,
        "entitlement_denied",
        policy={"entitlements": {"chat_completions": False, "responses": True}},
    ),
    Case(
        "entitlement_denied: vision",
        403,
        "entitlement_denied",
        policy={"entitlements": {"vision": False}},
        body=chat(messages=[{"role": "user", "content": [IMAGE]}]),
    ),
    Case(
        "entitlement_denied: structured_output",
        403,
        "entitlement_denied",
        policy={"entitlements": {"structured_output": False}},
        body=chat(response_format={"type": "json_schema", "json_schema": SCHEMA}),
    ),
    Case(
        "entitlement_denied: web_search",
        403,
        "entitlement_denied",
        policy={"entitlements": {"web_search": False}},
        body=chat(web_search_options={}),
    ),
    Case(
        "entitlement_denied: live",
        403,
        "entitlement_denied",
        policy={"entitlements": {"live": False}},
        key={"mode": "live"},
    ),
    Case(
        "web_search_not_allowed",
        403,
        "web_search_not_allowed",
        "web_search_options",
        policy={"web_search_models": ["u-chat"]},
        body=chat(web_search_options={}),
    ),
    Case(
        "web_search_not_allowed on responses",
        403,
        "web_search_not_allowed",
        "tools",
        policy={"web_search_models": []},
        body={"model": "m-chat", "input": "hello", "tools": [{"type": "web_search"}]},
        endpoint="/v1/responses",
    ),
    Case(
        "web_search_unavailable stays 400 without native search",
        400,
        "web_search_unavailable",
        "web_search_options",
        policy={"web_search_models": []},
        body=chat("m-nosearch", web_search_options={}),
    ),
    Case(
        "budget_exceeded",
        402,
        "budget_exceeded",
        policy={"budget_usd_month": 0.00001},
        key={"mode": "live"},
        body=chat("u-chat"),  # a live key needs a real provider (refused before it is asked)
        reached_reservation=True,
    ),
    Case(
        "spend_refused",
        402,
        "spend_refused",
        policy={"spend_paused": True},
        key={"mode": "live"},
        body=chat("u-chat"),
    ),
    Case(
        "model_not_zdr",
        400,
        "model_not_zdr",
        "model",
        key={"data_mode": "zero_retention"},
        body=chat("m-nozdr"),
    ),
    Case("confidential", 501, "not_implemented", key={"data_mode": "confidential"}),
]


async def setup(gw: Gateway, case: Case) -> str:
    response = await gw.admin(
        "POST", "/admin/orgs", {"name": "acme", "credits_usd": 10, "residency": case.residency}
    )
    assert response.status_code == 201, response.text
    org_id = response.json()["id"]
    if case.policy:
        response = await gw.admin("PUT", f"/admin/orgs/{org_id}/policy", case.policy)
        assert response.status_code == 200, response.text
    key = await gw.create_key(
        org_id=org_id, scopes=["inference", "embeddings", "usage:read"], **case.key
    )
    return key["token"]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_policy_refusals(gw: Gateway, case: Case) -> None:
    token = await setup(gw, case)
    async with gw.client(token) as client:
        response = await client.post(case.endpoint, json=case.body or chat())
        assert response.status_code == case.status, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == (case.code, case.param)
        expected_type = {
            400: "invalid_request_error",
            402: "insufficient_quota",
            403: "permission_error",
            404: "not_found_error",
        }
        assert error["type"] == expected_type.get(case.status, "api_error")
        request_id = response.headers["X-Request-Id"]
        svc = response.json().get("svc")
        if case.decisions is None:
            assert svc is None
        else:
            assert svc["request_id"] == request_id
            assert svc["policy"]["decisions"] == [
                {"rule": rule, "verdict": "deny"} for rule in case.decisions
            ]
        # refused before the model: no record
        record = await client.get(f"/v1/requests/{request_id}")
        assert record.status_code == 404
        key = (await client.get("/v1/key")).json()
        assert key["usage"]["day"]["spent_usd"] == 0
        assert key["usage"]["day"]["reserved_usd"] == 0
        assert (key["rate_limit"]["tokens_this_minute"] > 0) == case.reached_reservation


async def test_the_same_setups_serve_what_they_allow(gw: Gateway) -> None:
    """Each rule refuses only what it names: the allowed model, an alias of one model,
    a call without the denied feature are served."""
    allowed = [
        (Case("", 200, "", policy={"contract_allowed_models": ["m-nozdr"]}), chat("m-nozdr")),
        (Case("", 200, "", key={"allowed_models": ["m-chat"]}), chat("solo")),
        (Case("", 200, "", policy={"entitlements": {"streaming": False}}), chat()),
        (Case("", 200, "", policy={"web_search_models": ["m-chat"]}), chat(web_search_options={})),
        (Case("", 200, "", residency="us"), chat("u-chat")),
    ]
    for case, body in allowed:
        token = await setup(gw, case)
        async with gw.client(token) as client:
            response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, (case, response.text)


async def test_an_alias_resolves_to_its_model(gw: Gateway) -> None:
    async with gw.client(gw.token) as client:
        response = await client.post("/v1/chat/completions", json=chat("solo"))
        assert response.status_code == 200, response.text
        record = await client.get(f"/v1/requests/{response.headers['X-Request-Id']}")
    assert record.json()["model"] == "m-chat"


async def test_a_model_switched_off_and_on_by_the_operator(gw: Gateway) -> None:
    async with gw.client(gw.token) as client:
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
        assert (await gw.admin("POST", "/admin/models/m-chat/disable")).status_code == 200
        response = await client.post("/v1/chat/completions", json=chat())
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "model_unavailable"
        assert "Retry-After" in response.headers
        listing = (await client.get("/v1/models")).json()["data"]
        assert "m-chat" not in [m["id"] for m in listing]
        assert (await gw.admin("POST", "/admin/models/m-chat/enable")).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat())).status_code == 200
    assert (await gw.admin("POST", "/admin/models/nope/enable")).status_code == 404


async def test_max_cost_is_checked_on_the_worst_case_before_reserving(gw: Gateway) -> None:
    """The ceiling binds the worst case: a small output budget passes, the key's full
    default budget (omitted max_tokens) does not."""
    case = Case("", 0, "", policy={"max_cost_per_request_usd": 0.001})
    token = await setup(gw, case)
    async with gw.client(token) as client:
        small = await client.post("/v1/chat/completions", json=chat(max_tokens=16))
        body = chat()
        del body["max_tokens"]
        body["messages"][0]["content"] = "x" * 2000
        large = await client.post("/v1/chat/completions", json=body)
    assert small.status_code == 200, small.text
    assert large.status_code == 402, large.text
    assert large.json()["error"]["code"] == "max_cost_per_request"


SECRET = "a-secret-the-gateway-must-not-keep-4711"


@pytest.mark.parametrize("data_mode", ["standard", "zero_retention"])
async def test_request_records_hold_metadata_only(
    gw: Gateway, tmp_path: Path, data_mode: str
) -> None:
    """Neither the prompt nor the answer reaches the record or the database file."""
    token = await setup(gw, Case("", 200, "", key={"data_mode": data_mode}))
    async with gw.client(token) as client:
        answers = [
            await client.post(
                "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": SECRET}])
            ),
            await client.post("/v1/responses", json={"model": "m-chat", "input": SECRET}),
            await client.post("/v1/embeddings", json={"model": "emb", "input": SECRET}),
        ]
        ids = [answer.headers["X-Request-Id"] for answer in answers]
        records = [await client.get(f"/v1/requests/{request_id}") for request_id in ids]
    assert [a.status_code for a in answers + records] == [200] * 6, [a.text for a in answers]
    said = answers[0].json()["choices"][0]["message"]["content"]
    assert len(said) > 20
    for record in records:
        assert record.json()["id"] in ids
        assert not {"messages", "input", "output", "choices", "data"} & set(record.json())
        assert SECRET not in record.text and said not in record.text
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("gateway.db*"))
    assert all(request_id.encode() in stored for request_id in ids)  # the rows are there
    assert SECRET.encode() not in stored
    assert said.encode() not in stored


@pytest.mark.parametrize(
    ("policy", "param"),
    [
        ({"entitlements": {"teleport": False}}, "entitlements"),
        ({"entitlements": {"streaming": "no"}}, "entitlements"),
        ({"byok_pricing": {"*": {"input_usd_per_mtok": 1}}}, "byok_pricing"),
        (
            {"byok_pricing": {"*": {"input_usd_per_mtok": -1, "output_usd_per_mtok": 1}}},
            "byok_pricing",
        ),
        ({"spend_paused": 1}, "spend_paused"),
        ({"max_cost_per_request_usd": True}, "max_cost_per_request_usd"),
    ],
)
async def test_policy_documents_are_validated(
    gw: Gateway, policy: dict[str, Any], param: str
) -> None:
    response = await gw.admin("PUT", f"/admin/orgs/{gw.org_id}/policy", policy)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
