"""Reservations from real token counts (issue 47): a model's ``tokenizer``.

The bound must never be below what a provider of that vocabulary bills. OpenAI bills a
chat prompt as its cookbook counts it: 3 tokens per message, the tokens of each of its
strings encoded apart (role, content; a list of text parts is joined first), 3 for the
reply primer; tools as a TypeScript rendering. The property tests check the bound
against that count, with the tokenizers themselves, on prose, code, CJK, emoji, control
characters and tool schemas; the seam tests check that counting strings apart never
undercounts them joined. Then, through a real gateway: a 20 KB English prompt reserves
within 10 % above the model's count, and a 1 MB prompt no more than the context window.
"""

from __future__ import annotations

import random
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.calls.estimate import estimate_prompt_tokens
from gateway.calls.parse.chat import parse_chat
from gateway.calls.tokens import (
    STRING_SLACK,
    counter,
    exact_counter,
    prompt_bound,
    seam_bytes,
)
from gateway.config.settings import ConfigError, load_config
from tests.conftest import Gateway, make_config, start_gateway

VOCABULARIES = ("o200k", "cl100k")
WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "or",
    "from",
    "at",
    "which",
    "but",
    "gateway",
    "token",
    "reserve",
    "budget",
    "provider",
    "settlement",
    "ledger",
    "quantum",
    "river",
    "mountain",
]
CODE = 'def f(x):\n    return {"k": [x ** 2, None]}  # ok\n\tif a != b: pass;\n'
CJK = "你好世界这是一个测试句子。日本語のテキストです。한국어 문장입니다"
EMOJI = "😀🎉👍🏽👨‍👩‍👧‍👦🇫🇷✨🔥"
CONTROL = "\x00\x01\x02\x7f\u200b\ufeff"

#: text from every family at once: sampled fragments, and arbitrary characters
fragments = st.sampled_from([*WORDS, CODE, CJK, EMOJI, CONTROL, " ", "\n", "  ", "..."])
texts = st.one_of(
    st.lists(fragments, max_size=40).map("".join),
    st.lists(fragments, max_size=40).map(" ".join),
    st.text(max_size=300),
    st.text(alphabet=CJK + EMOJI + CODE, max_size=300),
)
schemas = st.recursive(
    st.fixed_dictionaries({"type": st.sampled_from(["string", "integer", "boolean"])}),
    lambda inner: st.fixed_dictionaries(
        {
            "type": st.just("object"),
            "properties": st.dictionaries(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), inner,
                                          max_size=4),
            "description": texts,
        }
    ),
    max_leaves=8,
)  # fmt: skip
tools = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.just("function"),
            "function": st.fixed_dictionaries(
                {
                    "name": st.from_regex(r"[a-z_]{1,20}", fullmatch=True),
                    "description": texts,
                    "parameters": schemas,
                }
            ),
        }
    ),
    max_size=3,
)
messages = st.lists(
    st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "user", "assistant"]),
            "content": st.one_of(
                texts, st.lists(texts, min_size=1, max_size=4).map(
                    lambda parts: [{"type": "text", "text": part} for part in parts])
            ),
        }
    ),
    min_size=1,
    max_size=5,
)  # fmt: skip


def typescript(tool: dict[str, Any]) -> str:
    """OpenAI's rendering of a function tool (the framing its cookbook counts)."""
    function = tool["function"]
    lines = [f"// {function['description']}", f"type {function['name']} = (_: {{"]
    for name, schema in (function["parameters"].get("properties") or {}).items():
        if schema.get("description"):
            lines.append(f"// {schema['description']}")
        lines.append(f"{name}?: {schema.get('type', 'any')},")
    lines.append("}) => any;")
    return "\n".join(lines)


def billed(body: dict[str, Any], vocabulary: str) -> int:
    """What a provider of ``vocabulary`` bills for the prompt of a chat ``body``."""
    count = exact_counter(vocabulary)
    total = 3
    for message in body["messages"]:
        content = message["content"]
        text = content if isinstance(content, str) else "".join(p["text"] for p in content)
        total += 3 + count(message["role"]) + count(text)
    if body.get("tools"):
        rendered = "\n".join(typescript(tool) for tool in body["tools"])
        total += count(f"namespace functions {{\n{rendered}\n}} // namespace functions") + 12
    return total


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sent=messages, offered=tools)
def test_the_bound_is_never_below_the_bill(
    vocabulary: str, sent: list[dict[str, Any]], offered: list[dict[str, Any]]
) -> None:
    body: dict[str, Any] = {"messages": sent, **({"tools": offered} if offered else {})}
    bound = estimate_prompt_tokens(body, count=counter(vocabulary))
    assert bound >= billed(body, vocabulary)
    # and never above the byte bound by more than the slack and the tools' framing
    strings = sum(1 + isinstance(m["content"], str) or 1 + 2 * len(m["content"]) for m in sent)
    assert bound <= estimate_prompt_tokens(body) + strings * STRING_SLACK + 24 * len(offered)


@pytest.mark.parametrize("vocabulary", VOCABULARIES)
@settings(max_examples=300, deadline=None)
@given(parts=st.lists(texts, min_size=2, max_size=6))
def test_strings_counted_apart_bound_them_joined(vocabulary: str, parts: list[str]) -> None:
    count = exact_counter(vocabulary)
    assert count("".join(parts)) <= sum(
        count(part) + STRING_SLACK + seam_bytes(part) for part in parts
    )


def test_a_seam_that_merges_letters_is_bounded() -> None:
    """Found by the property above: BPE is not subadditive across a seam of letters."""
    count, parts = exact_counter("cl100k"), ["the", "providerthe", "provider"]
    assert count("".join(parts)) > sum(count(part) + STRING_SLACK for part in parts)
    assert count("".join(parts)) <= sum(
        count(part) + STRING_SLACK + seam_bytes(part) for part in parts
    )


def test_the_vocabularies_are_exact_and_offline() -> None:
    """Known ids (tiktoken's: cl100k [15339, 1917], o200k [24912, 2375] for "hello
    world"), from the wheel's own files, loaded without the package's wrapper."""
    assert exact_counter("o200k")("hello world") == 2
    assert exact_counter("cl100k")("hello world") == 2
    assert exact_counter("cl100k")("tiktoken is great!") == 6
    assert "bpe_openai" not in sys.modules
    assert counter("bytes").text("héllo") == 6


def test_an_unknown_tokenizer_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(
        '[[providers]]\nname = "mock"\nkind = "mock"\n\n'
        '[[models]]\nid = "m"\nprovider = "mock"\ntokenizer = "llama"\n'
    )
    with pytest.raises(ConfigError, match=r"models\[0\]\.tokenizer: must be one of"):
        load_config(path, environ={})


def english(size: int) -> str:
    rng = random.Random(47)
    sentences = []
    length = 0  # kept, not summed again each sentence (1 MB was ~3 s of CPU)
    while length < size:
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        sentences.append(" ".join(words).capitalize() + ". ")
        length += len(sentences[-1])
    return "".join(sentences)[:size]


def test_the_context_window_clamps_the_bound() -> None:
    model = replace(load_config(None, environ={}).models[0], tokenizer="o200k",
                    context_window=200_000)  # fmt: skip
    call = parse_chat({"model": model.id, "messages": [{"role": "user",
                       "content": english(1_000_000)}]}, 16)  # fmt: skip
    assert prompt_bound(call, model) == 200_000
    assert prompt_bound(call, replace(model, context_window=None)) > 200_000


IN_USD, OUT_USD, MAX_TOKENS = 1.0, 1.0, 16


@pytest.fixture
async def gw(nursery: trio.Nursery, tmp_path: Path) -> AsyncIterator[Gateway]:
    """gpt-4o-mini (the mock) counted in o200k, with a 200,000-token window, at 1 USD per
    million tokens in and out (reserved USD × 10^6 are tokens)."""
    base = make_config(tmp_path)
    models = tuple(
        replace(m, tokenizer="o200k", context_window=200_000, input_usd_per_mtok=IN_USD,
                output_usd_per_mtok=OUT_USD) if m.id == "gpt-4o-mini" else m
        for m in base.models
    )  # fmt: skip
    gateway = await start_gateway(nursery, replace(base, models=models))
    yield gateway
    gateway.stop.set()


async def reserved_input(gw: Gateway, client: httpx.AsyncClient, text: str) -> tuple[int, int]:
    """The input tokens a call of ``text`` reserved, and the prompt tokens it was billed."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}],
            "max_tokens": MAX_TOKENS}  # fmt: skip
    response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    record = (await client.get(f"/v1/requests/{response.headers['x-request-id']}")).json()
    reserved = round(record["cost"]["reserved_usd"] * 1e6) - MAX_TOKENS
    return reserved, response.json()["usage"]["prompt_tokens"]


async def test_a_20_kb_english_prompt_reserves_within_10_percent(gw: Gateway) -> None:
    token = (await gw.create_key())["token"]
    text = english(20_000)
    model = billed({"messages": [{"role": "user", "content": text}]}, "o200k")
    async with gw.client(token) as client:
        reserved, charged = await reserved_input(gw, client, text)
        assert model <= reserved <= 1.10 * model
        assert charged <= reserved  # the mock bills the vocabulary's count
        big, _ = await reserved_input(gw, client, english(1_000_000))
    assert big <= 200_000
    assert len(orjson.dumps(text)) > 4 * model * 0.9  # the byte bound was ~4x


async def test_no_call_on_a_vocabulary_model_is_under_reserved(gw: Gateway) -> None:
    """Varied calls through the gateway on the o200k model: the prompt tokens the mock
    bills (the vocabulary's count) never pass the input tokens reserved."""
    token = (await gw.create_key())["token"]
    parameters = {"type": "object", "properties": {"city": {"type": "string"}}}
    function = {"name": "get_weather", "description": "天气 ☀️", "parameters": parameters}
    weather = {"type": "function", "function": function}
    prompts = [english(3_000), CODE * 40, CJK * 60, EMOJI * 80, CONTROL * 50, "x"]
    async with gw.client(token) as client:
        for text in prompts:
            reserved, charged = await reserved_input(gw, client, text)
            assert 0 < charged <= reserved
        parts = [{"type": "text", "text": CJK}, {"type": "text", "text": EMOJI}]
        messages = [{"role": "system", "content": CODE}, {"role": "user", "content": parts}]
        body = {"model": "gpt-4o-mini", "max_tokens": MAX_TOKENS, "tools": [weather],
                "messages": messages}  # fmt: skip
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        record = (await client.get(f"/v1/requests/{response.headers['x-request-id']}")).json()
        reserved = round(record["cost"]["reserved_usd"] * 1e6) - MAX_TOKENS
        assert response.json()["usage"]["prompt_tokens"] <= reserved
