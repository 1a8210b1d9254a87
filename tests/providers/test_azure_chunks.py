"""What the azure kind passes on of Azure's stream chunks and answers, and the addresses
it asks (the end-to-end behaviour: tests/calls/test_azure_calls.py)."""

from __future__ import annotations

from typing import Any

from gateway.config.settings import ProviderConfig
from gateway.providers.azure import AzureProvider

FILTERS = {"hate": {"filtered": False, "severity": "safe"}}


def provider(api_version: str | None = "2024-10-21") -> AzureProvider:
    config = ProviderConfig(
        "azure", "azure", base_url="https://r.openai.azure.com", api_version=api_version
    )
    return AzureProvider(config)


def chunk(**fields: Any) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "model": "m", **fields}


def test_the_prompt_filter_chunk_is_not_passed_on() -> None:
    first = {"choices": [], "id": "", "model": "", "object": "", "created": 0}
    first["prompt_filter_results"] = [{"prompt_index": 0, "content_filter_results": FILTERS}]
    assert provider()._passed_on(first) is None


def test_annotation_only_chunks_of_the_asynchronous_filter_are_not_passed_on() -> None:
    offsets = {"check_offset": 0, "start_offset": 0, "end_offset": 12}
    choice = {"index": 0, "finish_reason": None, "content_filter_results": FILTERS}
    assert (
        provider()._passed_on(chunk(choices=[{**choice, "content_filter_offsets": offsets}]))
        is None
    )
    assert provider()._passed_on(chunk(choices=[choice])) is None


def test_output_chunks_lose_the_annotations_and_keep_everything_else() -> None:
    choice = {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}
    passed = provider()._passed_on(chunk(choices=[{**choice, "content_filter_results": FILTERS}]))
    assert passed == chunk(choices=[choice])
    finish = {"index": 0, "finish_reason": "content_filter", "content_filter_results": FILTERS}
    assert provider()._passed_on(chunk(choices=[finish])) == chunk(
        choices=[{"index": 0, "finish_reason": "content_filter"}]
    )
    usage = chunk(choices=[], usage={"prompt_tokens": 3}, prompt_filter_results=[])
    assert provider()._passed_on(usage) == chunk(choices=[], usage={"prompt_tokens": 3})
    plain = chunk(choices=[])
    assert provider()._passed_on(plain) == plain


def test_the_paths_of_both_surfaces() -> None:
    dated = provider("2024-10-21")
    assert dated._path("chat/completions", "gpt 4o/x") == (
        "/openai/deployments/gpt%204o%2Fx/chat/completions?api-version=2024-10-21"
    )
    assert (
        dated._path("embeddings", "emb")
        == "/openai/deployments/emb/embeddings?api-version=2024-10-21"
    )
    assert provider(None)._path("chat/completions", "gpt-4o") == "/openai/v1/chat/completions"
    headers = provider()._headers("k" * 32, None)
    assert headers["api-key"] == "k" * 32 and "Authorization" not in headers
