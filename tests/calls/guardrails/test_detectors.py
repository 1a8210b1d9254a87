"""The detectors and the stream window as pure functions of text (no server): a table of
what each entity looks like and what it must not match, and Hypothesis properties of
the window (however an answer is cut into chunks, the client gets the text redacted as
if it had come whole; a deny leaves no byte of the match)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.calls.guardrails.detectors import (
    PII_HOLD,
    find_patterns,
    find_pii,
    find_secrets,
    iban_ok,
    luhn_ok,
    redact,
)
from gateway.calls.guardrails.rules import Guardrail
from gateway.calls.guardrails.window import Denied, StreamWindow
from gateway.config.guardrails import ENTITIES, GuardrailConfig

pytestmark = pytest.mark.quick

FOUND = [
    ("email", "write to jane.doe+x@mail.example.co.uk today"),
    ("phone", "call +1 415-555-2671 now"),
    ("phone", "or (415) 555-2671"),
    ("phone", "London +44 20 7946 0958"),
    ("credit_card", "card 4111 1111 1111 1111."),
    ("credit_card", "card 5500-0000-0000-0004"),
    ("credit_card", "card 378282246310005"),
    ("iban", "IBAN GB82 WEST 1234 5698 7654 32"),
    ("iban", "DE89370400440532013000"),
    ("us_ssn", "ssn 123-45-6789"),
    ("ip_address", "host 192.168.0.1."),
    ("ip_address", "v6 2001:db8::8a2e:370:7334 here"),
]
NOT_FOUND = [
    ("credit_card", "order 4111 1111 1111 1112 (Luhn fails)"),
    ("iban", "GB82 WEST 1234 5698 7654 33"),
    ("us_ssn", "ssn 000-12-3456, 666-12-3456, 123456789"),
    ("ip_address", "version 1.2.3.4.5 and time 12:30:45 and 999.1.1.1"),
    ("email", "no at sign: jane.example.com"),
    ("phone", "a year 2026 and a count of 1234"),
]
SECRETS = [
    ("openai_key", "sk-proj-" + "aB3dE5fG7h" * 4),
    ("anthropic_key", "sk-ant-api03-" + "aB3dE5fG7h" * 3),
    ("aws_access_key", "AKIAIOSFODNN7EXAMPLE"),
    ("github_token", "ghp_" + "a1B2c3D4e5" * 4),
    ("slack_token", "xoxb-1234567890-abcdefghij"),
    ("stripe_key", "sk_live_" + "a1B2c3D4e5" * 2),
    ("google_api_key", "AIza" + "a1B2c3D4e5f6G7h8i9J0k1L2m3N4o5P6q7R"),
    ("svc_token", "svc_live_abcdef123456_" + "A1b2C3d4E5" * 3 + "xy"),
    ("private_key", "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nAbC=\n-----END RSA PRIVATE KEY-----"),
]


@pytest.mark.parametrize(("entity", "text"), FOUND)
def test_each_entity_is_found(entity: str, text: str) -> None:
    assert [m.entity for m in find_pii(text, ENTITIES)] == [entity]


@pytest.mark.parametrize(("entity", "text"), NOT_FOUND)
def test_look_alikes_are_not_found(entity: str, text: str) -> None:
    assert [m for m in find_pii(text, ENTITIES) if m.entity == entity] == []


@pytest.mark.parametrize(("entity", "secret"), SECRETS)
def test_each_secret_shape_is_found_whole(entity: str, secret: str) -> None:
    text = f"here: {secret} thanks"
    assert redact(text, find_secrets(text)) == f"here: [REDACTED:{entity}] thanks"


def test_prose_holds_no_secret() -> None:
    prose = "The skeleton key (sk) is ask-based; AKIA is a prefix; ghp_ too short."
    assert find_secrets(prose) == []


def test_checksums() -> None:
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    assert iban_ok("GB82WEST12345698765432") and not iban_ok("GB82WEST12345698765433")


def test_a_catastrophic_pattern_takes_linear_time() -> None:
    """RE2: ``(a+)+b`` over 100 k ``a`` (backtracking engines take forever)."""
    pattern = GuardrailConfig("evil", "regex", patterns=("(a+)+b",))
    rule = Guardrail.build(pattern)
    started = time.perf_counter()
    assert rule.detect is not None and rule.detect("a" * 100_000) == []
    assert time.perf_counter() - started < 1.0
    assert find_patterns("xx ACME-1234", [__import__("re2").compile("ACME-[0-9]+")], "n")


# -- the stream window

PII = Guardrail.build(GuardrailConfig("pii", "pii", action="redact"))
SECRETS_DENY = Guardrail.build(GuardrailConfig("s", "secrets", action="deny"))
ENTITY_TEXTS = [
    "jane.doe+x@mail.example.co.uk",
    "4111 1111 1111 1111",
    "5500-0000-0000-0004",
    "GB82 WEST 1234 5698 7654 32",
    "123-45-6789",
    "192.168.0.1",
    "2001:db8::8a2e:370:7334",
    "+1 415-555-2671",
]
WORDS = ["hello", "the", "order", "is", "ready,", "thanks", "a", "42", "x@", "-", "\n"]
#: words and entities, a word between two of them (numbers written back to back are one
#: run of digits, read differently whole and in pieces: PHONE_TRIES bounds the parses)
texts = st.lists(st.sampled_from(WORDS + ENTITY_TEXTS), min_size=1, max_size=30).map(" so ".join)


def pieces(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@settings(max_examples=300, deadline=None)
@given(text=texts, cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_a_stream_is_redacted_as_the_whole_text(text: str, cuts: list[int]) -> None:
    window = StreamWindow([PII])
    out = "".join(window.feed(piece) for piece in pieces(text, cuts)) + window.flush()
    assert out == redact(text, find_pii(text, ENTITIES))


@settings(max_examples=300, deadline=None)
@given(
    before=texts,
    after=texts,
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    secret=st.sampled_from([s for _, s in SECRETS]),
)
def test_a_deny_leaves_no_byte_of_the_match(
    before: str, after: str, cuts: list[int], secret: str
) -> None:
    text = f"{before} {secret} {after}"
    start = text.index(secret)
    window = StreamWindow([SECRETS_DENY])
    released = ""
    with pytest.raises(Denied):
        for piece in pieces(text, cuts):
            released += window.feed(piece)
        released += window.flush()
    assert text.startswith(released) and len(released) <= start


def test_the_window_holds_back_only_the_longest_lead() -> None:
    window = StreamWindow([PII])
    assert window.hold == max(PII_HOLD.values())
    long = "word " * 40
    assert len(window.feed(long)) == len(long) - window.hold
