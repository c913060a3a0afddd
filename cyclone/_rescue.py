"""Heartbeats of running jobs, rescue of jobs whose worker stopped beating, and deadlines."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Interval,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONPATH

from cyclone import _completion
from cyclone._completion import run_over
from cyclone.schema import jobs, runs
from cyclone.states import JobState, RunState

MIN_LOSSES = 3
"""A job is failed, not handed back, once lost with its worker max(max_attempts, this) times."""


def heartbeat_stmt() -> Any:
    """Mark the jobs this worker is running alive (only those it still tracks)."""
    return (
        update(jobs)
        .where(
            jobs.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger))),
            jobs.c.worker_id == bindparam("me", type_=Text),
            jobs.c.state == JobState.RUNNING.value,
        )
        .values(heartbeat_at=func.now())
    )


def rescue_jobs_stmt() -> Any:
    """Hand back running jobs whose worker has not beaten for ``rescue_after``.

    The lost attempt is recorded as a ``WorkerLost`` error but not counted as an attempt:
    a crash of the worker is not a failure of the step, so the job runs again. A job lost
    ``max(max_attempts, MIN_LOSSES)`` times fails instead (a step that kills its worker
    every time must not loop forever), and a job whose run ended meanwhile (cancelled,
    failed, past its deadline) is cancelled.
    """
    over = run_over()
    lost_before = func.jsonb_array_length(
        func.jsonb_path_query_array(jobs.c.errors, literal(_LOST_PATH, JSONPATH))
    )
    gives_up = lost_before + 1 >= func.greatest(jobs.c.max_attempts, MIN_LOSSES)
    record = func.jsonb_build_array(
        func.jsonb_build_object(
            "type",
            "WorkerLost",
            "message",
            func.concat("worker ", jobs.c.worker_id, " stopped heartbeating"),
            "attempt",
            jobs.c.attempt,
            "at",
            func.now(),
        )
    )
    return (
        update(jobs)
        .where(
            jobs.c.state == JobState.RUNNING.value,
            jobs.c.heartbeat_at < func.now() - bindparam("rescue_after", type_=Interval),
        )
        .values(
            state=case(
                (over, JobState.CANCELLED.value),
                (gives_up, JobState.FAILED.value),
                else_=JobState.AVAILABLE.value,
            ),
            finalized_at=case((over | gives_up, func.now()), else_=None),
            attempt=case(
                (gives_up, jobs.c.attempt), (jobs.c.attempt > 0, jobs.c.attempt - 1), else_=0
            ),
            worker_id=None,
            heartbeat_at=None,
            scheduled_at=func.now(),
            errors=jobs.c.errors.op("||")(record),
        )
        .returning(jobs.c.id, jobs.c.run_id, jobs.c.kind, jobs.c.state)
    )


def expire_runs_stmt() -> Any:
    """Fail running runs past their deadline and cancel their steps not yet started."""
    expired = (
        update(runs)
        .where(runs.c.state == RunState.RUNNING.value, runs.c.deadline <= func.now())
        .values(
            state=RunState.FAILED.value,
            finalized_at=func.now(),
            error=func.jsonb_build_object(
                "type",
                "DeadlineExceeded",
                "message",
                func.concat(
                    "deadline exceeded: the run's deadline ", cast(runs.c.deadline, Text), " passed"
                ),
            ),
        )
        .returning(runs.c.id)
        .cte("expired")
    )
    cancelled = (
        update(jobs)
        .where(
            jobs.c.run_id.in_(select(expired.c.id)),
            jobs.c.state.in_([JobState.BLOCKED.value, JobState.AVAILABLE.value]),
        )
        .values(state=JobState.CANCELLED.value, finalized_at=func.now())
        .returning(jobs.c.id)
        .cte("cancelled")
    )
    return select(
        select(func.count()).select_from(expired).scalar_subquery(),
        select(func.count()).select_from(cancelled).scalar_subquery(),
    )


_LOST_PATH = '$[*] ? (@.type == "WorkerLost")'
_HEARTBEAT = heartbeat_stmt()
_RESCUE = rescue_jobs_stmt()
_EXPIRE = expire_runs_stmt()


def heartbeat(conn: Connection, worker_id: str, job_ids: list[int]) -> None:
    conn.execute(_HEARTBEAT, {"me": worker_id, "ids": job_ids})


def rescue(conn: Connection, rescue_after: timedelta) -> list[int]:
    """Hand back (or fail) the jobs of workers that stopped; fail the runs of failed ones."""
    rows = conn.execute(_RESCUE, {"rescue_after": rescue_after}).all()
    for _job_id, run_id, kind, state in rows:
        if state == JobState.FAILED.value and run_id is not None:
            error = {
                "type": "WorkerLost",
                "message": f"step {kind!r} was lost with its worker too many times "
                "(max(max_attempts, 3)); it may be killing its worker",
            }
            _completion.fail_run(conn, run_id, kind, error)
    return [row[0] for row in rows]


def expire_runs(conn: Connection) -> int:
    expired, _cancelled = conn.execute(_EXPIRE).one()
    return int(expired)
