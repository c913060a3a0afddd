"""Paused queues: pause and resume a queue, read which are paused, and the claim's test.

A queue is paused by its row in ``cyclone_queues`` (revision cyclone_0012); a queue with
no row, or a row not paused, is served. The claim statement leaves the jobs of paused
queues available (:func:`served`); resuming rings ``cyclone_jobs_available`` in the same
statement, as a submit does, so that idle workers claim the queue's jobs at once.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Boolean, Connection, Engine, Text, bindparam, func, select, update
from sqlalchemy.dialects.postgresql import array, insert

from cyclone._store import binds as _binds
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone.schema import queues


def paused_names() -> Any:
    """The names of the paused queues, as an array: an uncorrelated subquery, which
    PostgreSQL runs once per statement (an InitPlan), whatever the rows it filters."""
    return func.array(select(queues.c.name).where(queues.c.paused).scalar_subquery())


def served(queue: Any) -> Any:
    """True for a job whose ``queue`` is not paused: ``NOT (ARRAY[queue] <@ paused)``.

    Written as an array containment, not ``queue <> ALL(paused)``: in a generic plan the
    planner cannot see the array, and estimates ``<> ALL`` from the queue column's
    statistics (with a few queues, as if nearly no job passed), which turns the claim's
    ordered index scan under ``LIMIT`` into a read and sort of the whole backlog; it
    estimates a containment as rarely true (0.5 %), so the test changes no plan. With no
    queue paused the array is empty and the test costs one comparison a row.
    """
    return ~array([queue], type_=Text).op("<@", return_type=Boolean)(paused_names())


def pause_queue_stmt() -> Any:
    """Pause queue ``:name``; returns its name if it was not paused before."""
    now = func.now()
    stmt = insert(queues).values(
        name=bindparam("queue", type_=Text), paused=True, paused_at=now, updated_at=now
    )
    return stmt.on_conflict_do_update(
        index_elements=[queues.c.name],
        set_={"paused": True, "paused_at": now, "updated_at": now},
        where=queues.c.paused.is_(False),
    ).returning(queues.c.name)


def resume_queue_stmt() -> Any:
    """Resume queue ``:name`` if it is paused, ringing NOTIFY for its jobs; returns its name."""
    return (
        update(queues)
        .where(queues.c.name == bindparam("queue", type_=Text), queues.c.paused)
        .values(paused=False, paused_at=None, updated_at=func.now())
        .returning(queues.c.name, _notify.ring().label("rang"))
    )


_PAUSE = pause_queue_stmt()
_RESUME = resume_queue_stmt()
_LIST = select(queues.c.name, queues.c.paused, queues.c.paused_at).order_by(queues.c.name)


def pause(engine: Engine, name: str) -> bool:
    """Pause queue ``name``; True if it was not paused before."""
    with _binds.autocommit(engine) as conn:
        return _executor.first(conn, _PAUSE, {"queue": name}) is not None


def resume(engine: Engine, name: str) -> bool:
    """Resume queue ``name``; True if it was paused."""
    with _binds.autocommit(engine) as conn:
        return _executor.first(conn, _RESUME, {"queue": name}) is not None


def recorded(conn: Connection) -> list[tuple[str, bool, datetime | None]]:
    """``(name, paused, paused_at)`` of every queue ever paused, by name."""
    return [(name, paused, paused_at) for name, paused, paused_at in _executor.rows(conn, _LIST)]
