"""The ticks of a schedule: pure rules over aware datetimes, no database and no clock.

A cron schedule's ticks are those of its expression in its time zone, as the ``cronsim``
library (the ``cron`` extra) computes them, daylight-saving transitions included: it
follows Debian's cron, so a job at a fixed time inside a skipped hour runs right after
the jump, and one inside a repeated hour runs once. Every other expression (a minute
or second field with ranges, steps or ``*`` and an hour field with ``*``) runs in both
copies of a repeated hour. An interval schedule (``every=``) ticks at the multiples of
its interval since the Unix epoch, in absolute time, so time zones do not move it.

This is the only module that imports ``cronsim``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cyclone import _timing, errors

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
CRON_EXTRA = "cron= schedules need the cron extra: pip install 'cyclone[cron]' (it adds cronsim)"


@dataclass(frozen=True, slots=True)
class Spec:
    """When a schedule ticks: a cron expression in a time zone, or a fixed interval."""

    cron: str | None
    every: timedelta | None
    timezone: str

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)


def _cronsim() -> Any:
    try:
        import cronsim
    except ImportError:
        raise errors.DefinitionError(CRON_EXTRA) from None
    return cronsim


def check(spec: Spec, where: str) -> None:
    """Raise DefinitionError unless ``spec`` is a valid schedule (exactly one of cron, every)."""
    if (spec.cron is None) == (spec.every is None):
        raise errors.DefinitionError(f"{where}: give exactly one of cron= and every=")
    if not isinstance(spec.timezone, str):
        raise errors.DefinitionError(f"{where}: timezone= takes an IANA zone name such as 'UTC'")
    try:
        zone = spec.zone
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # OSError: a name zoneinfo looks up as a path but cannot open as a file (a folder
        # of zones such as 'America', a name too long for the file system).
        raise errors.DefinitionError(f"{where}: unknown time zone {spec.timezone!r}") from None
    if spec.every is not None:
        if not isinstance(spec.every, timedelta):
            raise errors.DefinitionError(f"{where}: every= takes a timedelta")
        if spec.every < timedelta(seconds=1) or spec.every.microseconds:
            raise errors.DefinitionError(f"{where}: every= must be a whole number of seconds >= 1")
        # The next tick is a multiple of every= after the epoch: past 1,000 years it fell
        # after year 9999, and the worker's scheduler failed on it every second, for ever.
        if spec.every > _timing.MAX_DURATION:
            raise errors.DefinitionError(
                f"{where}: every= is at most {_timing.MAX_DURATION.days} days (1,000 years)"
            )
        return
    if not isinstance(spec.cron, str):
        raise errors.DefinitionError(f"{where}: cron= takes a cron expression (str)")
    cronsim = _cronsim()
    try:
        cronsim.CronSim(spec.cron, datetime.now(zone))
    except cronsim.CronSimError as exc:
        raise errors.DefinitionError(f"{where}: bad cron expression {spec.cron!r}: {exc}") from None


def _floor_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


def latest(spec: Spec, after: datetime, now: datetime, count: int) -> list[datetime]:
    """Up to ``count`` of the latest ticks in ``(after, now]``, oldest first, in UTC."""
    if count < 1 or now <= after:
        return []
    found: list[datetime] = []
    if spec.every is not None:
        step = int(spec.every.total_seconds())
        last = EPOCH + timedelta(seconds=int((now - EPOCH).total_seconds()) // step * step)
        while last > after and len(found) < count:
            found.append(last)
            last -= spec.every
        return found[::-1]
    assert spec.cron is not None
    # cronsim iterates backwards strictly before its start: start one second after now.
    start = _floor_second(now.astimezone(spec.zone)) + timedelta(seconds=1)
    for tick in _cronsim().CronSim(spec.cron, start, reverse=True):
        moment = tick.astimezone(UTC)
        if moment <= after or len(found) >= count:
            break
        if moment <= now:
            found.append(moment)
    return found[::-1]


def following(spec: Spec, after: datetime) -> datetime | None:
    """The first tick strictly after ``after``, in UTC (None if the cron never matches)."""
    if spec.every is not None:
        step = int(spec.every.total_seconds())
        passed = int((after - EPOCH).total_seconds()) // step + 1
        return EPOCH + timedelta(seconds=passed * step)
    assert spec.cron is not None
    start = _floor_second(after.astimezone(spec.zone))
    try:
        tick: datetime = next(iter(_cronsim().CronSim(spec.cron, start)))
    except StopIteration:
        return None
    return tick.astimezone(UTC)


def key(name: str, tick: datetime) -> str:
    """The submit key of a schedule's tick: ``schedule:<name>:<tick in UTC, ISO 8601>``."""
    return f"schedule:{name}:{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
