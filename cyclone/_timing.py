"""Bounds of the durations and instants cyclone stores, checked before anything is sent.

PostgreSQL computes times from a duration (now plus a delay, a sleep, a wait's timeout or
a deadline; now minus a retention) and cyclone reads each stored time back as a Python
``datetime``. A duration past these bounds made the statement fail in the driver
("timestamp out of range"), or stored a time after year 9999 that no read could decode:
every listing then failed, and a worker deciding a sleep or wait node handed it back
forever.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MAX_DURATION = timedelta(days=365_250)
"""The longest duration cyclone takes, either sign: 1,000 years, so that now plus or
minus it stays a time both PostgreSQL and Python hold."""


def check_duration(value: timedelta, what: str) -> timedelta:
    """Return ``value`` (a timedelta) if it is at most :data:`MAX_DURATION` either way.

    Raises:
        ValueError: it is longer.
    """
    if abs(value) > MAX_DURATION:
        raise ValueError(
            f"{what} is {value.days} days long, at most {MAX_DURATION.days} (1,000 years) allowed"
        )
    return value


EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
"""The range of the instants cyclone takes: years 1 to 9999 less a day at each end, so
that a stored time reads back in any session time zone (a read in UTC+14 of a time late
on 9999-12-31 UTC would fall in year 10000, which Python cannot hold)."""


def check_instant(value: datetime, what: str) -> datetime:
    """Return ``value`` (an aware datetime) if it falls within :data:`EARLIEST` and
    :data:`LATEST`, the times a read can decode.

    Raises:
        ValueError: it falls outside, as its offset may move it past year 9999 or before
            year 1.
    """
    try:
        inside = EARLIEST <= value.astimezone(UTC) <= LATEST
    except OverflowError:
        inside = False
    if not inside:
        first, last = EARLIEST.date().isoformat(), LATEST.date().isoformat()
        raise ValueError(f"{what} {value.isoformat()} is outside {first} to {last} in UTC")
    return value
