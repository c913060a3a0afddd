"""The statements of standalone jobs: insert one unless its unique key is held, find the
key's holder, cancel a job before it starts, and retry one that failed or was cancelled.

A unique key is held only while its job is active (available, blocked or running); a
partial unique index enforces it, so concurrent enqueues from many processes cannot
both win.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, Interval, Text, bindparam, cast, func, null, select, update
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.exc import IntegrityError

from cyclone import errors
from cyclone._store import binds as _binds
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone._store.executor import const
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
            rate_name=bindparam("rate_name", None, type_=Text),
            rate_key=bindparam("rate_key", None, type_=Text),
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


INSERT_JOB = _executor.Compiled(insert_job_stmt())
SELECT_HOLDER = _executor.Compiled(select_active_holder_stmt())


def insert_job(conn: _executor.Executor, params: dict[str, Any]) -> int | None:
    """Insert a standalone job; its id, or None when its unique key is held."""
    inserted = conn.rows(INSERT_JOB, params)
    return int(inserted[0][0]) if inserted else None


def holder_of(conn: _executor.Executor, params: dict[str, Any]) -> int | None:
    """The id of the active job holding the unique key of ``params``, or None."""
    holders = conn.rows(SELECT_HOLDER, params)
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
        if _executor.first(conn, _CANCEL_JOB, {"job_id": job_id}) is not None:
            return
        state = _executor.value(conn, _SELECT_STANDALONE_STATE, {"job_id": job_id})
        step = (
            None if state is not None else _executor.first(conn, _SELECT_STEP, {"job_id": job_id})
        )
    if state is None:
        raise errors.NotFoundError(not_standalone(job_id, step))
    raise errors.InvalidStateError(operation="cancel", run_id=job_id, state=state, what="job")


_SELECT_STEP = select(jobs.c.kind, jobs.c.run_id).where(
    jobs.c.id == bindparam("job_id"), jobs.c.run_id.is_not(None)
)


def not_standalone(job_id: int, step: Any) -> str:
    """Why job ``job_id`` is not found as a standalone job: it does not exist, or it is a
    step of a run. Worker logs name the jobs of steps (a hand-back, a rescue), so an
    operator looking one up is told which run it belongs to, not that it does not exist."""
    if step is None:
        return f"standalone job {job_id} does not exist"
    kind, run_id = step
    return f"job {job_id} is step {kind} of run {run_id}, not a standalone job (see the run)"


def retry_standalone_job_stmt() -> Any:
    """Make a failed or cancelled standalone job available again, its attempts afresh.

    Its errors and output are cleared (its attempts count from one again); its lease only
    grows, as always. The ``UPDATE`` rings NOTIFY through the jobs' state trigger.
    """
    edge = EDGES["job.retry"]
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_id"),
            jobs.c.run_id.is_(None),
            jobs.c.state.in_([const(s) for s in edge.sources]),
        )
        .values(
            state=const(edge.target),
            attempt=0,
            lost=0,
            errors=cast(const("[]"), JSONB),
            output=null(),
            worker_id=None,
            heartbeat_at=None,
            finalized_at=None,
            scheduled_at=func.now(),
        )
        .returning(jobs.c.id)
    )


_RETRY_JOB = retry_standalone_job_stmt()
_SELECT_JOB = select(jobs.c.state, jobs.c.run_id, jobs.c.kind, jobs.c.unique_key).where(
    jobs.c.id == bindparam("job_id")
)
_UNIQUE_INDEX = "ix_cyclone_jobs_unique_key"


def retry_job(engine: Engine, job_id: int) -> None:
    """Run a failed or cancelled standalone job again; one guarded UPDATE.

    Raises:
        NotFoundError: no job has this id.
        InvalidStateError: the job is not failed or cancelled, or is a step of a run.
        DuplicateError: another active job of its kind holds its unique key now.
    """
    try:
        with _binds.autocommit(engine) as conn:
            if _executor.first(conn, _RETRY_JOB, {"job_id": job_id}) is not None:
                return
            row = _executor.first(conn, _SELECT_JOB, {"job_id": job_id})
    except IntegrityError as exc:
        if getattr(getattr(exc.orig, "diag", None), "constraint_name", None) != _UNIQUE_INDEX:
            raise
        with _binds.autocommit(engine) as conn:
            row = _executor.first(conn, _SELECT_JOB, {"job_id": job_id})
            assert row is not None
            _, _, kind, unique_key = row
            params = {"kind": kind, "unique": unique_key}
            holder = _executor.value(conn, select_active_holder_stmt(), params)
        raise errors.DuplicateError(kind=kind, key=unique_key, job_id=holder or 0) from exc
    if row is None:
        raise errors.NotFoundError(f"job {job_id} does not exist")
    state, run_id, _, _ = row
    if run_id is not None:
        raise errors.InvalidStateError(
            operation="retry",
            run_id=job_id,
            state=f"a step of run {run_id} (retry the run instead)",
            what="job",
        )
    raise errors.InvalidStateError(operation="retry", run_id=job_id, state=state, what="job")
