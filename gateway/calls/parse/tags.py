"""Step 4 of a model call: the call's tags, and the key's required tags.

1. Read the caller's three sources, each checked on its own (invalid_tags, param naming
   the source): the ``X-Svc-Tags`` header (``k=v,k2=v2``, values percent-encoded; empty
   segments are skipped, a segment without ``=`` is malformed), then the body's
   ``metadata``, then its ``svc_tags``. A later source wins on a shared key.
2. The caller's merged tags hold at most 16 keys (invalid_tags, param the source that
   went over). The key's default tags do not count: the caller does not choose them.
3. Merge: the key's default tags first, the caller's on top (the caller wins).
4. Required tags, checked on the merged map, so a default tag can satisfy one. A required
   tag with an empty value accepts any value; with a value, the tag must carry exactly
   that value. Absent or different: missing_tags, param null (the tags may come from
   three places, no one field is at fault), the message listing every missing tag.

Runs before body validation, so a body that is not an object has no body tags here.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from gateway.accounts.tag_rules import MAX_TAGS, check_tag_map
from gateway.errors import GatewayError

HEADER = "X-Svc-Tags"


def collect_tags(
    header: str | None,
    body: Any,
    key_default_tags: dict[str, str],
    key_required_tags: dict[str, str],
) -> dict[str, str]:
    """The call's tags (defaults merged), or invalid_tags / missing_tags."""
    fields = body if isinstance(body, dict) else {}
    sources = (
        (HEADER, parse_header(header)),
        ("metadata", check_tag_map(fields.get("metadata"), "metadata", code="invalid_tags")),
        ("svc_tags", check_tag_map(fields.get("svc_tags"), "svc_tags", code="invalid_tags")),
    )
    sent: dict[str, str] = {}
    for param, tags in sources:
        sent.update(tags)
        if len(sent) > MAX_TAGS:
            raise GatewayError(
                "invalid_tags", f"At most {MAX_TAGS} tags are allowed per call.", param=param
            )
    merged = {**key_default_tags, **sent}
    missing = [
        f"{key}={expected}" if expected else key
        for key, expected in key_required_tags.items()
        if key not in merged or (expected and merged[key] != expected)
    ]
    if missing:
        raise GatewayError("missing_tags", f"Required tags are missing: {', '.join(missing)}.")
    return merged


def parse_header(header: str | None) -> dict[str, str]:
    """``k=v,k2=v2`` with percent-encoded values; keys and values checked as every tag."""
    tags: dict[str, str] = {}
    for segment in (header or "").split(","):
        if not segment.strip():
            continue
        key, sep, value = segment.partition("=")
        if not sep:
            raise GatewayError(
                "invalid_tags", f"{HEADER} holds {segment!r}: not k=v.", param=HEADER
            )
        try:
            tags[key.strip()] = unquote(value.strip(), errors="strict")
        except UnicodeDecodeError:
            raise GatewayError(
                "invalid_tags", f"{HEADER} value of {key.strip()!r} is not UTF-8.", param=HEADER
            ) from None
    return check_tag_map(tags, HEADER, code="invalid_tags")
