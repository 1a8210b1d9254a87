"""Tags: string maps that attribute model calls (never grant access).

Sources on a model call, later ones winning: the key's default_tags, then the
``X-Svc-Tags`` header (``k=v,k2=v2``, values percent-encoded), ``metadata`` and
``svc_tags`` in the body. At most 16 tags per call, keys ``^[A-Za-z0-9_.:-]{1,64}$``,
values strings of at most 200 characters without control characters (C0, DEL, C1,
U+2028, U+2029): a tag is written into records, exports and logs as it came, and a line
break or escape code there could forge a line or a field for whoever reads them.
"""

from __future__ import annotations

import re
from typing import Any

from gateway.errors import GatewayError

TAG_KEY = re.compile(r"[A-Za-z0-9_.:-]{1,64}")  # fullmatch: "$" would allow a final newline
MAX_TAGS = 16
MAX_VALUE = 200
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def check_tag_map(value: Any, param: str, code: str = "invalid_request") -> dict[str, str]:
    """Validate one map of tags; None is an empty map."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise GatewayError(code, f"{param} must be an object of strings.", param=param)
    for key, item in value.items():
        if not TAG_KEY.fullmatch(key):
            raise GatewayError(code, f"Tag key {key!r} is malformed.", param=param)
        if not isinstance(item, str):
            raise GatewayError(code, f"Tag {key!r} must have a string value.", param=param)
        if len(item) > MAX_VALUE:
            raise GatewayError(
                code, f"Tag {key!r} is longer than {MAX_VALUE} characters.", param=param
            )
        if CONTROL.search(item):
            raise GatewayError(
                code, f"Tag {key!r} holds a control character or line break.", param=param
            )
    if len(value) > MAX_TAGS:
        raise GatewayError(code, f"At most {MAX_TAGS} tags are allowed.", param=param)
    return dict(value)
