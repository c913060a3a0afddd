"""Standalone jobs: ``enqueue`` / ``enqueue_tx`` with unique keys, and the ``Job`` handle.

A unique key is held only while its job is active (available, blocked or running); a
partial unique index enforces it, so concurrent enqueues from many processes cannot
both win.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from sqlalchemy import (
    Engine,
    Interval,
    Text,
    bindparam,
    cast,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert

from cyclone import _binds, _codec, _fastpath, _notify, _observe, errors
from cyclone._fastpath import const
from cyclone.runs import read_within, wait_until_finished
from cyclone.schema import jobs
from cyclone.states import ACTIVE_JOB_STATES, EDGES, TERMINAL_JOB_STATES, JobState

R = TypeVar("R")

_MAX_RACE_RETRIES = 5
# The states are rendered inline, not bound: PostgreSQL infers the partial unique index
# from ON CONFLICT ... WHERE only when the predicate is constant, and a bound predicate
# fails once psycopg prepares the statement (a generic plan) after a few executions.
_UNIQUE_WHERE = jobs.c.unique_key.is_not(None) & jobs.c.state.in_(
    [_fastpath.const(s.value) for s in sorted(ACTIVE_JOB_STATES)]
)


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """A validated, encoded enqueue."""

    kind: str
    args: str
    unique: str | None
    run_at: datetime | None
    delay: timedelta | None
    queue: str
    priority: int
    max_attempts: int
    output_type: Any


@dataclass(frozen=True, slots=True)
class JobStatus:
    """A snapshot of one standalone job."""

    id: int
    kind: str
    key: str | None
    queue: str
    priority: int
    state: JobState
    attempt: int
    max_attempts: int
    created_at: datetime
    scheduled_at: datetime
    finished_at: datetime | None
    errors: list[dict[str, Any]]

    @property
    def done(self) -> bool:
        """True once the job is completed, failed or cancelled."""
        return self.state in TERMINAL_JOB_STATES


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
        jobs.c.state.in_([_fastpath.const(s.value) for s in sorted(ACTIVE_JOB_STATES)]),
    )


JOB_STATUS_COLUMNS = (
    jobs.c.id,
    jobs.c.kind,
    jobs.c.unique_key,
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.state,
    jobs.c.attempt,
    jobs.c.max_attempts,
    jobs.c.created_at,
    jobs.c.scheduled_at,
    jobs.c.finalized_at,
    cast(jobs.c.errors, Text),
)


def job_status_from_row(row: Any) -> JobStatus:
    return JobStatus(
        id=row[0],
        kind=row[1],
        key=row[2],
        queue=row[3],
        priority=row[4],
        state=JobState(row[5]),
        attempt=row[6],
        max_attempts=row[7],
        created_at=row[8],
        scheduled_at=row[9],
        finished_at=row[10],
        errors=_codec.decode(row[11]),
    )


_FAST_INSERT_JOB = _fastpath.Compiled(insert_job_stmt())
_FAST_SELECT_HOLDER = _fastpath.Compiled(select_active_holder_stmt())
_SELECT_JOB = select(*JOB_STATUS_COLUMNS).where(jobs.c.id == bindparam("job_id"))
_SELECT_OUTPUT = select(jobs.c.state, cast(jobs.c.output, Text)).where(
    jobs.c.id == bindparam("job_id")
)


def cancel_job_stmt() -> Any:
    """Cancel a standalone job that has not started; returns nothing otherwise."""
    edge = EDGES["job.cancel_unstarted"]
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


TRANSITIONS = {cancel_job_stmt: ("job.cancel_unstarted",)}
"""The edges of :data:`cyclone.states.EDGES` each statement of this module implements."""

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


class Job(Generic[R]):
    """A handle on one standalone job."""

    def __init__(
        self, engine: Engine, job_id: int, kind: str, key: str | None, output_type: Any = Any
    ) -> None:
        self._engine = engine
        self.id = job_id
        self.kind = kind
        self.key = key
        self.output_type = output_type

    def __repr__(self) -> str:
        return f"<Job {self.id} kind={self.kind!r} key={self.key!r}>"

    def status(self) -> JobStatus:
        """The job's current status.

        Raises:
            NotFoundError: the job was pruned, or its transaction did not commit.
        """
        with _binds.autocommit(self._engine) as conn:
            row = conn.execute(_SELECT_JOB, {"job_id": self.id}).first()
        if row is None:
            raise errors.NotFoundError(f"job {self.id} does not exist (pruned, or not committed)")
        return job_status_from_row(row)

    def cancel(self) -> None:
        """Cancel the job if it has not started (a running job finishes its attempt).

        Raises:
            InvalidStateError: the job is running or has ended.
        """
        cancel_job(self._engine, self.id)

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Wait until the job is completed, failed or cancelled; return its status.

        Raises:
            TimeoutError: ``timeout`` seconds passed first.
        """

        def read() -> JobStatus | None:
            status = self.status()
            return status if status.done else None

        result: JobStatus = wait_until_finished(self._engine, f"job:{self.id}", timeout, read)
        return result

    def _read_output(self) -> str | None:
        with _binds.autocommit(self._engine) as conn:
            output: str | None = conn.execute(_SELECT_OUTPUT, {"job_id": self.id}).one()[1]
        return output

    def result(self, timeout: float | None = None) -> R:
        """Wait for the job and return its output, decoded to the step's return type.

        Raises:
            RunFailedError: the job failed or was cancelled.
            TimeoutError: ``timeout`` seconds passed first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        status = self.wait(timeout)
        if status.state != JobState.COMPLETED:
            raise errors.RunFailedError(
                run_id=self.id,
                workflow=self.kind,
                state=status.state.value,
                step=self.kind,
                error=status.errors[-1] if status.errors else None,
            )
        output = read_within(self._read_output, deadline, f"job:{self.id}")
        value: R = _codec.decode(output or "null", self.output_type)
        return value


def _enqueue(conn: _fastpath.Executor, engine: Engine, req: EnqueueRequest) -> Job[Any]:
    params = {
        "kind": req.kind,
        "queue": req.queue,
        "priority": req.priority,
        "args": req.args,
        "max_attempts": req.max_attempts,
        "unique": req.unique,
        "run_at": req.run_at,
        "delay": req.delay,
        "trace_context": _observe.trace_context(),
    }
    for _ in range(_MAX_RACE_RETRIES):
        inserted = conn.execute(_FAST_INSERT_JOB, params)
        if inserted:
            return Job(engine, inserted[0][0], req.kind, req.unique, req.output_type)
        holders = conn.execute(_FAST_SELECT_HOLDER, params)
        if holders:
            holder = holders[0][0]
            assert req.unique is not None
            raise errors.DuplicateError(kind=req.kind, key=req.unique, job_id=holder)
    raise RuntimeError(f"unique key {req.unique!r} kept changing hands while enqueueing")


@_observe.submits
def enqueue(bind: _binds.Bind, req: EnqueueRequest) -> Job[Any]:
    engine = _binds.engine_of(bind)
    with _fastpath.connect(engine) as conn:
        return _enqueue(conn, engine, req)


@_observe.submits
def enqueue_tx(conn: _binds.Conn, req: EnqueueRequest) -> Job[Any]:
    executor, engine = _binds.joined(conn)
    return _enqueue(executor, engine, req)
