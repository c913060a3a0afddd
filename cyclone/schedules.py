"""Schedules: a workflow submitted on a cron expression or a fixed interval, once per tick.

``wf.schedule(...)`` defines one (no database contact). A Worker serving the workflow
registers it in ``cyclone_schedules`` when :meth:`~cyclone.Worker.run` starts and fires
its ticks: each tick is ``wf.submit_once(bind, f"schedule:{name}:{tick}", input)``, with
the tick in UTC ISO 8601, so any number of workers and hosts firing the same tick make
one run. A worker fires a tick inside the transaction that moves the schedule's
``last_tick`` past it, holding the schedule row's lock (others skip the row meanwhile):
a tick is fired once, and a crash before the commit leaves it to the next worker.
Ticks missed while no worker ran are fired by policy: ``"latest"`` fires only the most
recent one, ``"catch_up"`` the most recent ``max_catch_up`` of them. Ticks that fall
while a schedule is paused are never fired.

A worker fires by the registered definition (the row, as the last worker to start wrote
it), so workers of two deploys fire the same ticks; only the input comes from its code.
Registering, pausing and resuming notify ``cyclone_schedules_changed``: the schedulers
of running workers re-read their schedules at once, rather than at their next tick.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfoNotFoundError

from sqlalchemy import Connection, Engine

from cyclone import _keys, _retry, _ticks, errors
from cyclone._store import notify as _notify
from cyclone._store import schedules as _schedules
from cyclone.runs import lost_connection
from cyclone.schema import MAX_INTEGER, MISSED_POLICIES

if TYPE_CHECKING:
    from cyclone.workflow import Workflow

log = logging.getLogger("cyclone.schedules")

DEFAULT_MAX_CATCH_UP = 10
MAX_SLEEP = 60.0
"""A scheduler re-reads its schedules at least this often (seconds), paused or not; a
``cyclone_schedules_changed`` notification wakes it sooner."""
UNHEARD_SLEEP = 1.0
"""The longest a scheduler sleeps while it cannot LISTEN (a pooler without a direct URL,
or its listener reconnecting): it re-reads its schedules this often instead."""
UNREACHABLE_MAX_SLEEP = 5.0
"""The longest a schedule waits to be looked at again after failing because the database
could not be reached: a tick due during an outage fires within this of its return."""
LOCKED_RETRY = 0.2
"""Seconds before looking again at a schedule another worker is firing."""
WAKE_SLACK = 0.005


class Schedule:
    """A schedule of one workflow, as defined in code by ``wf.schedule(...)``."""

    def __init__(
        self,
        workflow: Workflow[Any],
        name: str,
        *,
        cron: str | None,
        every: timedelta | None,
        input: Any,
        timezone: str,
        missed: str,
        max_catch_up: int,
    ) -> None:
        where = f"schedule {name!r} of workflow {getattr(workflow, 'name', '?')!r}"
        if not isinstance(name, str) or not name or ":" in name:
            raise errors.DefinitionError(f"{where}: a schedule name is a non-empty str without ':'")
        try:
            _keys.check_key(_ticks.key(name, datetime(2000, 1, 1, tzinfo=UTC)))
        except errors.InvalidKeyError as exc:
            raise errors.DefinitionError(
                f"{where}: its tick keys break the key rules: {exc}"
            ) from None
        if missed not in MISSED_POLICIES:
            raise errors.DefinitionError(f"{where}: missed= is 'latest' or 'catch_up'")
        if (
            not isinstance(max_catch_up, int)
            or isinstance(max_catch_up, bool)
            or not 1 <= max_catch_up <= MAX_INTEGER
        ):
            raise errors.DefinitionError(
                f"{where}: max_catch_up= must be an int from 1 to {MAX_INTEGER}"
            )
        self.spec = _ticks.Spec(cron=cron, every=every, timezone=timezone)
        _ticks.check(self.spec, where)
        if not callable(input):
            workflow._encode_input(input)  # an input that cannot be encoded fails here
        self.workflow = workflow
        self.name = name
        self.input = input
        self.missed = missed
        self.max_catch_up = max_catch_up

    def __repr__(self) -> str:
        what = f"cron={self.spec.cron!r}" if self.spec.cron else f"every={self.spec.every!r}"
        return f"<Schedule {self.name!r} of {self.workflow.name!r} {what}>"

    @property
    def cron(self) -> str | None:
        return self.spec.cron

    @property
    def every(self) -> timedelta | None:
        return self.spec.every

    @property
    def timezone(self) -> str:
        return self.spec.timezone

    def key(self, tick: datetime) -> str:
        """The submit key of ``tick``: ``schedule:<name>:<tick in UTC ISO 8601>``."""
        return _ticks.key(self.name, tick)

    def input_for(self, tick: datetime) -> Any:
        """The input of the run of ``tick``: the fixed input, or ``input(tick)`` (aware, local)."""
        if callable(self.input):
            return self.input(tick.astimezone(self.spec.zone))
        return self.input

    def due(self, last_tick: datetime, now: datetime) -> list[datetime]:
        """The ticks to fire now, oldest first, after ``last_tick`` and up to ``now``."""
        return _due(self.spec, self.missed, self.max_catch_up, last_tick, now)


def _due(
    spec: _ticks.Spec, missed: str, max_catch_up: int, last_tick: datetime, now: datetime
) -> list[datetime]:
    count = 1 if missed == "latest" else max_catch_up
    return _ticks.latest(spec, last_tick, now, count)


@dataclass(frozen=True, slots=True)
class ScheduleStatus:
    """A schedule as stored in ``cyclone_schedules``."""

    name: str
    workflow: str
    cron: str | None
    every: timedelta | None
    timezone: str
    missed: str
    max_catch_up: int
    paused: bool
    last_tick: datetime
    """The last tick fired (or the registration, or the resume), in UTC."""
    next_tick: datetime | None
    """The next tick to fire (None while paused, or when the cron extra is missing)."""
    updated_at: datetime


# -- operations ------------------------------------------------------------------------


def register(engine: Engine, defined: Sequence[Schedule]) -> None:
    """Insert or update the rows of ``defined``; one statement."""
    if defined:
        _schedules.register(engine, defined)


def _status(row: Any) -> ScheduleStatus:
    spec = _ticks.Spec(cron=row[2], every=row[3], timezone=row[4])
    # In UTC, whatever the session's time zone (see _store.schedules.lock).
    now: datetime = row[10].astimezone(UTC)
    last_tick: datetime = row[8].astimezone(UTC)
    next_tick = None
    if not row[7]:
        try:
            next_tick = _ticks.following(spec, max(last_tick, now))
        except Exception:  # cron extra missing, or a zone this host does not know
            next_tick = None
    return ScheduleStatus(
        name=row[0],
        workflow=row[1],
        cron=row[2],
        every=row[3],
        timezone=row[4],
        missed=row[5],
        max_catch_up=row[6],
        paused=row[7],
        last_tick=last_tick,
        next_tick=next_tick,
        updated_at=row[9].astimezone(UTC),
    )


def list_all(engine: Engine) -> list[ScheduleStatus]:
    """Every registered schedule, by name; one statement."""
    return [_status(row) for row in _schedules.list_rows(engine)]


def set_paused(engine: Engine, name: str, paused: bool) -> bool:
    """Pause or resume ``name``; resuming skips the ticks that fell while it was paused.

    Returns True if the schedule changed, False if it already was paused (or running):
    resuming a running schedule leaves it, and the ticks it is yet to catch up, alone.

    Raises:
        NotFoundError: no schedule of that name is registered.
    """
    changed = _schedules.set_paused(engine, name, paused)
    if changed is None:
        raise errors.NotFoundError(f"no schedule named {name!r} is registered")
    return changed


@dataclass(frozen=True, slots=True)
class Fired:
    """What one look at a schedule did: the ticks fired and when to look again (seconds)."""

    ticks: tuple[datetime, ...]
    wait: float


def fire(conn: Connection, schedule: Schedule) -> Fired:
    """Fire the due ticks of ``schedule`` in the caller's transaction (one schedule row lock).

    Statements: the row's ``SELECT ... FOR UPDATE SKIP LOCKED`` (with the database's
    now()); when ticks are due, one ``submit_once_tx`` per tick and the ``UPDATE`` of
    ``last_tick``. A locked row (another worker is firing it) is looked at again
    shortly; a missing one (deleted by hand) is registered again.
    """
    row = _schedules.lock(conn, schedule.name)
    if row is None:
        if not _schedules.exists(conn, schedule.name):
            _schedules.register_one(conn, schedule)  # deleted by hand: register it again
            return Fired((), 0.0)
        return Fired((), LOCKED_RETRY)
    last_tick: datetime = row.last_tick
    now: datetime = row.now
    if row.paused:
        log.debug("schedule %s is paused", schedule.name)
        return Fired((), MAX_SLEEP)
    spec = _ticks.Spec(cron=row.cron, every=row.every, timezone=row.timezone)
    try:
        ticks = _due(spec, row.missed, row.max_catch_up, last_tick, now)
    except (errors.DefinitionError, ZoneInfoNotFoundError, ValueError):
        # A definition this host cannot compute (the cron extra or the time zone missing
        # here): fire by the one in this worker's code.
        spec = schedule.spec
        ticks = schedule.due(last_tick, now)
    for tick in ticks:
        try:
            schedule.workflow.submit_once_tx(conn, schedule.key(tick), schedule.input_for(tick))
        except errors.SubmitConflictError as exc:
            # The tick's key already has a run with another input (submitted by hand, or
            # by an earlier definition): that run stands for the tick.
            log.warning("schedule %s: tick %s kept its existing run: %s", schedule.name, tick, exc)
    if ticks:
        _schedules.advance(conn, schedule.name, ticks[-1])
    following = _ticks.following(spec, max(last_tick, now, *ticks))
    wait = MAX_SLEEP if following is None else (following - now).total_seconds() + WAKE_SLACK
    return Fired(tuple(ticks), max(0.0, min(wait, MAX_SLEEP)))


@dataclass(slots=True)
class Failing:
    """A schedule whose last look failed: how many times in a row, and when to look again
    (``time.monotonic()`` seconds)."""

    failures: int
    retry_at: float


def fire_all(
    engine: Engine, defined: Iterable[Schedule], failing: dict[str, Failing] | None = None
) -> float:
    """Fire every schedule's due ticks, one transaction each; seconds until a tick is next due.

    A schedule whose look fails (its ``input`` callable raised or returned a value that is
    not the workflow's input, or the database failed) is looked at again after 1 s,
    doubling up to :data:`MAX_SLEEP`, counted in ``failing`` (the caller keeps it between
    calls), until a look succeeds: such a callable failed every second, for ever, each
    failure a transaction and a traceback in the log. Its ticks are not skipped. A look
    that failed to reach the database waits at most :data:`UNREACHABLE_MAX_SLEEP`, so the
    ticks of an outage fire soon after it ends.
    """
    failing = {} if failing is None else failing
    wait = MAX_SLEEP
    for schedule in sorted(defined, key=lambda s: s.name):
        held = failing.get(schedule.name)
        now = time.monotonic()
        if held is not None and held.retry_at > now:
            wait = min(wait, held.retry_at - now)
            continue
        try:
            with engine.begin() as conn:
                fired = fire(conn, schedule)
        except Exception as exc:
            failures = 1 if held is None else held.failures + 1
            cap = UNREACHABLE_MAX_SLEEP if lost_connection(exc) else MAX_SLEEP
            # _retry.doubling bounds its exponent: 2.0 ** 1024 overflowed here, and the
            # OverflowError left this loop, so no schedule after this one was looked at.
            delay = _retry.doubling(1.0, cap, failures)
            failing[schedule.name] = Failing(failures, time.monotonic() + delay)
            log.exception(
                "schedule %s could not fire (%d times in a row); will try again in %.0f s",
                schedule.name,
                failures,
                delay,
            )
            wait = min(wait, delay)
            continue
        failing.pop(schedule.name, None)
        if fired.ticks:
            log.info("schedule %s fired %d ticks", schedule.name, len(fired.ticks))
        wait = min(wait, fired.wait)
    return wait


class Stopping(Protocol):
    """What a scheduler reads of its worker's stop: whether it was asked."""

    def is_set(self) -> bool: ...


class Scheduler:
    """A worker's thread that registers its workflows' schedules and fires their ticks.

    It sleeps until the next tick of its schedules, or until ``cyclone_schedules_changed``
    (a schedule registered, paused or resumed anywhere) or :meth:`stop` wakes it.
    """

    def __init__(self, engine: Engine, defined: Sequence[Schedule], stop: Stopping):
        self.engine = engine
        self.defined = list(defined)
        self._stop = stop
        self._woken = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cyclone-scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self, _payload: str = "") -> None:
        """Look at the schedules now (a notification's callback, and :meth:`stop`'s)."""
        self._woken.set()

    def stop(self) -> None:
        """End the thread once the worker's stop event is set (wakes it from its sleep)."""
        self._woken.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _loop(self) -> None:
        listener = _notify.listener(self.engine)
        unsubscribe = listener.subscribe(_notify.SCHEDULES_CHANGED, self.wake)
        try:
            registered = False
            failing: dict[str, Failing] = {}
            while not self._stop.is_set():
                # Cleared before the look: a notification during it makes another look.
                self._woken.clear()
                wait = 1.0
                try:
                    if not registered:
                        register(self.engine, self.defined)
                        registered = True
                    wait = fire_all(self.engine, self.defined, failing)
                except Exception:
                    log.exception("scheduler could not register its schedules; will try again")
                if not listener.wait_ready(0):
                    wait = min(wait, UNHEARD_SLEEP)
                self._woken.wait(wait)
        finally:
            unsubscribe()


def collect(workflows: Iterable[Workflow[Any]]) -> list[Schedule]:
    """The schedules of ``workflows``; a name used by two of them is a DefinitionError."""
    found: dict[str, Schedule] = {}
    for wf in workflows:
        for schedule in wf.schedules.values():
            other = found.get(schedule.name)
            if other is not None and other is not schedule:
                raise errors.DefinitionError(
                    f"schedule {schedule.name!r} is defined by workflows {other.workflow.name!r} "
                    f"and {wf.name!r}; schedule names are global"
                )
            found[schedule.name] = schedule
    return list(found.values())
