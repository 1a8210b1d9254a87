"""USD amounts as answers write them: JSON numbers, never in exponent notation.

orjson (like Python's ``repr``) writes a small float with an exponent (``9.3e-06``),
which is a valid JSON number but reads badly in an answer, a log line or a spreadsheet
import. Amounts are rounded to the nano-USD (:func:`gateway.accounts.catalog.nanos_to_usd`),
so their plain decimal form is short and exact: ``0.0000093``. They stay numbers: an
``orjson.Fragment`` writes the digits as they are, and every JSON reader (the ``openai``
client, the OpenAPI ``number`` type) reads them as the same float.

The answer fields that hold amounts are named ``*_usd``, ``usd_*`` or ``*_usd_per_mtok``
(DESIGN.md and the spec's ``cost.settled_usd``, ``caps.usd_day``); only those are
rewritten, so a vector of embeddings is never walked float by float.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import orjson

_AMOUNT = re.compile(r"(?:^|_)usd(?:_|$)")


def plain_usd(value: float) -> str:
    """``value`` written without an exponent: 9.3e-06 is ``0.0000093``."""
    text = repr(value)
    if "e" not in text:
        return text
    plain = format(Decimal(text), "f")
    return plain if "." in plain else f"{plain}.0"


def plain_amounts(data: Any) -> Any:
    """``data`` with every float of an amount field made a plain-decimal JSON number (the
    dicts on the way are copied, never changed: they may be shared state)."""
    if isinstance(data, dict):
        return {name: _field(name, value) for name, value in data.items()}
    if isinstance(data, list) and data and isinstance(data[0], dict | list):
        return [plain_amounts(item) for item in data]
    return data


def _field(name: Any, value: Any) -> Any:
    if type(value) is float and isinstance(name, str) and _AMOUNT.search(name):
        return orjson.Fragment(plain_usd(value)) if "e" in repr(value) else value
    return plain_amounts(value)
