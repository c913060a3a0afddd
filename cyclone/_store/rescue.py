"""Heartbeats of running jobs, hand-backs, rescue of jobs whose worker stopped, deadlines.

Every statement here follows the lock order of :mod:`cyclone.states`: runs first, in id
order, then jobs, in id order; the heartbeat locks jobs only and never waits. A
hand-back and a rescue release a running job through one statement builder,
:func:`release_jobs_stmt` (the park of a wait or sleep node in :mod:`cyclone._store.waits`
is the one release not written with it yet).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from typing import Any

import msgspec
from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Text,
    Uuid,
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
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from cyclone._store import binds as _binds
from cyclone._store import completion as _completion
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone._store import notify as _notify
from cyclone._store import workers as _workers
from cyclone._store.completion import run_over
from cyclone._store.executor import among, const
from cyclone.schema import jobs, runs
from cyclone.states import JobState, RunState

MIN_LOSSES = 3
"""A job is failed, not handed back, once lost with its worker max(max_attempts, this) times."""


def _leases() -> Any:
    """``:leases``, a jsonb array of ``{"id", "lease"}``: the jobs a worker holds."""
    return (
        func.jsonb_to_recordset(cast(bindparam("leases", type_=Text), JSONB))
        .table_valued(column("id", BigInteger), column("lease", BigInteger))
        .render_derived("h", with_types=True)
    )


def _held_jobs() -> Any:
    """The ids of the jobs still running under the leases given, in id order (the lock
    order). Found by id: joined to the leases alone, a generic plan hashed them against a
    scan of the running jobs (cyclone_0028_heartbeat_index)."""
    held = _leases()
    return (
        select(jobs.c.id)
        .join(held, and_(jobs.c.id == held.c.id, jobs.c.lease == held.c.lease))
        .where(
            among(jobs.c.id, select(_leases().c.id)),
            jobs.c.state == const(JobState.RUNNING.value),
        )
        .order_by(jobs.c.id)
    )


def heartbeat_stmt() -> Any:
    """Mark alive the jobs still held under the leases given; returns their ids.

    Rows another transaction has locked (a record, a rescue) are skipped, not waited
    for: a heartbeat never waits, so it is in no lock cycle; the next one beats them.
    """
    mine = _held_jobs().with_for_update(of=jobs, skip_locked=True)
    return (
        update(jobs)
        .where(jobs.c.id.in_(mine.scalar_subquery()))
        .values(heartbeat_at=func.now())
        .returning(jobs.c.id)
    )


def release_jobs_stmt(
    chosen: Any, *, guard: tuple[Any, ...] = (), give_up: Any = None, **values: Any
) -> Any:
    """Release the running jobs whose ids ``chosen`` selects: available again now, under a
    new lease, the attempt not counted; or cancelled when their run has ended.

    The one statement for a job taken from its worker (a hand-back, a rescue): the lease
    grows, so the execution still running can no longer record its outcome. A job
    whose run is over (cancelled, failed, past its deadline) is ``cancel_ended``, so an
    ended run keeps no job to run; ``give_up``, a condition, fails the job instead of
    releasing it. The caller's transaction has locked the jobs' runs first (the lock
    order of :mod:`cyclone.states`), so the run's state read here is current. ``guard``
    adds conditions to the ``WHERE``; ``values`` adds columns to set.
    """
    over = run_over()
    outcomes = [(over, const(JobState.CANCELLED.value))]
    kept_attempt = []
    ends = over
    if give_up is not None:
        outcomes.append((give_up, const(JobState.FAILED.value)))
        kept_attempt.append((give_up, jobs.c.attempt))
        ends = over | give_up
    return (
        update(jobs)
        .where(jobs.c.id.in_(chosen), jobs.c.state == const(JobState.RUNNING.value), *guard)
        .values(
            state=case(*outcomes, else_=const(JobState.AVAILABLE.value)),
            finalized_at=case((ends, func.now()), else_=None),
            # An available job waits for no upstream. A map node being decided was counted
            # down by its items completing meanwhile, for its decision to count anew.
            pending_deps=case((ends, jobs.c.pending_deps), else_=0),
            attempt=case(*kept_attempt, (jobs.c.attempt > 0, jobs.c.attempt - 1), else_=0),
            lease=jobs.c.lease + 1,
            worker_id=None,
            heartbeat_at=None,
            scheduled_at=func.now(),
            **values,
        )
    )


def _freed_slot_rings() -> Any:
    """A ``RETURNING`` column of a release: ring when a job under a Concurrency ends
    (cancelled in an ended run, or failed) instead of being made available.

    Its slot is free, and a job waiting for it is not one this statement made available,
    for which the jobs' trigger rings.
    """
    ends = and_(jobs.c.state != const(JobState.AVAILABLE.value), jobs.c.limit_name.is_not(None))
    return case((ends, _notify.ring())).label("rang")


def hand_back_stmt() -> Any:
    """Make the jobs held under ``:leases`` available again, now, without counting the attempt.

    A job whose run is over is cancelled instead (:func:`release_jobs_stmt`). Locks the
    jobs in id order, after :func:`hand_back` has locked their runs.
    """
    mine = _held_jobs().with_for_update(of=jobs)
    return release_jobs_stmt(mine.scalar_subquery()).returning(jobs.c.id, _freed_slot_rings())


def _stale() -> tuple[Any, ...]:
    """Running jobs not beaten for their worker's ``rescue_after``: the one its row in
    ``cyclone_workers`` records, or the leader's (``:rescue_after``) for a worker with no
    row or none recorded (:func:`cyclone._store.workers.promised`). The first bound, the
    shortest of them all, reads only the heartbeats old enough, by their index."""
    return (
        jobs.c.state == const(JobState.RUNNING.value),
        jobs.c.heartbeat_at < func.now() - _workers.shortest_promise(),
        jobs.c.heartbeat_at < func.now() - _workers.promised(jobs.c.worker_id),
    )


def lock_runs_of_stale_jobs_stmt() -> Any:
    """Lock, in id order, the runs of jobs whose worker stopped beating (skip locked runs)."""
    return (
        select(runs.c.id)
        .where(runs.c.id.in_(select(jobs.c.run_id).where(*_stale())))
        .order_by(runs.c.id)
        .with_for_update(key_share=True, skip_locked=True)
    )


def rescue_jobs_stmt() -> Any:
    """Hand back running jobs whose worker has not beaten for its ``rescue_after``
    (:func:`_stale`).

    Only jobs whose run is in ``:rids`` (locked first by this transaction) or that have
    no run are taken, in id order, skipping locked ones. The lost attempt is counted in
    ``lost``, not as an attempt: a crash of the worker is not a failure of the step, so
    the job runs again, under a new lease. A job lost ``max(max_attempts, MIN_LOSSES)``
    times fails instead (a step that kills its worker every time must not loop forever),
    and a job whose run ended meanwhile (cancelled, failed, past its deadline) is
    cancelled.
    """
    gives_up = jobs.c.lost + 1 >= func.greatest(jobs.c.max_attempts, MIN_LOSSES)
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
    taken = (
        select(jobs.c.id)
        .where(
            *_stale(),
            or_(
                jobs.c.run_id.is_(None),
                jobs.c.run_id == func.any(bindparam("rids", type_=ARRAY(Uuid))),
            ),
        )
        .order_by(jobs.c.id)
        .with_for_update(skip_locked=True)
    )
    return release_jobs_stmt(
        taken.scalar_subquery(),
        guard=_stale(),
        give_up=gives_up,
        lost=jobs.c.lost + 1,
        errors=jobs.c.errors.op("||")(record),
    ).returning(
        jobs.c.id, jobs.c.run_id, jobs.c.kind, jobs.c.state, jobs.c.item, _freed_slot_rings()
    )


def expire_runs_stmt() -> Any:
    """Fail running runs past their deadline and cancel their steps not yet started.

    Returns the counts of runs failed and steps cancelled, and rings NOTIFY when a run
    failed is under a workflow limit and held its slot (admitted, not held), which it
    frees, so that a worker admits the key's next held run at once, as a cancel's does.
    A held run failed frees no slot and rings nothing.
    """
    due = (
        select(runs.c.id)
        .where(runs.c.state == const(RunState.RUNNING.value), runs.c.deadline <= func.now())
        .order_by(runs.c.id)
        .with_for_update(key_share=True, skip_locked=True)
    )
    expired = (
        update(runs)
        .where(
            runs.c.id.in_(due.scalar_subquery()),
            runs.c.state == const(RunState.RUNNING.value),
            runs.c.deadline <= func.now(),
        )
        .values(
            state=const(RunState.FAILED.value),
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
        .returning(runs.c.id, runs.c.limit_name, runs.c.start_at)
        .cte("expired")
    )
    cancelled = (
        update(jobs)
        .where(
            jobs.c.run_id.in_(select(expired.c.id)),
            jobs.c.state.in_([const(JobState.BLOCKED.value), const(JobState.AVAILABLE.value)]),
        )
        .values(state=const(JobState.CANCELLED.value), finalized_at=func.now())
        .returning(jobs.c.id)
        .cte("cancelled")
    )
    limited = exists().where(
        expired.c.limit_name.is_not(None),
        _limits.admitted(expired.c.start_at),
    )
    return select(
        select(func.count()).select_from(expired).scalar_subquery(),
        select(func.count()).select_from(cancelled).scalar_subquery(),
        case((limited, _notify.ring())).label("rang"),
    )


_HEARTBEAT = heartbeat_stmt()
_LOCK_RUNS = _completion.lock_runs_of_jobs_stmt()
_HAND_BACK = hand_back_stmt()
_LOCK_STALE_RUNS = lock_runs_of_stale_jobs_stmt()
_RESCUE = rescue_jobs_stmt()
_EXPIRE = expire_runs_stmt()


def leases_payload(held: Iterable[tuple[int, int]]) -> str:
    """The ``:leases`` jsonb array of ``(job id, lease)`` pairs, in id order."""
    return msgspec.json.encode([{"id": i, "lease": lease} for i, lease in sorted(held)]).decode()


def heartbeat(conn: Connection, held: Iterable[tuple[int, int]]) -> set[int]:
    """Beat the jobs held under these ``(id, lease)`` pairs; return the ids beaten."""
    return set(_executor.column(conn, _HEARTBEAT, {"leases": leases_payload(held)}))


def hand_back(conn: Connection, held: Iterable[tuple[int, int]]) -> set[int]:
    """Hand back the jobs held under these ``(id, lease)`` pairs; return the ids handed back.

    Their runs are locked first, in id order, so a cancel either ends before the
    hand-back reads the run's state (the job is cancelled) or waits for it (and cancels
    the job it made available).
    """
    held = sorted(held)
    _executor.rows(conn, _LOCK_RUNS, {"ids": [job_id for job_id, _ in held]})
    return set(_executor.column(conn, _HAND_BACK, {"leases": leases_payload(held)}))


def rescue(conn: Connection, rescue_after: timedelta) -> list[int]:
    """Hand back (or fail) the jobs of workers that stopped; fail the runs of failed ones.

    The runs are locked first (in id order), then the jobs (in id order). A limited job
    it ends (failed, or cancelled in its ended run) rings for its freed slot
    (:func:`_freed_slot_rings`), and a run it fails rings for the slot of its workflow
    limit (:func:`cyclone._store.completion.fail_run_stmt`), which a worker woken admits
    the key's next held run to.
    """
    params = {"rescue_after": rescue_after}
    rids = _executor.column(conn, _LOCK_STALE_RUNS, params)
    rows = _executor.rows(conn, _RESCUE, {**params, "rids": rids})
    for _job_id, run_id, kind, state, item, _rang in rows:
        if state == JobState.FAILED.value and run_id is not None:
            what = f"step {kind!r}" if item is None else f"item {item} of step {kind!r}"
            error = {
                "type": "WorkerLost",
                "message": f"{what} was lost with its worker too many times "
                "(max(max_attempts, 3)); it may be killing its worker",
                **({} if item is None else {"item": item}),
            }
            # No worker serving the run's workflow records this failure, and admits the
            # held runs after it: ring for the slot of its workflow limit, if any.
            _completion.fail_run(conn, run_id, kind, error, rings=True)
    return [row[0] for row in rows]


def expire_runs(conn: Connection) -> int:
    expired, _cancelled, _rang = _executor.one(conn, _EXPIRE)
    return int(expired)


def execution_ended(
    engine: Engine, run_id: uuid.UUID | None, job_id: int, lease: int | None
) -> bool:
    """Whether an execution of job ``job_id`` claimed under ``lease`` has ended for its
    step: its run is no longer running, or the job was rescued, handed back or retried
    (:meth:`cyclone.StepContext.cancelled`)."""
    with _binds.autocommit(engine) as conn:
        if run_id is not None:
            state = _executor.value(conn, select(runs.c.state).where(runs.c.id == run_id))
            if state != RunState.RUNNING.value:
                return True
        row = _executor.first(conn, select(jobs.c.state, jobs.c.lease).where(jobs.c.id == job_id))
    return row is None or row[0] != JobState.RUNNING.value or row[1] != lease
