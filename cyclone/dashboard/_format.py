"""Jinja2 filters of the dashboard: times, durations, intervals and pretty JSON (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any


def when(value: datetime | None) -> str:
    """A UTC timestamp to the second, or an em dash."""
    if value is None:
        return "—"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def hhmm(value: datetime) -> str:
    """Hours and minutes in UTC, for the chart's axis."""
    return value.astimezone(UTC).strftime("%H:%M")


def duration(value: timedelta | float | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 05 s``, ``3 h 02 min`` or ``2 d 04 h``."""
    if value is None:
        return "—"
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600:02d} h"


def between(start: datetime | None, end: datetime | None) -> str:
    """The duration from ``start`` to ``end``, or an em dash when either is missing."""
    if start is None or end is None:
        return "—"
    return duration(end - start)


MAX_SHOWN = 100_000
"""Characters of one JSON value a page shows; the rest is cut, with a note saying how much."""


def pretty(value: Any) -> str:
    """A JSON value indented for reading, cut at :data:`MAX_SHOWN` characters."""
    shown = json.dumps(value, indent=2, ensure_ascii=False)
    if len(shown) > MAX_SHOWN:
        return f"{shown[:MAX_SHOWN]}\n… ({len(shown) - MAX_SHOWN:,} more characters not shown)"
    return shown


def records(value: Any) -> list[dict[str, Any]]:
    """The error records of a job (a list), or a run's error (one record)."""
    if not value:
        return []
    if isinstance(value, dict):
        return [value]
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def short_id(value: object) -> str:
    """The first block of a UUID, for tables; the full id stays in links and titles."""
    return str(value).split("-", 1)[0]
