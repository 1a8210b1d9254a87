"""A stacked bar chart of daily spend as inline SVG, drawn on the server (no script).

One bar a day; each bar stacks the day's groups (keys, models or tag values) in the
colours of the legend. The largest ``MAX_SERIES - 1`` groups over the period keep their
own colour, the rest are summed as "other". Every bar has a ``<title>`` (a tooltip, and
what a screen reader says), and the figure has a text summary for those who cannot see it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import date

from markupsafe import Markup, escape

from gateway.edge.dashboard.format import usd

# colour-blind-safe (Okabe-Ito), each with at least 3:1 contrast against white
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#6b6b6b")
MAX_SERIES = len(COLOURS)
WIDTH, HEIGHT = 760, 260
LEFT, RIGHT, TOP, BOTTOM = 84, 12, 12, 36


@dataclass(frozen=True)
class Series:
    name: str
    colour: str
    total: float


def series(points: dict[tuple[str, str], float]) -> tuple[list[Series], dict[str, str]]:
    """The legend, and which legend entry each group falls in."""
    totals: dict[str, float] = {}
    for (_day, group), amount in points.items():
        totals[group] = totals.get(group, 0.0) + amount
    ranked = sorted(totals, key=lambda g: (-totals[g], g))
    keep = ranked if len(ranked) <= MAX_SERIES else ranked[: MAX_SERIES - 1]
    mapping = {g: g for g in keep} | {g: "other" for g in ranked if g not in keep}
    legend = [Series(g, COLOURS[i], totals[g]) for i, g in enumerate(keep)]
    if len(keep) < len(ranked):
        other = sum(totals[g] for g in ranked if g not in keep)
        legend.append(Series("other", COLOURS[-1], other))
    return legend, mapping


def _nice_max(value: float) -> float:
    """A round axis maximum at or above ``value``."""
    if value <= 0:
        return 1.0
    step = 10 ** len(str(int(value))) / 10 if value >= 1 else 1.0
    while step > value:
        step /= 10
    for factor in (1, 2, 4, 6, 8, 10):  # each a multiple of the 4 grid steps' size
        if step * factor >= value:
            return step * factor
    return step * 10  # pragma: no cover


def _axis(value: float, top: float) -> str:
    """An axis label: as many decimals as the scale needs (3 significant digits)."""
    if value == 0:
        return "$0"
    decimals = max(2, 2 - math.floor(math.log10(top)))
    return f"${value:,.{decimals}f}"


def bar_chart(
    days: list[date], points: dict[tuple[str, str], float], label: str
) -> tuple[Markup, list[Series]]:
    """The SVG of ``points`` (``(day, group) -> USD``) over ``days``, and its legend."""
    legend, mapping = series(points)
    colour = {s.name: s.colour for s in legend}
    stacks: dict[str, dict[str, float]] = {d.isoformat(): {} for d in days}
    for (iso_day, group), amount in points.items():
        if iso_day in stacks:
            stack = stacks[iso_day]
            stack[mapping[group]] = stack.get(mapping[group], 0.0) + amount
    top = _nice_max(max((sum(s.values()) for s in stacks.values()), default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / max(len(days), 1)
    parts = [
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for i in range(5):
        value = top * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" class="axis" text-anchor="end">'
            f"{_axis(value, top)}</text>"
        )
    for index, day in enumerate(days):
        x = LEFT + index * slot
        y = TOP + plot_h
        stack = stacks[day.isoformat()]
        for entry in legend:
            amount = stack.get(entry.name, 0.0)
            if amount <= 0:
                continue
            h = max(plot_h * amount / top, 1.0)
            y -= h
            tip = f"{day.isoformat()} · {entry.name}: {usd(amount)}"
            parts.append(
                f'<rect x="{x + slot * 0.15:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" '
                f'height="{h:.1f}" fill="{colour[entry.name]}"><title>{escape(tip)}</title></rect>'
            )
        if index % 5 == 0 or index == len(days) - 1:
            parts.append(
                f'<text x="{x + slot / 2:.1f}" y="{HEIGHT - BOTTOM + 16}" class="axis" '
                f'text-anchor="middle">{day.strftime("%b %d")}</text>'
            )
    parts.append("</svg>")
    return Markup("".join(parts)), legend
