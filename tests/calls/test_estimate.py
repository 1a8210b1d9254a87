"""The worst-case token estimates: exact values, and the bound they must never break."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.calls.estimate import (
    EMBEDDING_INPUT_OVERHEAD,
    IMAGE_TOKENS,
    PER_MESSAGE_TOKENS,
    REQUEST_OVERHEAD_TOKENS,
    estimate_embedding_tokens,
    estimate_prompt_tokens,
    worst_case_tokens,
)
from gateway.providers import mock

BASE = REQUEST_OVERHEAD_TOKENS + PER_MESSAGE_TOKENS  # one message, before its strings


def user(content: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}]}


# (body, expected estimate): the UTF-8 bytes of every string plus the fixed allowances
EXACT = [
    (user("hello"), BASE + 4 + 5),
    (user("é"), BASE + 4 + 2),
    (user("你好"), BASE + 4 + 6),
    (user("😀"), BASE + 4 + 4),
    (user(""), BASE + 4),
    (user([{"type": "text", "text": "hi"}]), BASE + 4 + 4 + 2),
    ({"messages": []}, REQUEST_OVERHEAD_TOKENS),
    (
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]},
        REQUEST_OVERHEAD_TOKENS + 2 * PER_MESSAGE_TOKENS + 6 + 1 + 4 + 1,
    ),
    ({**user("x"), "tools": [{"type": "function"}]}, BASE + 4 + 1 + 21),
    ({**user("x"), "response_format": {"type": "json_object"}}, BASE + 4 + 1 + 22),
    ({**user("x"), "temperature": 0.5, "max_tokens": 10, "stop": ["zz"]}, BASE + 4 + 1),
]


@pytest.mark.parametrize(("body", "expected"), EXACT)
def test_estimate_is_bytes_plus_allowances(body: dict[str, Any], expected: int) -> None:
    assert estimate_prompt_tokens(body) == expected


def test_an_image_costs_the_allowance_not_its_url() -> None:
    huge = "data:image/png;base64," + "A" * 1_000_000
    part = {"type": "image_url", "image_url": {"url": huge, "detail": "high"}}
    body = user([{"type": "text", "text": "what?"}, part])
    assert IMAGE_TOKENS == 2805
    assert estimate_prompt_tokens(body) == BASE + 4 + 4 + 5 + IMAGE_TOKENS
    assert estimate_prompt_tokens(body, image_tokens=48_169) == BASE + 4 + 4 + 5 + 48_169


def test_each_tool_call_is_framed_like_a_message() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    body = {"messages": [{"role": "assistant", "content": None, "tool_calls": [call, call]}]}
    strings = len("assistant") + 2 * len("c1function" + "f{}")
    assert estimate_prompt_tokens(body) == BASE + 2 * PER_MESSAGE_TOKENS + strings


# Real token counts, measured with cl100k_base and o200k_base (the larger of the two):
# the estimate must cover OpenAI's own formula, 3 per message + the tokens of each value
# + 3 for the reply primer, for each of them. The control characters are the worst
# case: one token per byte, where bytes/4 would promise a single token.
MEASURED = [
    ("Hello, how are you today?", 7),
    ("Привет, как дела? Это тест.", 13),
    ("你好，世界。今天天气很好。", 16),
    ("😀😃😄😁", 8),
    ("def f(x):\n    return x ** 2\n", 11),
    ("a" * 1000, 125),
    ("\x00\x01\x02\x7f", 4),
    ("𝔘𝔫𝔦𝔠𝔬𝔡𝔢", 21),
    ("1234567890" * 5, 17),
]


@pytest.mark.parametrize(("text", "tokens"), MEASURED)
def test_estimate_covers_measured_openai_counts(text: str, tokens: int) -> None:
    openai_count = 3 + (1 + tokens) + 3  # "user" is one token in both encodings
    assert estimate_prompt_tokens(user(text)) >= openai_count
    assert estimate_prompt_tokens(user(text)) >= len(text.encode())


# Special tokens of chat templates, for n messages of empty content whose role is one
# token: (before the messages, per message, reply primer). Llama 3.1 opens with
# <|begin_of_text|> and a default system message of 5 framing + 20 text tokens.
TEMPLATES = {
    "openai (cookbook)": (0, 3 + 1, 3),
    "llama 3": (1, 5, 4),
    "llama 3.1": (1 + 25, 5, 4),
}


@pytest.mark.parametrize("framing", TEMPLATES.values(), ids=TEMPLATES)
@pytest.mark.parametrize("n", [1, 2, 50])
def test_estimate_covers_chat_template_framing(framing: tuple[int, int, int], n: int) -> None:
    before, per_message, primer = framing
    body = {"messages": [{"role": "tool", "content": ""}] * n}
    assert estimate_prompt_tokens(body) >= before + n * per_message + primer


# ---------------------------------------------------------------- the mock stays below

texts = st.text(max_size=200)  # any code point but surrogates: emoji, CJK, controls
image = st.builds(
    lambda url: {"type": "image_url", "image_url": {"url": url}}, st.text(max_size=300)
)
parts = st.lists(st.one_of(st.builds(lambda t: {"type": "text", "text": t}, texts), image))
tool_call = st.builds(
    lambda i, n, a: {"id": i, "type": "function", "function": {"name": n, "arguments": a}},
    texts,
    texts,
    texts,
)
message = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["system", "user", "assistant", "tool"]),
        "content": st.one_of(st.none(), texts, parts),
    },
    optional={"name": texts, "tool_calls": st.lists(tool_call, max_size=2)},
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | texts,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=20,
)
bodies = st.fixed_dictionaries(
    {"messages": st.lists(message, min_size=1, max_size=6)},
    optional={
        "tools": st.lists(st.dictionaries(texts, json_values, max_size=3), max_size=3),
        "response_format": st.dictionaries(texts, json_values, max_size=3),
    },
)


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_mock_prompt_tokens_never_exceed_the_estimate(body: dict[str, Any]) -> None:
    assert mock.prompt_tokens(body) <= estimate_prompt_tokens(body)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.lists(texts, min_size=1), st.lists(st.lists(st.integers(0, 100_000)))))
def test_mock_embedding_tokens_never_exceed_the_estimate(inputs: list[Any]) -> None:
    counted = sum(mock.count_tokens(i) if isinstance(i, str) else len(i) for i in inputs)
    assert counted <= estimate_embedding_tokens(inputs)


# ---------------------------------------------------------------- embeddings, worst case


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ("hello", 5 + EMBEDDING_INPUT_OVERHEAD),
        ("你好", 6 + EMBEDDING_INPUT_OVERHEAD),
        (["a", "bb"], 3 + 2 * EMBEDDING_INPUT_OVERHEAD),
        ([1, 2, 3], 3 + EMBEDDING_INPUT_OVERHEAD),
        ([[1, 2], [3]], 3 + 2 * EMBEDDING_INPUT_OVERHEAD),
    ],
)
def test_embedding_estimate(inputs: str | list[Any], expected: int) -> None:
    assert estimate_embedding_tokens(inputs) == expected


def test_worst_case_is_prompt_plus_full_output_ceiling() -> None:
    assert worst_case_tokens(120, 4096) == 4216
    assert worst_case_tokens(0, 0) == 0
    with pytest.raises(ValueError):
        worst_case_tokens(-1, 10)
