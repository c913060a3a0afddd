"""The statements of ``cyclone_schedules``: register, list, pause and resume schedules,
and lock, advance or re-register one while its ticks are fired (:mod:`cyclone.schedules`
decides which ticks are due and submits them).

Every statement that changes a schedule's definition or its paused flag also sends
``NOTIFY cyclone_schedules_changed`` (in its ``RETURNING``, so only for the rows it
changed): running workers' schedulers re-read their schedules at once instead of at their
next tick (or a minute later, for a paused one)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import Connection, Engine, bindparam, case, func, select, update
from sqlalchemy.dialects.postgresql import insert

from cyclone._store import executor as _executor
from cyclone._store.executor import const
from cyclone._store.notify import SCHEDULES_CHANGED
from cyclone.schema import schedules

if TYPE_CHECKING:
    from cyclone.schedules import Schedule


def upsert_stmt(rows: Sequence[Schedule]) -> Any:
    """Register schedules: a new one starts at now (no past ticks), a known one keeps its
    ``paused`` and takes the definition given, and keeps its ``last_tick`` unless its
    cron, interval or time zone changed (then it starts at now, as a new one)."""
    stmt = insert(schedules).values(
        [
            {
                "name": s.name,
                "workflow": s.workflow.name,
                "cron": s.spec.cron,
                "every": s.spec.every,
                "timezone": s.spec.timezone,
                "missed": s.missed,
                "max_catch_up": s.max_catch_up,
                "last_tick": func.now(),
            }
            for s in rows
        ]
    )
    changed = ("workflow", "cron", "every", "timezone", "missed", "max_catch_up")
    timing = ("cron", "every", "timezone")
    excluded = stmt.excluded
    # A new cron, interval or time zone starts at its registration, as a new schedule
    # does: from the old definition's last tick (hours or days back), a catch_up
    # schedule fired at once up to max_catch_up of the new one's ticks from before it.
    retimed = func.row(*(schedules.c[c] for c in timing)).is_distinct_from(
        func.row(*(excluded[c] for c in timing))
    )
    last_tick = case(
        (retimed, func.greatest(schedules.c.last_tick, func.now())),
        else_=schedules.c.last_tick,
    )
    return stmt.on_conflict_do_update(
        index_elements=[schedules.c.name],
        set_={
            **{c: excluded[c] for c in changed},
            "last_tick": last_tick,
            "updated_at": func.now(),
        },
        where=func.row(*(schedules.c[c] for c in changed)).is_distinct_from(
            func.row(*(excluded[c] for c in changed))
        ),
    ).returning(_notified())


def _notified() -> Any:
    """A ``RETURNING`` column: NOTIFY the schedulers that this row changed."""
    return func.pg_notify(const(SCHEDULES_CHANGED), schedules.c.name).label("notified")


_LOCK = (
    select(
        schedules.c.paused,
        schedules.c.last_tick,
        func.now().label("now"),
        schedules.c.cron,
        schedules.c.every,
        schedules.c.timezone,
        schedules.c.missed,
        schedules.c.max_catch_up,
    )
    .where(schedules.c.name == bindparam("schedule"))
    .with_for_update(skip_locked=True)
)
_EXISTS = select(schedules.c.name).where(schedules.c.name == bindparam("schedule"))
_ADVANCE = (
    update(schedules)
    .where(schedules.c.name == bindparam("schedule"))
    .values(last_tick=bindparam("tick", type_=schedules.c.last_tick.type))
)
_STATUS_COLUMNS = (
    schedules.c.name,
    schedules.c.workflow,
    schedules.c.cron,
    schedules.c.every,
    schedules.c.timezone,
    schedules.c.missed,
    schedules.c.max_catch_up,
    schedules.c.paused,
    schedules.c.last_tick,
    schedules.c.updated_at,
)
_LIST = select(*_STATUS_COLUMNS, func.now()).order_by(schedules.c.name)


def _set_paused_stmt(paused: bool) -> Any:
    """Pause or resume one schedule, one ``UPDATE ... RETURNING``: whether it changed
    (its ``paused`` flag before, read from the locked row), no row when it is unknown.

    Resuming moves ``last_tick`` to now only when the schedule was paused (the ticks that
    fell while it was paused are never fired): it did so for a running schedule too,
    which silently dropped the ticks it missed while no worker ran (``missed="catch_up"``).
    Either way the row is written and the schedulers notified, as before.
    """
    before = (
        select(schedules.c.name, schedules.c.paused)
        .where(schedules.c.name == bindparam("schedule"))
        .with_for_update()
        .subquery("before")
    )
    values: dict[str, Any] = {"paused": paused, "updated_at": func.now()}
    if not paused:
        values["last_tick"] = case(
            (schedules.c.paused, func.greatest(schedules.c.last_tick, func.now())),
            else_=schedules.c.last_tick,
        )
    return (
        update(schedules)
        .where(schedules.c.name == before.c.name)
        .values(**values)
        .returning((before.c.paused != paused).label("changed"), _notified())
    )


_PAUSE = _set_paused_stmt(True)
_RESUME = _set_paused_stmt(False)


def register(engine: Engine, defined: Sequence[Schedule]) -> None:
    """Insert or update the rows of ``defined``, in name order; one statement."""
    with engine.begin() as conn:
        _executor.affected(conn, upsert_stmt(sorted(defined, key=lambda s: s.name)))


def list_rows(engine: Engine) -> list[_executor.Row]:
    """Every registered schedule's row and the database's now(), by name; one statement."""
    with engine.connect() as conn:
        return _executor.rows(conn, _LIST)


def set_paused(engine: Engine, name: str, paused: bool) -> bool | None:
    """Pause or resume ``name``: True if it changed, False if it already was so, None
    when no schedule of that name is registered."""
    with engine.begin() as conn:
        found = _executor.first(conn, _PAUSE if paused else _RESUME, {"schedule": name})
    return None if found is None else bool(found[0])


class Locked(NamedTuple):
    """A schedule's row as :func:`lock` read it, with the database's now()."""

    paused: bool
    last_tick: datetime
    now: datetime
    cron: str | None
    every: timedelta | None
    timezone: str
    missed: str
    max_catch_up: int


def lock(conn: Connection, name: str) -> Locked | None:
    """Lock schedule ``name``'s row, skipping it if locked: its ``paused``, ``last_tick``,
    the database's now() and the registered definition (``cron``, ``every``,
    ``timezone``, ``missed``, ``max_catch_up``), or None when it is locked or missing."""
    row = _executor.first(conn, _LOCK, {"schedule": name})
    if row is None:
        return None
    locked = Locked(*row)
    # In UTC: psycopg gives a timestamptz in the session's time zone, and Python compares
    # two datetimes of one zone by their wall-clock time, so in the hour the session's
    # clocks go back a later now() came before an earlier last_tick.
    return locked._replace(
        last_tick=locked.last_tick.astimezone(UTC), now=locked.now.astimezone(UTC)
    )


def exists(conn: Connection, name: str) -> bool:
    """Whether schedule ``name`` has a row."""
    return _executor.first(conn, _EXISTS, {"schedule": name}) is not None


def register_one(conn: Connection, schedule: Schedule) -> None:
    """Register ``schedule`` in the caller's transaction."""
    _executor.affected(conn, upsert_stmt([schedule]))


def advance(conn: Connection, name: str, tick: datetime) -> None:
    """Move schedule ``name``'s ``last_tick`` to ``tick``."""
    _executor.affected(conn, _ADVANCE, {"schedule": name, "tick": tick})
