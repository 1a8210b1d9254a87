"""The guardrails of a call, and what they decide of a list of texts.

    config (GuardrailConfig) ──► Guardrail (its detector compiled)
    a call: the organisation's names + the key's + its ancestors' ──► Guardrails.of(...)
    texts ──► check(...) ──► Checked: the texts to send on, the verdicts, the deny if any

A verdict names the guardrail, the direction and what it did (``allow``, ``deny``,
``redact``, ``flag``) and never the text it matched. A webhook guardrail's texts go to
the operator's service through an injected :data:`AskWebhook` (this package knows no
HTTP); a webhook that cannot decide follows its ``on_error``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from gateway.calls.guardrails.detectors import (
    SECRETS_HOLD,
    Detector,
    compile_patterns,
    find_patterns,
    find_pii,
    find_secrets,
    pattern_hold,
    pii_hold,
    redact,
)
from gateway.config.guardrails import GuardrailConfig
from gateway.errors import GatewayError
from gateway.providers.guardrail_webhook import WebhookFailed

#: posts ``{"guardrail","direction","texts"}`` to a webhook guardrail's URL within its
#: timeout; its JSON answer, or an exception when it could not decide
AskWebhook = Callable[[GuardrailConfig, dict[str, Any]], Awaitable[dict[str, Any]]]
#: counts a verdict: guardrail, direction, verdict
CountVerdict = Callable[[str, str, str], None]


@dataclass(frozen=True, slots=True)
class Guardrail:
    """One guardrail, ready to check: its config and its detector (None: a webhook)."""

    config: GuardrailConfig
    detect: Detector | None
    #: what a stream holds back for it (a webhook: everything, see the window)
    hold: int

    @classmethod
    def build(cls, config: GuardrailConfig) -> Guardrail:
        if config.kind == "pii":
            return cls(
                config, partial(find_pii, entities=config.entities), pii_hold(config.entities)
            )
        if config.kind == "secrets":
            return cls(config, find_secrets, SECRETS_HOLD)
        if config.kind == "regex":
            compiled = compile_patterns(config.patterns)
            detect = partial(find_patterns, compiled=compiled, entity=config.name)
            return cls(config, detect, pattern_hold(config.patterns))
        return cls(config, None, 0)

    @property
    def name(self) -> str:
        return self.config.name


@dataclass(frozen=True, slots=True)
class Verdict:
    guardrail: str
    direction: str
    verdict: str  # allow | deny | redact | flag

    def row(self) -> dict[str, str]:
        """As the request record lists it."""
        return {"name": self.guardrail, "direction": self.direction, "verdict": self.verdict}


@dataclass(slots=True)
class Checked:
    """What the guardrails of one direction decided of a list of texts."""

    texts: list[str]
    verdicts: list[Verdict] = field(default_factory=list)
    #: the guardrail that denied, if one did
    denied: str | None = None


def blocked(name: str, direction: str) -> GatewayError:
    """The ``400 content_blocked`` of a deny, naming the guardrail (not what it matched)."""
    where = "request" if direction == "input" else "answer"
    return GatewayError(
        "content_blocked",
        f"The {where} was blocked by the guardrail {name!r}; remove the content it"
        " guards against, or ask your administrator.",
        svc={"policy": {"decisions": [{"rule": "guardrail", "name": name, "verdict": "deny"}]}},
    )


@dataclass(frozen=True, slots=True)
class Guardrails:
    """The configured guardrails by name, and how webhooks are asked and verdicts counted."""

    by_name: dict[str, Guardrail] = field(default_factory=dict)
    ask: AskWebhook | None = None
    count: CountVerdict | None = None

    @classmethod
    def build(
        cls,
        configs: Iterable[GuardrailConfig],
        ask: AskWebhook | None = None,
        count: CountVerdict | None = None,
    ) -> Guardrails:
        return cls({c.name: Guardrail.build(c) for c in configs}, ask, count)

    def check_names(self, names: Iterable[str] | None, param: str) -> None:
        """Refuse (400 invalid_request) a name no ``[[guardrails]]`` table defines."""
        unknown = [name for name in names or () if name not in self.by_name]
        if unknown:
            known = ", ".join(self.by_name) or "none are configured"
            raise GatewayError(
                "invalid_request",
                f"Unknown guardrail {unknown[0]!r}; the server's guardrails: {known}.",
                param=param,
            )

    def of(self, *name_lists: Sequence[str] | None) -> tuple[Guardrail, ...]:
        """The guardrails named by any of the lists (organisation, key, ancestors), in
        the order of the config file; a name the config lacks is skipped (refused when
        set, so only a config changed since can lack it)."""
        wanted = {name for names in name_lists for name in names or ()}
        return tuple(g for name, g in self.by_name.items() if name in wanted)

    async def check(self, rules: Sequence[Guardrail], direction: str, texts: list[str]) -> Checked:
        """Every guardrail of ``direction`` over ``texts``, in order; stops at a deny.
        Each verdict is counted (the metric)."""
        checked = await self.decide(rules, direction, texts)
        if self.count is not None:
            for verdict in checked.verdicts:
                self.count(verdict.guardrail, verdict.direction, verdict.verdict)
        return checked

    async def decide(self, rules: Sequence[Guardrail], direction: str, texts: list[str]) -> Checked:
        """:meth:`check` without counting (a stream counts its verdicts once, at its end
        or its first match, whatever number of checks it took)."""
        checked = Checked(list(texts))  # redacted in place: the caller compares
        for rule in rules:
            if not rule.config.applies(direction):
                continue
            if rule.detect is None:
                verdict = await self._webhook(rule, direction, checked)
            else:
                verdict = scan(rule, checked)
            checked.verdicts.append(Verdict(rule.name, direction, verdict))
            if verdict == "deny":
                checked.denied = rule.name
                break
        return checked

    async def _webhook(self, rule: Guardrail, direction: str, checked: Checked) -> str:
        config = rule.config
        payload = {"guardrail": config.name, "direction": direction, "texts": checked.texts}
        try:
            if self.ask is None:
                raise WebhookFailed("no webhook client")
            answer = await self.ask(config, payload)
            verdict = answer.get("verdict")
            if verdict == "redact":
                texts = answer.get("texts")
                if not isinstance(texts, list) or len(texts) != len(checked.texts):
                    raise WebhookFailed("a redact verdict without one text per text sent")
                if not all(isinstance(text, str) for text in texts):
                    raise WebhookFailed("a redact verdict with a text that is not a string")
                checked.texts = texts
            elif verdict not in ("allow", "deny"):
                raise WebhookFailed("no verdict")
        except WebhookFailed:
            return "deny" if config.on_error == "deny" else "allow"
        return str(verdict)


def scan(rule: Guardrail, checked: Checked) -> str:
    """A detector guardrail over the texts: its verdict, the texts redacted in place when
    it redacts."""
    assert rule.detect is not None
    action = rule.config.action
    hit = False
    for i, text in enumerate(checked.texts):
        matches = rule.detect(text)
        if not matches:
            continue
        hit = True
        if action == "deny":
            return "deny"
        if action == "redact":
            checked.texts[i] = redact(text, matches)
    return action if hit else "allow"
