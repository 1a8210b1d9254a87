"""Trying a provider configuration before serving it: ``svc-gateway provider test NAME``
(one small real request through a configured provider: it costs a few tokens, so it
asks first) and ``svc-gateway fake-upstream --kind K`` (a local fake of a provider
kind, free: :mod:`gateway.fakes`).

Errors are :class:`click.ClickException`: the top-level group prints them (under
``--json`` also as one JSON object on stdout), as it does for the other verbs.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import click
import orjson
import trio

from gateway.cli.help_format import WholeSummaries
from gateway.config.credentials import missing_credentials
from gateway.config.settings import Config, ConfigError, load_config
from gateway.fakes.local_fake import KINDS, default_key, serve_fake

#: the request ``provider test`` sends: a few tokens each way
PROMPT = "Reply with the word OK."
MAX_TOKENS = 16


def _echo(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(orjson.dumps(data).decode())
    else:
        for name, value in data.items():
            click.echo(
                f"{name}: {value if isinstance(value, str) else orjson.dumps(value).decode()}"
            )


def _upstream_model(config: Config, provider: str, model_id: str | None) -> tuple[str, str]:
    """(the catalog's model id, the provider's name for it): ``model_id``'s deployment on
    ``provider``, else the first model it serves; a model the config does not name is
    sent as given."""
    for model in config.models:
        if model_id is not None and model_id not in (model.id, *model.aliases):
            continue
        for deployment in model.deployments:
            if deployment.provider == provider:
                return model.id, deployment.upstream_id
        if model.provider == provider:
            return model.id, model.upstream_id
    if model_id is not None:
        return model_id, model_id
    raise click.ClickException(
        f"no model of the config is served by {provider}: name one with --model"
    )


async def _one_call(config: Config, name: str, upstream_model: str) -> dict[str, Any]:
    from gateway.providers.base import ProviderRequest
    from gateway.providers.mock import MockProvider
    from gateway.providers.registry import build_providers

    providers = build_providers(config, MockProvider.for_models(config.models))
    provider = providers[name]
    # the credential the gateway sends for a gateway key (bedrock reads its own variables)
    env = config.provider(name).api_key_env
    api_key = os.environ.get(env) if env else None
    body = {
        "model": upstream_model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
    }
    started = time.perf_counter()
    try:
        result = await provider.complete(ProviderRequest(upstream_model, body, api_key))
    finally:
        for each in providers.values():
            aclose = getattr(each, "aclose", None)
            if aclose is not None:
                await aclose()
    usage = result.usage
    choices = result.completion.get("choices") or [{}]
    return {
        "latency_ms": round((time.perf_counter() - started) * 1000, 1),
        "usage": {
            "input_tokens": usage.prompt_tokens if usage else None,
            "output_tokens": usage.completion_tokens if usage else None,
        },
        "finish_reason": choices[0].get("finish_reason"),
    }


@click.group("provider", cls=WholeSummaries)
def provider() -> None:
    """Try a configured provider with one small real request."""


@provider.command("test")
@click.argument("name")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--model", "model_id", help="A model of the config (default: the first NAME serves).")
@click.option("--yes", is_flag=True, help="Send without asking: the request costs a few tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def provider_test(
    name: str, config_path: str | None, model_id: str | None, yes: bool, as_json: bool
) -> None:
    """Send one small chat request (a few tokens, billed by the provider) through
    provider NAME of the config, as the gateway would; print its status, latency and
    usage. Nothing is recorded and no key is needed."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    names = [p.name for p in config.providers]
    if name not in names:
        raise click.ClickException(f"no provider {name!r} in the config: one of {', '.join(names)}")
    if next(p for p in config.providers if p.name == name).kind == "mock":
        raise click.ClickException(f"{name} is the mock: it needs no test")
    missing = missing_credentials(config, os.environ)
    if missing:
        raise click.ClickException("; ".join(missing))
    model, upstream = _upstream_model(config, name, model_id)
    if not yes:
        if not sys.stdin.isatty():
            raise click.ClickException("this sends a real request that costs tokens: add --yes")
        click.confirm(
            f"Send one small request to {name} ({upstream})? It costs a few tokens", abort=True
        )
    # imported here, as in _one_call: every verb imports this module, and the providers
    # (botocore among them) cost a third of a second to import
    from gateway.providers.base import ProviderError

    answer: dict[str, Any] = {"provider": name, "model": model, "upstream_model": upstream}
    try:
        answer |= {"status": "ok", **trio.run(_one_call, config, name, upstream)}
    except ProviderError as exc:  # the provider's refusal or failure is the test's answer
        answer |= {"status": "failed", "error": f"{type(exc).__name__}: {exc}"}
        _echo(answer, as_json)
        sys.exit(1)
    _echo(answer, as_json)


@click.command("fake-upstream")
@click.option("--kind", type=click.Choice(KINDS), required=True, help="The provider kind to fake.")
@click.option("--port", type=int, default=0, help="Loopback port (default 0: a free one, printed).")
@click.option("--key", help="The credential it accepts (default fake-key; bedrock: ID:SECRET).")
@click.option(
    "--model",
    "models",
    multiple=True,
    help="azure: a deployment it serves (repeatable; default gpt-4o-mini).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object once listening.")
def fake_upstream(
    kind: str, port: int, key: str | None, models: tuple[str, ...], as_json: bool
) -> None:
    """Serve a local fake of a provider kind on 127.0.0.1 until interrupted, to try a
    configuration for free; prints the [[providers]] table that points at it."""
    credential = key or default_key(kind)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            started = await nursery.start(
                serve_fake, kind, port, credential, models or ("gpt-4o-mini",)
            )
            if as_json:
                out = {"url": started.url, "provider": started.provider, "env": started.environ}
                click.echo(orjson.dumps(out).decode())
            else:
                click.echo(f"fake {kind} upstream on {started.url} (Ctrl-C stops it)")
                click.echo("set " + " ".join(f"{k}={v}" for k, v in started.environ.items()))
                click.echo(started.toml(), nl=False)
            sys.stdout.flush()

    try:
        trio.run(run)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        raise click.ClickException(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None
