"""The ``gemini`` kind: Google's Gemini API spoken natively (docs/providers/gemini.md).

- :mod:`.gemini_provider` — the provider: HTTP calls, streams, embeddings, failures
- :mod:`.gemini_request` — an OpenAI chat body into a GenerateContentRequest
- :mod:`.gemini_answer` — Gemini answers and stream events into OpenAI's shapes
- :mod:`.gemini_schema` — JSON Schema into Gemini's OpenAPI subset
"""

from gateway.providers.gemini.gemini_provider import GeminiProvider

__all__ = ["GeminiProvider"]
