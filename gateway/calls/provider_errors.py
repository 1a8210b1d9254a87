"""Provider failures → the spec's error codes and settlement rows, in one table.

    provider failure                     answer                              settlement row
    -----------------------------------  ----------------------------------  ----------------
    refused (400/401/403/404/413/422)    400 invalid_request, fixed phrase   nothing
      (BYOK key, 401/403)                400 byok_credential_rejected        nothing
    429                                  429 rate_limited, Retry-After 30    nothing
    5xx, unreachable, nothing produced   503 service_unavailable             input share
    dropped mid-stream, other status,    503 service_unavailable             full estimate
      unreadable 200 answer
    its timeout_s passed, request sent   504 request_timeout                 full estimate
    any of the above with usage          (same answer)                       real cost

The provider's explanation is cleaned before it reaches the client: no URL, key or
header of the upstream is echoed. Two layers: the provider removes every credential this
server holds (:func:`redact_secrets`, exact values, as soon as the upstream's text is
read), and :func:`clean_explanation` removes whatever looks like a key of a known shape,
a URL or an auth header.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from gateway.calls.settlement import Ending
from gateway.errors import GatewayError
from gateway.providers import base

REFUSED_PHRASE = "The provider refused the request: "
PROVIDER_RETRY_AFTER = 30
_MAX_EXPLANATION = 300
#: a secret shorter than this is not searched for: it would erase ordinary words
MIN_SECRET = 8
REDACTED = "[key]"
#: key shapes of the providers and services an upstream may echo (first match wins)
_KEY_SHAPES = "|".join(
    (
        # OpenAI (sk-, sk-proj-, masked sk-...****), Anthropic (sk-ant-), ours, restricted
        r"\b(?:sk|rk|pk|svc_live|svc_test|key)[-_][A-Za-z0-9_\-*]{8,}",
        r"\bAIza[0-9A-Za-z_\-]{20,}",  # Google
        # Groq, Hugging Face, Replicate, xAI, GitHub, GitLab, Perplexity, Fireworks, NVIDIA
        r"\b(?:gsk|hf|r8|xai|gh[pousr]|github_pat|glpat|pplx|fw|nvapi)[-_][A-Za-z0-9_\-]{8,}",
        r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
        r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]*",  # JWTs
        r"\b[0-9a-fA-F]{32,}\b",  # Azure OpenAI and other hex keys
        # any other long token of letters and digits (Mistral, Cohere, Together, ...)
        r"\b(?=[A-Za-z0-9]*[0-9])(?=[A-Za-z0-9]*[A-Za-z])[A-Za-z0-9]{32,}\b",
    )
)
_SCRUB = (
    (re.compile(r"https?://\S+"), "[url]"),
    (re.compile(r"(?i)bearer\s+\S+"), "Bearer " + REDACTED),
    (re.compile(r"(?i)(authorization|x-api-key|api-key)\s*[:=]\s*\S+"), r"\1: [redacted]"),
    (re.compile(_KEY_SHAPES), REDACTED),
)


def redact_secrets(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each secret (exact value, longest first, so a
    secret that contains another goes whole) replaced by ``[key]``."""
    for secret in sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def clean_explanation(text: str) -> str:
    for pattern, replacement in _SCRUB:
        text = pattern.sub(replacement, text)
    text = " ".join(text.split())
    if len(text) > _MAX_EXPLANATION:
        text = text[: _MAX_EXPLANATION - 1] + "…"
    return text or "no explanation given"


#: the provider statuses of an overloaded upstream (Anthropic's 529)
OVERLOADED = frozenset({529})


def retry_reason(exc: base.ProviderError, *, byok: bool) -> str | None:
    """Why a failure before the first byte may be tried on another deployment, or None
    when it may not (docs/decisions/routing.md): a refusal as written (400, 404, 413,
    422) would be refused again, a BYOK credential is the organisation's own, an answer
    that came (unreadable) or a stream cut after output did work."""
    if isinstance(exc, base.ProviderUnreachable):
        return "connect"
    if isinstance(exc, base.ProviderTimedOut):
        return "first_byte_timeout"
    if isinstance(exc, base.ProviderRateLimited):
        return "rate_limited"
    if isinstance(exc, base.ProviderServerError) and exc.status >= 500:
        return "overloaded" if exc.status in OVERLOADED else "server_error"
    if isinstance(exc, base.ProviderRefused) and exc.status in (401, 403) and not byok:
        return "credential"
    return None


def map_provider_error(exc: base.ProviderError, *, byok: bool) -> tuple[GatewayError, Ending]:
    """The answer and the settlement row of a provider failure that reported no usage
    (:func:`gateway.calls.settlement.ending_for` decides when it did)."""
    if isinstance(exc, base.ProviderRefused):
        if byok and exc.status in (401, 403):
            return GatewayError("byok_credential_rejected"), Ending.PROVIDER_REFUSED
        message = REFUSED_PHRASE + clean_explanation(exc.message)
        return GatewayError("invalid_request", message), Ending.PROVIDER_REFUSED
    if isinstance(exc, base.ProviderRateLimited):
        error = GatewayError(
            "rate_limited",
            "The model's provider is limiting this model; retry later.",
            retry_after=PROVIDER_RETRY_AFTER,
        )
        return error, Ending.PROVIDER_REFUSED
    unreachable = GatewayError("service_unavailable", "The model's provider could not be reached.")
    if isinstance(exc, base.ProviderUnreachable):
        return unreachable, Ending.SERVER_ERROR
    if isinstance(exc, base.ProviderServerError):
        failed = GatewayError("service_unavailable", "The model's provider failed.")
        return failed, Ending.SERVER_ERROR if exc.status >= 500 else Ending.FULL_RESERVATION
    if isinstance(exc, base.ProviderTimedOut):
        late = GatewayError("request_timeout", "The model's provider did not answer in time.")
        return late, Ending.FULL_RESERVATION
    if isinstance(exc, base.ProviderMalformed):
        unreadable = GatewayError("service_unavailable", "The provider's answer was unreadable.")
        return unreadable, Ending.FULL_RESERVATION
    if isinstance(exc, base.ProviderDropped):
        return GatewayError("service_unavailable", "The model's provider dropped the call."), (
            Ending.FULL_RESERVATION
        )
    return unreachable, Ending.FULL_RESERVATION
