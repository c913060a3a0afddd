"""Persist job outcomes and advance the DAG in the same transaction.

Successes are written in one statement per batch: mark the jobs completed (guarded by
state, attempt and worker, so a rescued or cancelled job's late outcome is dropped),
decrement the pending count of their dependents (a join node becomes available exactly
once, even when its predecessors finish concurrently, because each decrement locks the
row), and count the run's remaining steps down to completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB

from cyclone._fastpath import const
from cyclone.schema import jobs, runs
from cyclone.states import JobState, RunState


@dataclass(frozen=True, slots=True)
class Success:
    job_id: int
    attempt: int
    output: str


@dataclass(frozen=True, slots=True)
class Failure:
    job_id: int
    attempt: int
    error: dict[str, Any]
    retry_in: float | None
    """Seconds until the next attempt, or None when the job fails for good."""


def complete_jobs_ctes() -> tuple[Any, Any, Any]:
    """The CTEs that complete ``:items`` and advance the DAG: ``(done, advanced, finished)``.

    They change rows when a statement carries them, whether or not it reads them, so the
    worker's claim statement carries them too: one statement records and claims.
    """
    done_items = (
        func.jsonb_to_recordset(cast(bindparam("items", type_=Text), JSONB))
        .table_valued(column("id", BigInteger), column("attempt", Integer), column("output", Text))
        .render_derived("v", with_types=True)
    )
    done = (
        update(jobs)
        .where(
            jobs.c.id == done_items.c.id,
            jobs.c.attempt == done_items.c.attempt,
            jobs.c.state == const(JobState.RUNNING.value),
            jobs.c.worker_id == bindparam("me", type_=Text),
        )
        .values(
            state=const(JobState.COMPLETED.value),
            output=cast(done_items.c.output, JSONB),
            finalized_at=func.now(),
            heartbeat_at=None,
        )
        .returning(jobs.c.id, jobs.c.run_id, jobs.c.kind)
        .cte("done")
    )
    dependent = jobs.alias("dependent")
    unblocked_counts = (
        select(dependent.c.id, func.count().label("n"))
        .select_from(
            dependent.join(
                done,
                and_(
                    dependent.c.run_id == done.c.run_id, done.c.kind == func.any(dependent.c.deps)
                ),
            )
        )
        .where(dependent.c.state == const(JobState.BLOCKED.value))
        .group_by(dependent.c.id)
        .subquery("c")
    )
    left = jobs.c.pending_deps - unblocked_counts.c.n
    advanced = (
        update(jobs)
        .where(jobs.c.id == unblocked_counts.c.id, jobs.c.state == const(JobState.BLOCKED.value))
        .values(
            pending_deps=left,
            state=case(
                (left == const(0, Integer), const(JobState.AVAILABLE.value)),
                else_=const(JobState.BLOCKED.value),
            ),
        )
        .returning(jobs.c.id)
        .cte("advanced")
    )
    per_run = (
        select(done.c.run_id, func.count().label("n"))
        .where(done.c.run_id.is_not(None))
        .group_by(done.c.run_id)
        .subquery("r")
    )
    remaining = runs.c.steps_remaining - per_run.c.n
    # A run whose deadline passed before its last step ended is left to the deadline
    # sweep, which fails it: it was still running when its deadline passed.
    completes = and_(
        remaining == const(0, Integer), or_(runs.c.deadline.is_(None), runs.c.deadline > func.now())
    )
    finished = (
        update(runs)
        .where(runs.c.id == per_run.c.run_id, runs.c.state == const(RunState.RUNNING.value))
        .values(
            steps_remaining=remaining,
            state=case((completes, const(RunState.COMPLETED.value)), else_=runs.c.state),
            finalized_at=case((completes, func.now()), else_=None),
        )
        .returning(runs.c.id)
        .cte("finished")
    )
    return done, advanced, finished


def complete_jobs_stmt() -> Any:
    """Complete ``:items`` alone; rows: how many jobs completed, advanced, runs finished."""
    done, advanced, finished = complete_jobs_ctes()
    return select(
        select(func.count()).select_from(done).scalar_subquery(),
        select(func.count()).select_from(advanced).scalar_subquery(),
        select(func.count()).select_from(finished).scalar_subquery(),
    )


def run_over() -> Any:
    """True for a job of a run that is no longer running (cancelled, failed, completed)."""
    return exists().where(runs.c.id == jobs.c.run_id, runs.c.state != const(RunState.RUNNING.value))


def retry_job_stmt() -> Any:
    """Record a failed attempt and make the job available again after its backoff.

    A job whose run ended meanwhile (cancelled, or failed by another step) is cancelled
    instead: a run that is over starts no new attempts.
    """
    over = run_over()
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_id"),
            jobs.c.attempt == bindparam("attempt_no"),
            jobs.c.state == const(JobState.RUNNING.value),
            jobs.c.worker_id == bindparam("me", type_=Text),
        )
        .values(
            state=case(
                (over, const(JobState.CANCELLED.value)), else_=const(JobState.AVAILABLE.value)
            ),
            finalized_at=case((over, func.now()), else_=None),
            worker_id=None,
            heartbeat_at=None,
            scheduled_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("delay")),
            errors=jobs.c.errors.op("||")(cast(bindparam("error", type_=Text), JSONB)),
        )
        .returning(jobs.c.id)
    )


def fail_job_stmt() -> Any:
    """Record the last failed attempt and fail the job; returns its run, if any."""
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_id"),
            jobs.c.attempt == bindparam("attempt_no"),
            jobs.c.state == const(JobState.RUNNING.value),
            jobs.c.worker_id == bindparam("me", type_=Text),
        )
        .values(
            state=const(JobState.FAILED.value),
            finalized_at=func.now(),
            heartbeat_at=None,
            errors=jobs.c.errors.op("||")(cast(bindparam("error", type_=Text), JSONB)),
        )
        .returning(jobs.c.run_id, jobs.c.kind)
    )


def fail_run_stmt() -> Any:
    """Fail a running run because one of its steps failed for good."""
    return (
        update(runs)
        .where(runs.c.id == bindparam("rid"), runs.c.state == const(RunState.RUNNING.value))
        .values(
            state=const(RunState.FAILED.value),
            finalized_at=func.now(),
            failed_step=bindparam("step", type_=Text),
            error=cast(bindparam("error", type_=Text), JSONB),
        )
        .returning(runs.c.id)
    )


def cancel_unstarted_stmt() -> Any:
    """Cancel the steps of a run that have not started."""
    return (
        update(jobs)
        .where(
            jobs.c.run_id == bindparam("rid"),
            jobs.c.state.in_([const(JobState.BLOCKED.value), const(JobState.AVAILABLE.value)]),
        )
        .values(state=const(JobState.CANCELLED.value), finalized_at=func.now())
    )


_COMPLETE = complete_jobs_stmt()
_RETRY = retry_job_stmt()
_FAIL_JOB = fail_job_stmt()
_FAIL_RUN = fail_run_stmt()
CANCEL_UNSTARTED = cancel_unstarted_stmt()


def items_payload(successes: Sequence[Success]) -> str:
    """The ``:items`` jsonb array of the complete statement."""
    return msgspec.json.encode(
        [{"id": s.job_id, "attempt": s.attempt, "output": s.output} for s in successes]
    ).decode()


def record(
    conn: Connection,
    worker_id: str,
    successes: Sequence[Success],
    failures: Sequence[Failure],
) -> None:
    """Write a batch of outcomes in the caller's transaction."""
    if successes:
        conn.execute(_COMPLETE, {"items": items_payload(successes), "me": worker_id})
    for failure in failures:
        error = msgspec.json.encode(failure.error).decode()
        params = {
            "job_id": failure.job_id,
            "attempt_no": failure.attempt,
            "me": worker_id,
            "error": f"[{error}]",
        }
        if failure.retry_in is not None:
            conn.execute(_RETRY, {**params, "delay": failure.retry_in})
            continue
        row = conn.execute(_FAIL_JOB, params).first()
        if row is None or row[0] is None:
            continue
        run_id, step = row
        fail_run(conn, run_id, step, failure.error)


def fail_run(conn: Connection, run_id: Any, step: str, error: dict[str, Any]) -> None:
    """Fail a running run because ``step`` failed for good, and cancel its unstarted steps."""
    params = {"rid": run_id, "step": step, "error": msgspec.json.encode(error).decode()}
    if conn.execute(_FAIL_RUN, params).first() is not None:
        conn.execute(CANCEL_UNSTARTED, {"rid": run_id})
