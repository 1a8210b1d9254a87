"""The ``webhook`` guardrail kind's client: the texts posted to the operator's service,
its verdict read back (gateway/calls/guardrails/rules.py decides what it means).

One POST of ``{"guardrail", "direction", "texts"}`` per check, within the guardrail's
``timeout_s``; anything but a 200 with a JSON object (a refused connection, a timeout,
another status, a body that is not JSON) is :class:`WebhookFailed`, which the
guardrail's ``on_error`` turns into a verdict. The texts are never logged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson
import trio

from gateway.config.guardrails import GuardrailConfig

if TYPE_CHECKING:
    import httpx


class WebhookFailed(Exception):
    """The webhook did not answer, or not with a verdict (its ``on_error`` decides)."""


class GuardrailWebhooks:
    """Posts to webhook guardrails over one pooled client, made at the first post (httpx's
    import and a TLS context's CA bundle were ~0.1 s of every start, most of which have
    no webhook guardrail) and closed with the server."""

    def __init__(self) -> None:
        self.client: httpx.AsyncClient | None = None

    async def ask(self, config: GuardrailConfig, payload: dict[str, Any]) -> dict[str, Any]:
        assert config.url is not None
        import httpx

        if self.client is None:
            self.client = httpx.AsyncClient(follow_redirects=False)
        try:
            with trio.fail_after(config.timeout_s):
                answer = await self.client.post(
                    config.url,
                    content=orjson.dumps(payload),
                    headers={"content-type": "application/json"},
                    timeout=config.timeout_s,
                )
            if answer.status_code != 200:
                raise WebhookFailed(f"status {answer.status_code}")
            body = orjson.loads(answer.content)
        except (httpx.HTTPError, orjson.JSONDecodeError, trio.TooSlowError) as exc:
            raise WebhookFailed(type(exc).__name__) from None
        if not isinstance(body, dict):
            raise WebhookFailed("an answer that is not a JSON object")
        return body

    async def aclose(self) -> None:
        if self.client is not None:
            await self.client.aclose()
