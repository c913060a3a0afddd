"""The statements of standalone jobs: insert one unless its unique key is held, find the
key's holder, and cancel a job before it starts.

A unique key is held only while its job is active (available, blocked or running); a
partial unique index enforces it, so concurrent enqueues from many processes cannot
both win.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Interval, Text, bindparam, cast, func, select, update
from sqlalchemy.dialects.postgresql import JSONB, insert

from cyclone import errors
from cyclone._store import binds as _binds
from cyclone._store import fastpath as _fastpath
from cyclone._store import notify as _notify
from cyclone._store.fastpath import const
from cyclone.schema import jobs
from cyclone.states import ACTIVE_JOB_STATES, EDGES, JobState

# The states are rendered inline, not bound: PostgreSQL infers the partial unique index
# from ON CONFLICT ... WHERE only when the predicate is constant, and a bound predicate
# fails once psycopg prepares the statement (a generic plan) after a few executions.
_UNIQUE_WHERE = jobs.c.unique_key.is_not(None) & jobs.c.state.in_(
    [const(s.value) for s in sorted(ACTIVE_JOB_STATES)]
)


def insert_job_stmt() -> Any:
    """Insert a standalone job unless an active job of its kind holds its unique key."""
    return (
        insert(jobs)
        .values(
            kind=bindparam("kind", type_=Text),
            queue=bindparam("queue", type_=Text),
            priority=bindparam("priority"),
            state=JobState.AVAILABLE.value,
            args=cast(bindparam("args", type_=Text), JSONB),
            max_attempts=bindparam("max_attempts"),
            unique_key=bindparam("unique", type_=Text),
            trace_context=bindparam("trace_context", None, type_=Text),
            limit_name=bindparam("limit_name", None, type_=Text),
            limit_key=bindparam("limit_key", None, type_=Text),
            scheduled_at=func.coalesce(
                bindparam("run_at", type_=jobs.c.scheduled_at.type),
                func.now()
                + func.coalesce(bindparam("delay", type_=Interval), func.make_interval()),
            ),
        )
        .on_conflict_do_nothing(
            index_elements=[jobs.c.kind, jobs.c.unique_key], index_where=_UNIQUE_WHERE
        )
        .returning(jobs.c.id, _notify.when_available(jobs.c.state))
    )


def select_active_holder_stmt() -> Any:
    return select(jobs.c.id).where(
        jobs.c.kind == bindparam("kind", type_=Text),
        jobs.c.unique_key == bindparam("unique", type_=Text),
        jobs.c.state.in_([const(s.value) for s in sorted(ACTIVE_JOB_STATES)]),
    )


INSERT_JOB = _fastpath.Compiled(insert_job_stmt())
SELECT_HOLDER = _fastpath.Compiled(select_active_holder_stmt())


def insert_job(conn: _fastpath.Executor, params: dict[str, Any]) -> int | None:
    """Insert a standalone job; its id, or None when its unique key is held."""
    inserted = conn.execute(INSERT_JOB, params)
    return int(inserted[0][0]) if inserted else None


def holder_of(conn: _fastpath.Executor, params: dict[str, Any]) -> int | None:
    """The id of the active job holding the unique key of ``params``, or None."""
    holders = conn.execute(SELECT_HOLDER, params)
    return int(holders[0][0]) if holders else None


def cancel_job_stmt() -> Any:
    """Cancel a standalone job that has not started; returns nothing otherwise."""
    edge = EDGES["job.cancel"]
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_id"),
            jobs.c.run_id.is_(None),
            jobs.c.state.in_([const(s) for s in edge.sources]),
        )
        .values(state=const(edge.target), finalized_at=func.now())
        .returning(jobs.c.id)
    )


_CANCEL_JOB = cancel_job_stmt()
_SELECT_STANDALONE_STATE = select(jobs.c.state).where(
    jobs.c.id == bindparam("job_id"), jobs.c.run_id.is_(None)
)


def cancel_job(engine: Engine, job_id: int) -> None:
    """Cancel a standalone job that has not started; one guarded UPDATE.

    Raises:
        NotFoundError: no standalone job has this id.
        InvalidStateError: the job is running or has ended.
    """
    with _binds.autocommit(engine) as conn:
        if conn.execute(_CANCEL_JOB, {"job_id": job_id}).first() is not None:
            return
        state = conn.execute(_SELECT_STANDALONE_STATE, {"job_id": job_id}).scalar()
    if state is None:
        raise errors.NotFoundError(f"standalone job {job_id} does not exist")
    raise errors.InvalidStateError(operation="cancel", run_id=job_id, state=state, what="job")
