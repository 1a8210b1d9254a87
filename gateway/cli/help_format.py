"""How the command's help lists the verbs of a group."""

from __future__ import annotations

import click


class WholeSummaries(click.Group):
    """A group whose listing shows each verb's whole first sentence (click cuts it at the
    terminal's width otherwise, mid-sentence); the lines wrap instead."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=10_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
