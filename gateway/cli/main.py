"""The ``svc-gateway`` command: ``serve``, and the operator verbs that call the admin API.

Every operator verb accepts ``--json`` and then prints exactly one JSON object on
stdout. The server URL comes from ``--url`` or ``SVC_GATEWAY_URL``
(default ``http://127.0.0.1:8080``); the admin token from ``SVC_ADMIN_TOKEN``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any, NoReturn
from urllib.parse import quote

import click
import orjson
import trio

from gateway import __version__
from gateway.accounts.key_fields import MAX_COUNT, MAX_USD
from gateway.cli.help_format import WholeSummaries
from gateway.cli.try_provider import fake_upstream, provider
from gateway.config.credentials import missing_credentials
from gateway.config.example import EXAMPLE
from gateway.config.settings import Config, ConfigError, load_config, parse_workers
from gateway.observe.logs import configure as configure_logging
from gateway.observe.logs import event
from gateway.serving.db_lock import DatabaseLock, DatabaseLockError
from gateway.store import StoreError

DEFAULT_URL = "http://127.0.0.1:8080"


def fail(message: str, status: int = 1, code: str | None = None) -> NoReturn:
    """One line on stderr and a non-zero exit; under ``--json`` also the error as one JSON
    object on stdout, so that a tool reading stdout always gets an object."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None and ctx.meta.get(JSON_MODE):
        _echo_error_object(message, status, code)
    if ctx is not None and ctx.meta.get(JSON_LOGS):
        # log_format = "json": every line of the process is one JSON object
        log.error("svc-gateway: %s", message, extra=event("error", exit_status=status))
    else:
        click.echo(f"svc-gateway: {message}", err=True)
    sys.exit(status)


def _echo_error_object(message: str, status: int, code: str | None = None) -> None:
    error = {"error": {"message": message, "code": code, "exit_status": status}}
    click.echo(orjson.dumps(error).decode())


class Usd(click.ParamType[float]):
    """An amount in USD: a finite number from 0 to ``MAX_USD`` (``nan`` is no amount)."""

    name = "usd"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        try:
            amount = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not (math.isfinite(amount) and 0 <= amount <= MAX_USD):
            self.fail(f"{value!r} is not an amount from 0 to {MAX_USD:,}", param, ctx)
        return amount


USD = Usd()
COUNT = click.IntRange(0, MAX_COUNT)
JSON_MODE = "svc_gateway.json"  # the verb's --json flag, once its callback has run
JSON_ARGS = "svc_gateway.json_args"  # "--json" is among the arguments
JSON_LOGS = "svc_gateway.json_logs"  # serve runs with log_format = "json"
log = logging.getLogger("gateway.cli")


def _json_mode(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    ctx.meta[JSON_MODE] = value
    return value


class _Cli(WholeSummaries):
    """The top-level group: under ``--json``, click's own refusals (a bad flag value, a
    missing option, an unknown verb) also print the error object on stdout, as
    :func:`fail` does; stderr and the exit status stay click's (usage, 2).

    ``--json`` anywhere among the arguments counts: the refusal may come before the
    flag's own callback has run (or instead of it)."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        as_json = "--json" in args
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            if as_json:
                _echo_error_object(exc.format_message(), exc.exit_code)
            raise
        ctx.meta[JSON_ARGS] = as_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:  # sub-verbs parse their flags in here
            if ctx.meta.get(JSON_ARGS):
                _echo_error_object(exc.format_message(), exc.exit_code)
            raise


_Cli.group_class = WholeSummaries


@click.group(
    cls=_Cli,
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, "--version", prog_name="svc-gateway")
@click.pass_context
def main(ctx: click.Context) -> None:
    """svc-gateway: a key-authenticated gateway for language-model calls.

    `serve` runs the gateway; the other verbs manage organisations and keys of a running
    gateway through its admin API (set SVC_ADMIN_TOKEN on both sides).
    """
    if ctx.invoked_subcommand is None:  # bare `svc-gateway`: its help, on stdout, status 0
        click.echo(ctx.get_help())


# -- serve ---------------------------------------------------------------------------------


@main.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="TOML config file.")
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 8080; 0 picks a free one).")
@click.option(
    "--db", help="SQLite database file (default svc-gateway.db here) or a postgresql:// URL."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    callback=_json_mode,
    help='Once listening, print one JSON object: {"url", "database", "sandbox_key"}.',
)
@click.option(
    "--demo",
    is_flag=True,
    help="On an empty database, create the demo organisation and sandbox key even with a "
    "config file (without one they are always created).",
)
@click.option(
    "--workers",
    help='Serving processes on the port (default 1; "auto": one per core), each a node of'
    " one deployment on the database.",
)
def serve(
    config_path: str | None,
    host: str | None,
    port: int | None,
    db: str | None,
    as_json: bool,
    demo: bool,
    workers: str | None,
) -> None:
    """Run the gateway. With no config: SQLite here, the mock provider, a demo catalog,
    and on a new database a demo organisation with a sandbox key.

    One server per SQLite database (a second one is refused); on PostgreSQL every
    server is a node of one deployment (the config's [cluster] table). --workers N: N
    processes on the port, each a node (on SQLite too: the server and its workers hold
    the one lock)."""
    try:
        count = None if workers is None else parse_workers(workers, "--workers")
        config = load_config(config_path, host=host, port=port, db=db, workers=count)
    except ConfigError as exc:
        fail(str(exc), 2)
    configure_logging(config.server.log_format, config.server.log_level)
    if config.server.log_format == "json":
        click.get_current_context().meta[JSON_LOGS] = True
        logging.captureWarnings(True)  # a warning is a log line too, in JSON
        sys.excepthook = _log_crash  # and so is a traceback
    missing = missing_credentials(config, os.environ)
    if missing:
        fail(
            f"{'; '.join(missing)} (set it, or leave the key out of the provider's table for"
            " a provider that needs no key or serves BYOK keys only: docs/CONFIG.md)",
            2,
        )
    if config.server.workers > 1:
        from gateway.serving.workers import WorkersError, check_workers

        try:
            check_workers(config)
        except WorkersError as exc:
            fail(str(exc), 2)
    lock = DatabaseLock(config.server.db)
    try:
        lock.acquire()
    except DatabaseLockError as exc:
        fail(str(exc))
    try:
        _serve(config, as_json, demo=demo or config.source is None)
    finally:
        lock.release()


def _log_crash(kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
    """An exception nothing caught, as one log line (its traceback a field)."""
    log.critical("unhandled %s", kind.__name__, exc_info=(kind, error, tb), extra=event("crash"))


def _serve(config: Config, as_json: bool, *, demo: bool) -> None:
    from gateway.serving.connections import (
        DescriptorLimitError,
        fit_descriptor_limit,
        raise_descriptor_limit,
    )
    from gateway.serving.heap import settle_heap
    from gateway.serving.runtime import Runtime
    from gateway.serving.server import bind_sockets, hypercorn_config
    from gateway.serving.server import serve as run_server

    try:
        # before the runtime: its upstream pools are built with the sizes that fit
        config = fit_descriptor_limit(config, raise_descriptor_limit())
    except DescriptorLimitError as exc:
        fail(str(exc), 2)
    try:
        sockets = bind_sockets(hypercorn_config(config))
    except OSError as exc:
        fail(f"cannot listen on {config.server.host}:{config.server.port}: {exc.strerror or exc}")
    json_logs = config.server.log_format == "json"
    announce = partial(_announce, as_json=as_json, json_logs=json_logs, demo=demo)
    if config.server.workers > 1:
        from gateway.serving.workers import WorkersError, run_workers

        try:
            run_workers(config, sockets, demo=demo, announce=announce)
        except WorkersError as exc:
            fail(str(exc))
        return
    try:
        runtime = Runtime.open(config)
    except StoreError as exc:
        fail(str(exc))
    # demo data (an organisation with credits and a key that manages keys) only where it
    # is asked for: never under an operator's configuration unless `--demo` says so
    runtime.demo = demo

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(run_server, runtime, sockets)
            settle_heap()  # start-up has loaded everything
            announce(binds[0], runtime.store.name, runtime.demo_token)

    trio.run(run)
    runtime.store.close()


#: how an operator gets a key when the demo key was not seen or is lost (it is stored only
#: as a fingerprint, so it cannot be shown again): a new key of the demo organisation
NEW_KEY_HINT = (
    "A new key (the admin API needs SVC_ADMIN_TOKEN set for the server): `svc-gateway org"
    " list` shows the demo organisation's id, then `svc-gateway key create --org ORG_ID"
    " --name demo --mode sandbox --keys-manage`"
)


def _start_note(token: str | None, demo: bool) -> str:
    """What ``serve`` says once listening when it does not show a sandbox key."""
    if token:
        # stdout is a file or a pipe, a log someone else may read: no token there
        return (
            "demo organisation created; its sandbox key is not printed because stdout is"
            f" not a terminal (`serve --json` prints it). {NEW_KEY_HINT}"
        )
    if demo:
        return f"existing database: the demo key was shown once. {NEW_KEY_HINT}"
    return "create organisations and keys with `svc-gateway org create`, `svc-gateway key create`"


def _announce(
    url: str, database: str, token: str | None, *, as_json: bool, json_logs: bool, demo: bool
) -> None:
    """The server is ready: say where, and the sandbox key where it may be shown."""
    note = _start_note(token, demo)
    if as_json:
        info: dict[str, Any] = {"url": url, "database": database, "sandbox_key": token}
        if token is None and note:
            info["message"] = note
        click.echo(orjson.dumps(info).decode())
    elif json_logs:
        # a log shipper reads one object per line: the token only to a terminal
        line: dict[str, Any] = {"event": "listening", "url": url, "database": database}
        if token and sys.stdout.isatty():
            line["sandbox_key"] = token
        elif note:
            line["message"] = note
        click.echo(orjson.dumps(line).decode())
    else:
        click.echo(f"svc-gateway listening on {url}")
        click.echo(f"database: {database}")
        if token and sys.stdout.isatty():
            click.echo(f"sandbox key (shown once): {token}")
            click.echo(f"try: curl -H 'Authorization: Bearer {token}' {url}/v1/key")
        else:
            click.echo(note)
    sys.stdout.flush()


# -- admin client --------------------------------------------------------------------------


def _url(url: str | None) -> str:
    return (url or os.environ.get("SVC_GATEWAY_URL") or DEFAULT_URL).rstrip("/")


def _url_flag() -> str:
    """The flag of the current verb that takes the gateway URL (``org webhook``'s differs)."""
    ctx = click.get_current_context(silent=True)
    for param in ctx.command.params if ctx is not None else ():
        if param.name == "url" and param.opts:
            return param.opts[0]
    return "--url"


def _seg(value: str) -> str:
    """One path segment of an admin URL: every reserved character encoded, ``/`` too
    (the server decodes and its id routes take them), and a ``.`` or ``..`` segment
    encoded so that no URL normalisation drops it."""
    if not value:
        fail("an id must not be empty", 2)
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def call_admin(
    url: str | None,
    method: str,
    path: str,
    body: Any = None,
    params: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Call the admin API; ``path`` is built with :func:`_seg` for any id in it."""
    token = os.environ.get("SVC_ADMIN_TOKEN")
    if not token:
        fail("SVC_ADMIN_TOKEN is not set (the admin API needs it on server and client)")
    if not (token.isascii() and token.isprintable()):
        fail("SVC_ADMIN_TOKEN must be printable ASCII (it is sent in an HTTP header)", 2)
    base = _url(url)
    import httpx  # here, not at the top: `serve` never needs it (~0.1 s of its start)

    try:
        response = httpx.request(
            method,
            f"{base}{path}",
            params=params,
            headers={"Authorization": f"Bearer {token}"},
            content=orjson.dumps(body) if body is not None else None,
            timeout=30.0,
            # TLS only for an https:// gateway: loading the CA bundle for a plain-HTTP
            # one (the default, loopback) cost ~30 ms of every verb
            verify=base.lower().startswith("https:"),
        )
    except httpx.InvalidURL as exc:
        fail(f"not a usable gateway URL {base!r}: {exc}", 2)
    except httpx.HTTPError as exc:
        fail(f"cannot reach the gateway at {base}: {exc}")
    try:
        data = response.json()
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if response.status_code >= 400 or not isinstance(data, dict):
        if not isinstance(error, dict):
            fail(f"{base} answered {response.status_code} without the gateway's error shape")
        if response.status_code == 404 and error.get("message") == "No such endpoint.":
            # the server says the same for an unknown path and for a disabled admin API
            fail(
                f"no such endpoint: {method} {response.url}; the gateway URL"
                f" ({_url_flag()} or SVC_GATEWAY_URL) must be the server's base address"
                " (without /v1), and the server must have SVC_ADMIN_TOKEN set (without"
                " it the admin API does not exist)",
                code=error.get("code"),
            )
        message = " ".join(str(error.get("message")).split())
        fail(f"{response.status_code} {error.get('code')}: {message}", code=error.get("code"))
    return data


def emit(data: dict[str, Any], as_json: bool, fields: tuple[str, ...] = ()) -> None:
    if as_json:
        click.echo(orjson.dumps(data).decode())
        return
    rows = data.get("data") if "data" in data and isinstance(data.get("data"), list) else None
    if rows is not None:
        for row in rows:
            click.echo("  ".join(f"{f}={_text(row.get(f))}" for f in fields or tuple(row)))
        return
    for name, value in data.items():
        click.echo(f"{name}: {_text(value)}")


def _text(value: Any) -> str:
    """A value as the text output shows it: strings as they are, the rest as JSON
    (``null`` and ``false``, not Python's ``None`` and ``False``)."""
    return value if isinstance(value, str) else orjson.dumps(value).decode()


url_option = click.option("--url", help="Gateway URL (default $SVC_GATEWAY_URL or 127.0.0.1:8080).")
json_option = click.option(
    "--json", "as_json", is_flag=True, callback=_json_mode, help="Print one JSON object."
)


main.add_command(provider)
main.add_command(fake_upstream)


@main.group()
def org() -> None:
    """Manage organisations: create, list, credits, policy, BYOK, spend-alert webhook."""


@org.command("create")
@click.argument("name")
@click.option("--credits", type=USD, default=0.0, help="Initial credits in USD.")
@click.option("--residency", help="Residency zone (e.g. us, eu).")
@url_option
@json_option
def org_create(
    name: str, credits: float, residency: str | None, url: str | None, as_json: bool
) -> None:
    """Create an organisation; prints its id."""
    body = {"name": name, "credits_usd": credits, "residency": residency}
    emit(call_admin(url, "POST", "/admin/orgs", body), as_json)


@org.command("list")
@url_option
@json_option
def org_list(url: str | None, as_json: bool) -> None:
    """List the organisations: id, name, residency, credit balance."""
    data = call_admin(url, "GET", "/admin/orgs")
    emit(data, as_json, ("id", "name", "residency", "balance_usd"))


@org.command("credits")
@click.argument("org_id")
@click.option("--add", "add_usd", type=USD, required=True, help="USD to add.")
@url_option
@json_option
def org_credits(org_id: str, add_usd: float, url: str | None, as_json: bool) -> None:
    """Add credits to an organisation; prints the new balance."""
    emit(
        call_admin(url, "POST", f"/admin/orgs/{_seg(org_id)}/credits", {"add_usd": add_usd}),
        as_json,
    )


@org.command("policy")
@click.argument("org_id")
@click.option(
    "--file",
    "policy_file",
    type=click.Path(exists=True, dir_okay=False),
    required=True,
    help="A JSON object of policy keys (docs/CONFIG.md, policy).",
)
@url_option
@json_option
def org_policy(org_id: str, policy_file: str, url: str | None, as_json: bool) -> None:
    """Set an organisation's policy from a JSON file; prints the policy."""
    try:
        policy = orjson.loads(Path(policy_file).read_bytes())
    except orjson.JSONDecodeError as exc:
        fail(f"{policy_file} is not valid JSON: {exc}", 2)
    emit(call_admin(url, "PUT", f"/admin/orgs/{_seg(org_id)}/policy", policy), as_json)


@org.command("byok")
@click.argument("org_id")
@click.option("--provider", required=True, help="Provider name of the config.")
@click.option("--api-key-env", required=True, help="Environment variable holding the key.")
@url_option
@json_option
def org_byok(org_id: str, provider: str, api_key_env: str, url: str | None, as_json: bool) -> None:
    """Register the organisation's own provider key (by environment variable name)."""
    body = {"provider": provider, "api_key_env": api_key_env}
    emit(call_admin(url, "PUT", f"/admin/orgs/{_seg(org_id)}/byok", body), as_json)


@org.command("webhook")
@click.argument("org_id")
@click.option("--url", "webhook_url", required=True, help="Where spend alerts are posted.")
@click.option(
    "--gateway-url", "url", help="Gateway URL (default $SVC_GATEWAY_URL or 127.0.0.1:8080)."
)
@json_option
def org_webhook(org_id: str, webhook_url: str, url: str | None, as_json: bool) -> None:
    """Send the organisation's spend alerts to URL; prints the signing secret (once).

    Here --url is the webhook's address (the operator contract), so the gateway's own
    address is --gateway-url."""
    body = {"url": webhook_url}
    emit(call_admin(url, "PUT", f"/admin/orgs/{_seg(org_id)}/webhook", body), as_json)


@main.group()
def key() -> None:
    """Manage API keys: create, rotate, revoke, disable, enable, list."""


def _tags(pairs: tuple[str, ...], option: str) -> dict[str, str]:
    tags = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            fail(f"{option} takes k=v, got {pair!r}", 2)
        tags[name] = value
    return tags


@key.command("create")
@click.option("--org", "org_id", required=True, help="Organisation id.")
@click.option("--name", required=True, help="A name to tell the key by (not secret).")
@click.option(
    "--mode",
    type=click.Choice(["live", "sandbox"]),
    required=True,
    help="live: real providers, billed; sandbox: the mock, never billed.",
)
@click.option(
    "--environment",
    type=click.Choice(["production", "staging", "development", "test"]),
    help="A bookkeeping label; it does not change how calls are served.",
)
@click.option("--scopes", help="Comma-separated: inference,embeddings,usage:read,keys:manage.")
@click.option("--keys-manage", is_flag=True, help="Allow this key to manage sub-keys.")
@click.option("--usd-day", type=USD, help="Spend cap per UTC day, in USD.")
@click.option("--usd-month", type=USD, help="Spend cap per calendar month (UTC), in USD.")
@click.option("--rpm", type=COUNT, help="Requests per minute (429 rate_limited past it).")
@click.option("--tpm", type=COUNT, help="Tokens per minute, input and output together.")
@click.option("--max-in-flight", type=COUNT, help="Calls at once (429 past it).")
@click.option(
    "--max-output-tokens", type=COUNT, help="Largest output a call may ask for (default 4096)."
)
@click.option(
    "--data-mode",
    type=click.Choice(["standard", "zero_retention", "confidential"]),
    help="standard (default); zero_retention: only providers that keep no content"
    " serve it; confidential: its calls answer 501 not_implemented.",
)
@click.option(
    "--byok",
    is_flag=True,
    help="Serve the key on its organisation's own provider key (org byok), billed apart.",
)
@click.option("--allowed-models", help="Comma-separated model ids.")
@click.option("--allowed-tools", help="Comma-separated MCP tool patterns: server__tool, server__*.")
@click.option("--required-tag", multiple=True, help="k=v, repeatable.")
@click.option("--default-tag", multiple=True, help="k=v, repeatable.")
@click.option("--expires-at", help="ISO 8601 timestamp.")
@click.option(
    "--guardrail",
    multiple=True,
    help="A [[guardrails]] name this key adds to its organisation's, repeatable.",
)
@url_option
@json_option
def key_create(**opts: Any) -> None:
    """Create a key; prints its id, prefix and token (the token is shown once)."""
    caps = {
        name: opts[name]
        for name in ("usd_day", "usd_month", "rpm", "tpm", "max_in_flight", "max_output_tokens")
        if opts[name] is not None
    }
    body: dict[str, Any] = {
        "org_id": opts["org_id"],
        "name": opts["name"],
        "mode": opts["mode"],
        "keys_manage": opts["keys_manage"],
        "byok": opts["byok"],
        "caps": caps,
        "required_tags": _tags(opts["required_tag"], "--required-tag"),
        "default_tags": _tags(opts["default_tag"], "--default-tag"),
    }
    for name in ("environment", "data_mode", "expires_at"):
        if opts[name] is not None:
            body[name] = opts[name]
    if opts["scopes"]:
        body["scopes"] = [s.strip() for s in opts["scopes"].split(",") if s.strip()]
    if opts["allowed_models"]:
        body["allowed_models"] = [m.strip() for m in opts["allowed_models"].split(",") if m.strip()]
    if opts["guardrail"]:
        body["guardrails"] = list(opts["guardrail"])
    if opts["allowed_tools"]:
        body["allowed_tools"] = [t.strip() for t in opts["allowed_tools"].split(",") if t.strip()]
    emit(call_admin(opts["url"], "POST", "/admin/keys", body), opts["as_json"])


def _id_action(group: click.Group, kind: str, action: str, help_text: str) -> None:
    """The verb ``KIND ACTION ID``: ``POST /admin/<kind>s/<id>/<action>``."""

    @group.command(action, help=help_text)
    @click.argument("item_id", metavar=f"{kind.upper()}_ID")
    @url_option
    @json_option
    def command(item_id: str, url: str | None, as_json: bool) -> None:
        emit(call_admin(url, "POST", f"/admin/{kind}s/{_seg(item_id)}/{action}"), as_json)


_id_action(
    key, "key", "rotate", "Issue a new key with the same settings; the old one expires later."
)
_id_action(key, "key", "revoke", "Revoke a key and its sub-keys, definitively.")
_id_action(key, "key", "disable", "Disable a key (reversible with enable).")
_id_action(key, "key", "enable", "Re-enable a disabled key.")


@key.command("list")
@click.option("--org", "org_id", required=True, help="Organisation id.")
@url_option
@json_option
def key_list(org_id: str, url: str | None, as_json: bool) -> None:
    """List the keys of an organisation."""
    data = call_admin(url, "GET", "/admin/keys", params={"org_id": org_id})
    emit(data, as_json, ("id", "prefix", "name", "mode", "status", "parent_id"))


@main.group()
def db() -> None:
    """Operate on databases directly (no server involved)."""


@db.command("copy")
@click.option("--from", "source", required=True, help="The database to copy (an SQLite file).")
@click.option("--to", "target", required=True, help="An empty database (a postgresql:// URL).")
@json_option
def db_copy(source: str, target: str, as_json: bool) -> None:
    """Copy every row of a database into an empty one: an embedded deployment moves to
    PostgreSQL. Refused when the target has any row; whole or nothing."""
    from gateway.store.copy import copy_database

    # a server on the source could write while the copy reads (and its in-memory spend
    # is not in the file): the copy takes the databases' one-server locks, as serve does
    locks = [DatabaseLock(source), DatabaseLock(target)]
    try:
        for lock in locks:
            lock.acquire()
    except DatabaseLockError as exc:
        for lock in locks:
            lock.release()
        fail(f"{exc}: stop that server before copying its database")
    try:
        copied = copy_database(source, target)
    except StoreError as exc:
        fail(str(exc))
    finally:
        for lock in locks:
            lock.release()
    if as_json:
        emit(copied, as_json)
        return
    click.echo(f"copied {copied['from']} to {copied['to']}")
    for table, count in copied["tables"].items():
        click.echo(f"  {table}: {count} rows")


@main.group()
def model() -> None:
    """Switch models of the catalog off and on (the switch is stored: it outlives a
    restart, and reaches every node of a cluster)."""


_id_action(model, "model", "disable", "Switch a model off: its calls answer 503 model_unavailable.")
_id_action(model, "model", "enable", "Switch a disabled model back on.")


@model.command("list")
@url_option
@json_option
def model_list(url: str | None, as_json: bool) -> None:
    """List every configured model and whether it is enabled."""
    data = call_admin(url, "GET", "/admin/models")
    emit(data, as_json, ("id", "kind", "owned_by", "enabled"))


@main.group()
def config() -> None:
    """The configuration file: print a commented example, check a file."""


@config.command("example")
def config_example() -> None:
    """Print an example configuration file, commented, with every key (docs/CONFIG.md)."""
    click.echo(EXAMPLE, nl=False)


@config.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@json_option
def config_check(file: str, as_json: bool) -> None:
    """Load FILE as serve would (with the SVC_* environment overrides): exit 0 with a
    one-line summary, or 1 with the first problem, naming the key at fault."""
    try:
        loaded = load_config(file)
    except ConfigError as exc:
        fail(str(exc))
    unset = missing_credentials(loaded, os.environ)
    summary = {
        "file": file,
        "providers": [p.name for p in loaded.providers],
        "models": [m.id for m in loaded.models],
        "db": loaded.server.db,
        "unset_credentials": unset,
    }
    if as_json:
        emit(summary, as_json)
        return
    note = f"; not set here (serve refuses to start without): {'; '.join(unset)}" if unset else ""
    click.echo(
        f"{file}: valid: {len(loaded.providers)} providers"
        f" ({', '.join(summary['providers'])}), {len(loaded.models)} models, db"
        f" {loaded.server.db}{note}"
    )


@main.group()
def user() -> None:
    """Manage dashboard users (owner, admin, viewer) of organisations."""


def _password_body(password_env: str | None) -> dict[str, str]:
    """``{"password": ...}`` from the named variable; empty: the server makes one up."""
    if password_env is None:
        return {}
    password = os.environ.get(password_env)
    if not password:
        fail(f"--password-env {password_env}: that environment variable is not set", 2)
    return {"password": password}


PASSWORD_ENV_HELP = (
    "Environment variable holding the password (default: the server makes one, shown once)."
)


@user.command("create")
@click.option("--org", "org_id", required=True, help="Organisation id.")
@click.option("--email", required=True, help="The email the user signs in with.")
@click.option(
    "--role",
    type=click.Choice(["owner", "admin", "viewer"]),
    required=True,
    help="owner: everything, users too; admin: keys and settings; viewer: reads only.",
)
@click.option("--password-env", help=PASSWORD_ENV_HELP)
@url_option
@json_option
def user_create(
    org_id: str, email: str, role: str, password_env: str | None, url: str | None, as_json: bool
) -> None:
    """Create a dashboard user; prints its id (and its password, once, if generated)."""
    body = {"org_id": org_id, "email": email, "role": role, **_password_body(password_env)}
    emit(call_admin(url, "POST", "/admin/users", body), as_json)


@user.command("list")
@click.option("--org", "org_id", help="Organisation id (default: every organisation).")
@url_option
@json_option
def user_list(org_id: str | None, url: str | None, as_json: bool) -> None:
    """List dashboard users."""
    params = {"org_id": org_id} if org_id is not None else None
    data = call_admin(url, "GET", "/admin/users", params=params)
    emit(data, as_json, ("id", "email", "role", "status", "org_id"))


_id_action(user, "user", "disable", "Disable a user and end its sessions (reversible with enable).")
_id_action(user, "user", "enable", "Re-enable a disabled user.")


@user.command("reset-password")
@click.argument("user_id")
@click.option("--password-env", help=PASSWORD_ENV_HELP)
@url_option
@json_option
def user_reset_password(
    user_id: str, password_env: str | None, url: str | None, as_json: bool
) -> None:
    """Give a user a new password (ends its sessions, lifts a lock-out)."""
    body = _password_body(password_env)
    emit(call_admin(url, "POST", f"/admin/users/{_seg(user_id)}/reset-password", body), as_json)


@main.group()
def cache() -> None:
    """The response cache ([cache] in the config file): drop its entries."""


@cache.command("clear")
@click.option("--org", "org_id", help="Only this organisation's entries.")
@url_option
@json_option
def cache_clear(org_id: str | None, url: str | None, as_json: bool) -> None:
    """Drop the cached answers (every organisation's, or one's); prints how many."""
    emit(call_admin(url, "POST", "/admin/cache/clear", {"org_id": org_id}), as_json)


if __name__ == "__main__":
    main()
