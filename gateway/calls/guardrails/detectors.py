"""The detectors: pure functions of a text to the spans it matches (no model, no download).

- ``pii``: email, phone (``phonenumbers.PhoneNumberMatcher``, numbers it deems valid),
  credit_card (13-19 digits, spaces or dashes between, the Luhn check), iban (country,
  check digits and 11-30 characters, the mod-97 check), us_ssn (``AAA-GG-SSSS`` with the
  dashes, the never-issued areas excluded), ip_address (IPv4, IPv6 as :mod:`ipaddress`
  reads it).
- ``secrets``: the token shapes of common providers (OpenAI, Anthropic, AWS access keys,
  GitHub, GitLab, Slack, Stripe, Google API keys), private key blocks, and this gateway's
  own ``svc_live_``/``svc_test_`` tokens.
- ``regex``: the operator's patterns, compiled by RE2 (linear time: no pattern stalls a
  check, whatever the text).

Each detector also says how many characters a stream must hold back (``hold``) so that no
match can start in text already sent: the longest text before a match becomes visible.
A match still growing at the end of the text is kept by the stream window
(:mod:`gateway.calls.guardrails.window`) until it stops growing.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import phonenumbers
import re2  # type: ignore[import-untyped]

#: the region phone numbers without a country code are read in
PHONE_REGION = "US"


@dataclass(frozen=True, slots=True)
class Match:
    """A span of a text a detector found: ``text[start:end]`` is an ``entity``."""

    start: int
    end: int
    entity: str


Detector = Callable[[str], list[Match]]

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*\.[A-Za-z]{2,24}"
)
#: a run of digits and what numbers are written with: the candidates of every entity
#: made of digits (card, phone, SSN, IPv4), found in one pass (a pass per entity over
#: the whole text cost several times as much)
_RUN = re.compile(r"\d[\d ().+/-]*")
_IBAN_START = re.compile(r"[A-Z]{2}\d{2}")
#: an IBAN printed in groups of four (the last shorter), or without spaces
_IBAN = re.compile(
    r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?:(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,4})?|[A-Z0-9]{11,30})"
    r"(?![A-Za-z0-9])"
)
_DIGITS = re.compile(r"\d+")
_CARD = re.compile(r"\d(?:[ -]?\d){12,}")
_SSN = re.compile(r"(?<![\d-])(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?![\d-])")
_IPV4 = re.compile(
    r"(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\.?\d)"
)
_IPV6 = re.compile(r"[0-9A-Fa-f]*:[0-9A-Fa-f]*:[0-9A-Fa-f:]*")
#: a group of a number as written: digits, with an opening ``+`` or brackets around
_GROUP = re.compile(r"[+(]?\d+\)?")
#: the most numbers a run of digits is parsed as, looking for phones
PHONE_TRIES = 12
_HEX = frozenset("0123456789abcdefABCDEF:")
#: digit runs that are not phone numbers: dates, versions and addresses
_NOT_PHONE = re.compile(r"\d{4}[-/.]\d{1,2}[-/.]\d{1,2}|\d+\.\d+\.\d+")


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum of a card number (digits only)."""
    total = 0
    for i, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if i % 2:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def iban_ok(iban: str) -> bool:
    """The ISO 13616 check of an IBAN (no spaces): mod 97 of the rearranged number is 1."""
    moved = iban[4:] + iban[:4]
    return int("".join(str(int(char, 36)) for char in moved)) % 97 == 1


Run = tuple[int, str]  # where a digit run starts, and the run (trailing separators cut)


def digit_runs(text: str) -> list[Run]:
    """The runs of :data:`_RUN` at least 7 characters long holding at least 4 digits (an
    IPv4 address ``1.2.3.4``; each entity counts its own), a leading ``+`` or ``(``
    included."""
    runs = []
    for found in _RUN.finditer(text):
        run = found.group().rstrip(" ().+/-")
        if len(run) < 7 or sum(c.isdigit() for c in run) < 4:
            continue
        start = found.start()
        if start and text[start - 1] in "+(":
            start, run = start - 1, text[start - 1] + run
        runs.append((start, run))
    return runs


def _emails(text: str, runs: list[Run]) -> Iterable[Match]:
    if "@" not in text:
        return
    for found in _EMAIL.finditer(text):
        yield Match(found.start(), found.end(), "email")


def _cards(text: str, runs: list[Run]) -> Iterable[Match]:
    """In each run, the longest spans of whole digit groups holding 13 to 19 digits that
    pass Luhn (two cards written one after the other are two; a card after other
    numbers is found)."""
    for at, run in runs:
        for found in _CARD.finditer(run):
            yield from _card_spans(at + found.start(), found.group())


def _card_spans(base: int, run: str) -> Iterable[Match]:
    groups = [(g.start(), g.end(), g.group()) for g in _DIGITS.finditer(run)]
    i = 0
    while i < len(groups):
        spans, digits = [], ""
        for j in range(i, len(groups)):
            digits += groups[j][2]
            if len(digits) > 19:
                break
            if len(digits) >= 13:
                spans.append((j, digits))
        for j, candidate in reversed(spans):
            if luhn_ok(candidate):
                yield Match(base + groups[i][0], base + groups[j][1], "credit_card")
                i = j + 1
                break
        else:
            i += 1


def _ibans(text: str, runs: list[Run]) -> Iterable[Match]:
    if _IBAN_START.search(text) is None:
        return
    for found in _IBAN.finditer(text):
        if iban_ok(found.group().replace(" ", "")):
            yield Match(found.start(), found.end(), "iban")


def _ssns(text: str, runs: list[Run]) -> Iterable[Match]:
    for at, run in runs:
        for found in _SSN.finditer(run):
            yield Match(at + found.start(), at + found.end(), "us_ssn")


def _ips(text: str, runs: list[Run]) -> Iterable[Match]:
    for at, run in runs:
        for found in _IPV4.finditer(run):
            yield Match(at + found.start(), at + found.end(), "ip_address")
    if text.count(":") < 2:
        return
    for found in _IPV6.finditer(text):
        start, end = found.start(), found.end()
        if (start and text[start - 1] in _HEX) or (end < len(text) and text[end] in _HEX):
            continue
        try:
            ipaddress.IPv6Address(found.group())
        except ValueError:
            continue
        yield Match(start, end, "ip_address")


def _phones(text: str, runs: list[Run]) -> Iterable[Match]:
    """Spans of whole digit groups of a run (a ``+`` starts a new one) holding 7 to 15
    digits, not a date, a version or an address, that ``phonenumbers`` reads as a
    valid number (without a country code: of the US); the longest from each group on,
    at most :data:`PHONE_TRIES` parses a run (a table of numbers stays cheap)."""
    for at, run in runs:
        groups = [g.span() for g in _GROUP.finditer(run)]
        tries, i = 0, 0
        while i < len(groups) and tries < PHONE_TRIES:
            ends = []
            digits = 0
            for j in range(i, len(groups)):
                if j > i and run[groups[j][0]] == "+":
                    break
                digits += sum(c.isdigit() for c in run[groups[j][0] : groups[j][1]])
                if digits > 15:
                    break
                if digits >= 7:
                    ends.append(j)
            found = None
            for j in reversed(ends):
                candidate = run[groups[i][0] : groups[j][1]]
                if _NOT_PHONE.search(candidate):
                    continue
                tries += 1
                if _valid_phone(candidate):
                    found = j
                    break
            if found is None:
                i += 1
                continue
            yield Match(at + groups[i][0], at + groups[found][1], "phone")
            i = found + 1


def _valid_phone(candidate: str) -> bool:
    try:
        number = phonenumbers.parse(candidate, PHONE_REGION)
    except phonenumbers.NumberParseException:
        return False
    return bool(phonenumbers.is_valid_number(number))


_PII: dict[str, Callable[[str, list[Run]], Iterable[Match]]] = {
    "email": _emails,
    "phone": _phones,
    "credit_card": _cards,
    "iban": _ibans,
    "us_ssn": _ssns,
    "ip_address": _ips,
}
#: the longest text of each entity before it is seen as one (an email's local part
#: comes before its ``@``; a card's 19 digits and 18 separators; an IBAN's 34
#: characters and 8 spaces; an IPv6 address)
PII_HOLD = {
    "email": 72,
    "phone": 32,
    "credit_card": 40,
    "iban": 44,
    "us_ssn": 12,
    "ip_address": 48,
}

#: (entity, pattern): the token shapes, most specific first
_SECRET_SHAPES = (
    ("svc_token", r"svc_(?:live|test)_[a-z0-9]{12}_[A-Za-z0-9]{32}"),
    ("anthropic_key", r"sk-ant-[A-Za-z0-9]{2,8}\d{2}-[A-Za-z0-9_-]{20,}"),
    ("openai_key", r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
    ("aws_access_key", r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Z0-9])"),
    ("github_token", r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})"),
    ("gitlab_token", r"glpat-[A-Za-z0-9_-]{20,}"),
    ("slack_token", r"xox[abposr]-[A-Za-z0-9-]{10,}"),
    ("stripe_key", r"(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}"),
    ("google_api_key", r"AIza[0-9A-Za-z_-]{35}"),
    (
        "private_key",
        # the header, the base64 body (no spaces: prose after it stops the match), the
        # end line when it came
        r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
        r"(?:[A-Za-z0-9+/=\r\n]|Proc-Type:[^\n]*|DEK-Info:[^\n]*)*"
        r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
    ),
)
_SECRETS = re.compile("|".join(f"(?P<{entity}>{pattern})" for entity, pattern in _SECRET_SHAPES))
#: what every shape of :data:`_SECRET_SHAPES` starts with
_SECRET_PREFIXES = (
    *("svc_live_", "svc_test_", "sk-", "sk_live_", "sk_test_", "rk_live_", "rk_test_"),
    *("AKIA", "ASIA", "ABIA", "ACCA", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    *("glpat-", "xoxa-", "xoxb-", "xoxp-", "xoxo-", "xoxs-", "xoxr-", "AIza", "-----BEGIN"),
)
#: the longest prefix before a token's shape is seen (a svc token is seen whole: 54)
SECRETS_HOLD = 64


def find_pii(text: str, entities: Sequence[str]) -> list[Match]:
    """The spans of ``entities`` in ``text``, without overlaps."""
    runs = digit_runs(text)
    return _disjoint(match for entity in entities for match in _PII[entity](text, runs))


def pii_hold(entities: Sequence[str]) -> int:
    return max(PII_HOLD[entity] for entity in entities)


def find_secrets(text: str) -> list[Match]:
    """The secrets in ``text`` (named by their shape: ``openai_key``, ``private_key``...);
    the shapes' pattern runs only when one of their prefixes is there (a substring test
    per prefix is a fraction of one pass of the pattern)."""
    if not any(prefix in text for prefix in _SECRET_PREFIXES):
        return []
    return [
        Match(found.start(), found.end(), str(found.lastgroup)) for found in _SECRETS.finditer(text)
    ]


def compile_patterns(patterns: Sequence[str]) -> list[object]:
    """The operator's patterns, compiled by RE2 (checked at start: they compile)."""
    return [re2.compile(pattern) for pattern in patterns]


def find_patterns(text: str, compiled: Sequence[object], entity: str) -> list[Match]:
    """The spans of the operator's patterns, named ``entity`` (the guardrail's name)."""
    found: list[Match] = []
    for pattern in compiled:
        for hit in pattern.finditer(text):  # type: ignore[attr-defined]
            if hit.end() > hit.start():
                found.append(Match(hit.start(), hit.end(), entity))
    return _disjoint(found)


#: the hold of an operator's pattern: its longest match when bounded, else this
PATTERN_HOLD = 256


def pattern_hold(patterns: Sequence[str]) -> int:
    """The longest match of the patterns, as Python's parser bounds it (RE2's syntax is
    close enough for a bound); :data:`PATTERN_HOLD` when unbounded or unknown."""
    longest = 0
    for pattern in patterns:
        try:
            width = re._parser.parse(pattern).getwidth()[1]  # type: ignore[attr-defined]
        except Exception:  # a pattern Python's parser does not read: RE2 syntax
            return PATTERN_HOLD
        longest = max(longest, min(int(width), PATTERN_HOLD))
    return longest + 1


def _disjoint(matches: Iterable[Match]) -> list[Match]:
    """Matches in text order, the first (longest at a start) kept where two overlap."""
    kept: list[Match] = []
    for match in sorted(matches, key=lambda m: (m.start, -m.end)):
        if kept and match.start < kept[-1].end:
            if match.end > kept[-1].end:
                kept[-1] = Match(kept[-1].start, match.end, kept[-1].entity)
            continue
        kept.append(match)
    return kept


def redact(text: str, matches: Sequence[Match]) -> str:
    """``text`` with each match replaced by ``[REDACTED:<entity>]`` (matches disjoint, in order)."""
    if not matches:
        return text
    parts: list[str] = []
    at = 0
    for match in matches:
        parts += (text[at : match.start], f"[REDACTED:{match.entity}]")
        at = match.end
    parts.append(text[at:])
    return "".join(parts)
