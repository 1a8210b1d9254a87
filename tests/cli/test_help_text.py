"""What ``svc-gateway ... --help`` shows a newcomer, for every verb (click's own runner, in
process): every option has a text, no reStructuredText markup, no summary cut
mid-sentence, and a bare ``svc-gateway`` prints its help on stdout and succeeds."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner

from gateway.cli.main import main


def commands(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from commands(sub, (*path, name))


def command_at(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


EVERY = list(commands(main))


def help_of(path: tuple[str, ...]) -> str:
    result = CliRunner().invoke(main, [*path, "--help"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_there_are_verbs_to_check() -> None:
    assert ("key", "create") in EVERY and ("serve",) in EVERY


@pytest.mark.parametrize("path", EVERY, ids=[" ".join(p) or "svc-gateway" for p in EVERY])
def test_every_option_has_a_text_and_no_markup(path: tuple[str, ...]) -> None:
    bare = [
        option.opts[0]
        for option in command_at(path).params
        if isinstance(option, click.Option) and not (option.help or "").strip()
    ]
    assert not bare, f"svc-gateway {' '.join(path)}: options without a text: {bare}"
    text = help_of(path)
    assert "``" not in text and ":class:" not in text, text
    if "Commands:" in text:
        listing = text.split("Commands:", 1)[1]
        assert "..." not in listing, listing  # click cuts a long summary with "..."


def test_bare_svc_gateway_prints_its_help_on_stdout_and_succeeds() -> None:
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage:"), result.stdout
    assert "Commands:" in result.stdout
    assert result.stderr == ""
