"""How the dashboard shows amounts and times: USD with the currency, UTC with a hint."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup, escape

_UNITS = (
    (86400 * 365, "year"),
    (86400 * 30, "month"),
    (86400, "day"),
    (3600, "hour"),
    (60, "minute"),
)


#: decimals of every amount a page shows (a tenth of a US cent: the smallest price step
#: of a call that a person compares); the exact amount is in the element's title
DECIMALS = 4
_SMALLEST = 10**-DECIMALS


def usd(value: float | None) -> str:
    """``$12.5000``, ``$0.0023``, ``<$0.0001`` (not zero, below the last decimal), ``—``.

    Every amount has the same four decimals, so figures line up in a column and a
    balance and a call's cost read alike."""
    if value is None:
        return "—"
    sign, size = ("-" if value < 0 else ""), abs(value)
    if 0 < size < _SMALLEST / 2:
        return f"{sign}<${_SMALLEST:.{DECIMALS}f}"
    return f"{sign}${size:,.{DECIMALS}f}"


def amount(value: float | None) -> Markup:
    """An amount as the page shows it, with the exact figure (nano-USD) on hover."""
    if value is None:
        return Markup('<span class="muted">—</span>')
    # the texts are digits, "$", "-", "<", ",", ".": only "<" needs escaping; escape()
    # is far cheaper than Markup.format on a page of fifty rows
    return Markup(
        f'<span class="amount" title="{exact(value)} exactly">{escape(usd(value))}</span>'
    )


def exact(value: float) -> str:
    """The full amount, to the nano-USD: ``$0.0000228``."""
    return ("-" if value < 0 else "") + "$" + decimal(abs(value))


def decimal(value: float) -> str:
    """Up to 9 decimals (nano-USD), no exponent, no trailing zeros: ``0.0000228``."""
    return f"{value:.9f}".rstrip("0").rstrip(".")


def relative(ts: float, now: float) -> str:
    """``3 minutes ago``, ``in 23 hours``, ``just now``."""
    delta = ts - now
    seconds = abs(delta)
    if seconds < 60:
        return "just now"
    for size, unit in _UNITS:
        if seconds >= size:
            count = round(seconds / size)
            text = f"{count} {unit}{'s' if count != 1 else ''}"
            return f"in {text}" if delta > 0 else f"{text} ago"
    raise AssertionError("unreachable")  # pragma: no cover


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def when(ts: float | str | None, now: float) -> Markup:
    """A moment as a ``<time>`` element: the UTC time and a relative hint."""
    if ts is None:
        return Markup('<span class="muted">never</span>')
    if isinstance(ts, str):
        ts = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    iso = datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
    return Markup(
        f'<time datetime="{iso}">{utc(ts)}</time> <span class="hint">({relative(ts, now)})</span>'
    )  # digits, letters, spaces, ":" and "-" only: nothing to escape


def number(value: int | float | None) -> str:
    return "—" if value is None else f"{value:,}"
