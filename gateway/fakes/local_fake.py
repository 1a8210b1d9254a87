"""``svc-gateway fake-upstream --kind K``: one fake upstream of a provider kind, served
until interrupted, and the ``[[providers]]`` table that points a gateway at it.

Each fake accepts one credential (``key``; bedrock: ``ACCESS_KEY_ID:SECRET``), which the
table names through an environment variable, as a real provider's table does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

KINDS = ("openai", "anthropic", "gemini", "bedrock", "azure")
#: the environment variable a fake's provider table names for its credential
KEY_ENV = "FAKE_UPSTREAM_KEY"
BEDROCK_ENVS = ("FAKE_AWS_ACCESS_KEY_ID", "FAKE_AWS_SECRET_ACCESS_KEY")
DEFAULT_KEY = "fake-key"
DEFAULT_BEDROCK_KEY = "AKIAFAKEFAKEFAKE:fake-secret"
REGION = "us-east-1"


@dataclass(frozen=True, slots=True)
class Started:
    """A fake serving: its kind, address, and what a gateway needs to call it."""

    kind: str
    url: str
    #: the provider table's keys (``name`` included)
    provider: dict[str, str]
    #: the environment the table's variables need: name → value
    environ: dict[str, str]

    def toml(self) -> str:
        lines = ["[[providers]]"] + [f'{k} = "{v}"' for k, v in self.provider.items()]
        return "\n".join(lines) + "\n"


def default_key(kind: str) -> str:
    return DEFAULT_BEDROCK_KEY if kind == "bedrock" else DEFAULT_KEY


async def serve_fake(
    kind: str,
    port: int,
    key: str,
    models: Sequence[str],
    *,
    task_status: trio.TaskStatus[Started],
) -> None:
    """Serve the fake of ``kind`` on loopback ``port`` (0: a free one) until cancelled;
    ``models``: the deployments an azure fake serves (the others serve any model)."""
    # imported here: every CLI verb imports this module (for KINDS), and the fakes
    # (botocore among them) cost a third of a second to import
    from gateway.fakes.fake_anthropic import FakeAnthropic
    from gateway.fakes.fake_azure import FakeAzure
    from gateway.fakes.fake_bedrock import FakeBedrock
    from gateway.fakes.fake_gemini import FakeGemini
    from gateway.fakes.fake_upstream import FakeUpstream

    fake: Any
    environ = {KEY_ENV: key}
    if kind == "openai":
        fake = FakeUpstream(port=port)
    elif kind == "anthropic":
        fake = FakeAnthropic(keys={key}, port=port)
    elif kind == "gemini":
        fake = FakeGemini(key=key, port=port)
    elif kind == "bedrock":
        key_id, _, secret = key.partition(":")
        fake = FakeBedrock(credentials={key_id: (secret, None)}, port=port, region=REGION)
        environ = dict(zip(BEDROCK_ENVS, (key_id, secret), strict=True))
    elif kind == "azure":
        fake = FakeAzure(keys=frozenset({key}), deployments=frozenset(models), port=port)
    else:
        raise ValueError(f"no fake of kind {kind!r}: one of {', '.join(KINDS)}")
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        provider = {"name": f"fake-{kind}", "kind": kind, "base_url": fake.url}
        if kind == "azure":
            provider["base_url"] = fake.endpoint
        if kind == "bedrock":
            provider |= {
                "region": REGION,
                "access_key_id_env": BEDROCK_ENVS[0],
                "secret_access_key_env": BEDROCK_ENVS[1],
            }
        else:
            provider["api_key_env"] = KEY_ENV
        task_status.started(Started(kind, provider["base_url"], provider, environ))
