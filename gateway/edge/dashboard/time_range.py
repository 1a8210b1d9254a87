"""The dates a report page covers: a preset (today, the last 7 or 30 days, this month,
last month) or a custom range, read from the query string. Days are UTC and inclusive,
as ``/v1/usage``'s ``start`` and ``end``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta

from werkzeug.datastructures import MultiDict

from gateway.errors import GatewayError

PRESETS = {
    "today": "Today",
    "7d": "Last 7 days",
    "30d": "Last 30 days",
    "this_month": "This month",
    "last_month": "Last month",
    "custom": "Custom range",
}
DEFAULT = "30d"
#: the longest custom range a page draws (a bar a day): a year, a leap day included
MAX_DAYS = 366


@dataclass(frozen=True, slots=True)
class TimeRange:
    preset: str
    start: date
    end: date

    @property
    def days(self) -> list[date]:
        return [self.start + timedelta(days=i) for i in range((self.end - self.start).days + 1)]

    @property
    def bounds(self) -> tuple[float, float]:
        """The range as epoch seconds: from the start's midnight to the next day's after
        the end (excluded), UTC."""
        start = datetime.combine(self.start, time(), UTC).timestamp()
        return start, datetime.combine(self.end + timedelta(days=1), time(), UTC).timestamp()

    def query(self) -> dict[str, str]:
        """The query-string fields that name this range again (links, the CSV)."""
        fields = {"range": self.preset}
        if self.preset == "custom":
            fields |= {"start": self.start.isoformat(), "end": self.end.isoformat()}
        return fields


def _day(args: MultiDict[str, str], name: str, default: date) -> date:
    text = args.get(name, "").strip()
    if not text:
        return default
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise GatewayError(
            "invalid_request", f"The {name} date must be a date (YYYY-MM-DD).", name
        ) from None


def read(args: MultiDict[str, str], now: float) -> TimeRange:
    """The range a page's query string names; an unknown preset is the default one."""
    today = datetime.fromtimestamp(now, UTC).date()
    preset = args.get("range", DEFAULT)
    first = today.replace(day=1)
    if preset == "today":
        return TimeRange(preset, today, today)
    if preset == "7d":
        return TimeRange(preset, today - timedelta(days=6), today)
    if preset == "this_month":
        return TimeRange(preset, first, today)
    if preset == "last_month":
        end = first - timedelta(days=1)
        return TimeRange(preset, end.replace(day=1), end)
    if preset == "custom":
        start = _day(args, "start", today - timedelta(days=29))
        end = _day(args, "end", today)
        if end < start:
            raise GatewayError("invalid_request", "The end date is before the start.", "end")
        if (end - start).days >= MAX_DAYS:
            raise GatewayError(
                "invalid_request",
                f"Choose at most {MAX_DAYS} days; for longer spans use /v1/usage.",
                "end",
            )
        return TimeRange(preset, start, end)
    return TimeRange(DEFAULT, today - timedelta(days=29), today)
