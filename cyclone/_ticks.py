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

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cyclone import _timing, errors

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SETTLE_STEP = timedelta(minutes=15)
_FIRST_WINDOW = timedelta(minutes=1)
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


def _settled(spec: Spec, moment: datetime) -> datetime:
    """``moment`` in the schedule's zone, moved back out of a repeated hour if inside one.

    cronsim reads a start by its wall-clock time: from the second copy of a repeated hour
    it iterated from the first, so its next tick could be one already past (a worker
    slept 0 s and looked again, for the whole hour), and iterating backwards it skipped
    the second copy's ticks. From a time that is not ambiguous it iterates both copies as
    Debian's cron does; the ticks before ``moment`` are dropped by the caller.
    """
    local = moment.astimezone(spec.zone)
    while local.replace(fold=1 - local.fold).utcoffset() != local.utcoffset():
        moment -= _SETTLE_STEP
        local = moment.astimezone(spec.zone)
    return local


def _after(spec: Spec, after: datetime) -> Iterator[datetime]:
    """The cron ticks strictly after ``after``, oldest first, in UTC, by cronsim's forward
    iteration (the one definition of a cron schedule's ticks, DST included)."""
    assert spec.cron is not None
    start = _settled(spec, _floor_second(after))
    previous = after
    for tick in _cronsim().CronSim(spec.cron, start):
        moment: datetime = tick.astimezone(UTC)
        if moment > previous:
            previous = moment
            yield moment


def latest(spec: Spec, after: datetime, now: datetime, count: int) -> list[datetime]:
    """Up to ``count`` of the latest ticks in ``(after, now]``, oldest first, in UTC.

    A cron schedule's ticks are found forwards (as :func:`following` finds them), in
    windows that end at ``now`` and double back towards ``after`` until ``count`` ticks
    are found: the work is about the ticks fired, not the length of the downtime.
    """
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
    high, span = now, _FIRST_WINDOW
    while high > after and len(found) < count:
        low = after if high - after <= span else high - span
        window: deque[datetime] = deque(maxlen=count - len(found))
        for tick in _after(spec, low):
            if tick > high:
                break
            window.append(tick)
        found[:0] = window
        high, span = low, span * 2
    return found


def following(spec: Spec, after: datetime) -> datetime | None:
    """The first tick strictly after ``after``, in UTC (None if the cron never matches)."""
    if spec.every is not None:
        step = int(spec.every.total_seconds())
        passed = int((after - EPOCH).total_seconds()) // step + 1
        return EPOCH + timedelta(seconds=passed * step)
    return next(_after(spec, after), None)


def key(name: str, tick: datetime) -> str:
    """The submit key of a schedule's tick: ``schedule:<name>:<tick in UTC, ISO 8601>``."""
    return f"schedule:{name}:{tick.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
