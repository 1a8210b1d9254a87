"""What an operator and a client meet first (issue 32): a live key on a mock-only model is
refused saying what to configure, refusals of unknown fields list the allowed ones, a key's
model list has one public name, a parent reads its sub-keys' records, refusals name the
worst case and the served embedding model, and amounts are never in exponent notation."""

from __future__ import annotations

import re

import openai
import orjson
import pytest

from tests.conftest import Gateway

CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello"}]}


async def test_a_live_key_is_never_served_by_the_mock(gateway: Gateway) -> None:
    live = await gateway.create_key(name="live", mode="live")
    async with gateway.client(live["token"]) as client:
        refused = await client.post("/v1/chat/completions", json=CHAT)
        embedding = await client.post(
            "/v1/embeddings", json={"model": "text-embedding-3-small", "input": "x"}
        )
        usage = (await client.get("/v1/usage")).json()
        spent = (await client.get("/v1/key")).json()["usage"]["day"]["spent_usd"]
    for answer in (refused, embedding):
        assert answer.status_code == 503, answer.text
        error = answer.json()["error"]
        assert (error["code"], error["param"]) == ("model_unavailable", "model")
        assert "mock" in error["message"] and "[[providers]]" in error["message"]
        assert "sandbox key" in error["message"]
        assert answer.headers["x-should-retry"] == "false"  # a setup to change
    # refused before the model: no record, nothing spent
    assert usage["totals"]["requests"] == 0 and spent == 0
    async with gateway.client(gateway.token) as client:  # the sandbox key: the mock
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200


async def test_unknown_fields_of_key_bodies_are_refused_with_the_allowed_list(
    gateway: Gateway,
) -> None:
    async with gateway.client(gateway.token) as client:
        created = await client.post("/v1/keys", json={"name": "c", "banana": 1})
        child = (await client.post("/v1/keys", json={"name": "c"})).json()
        patched = await client.patch(f"/v1/keys/{child['id']}", json={"banana": True})
        chat = await client.post("/v1/chat/completions", json={**CHAT, "banana": 1})
    admin = await gateway.admin(
        "POST", "/admin/keys", {"org_id": gateway.org_id, "name": "k", "banana": 1}
    )
    policy = await gateway.admin("PUT", f"/admin/orgs/{gateway.org_id}/policy", {"banana": 1})
    org = await gateway.admin("POST", "/admin/orgs", {"name": "o", "banana": 1})
    for answer, listed in (
        (created, "name, scopes, caps, data_mode, allowed_model_keys"),
        (patched, "disabled"),
        (admin, "org_id, name, mode"),
        (policy, "contract_allowed_models, contract_blocked_models"),
        (chat, "max_tokens"),
        (org, "name, credits_usd, residency"),
    ):
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert error["param"] == "banana"
        assert "banana" in error["message"] and listed in error["message"], error["message"]


async def test_allowed_model_keys_is_the_public_name_both_ways(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as client:
        new = await client.post(
            "/v1/keys", json={"name": "new", "allowed_model_keys": ["gpt-4o-mini"]}
        )
        old = await client.post("/v1/keys", json={"name": "old", "allowed_models": ["gpt-4o"]})
        both = await client.post(
            "/v1/keys",
            json={"name": "both", "allowed_models": ["gpt-4o"], "allowed_model_keys": ["gpt-4o"]},
        )
        outside = await client.post(
            "/v1/keys", json={"name": "x", "allowed_model_keys": ["no-such-model"]}
        )
    assert new.status_code == 201 and new.json()["allowed_model_keys"] == ["gpt-4o-mini"]
    assert old.status_code == 201 and old.json()["allowed_model_keys"] == ["gpt-4o"]
    assert both.status_code == 400 and both.json()["error"]["param"] == "allowed_models"
    assert outside.json()["error"]["code"] == "model_not_in_catalog"
    assert outside.json()["error"]["param"] == "allowed_model_keys"
    root = await gateway.create_key(allowed_model_keys=["mock-basic"])
    assert root["allowed_model_keys"] == ["mock-basic"]
    async with gateway.client(new.json()["token"]) as client:
        assert (await client.get("/v1/key")).json()["allowed_model_keys"] == ["gpt-4o-mini"]
        refused = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o"})
    assert refused.json()["error"]["code"] == "model_not_allowed"


async def test_a_parent_reads_the_records_of_its_sub_keys(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as client:
        child = (await client.post("/v1/keys", json={"name": "child"})).json()
    async with gateway.client(child["token"]) as client:
        call = await client.post("/v1/chat/completions", json=CHAT)
    request_id = call.headers["X-Request-Id"]
    other = await gateway.create_key(name="stranger")
    async with gateway.client(gateway.token) as client:
        record = await client.get(f"/v1/requests/{request_id}")
        usage = (await client.get("/v1/usage")).json()
    assert record.status_code == 200 and record.json()["id"] == request_id
    assert usage["totals"]["requests"] == 1  # what /v1/usage counts, the records show
    async with gateway.client(other["token"]) as client:  # not a parent: still 404
        assert (await client.get(f"/v1/requests/{request_id}")).status_code == 404


async def test_refusals_of_the_reservation_name_the_worst_case(gateway: Gateway) -> None:
    key = await gateway.create_key(caps={"usd_day": 0.000001})
    async with gateway.client(key["token"]) as client:
        refused = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1000})
    error = refused.json()["error"]
    assert refused.status_code == 402 and error["code"] == "key_cap_exceeded"
    amount = re.search(r"worst-case cost of this call, ([0-9.]+) USD", error["message"])
    assert amount is not None and float(amount.group(1)) > 0.000001
    assert "a lower max_tokens" in error["message"]


async def test_the_embedding_refusal_names_the_served_model(gateway: Gateway) -> None:
    async with gateway.client(gateway.token) as client:
        refused = await client.post("/v1/embeddings", json={"model": "gpt-4o", "input": "x"})
    assert refused.status_code == 400
    assert "text-embedding-3-small" in refused.json()["error"]["message"]


@pytest.mark.parametrize("max_tokens", [1, 3])
async def test_amounts_are_never_written_with_an_exponent(
    gateway: Gateway, max_tokens: int
) -> None:
    """mock-basic costs 0.10 / 0.20 USD per million tokens: a short call settles a few
    millionths of a dollar, which a float writes as 9.3e-06."""
    body = {**CHAT, "model": "mock-basic", "max_tokens": max_tokens}
    async with gateway.client(gateway.token) as client:
        call = await client.post("/v1/chat/completions", json=body)
        raw = (await client.get(f"/v1/requests/{call.headers['X-Request-Id']}")).content
        key_raw = (await client.get("/v1/key")).content
    record = orjson.loads(raw)
    settled = record["cost"]["settled_usd"]
    assert 0 < settled < 0.0001 and isinstance(settled, float)  # still a JSON number
    for text in (raw, key_raw):
        assert not re.search(rb"[:,\[]-?\d+(?:\.\d+)?[eE][-+]?\d", text), text
    assert "e" in repr(settled)  # what a float would have written
    # the official client reads the same amounts
    sdk = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=gateway.token)
    async with sdk:
        answer = await sdk.chat.completions.with_raw_response.create(**body)
    assert answer.http_response.status_code == 200
