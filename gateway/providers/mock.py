"""The deterministic mock provider that serves every sandbox key.

The content derives from a SHA-256 digest of the canonical JSON (sorted keys) of the
upstream model and the parameters that shape an answer (:data:`_ANSWER_KEYS`), so the same
body gives the same answer, streamed or not: same text, same tool call, same usage.
``max_tokens`` and ``stop`` are left out of the digest: they only cut the same answer
shorter. Ids and timestamps are per call, as a real provider's are (tracing and dedupe
tools key on them): ``chatcmpl-<hex>`` and the tool call's ``call_<hex>`` carry the hex of
the gateway's request id (a fresh random one without it), ``created`` is the clock's
second.

The answer, in order of precedence:

1. a tool call to the first function tool, when ``tools`` is non-empty, ``tool_choice`` is
   not ``"none"`` and the last message is not a tool result (so an agent loop ends), with
   JSON arguments that satisfy the tool's ``parameters`` schema;
2. a JSON value satisfying ``response_format.json_schema.schema``, or a JSON object for
   ``json_object``;
3. prose, mentioning how many images the messages hold.

Every schema gets an answer, however odd (:mod:`gateway.providers.schema_values`).

Tokens are the mock's own: a word or a punctuation mark with its leading whitespace
(:func:`count_tokens`). Each covers at least one character, so every count here stays
below the byte-based bound of :mod:`gateway.calls.estimate`. The output is cut at ``max_tokens``
of them (finish_reason ``length``); a stream sends one of them per chunk.

Embeddings are unit vectors from SHAKE-256 of each input, independent of the dimensions:
a shorter vector is the renormalised prefix of a longer one, as with OpenAI's
``text-embedding-3`` models. Values are rounded to float32, so the ``float`` and
``base64`` encodings carry the same numbers.
"""

from __future__ import annotations

import hashlib
import math
import re
import secrets
import struct
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import trio

from gateway.calls.estimate import IMAGE_PART_TYPES
from gateway.calls.tokens import ENCODINGS, exact_counter
from gateway.config.settings import ModelConfig
from gateway.providers.base import (
    EmbeddingRequest,
    EmbeddingResult,
    ProviderRequest,
    ProviderResult,
    Usage,
)
from gateway.providers.schema_values import Draw, as_dict, below, phrase, sample

DEFAULT_DIMENSIONS = 1536
SYSTEM_FINGERPRINT = "fp_mock"
MESSAGE_TOKENS = 3
IMAGE_TOKENS = 85  # OpenAI's price of a "low" detail image

_ANSWER_KEYS = (
    "messages",
    "tools",
    "tool_choice",
    "response_format",
    "temperature",
    "top_p",
    "seed",
)
# Parameters the mock honours, or that change no answer of any provider.
_READ_KEYS = frozenset(
    {*_ANSWER_KEYS, "model", "max_tokens", "max_completion_tokens", "stop", "stream"}
    | {"stream_options", "user", "metadata", "service_tier", "parallel_tool_calls"}
)
_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")


#: each ASCII character as its class under _TOKEN: w (\w), s (\s) or p (anything else)
_ASCII_CLASSES = (
    bytes(
        ord("w") if re.match(r"\w", chr(c)) else ord("s") if re.match(r"\s", chr(c)) else ord("p")
        for c in range(128)
    )
    + b"p" * 128
)
#: below this length the regex is as quick as anything
_LONG_TEXT = 1024


def count_tokens(text: str) -> int:
    """The mock's token count of ``text``: words and punctuation marks.

    The number of ``_TOKEN`` matches: a match per run of word characters, per other
    non-space character, and one for whitespace that ends the text (whitespace before a
    word or a mark belongs to it). A long ASCII text is counted so, with C-speed bytes
    operations: the regex took 0.1 to 1 s on a 10 MB prompt, all of it blocking the
    event loop.
    """
    if len(text) < _LONG_TEXT or not text.isascii():
        return len(_TOKEN.findall(text))
    classes = text.encode("ascii").translate(_ASCII_CLASSES)
    words = classes.count(b"sw") + classes.count(b"pw") + classes.startswith(b"w")
    return words + classes.count(b"p") + classes.endswith(b"s")


def prompt_tokens(body: dict[str, Any], count: Callable[[str], int] = count_tokens) -> int:
    """The mock's prompt tokens of a chat body (never above the gateway's estimate);
    ``count``: its tokens of one string (a model's vocabulary, else the mock's own)."""
    messages = body.get("messages") or []
    total = MESSAGE_TOKENS * (len(messages) + 1) + sum(
        IMAGE_TOKENS if leaf is None else count(leaf) for leaf in _leaves(messages)
    )
    for key in ("tools", "response_format"):
        if body.get(key):
            total += count(orjson.dumps(body[key]).decode())
    return total


@dataclass(frozen=True, slots=True)
class _Answer:
    id: str
    created: int
    model: str
    pieces: list[str]  # content, or the tool call's arguments
    finish_reason: str
    usage: Usage
    tool_call: tuple[str, str] | None  # (call id, function name)
    #: the stop sequence the text was cut at (vLLM's ``stop_reason`` of the choice)
    stop_sequence: str | None = None

    def finish(self) -> dict[str, Any]:
        """The finish fields of the answer's choice."""
        fields: dict[str, Any] = {"finish_reason": self.finish_reason}
        if self.stop_sequence is not None and self.finish_reason == "stop":
            fields["stop_reason"] = self.stop_sequence
        return fields


class MockProvider:
    """The deterministic provider of sandbox keys.

    ``chunk_delay`` slows each stream chunk, and a whole answer by as long as its stream
    would take (one delay per chunk), so a slow model is slow streamed or not. ``clock``
    (epoch seconds) dates the answers.
    """

    def __init__(
        self,
        *,
        embedding_dimensions: Mapping[str, int] | None = None,
        chunk_delay: float = 0.0,
        clock: Callable[[], float] = time.time,
        tokenizers: Mapping[str, str] | None = None,
    ) -> None:
        self._dimensions = dict(embedding_dimensions or {})
        #: upstream model → its tokenizer, where it names a vocabulary: the mock bills
        #: what a provider of that vocabulary would (the exact count of each string)
        self._tokenizers = dict(tokenizers or {})
        self._chunk_delay = chunk_delay
        self._clock = clock

    @classmethod
    def for_models(
        cls,
        models: Iterable[ModelConfig],
        chunk_delay: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> MockProvider:
        """A mock that knows the configured dimensions of the embedding models and the
        chat models' tokenizers."""
        models = list(models)
        dimensions = {m.upstream_id: m.dimensions for m in models if m.kind == "embedding"}
        tokenizers = {
            d.upstream_id: m.tokenizer
            for m in models
            if m.tokenizer in ENCODINGS
            for d in m.routes()
        }
        return cls(
            embedding_dimensions=dimensions,
            chunk_delay=chunk_delay,
            clock=clock,
            tokenizers=tokenizers,
        )

    def _counter(self, upstream_model: str) -> Callable[[str], int]:
        tokenizer = self._tokenizers.get(upstream_model)
        return count_tokens if tokenizer is None else exact_counter(tokenizer)

    async def complete(self, request: ProviderRequest) -> ProviderResult:
        answer = _answer(request, int(self._clock()), self._counter(request.upstream_model))
        # the chunks of the stream of the same answer: role, one per piece, finish, usage
        await self._pause(len(answer.pieces) + 3)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(answer.pieces)}
        if answer.tool_call:
            call_id, name = answer.tool_call
            function = {"name": name, "arguments": message["content"]}
            message["content"] = None
            message["tool_calls"] = [{"id": call_id, "type": "function", "function": function}]
        choice = {"index": 0, "message": message, **answer.finish()}
        completion = {
            **_header(answer, "chat.completion"),
            "choices": [{**choice, "logprobs": None}],
            "usage": answer.usage.as_dict(),
        }
        return ProviderResult(completion=completion, usage=answer.usage)

    async def stream(self, request: ProviderRequest) -> AsyncIterator[dict[str, Any]]:
        answer = _answer(request, int(self._clock()), self._counter(request.upstream_model))
        header = _header(answer, "chat.completion.chunk")
        first: dict[str, Any] = {"role": "assistant", "content": ""}
        if answer.tool_call:
            call_id, name = answer.tool_call
            function = {"name": name, "arguments": ""}
            call = {"index": 0, "id": call_id, "type": "function", "function": function}
            first = {"role": "assistant", "content": None, "tool_calls": [call]}
        deltas = [first]
        for piece in answer.pieces:
            if answer.tool_call:
                deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
            else:
                deltas.append({"content": piece})
        for index, delta in enumerate([*deltas, {}]):
            await self._pause()
            finish = answer.finish() if index == len(deltas) else {"finish_reason": None}
            choice = {"index": 0, "delta": delta, "logprobs": None, **finish}
            yield {**header, "choices": [choice]}
        await self._pause()
        yield {**header, "choices": [], "usage": answer.usage.as_dict()}

    async def embed(self, request: EmbeddingRequest) -> EmbeddingResult:
        await trio.lowlevel.checkpoint()
        model, inputs = request.upstream_model, request.inputs
        size = request.dimensions or self._dimensions.get(model, DEFAULT_DIMENSIONS)
        vectors = [_unit_vector(model, item, size) for item in inputs]
        tokens = sum(count_tokens(item) if isinstance(item, str) else len(item) for item in inputs)
        return EmbeddingResult(vectors=vectors, usage=Usage(prompt_tokens=tokens))

    def ignored_parameters(self, body: dict[str, Any]) -> list[str]:
        return [key for key in body if key not in _READ_KEYS]

    async def _pause(self, chunks: int = 1) -> None:
        if self._chunk_delay > 0:
            await trio.sleep(self._chunk_delay * chunks)
        else:
            await trio.lowlevel.checkpoint()


# ---------------------------------------------------------------- answers


def _answer(request: ProviderRequest, created: int, count: Callable[[str], int]) -> _Answer:
    body = request.body
    call = request.request_id.removeprefix("req_") or secrets.token_hex(12)
    shaping = {key: body[key] for key in _ANSWER_KEYS if key in body}
    canonical = orjson.dumps([request.upstream_model, shaping], option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(canonical).hexdigest()
    rng = Draw(digest)  # only .random() is used: stable across Python versions
    messages = body.get("messages") or []
    tool = _tool_to_call(body, messages)
    if tool is not None:
        schema = tool.get("parameters")
        schema = schema if isinstance(schema, dict) and schema else {"type": "object"}
        text = _json(sample(schema, rng))
        tool_call: tuple[str, str] | None = (f"call_{call}", tool["name"])
        reason, matched = "tool_calls", None
    else:
        text, tool_call, reason = _content(body, messages, rng), None, "stop"
        text, matched = _cut_at_stop(text, body.get("stop"))
    pieces = _TOKEN.findall(text)
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    if isinstance(limit, int) and len(pieces) > limit:
        pieces, reason = pieces[:limit], "length"
    usage = Usage(prompt_tokens=prompt_tokens(body, count), completion_tokens=len(pieces))
    answer_id = f"chatcmpl-{call}"
    return _Answer(
        answer_id, created, request.upstream_model, pieces, reason, usage, tool_call, matched
    )


def _header(answer: _Answer, obj: str) -> dict[str, Any]:
    return {
        "id": answer.id,
        "object": obj,
        "created": answer.created,
        "model": answer.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def _tool_to_call(body: dict[str, Any], messages: list[Any]) -> dict[str, Any] | None:
    if body.get("tool_choice") == "none" or not isinstance(body.get("tools"), list):
        return None
    if messages and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool":
        return None
    for tool in body["tools"]:
        if isinstance(tool, dict) and tool.get("type") == "function":
            function = tool.get("function")
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                return function
    return None


def _content(body: dict[str, Any], messages: list[Any], rng: Draw) -> str:
    response_format = as_dict(body.get("response_format"))
    kind = response_format.get("type")
    if kind == "json_schema":  # the parser checked the shape; an odd one is an object
        schema = as_dict(response_format.get("json_schema")).get("schema")
        schema = schema if isinstance(schema, dict) and schema else {"type": "object"}
        return _json(sample(schema, rng))
    if kind == "json_object":
        return orjson.dumps({"answer": phrase(rng, 6)}).decode()
    images = sum(leaf is None for leaf in _leaves(messages))
    seen = f"; I see {images} image{'' if images == 1 else 's'}" if images else ""
    return f"This is a deterministic mock reply{seen}. {phrase(rng, 8 + below(rng, 24))}."


def _json(value: Any) -> str:
    """``value`` as JSON text. The generator writes only serialisable numbers and nests
    less than orjson's limit, but a caller's ``const`` or ``enum`` value placed deep in the
    answer could pass it: then the answer is an empty object rather than a crash."""
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:
        return "{}"


def _cut_at_stop(text: str, stop: Any) -> tuple[str, str | None]:
    """The text before the first stop sequence in it, and that sequence (None: none)."""
    sequences = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    cuts = [(text.find(s), s) for s in sequences if isinstance(s, str) and s and s in text]
    if not cuts:
        return text, None
    at, sequence = min(cuts)
    return text[:at], sequence


def _leaves(value: Any) -> Iterator[str | None]:
    """The strings inside ``value``, and ``None`` for each image part."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict) and value.get("type") in IMAGE_PART_TYPES:
        yield None
    elif isinstance(value, dict | list):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _leaves(item)


def _unit_vector(model: str, item: Any, size: int) -> list[float]:
    raw = hashlib.shake_256(orjson.dumps([model, item])).digest(4 * size)
    ints = struct.unpack(f"<{size}i", raw)
    norm = math.sqrt(math.fsum(float(v) * v for v in ints)) or 1.0
    return list(struct.unpack(f"<{size}f", struct.pack(f"<{size}f", *(v / norm for v in ints))))
