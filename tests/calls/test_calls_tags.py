"""Tags of a model call: header, metadata, svc_tags, key defaults, required tags."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.calls.parse.tags import collect_tags
from gateway.errors import GatewayError


def tags(header: str | None = None, body: Any = None, defaults: dict[str, str] | None = None,
         required: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    return collect_tags(header, body if body is not None else {}, defaults or {}, required or {})


def refused(**kwargs: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        tags(**kwargs)
    return caught.value


SIXTEEN = {f"k{i}": "v" for i in range(16)}

# (case, kwargs, code, param): the invalid_tags and missing_tags rows.
REFUSALS: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("header pair without =", {"header": "team"}, "invalid_tags", "X-Svc-Tags"),
    ("header bad key", {"header": "te am=x"}, "invalid_tags", "X-Svc-Tags"),
    ("header empty key", {"header": "=x"}, "invalid_tags", "X-Svc-Tags"),
    ("header value not UTF-8", {"header": "team=%ff"}, "invalid_tags", "X-Svc-Tags"),
    ("header value over 200", {"header": "team=" + "x" * 201}, "invalid_tags", "X-Svc-Tags"),
    ("header 17 tags", {"header": ",".join(f"k{i}=v" for i in range(17))},
     "invalid_tags", "X-Svc-Tags"),
    ("metadata not an object", {"body": {"metadata": ["a"]}}, "invalid_tags", "metadata"),
    ("metadata a string", {"body": {"metadata": "team=a"}}, "invalid_tags", "metadata"),
    ("metadata value not a string", {"body": {"metadata": {"n": 1}}}, "invalid_tags", "metadata"),
    ("metadata bad key", {"body": {"metadata": {"a b": "x"}}}, "invalid_tags", "metadata"),
    ("metadata key over 64", {"body": {"metadata": {"k" * 65: "x"}}}, "invalid_tags", "metadata"),
    ("metadata key ending in a newline", {"body": {"metadata": {"k\n": "x"}}},
     "invalid_tags", "metadata"),
    ("metadata value over 200", {"body": {"metadata": {"a": "x" * 201}}},
     "invalid_tags", "metadata"),
    ("header value with CR LF", {"header": "t=a%0D%0AX-Injected:%201"},
     "invalid_tags", "X-Svc-Tags"),
    ("header value with NUL", {"header": "t=a%00"}, "invalid_tags", "X-Svc-Tags"),
    ("metadata value with a C1 control", {"body": {"metadata": {"t": "a\x85b"}}},
     "invalid_tags", "metadata"),
    ("metadata value with DEL", {"body": {"metadata": {"t": "a\x7f"}}},
     "invalid_tags", "metadata"),
    ("svc_tags value with U+2028", {"body": {"svc_tags": {"t": "a\u2028b"}}},
     "invalid_tags", "svc_tags"),
    ("svc_tags value with U+2029", {"body": {"svc_tags": {"t": "a\u2029b"}}},
     "invalid_tags", "svc_tags"),
    ("svc_tags value with ESC", {"body": {"svc_tags": {"t": "\x1b[31m"}}},
     "invalid_tags", "svc_tags"),
    ("svc_tags key with a tab", {"body": {"svc_tags": {"t\t": "a"}}}, "invalid_tags", "svc_tags"),
    ("svc_tags not an object", {"body": {"svc_tags": 3}}, "invalid_tags", "svc_tags"),
    ("svc_tags value null", {"body": {"svc_tags": {"a": None}}}, "invalid_tags", "svc_tags"),
    ("17 across sources", {"header": "x=1", "body": {"svc_tags": SIXTEEN}},
     "invalid_tags", "svc_tags"),
    ("required tag absent", {"required": {"project": ""}}, "missing_tags", None),
    ("required tag with another value", {"header": "env=dev", "required": {"env": "prod"}},
     "missing_tags", None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "code", "param"),
    [row[1:] for row in REFUSALS],
    ids=[row[0] for row in REFUSALS],
)
def test_refusals(kwargs: dict[str, Any], code: str, param: str | None) -> None:
    error = refused(**kwargs)
    assert (error.code, error.param, error.status) == (code, param, 400)


def test_printable_unicode_is_a_tag_value() -> None:
    assert tags(body={"svc_tags": {"t": "é 日本 \u00a0 ✓"}}) == {"t": "é 日本 \u00a0 ✓"}


def test_header_parsing() -> None:
    assert tags(header="team=a%2Cb, env = prod%20eu,,") == {"team": "a,b", "env": "prod eu"}
    assert tags(header="") == {}
    assert tags(header="note=a=b") == {"note": "a=b"}
    assert tags(header="empty=") == {"empty": ""}


def test_merge_order_caller_wins() -> None:
    merged = tags(
        header="a=header,b=header,c=header",
        body={"metadata": {"b": "metadata", "c": "metadata"}, "svc_tags": {"c": "svc"}},
        defaults={"a": "default", "d": "default"},
    )
    assert merged == {"a": "header", "b": "metadata", "c": "svc", "d": "default"}


def test_sixteen_caller_tags_plus_defaults_are_accepted() -> None:
    merged = tags(body={"svc_tags": SIXTEEN}, defaults={"team": "a", "env": "b"})
    assert len(merged) == 18


def test_overlapping_sources_count_once() -> None:
    header = ",".join(f"k{i}=h" for i in range(16))
    assert tags(header=header, body={"metadata": SIXTEEN})["k0"] == "v"


def test_missing_tags_message_lists_them() -> None:
    error = refused(required={"project": "", "env": "prod", "team": ""}, header="team=a")
    assert error.message is not None
    assert "project" in error.message and "env=prod" in error.message
    assert "team" not in error.message


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"header": "project=x", "required": {"project": ""}}, {"project": "x"}),
        ({"body": {"metadata": {"env": "prod"}}, "required": {"env": "prod"}}, {"env": "prod"}),
        ({"defaults": {"project": "p"}, "required": {"project": ""}}, {"project": "p"}),
    ],
)
def test_required_tags_satisfied(kwargs: dict[str, Any], expected: dict[str, str]) -> None:
    assert tags(**kwargs) == expected


def test_body_not_an_object_has_no_tags() -> None:
    assert collect_tags("a=1", ["not", "an", "object"], {}, {}) == {"a": "1"}


def test_null_sources_are_empty() -> None:
    assert tags(header=None, body={"metadata": None, "svc_tags": None}) == {}
