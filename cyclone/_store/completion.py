"""Persist job outcomes and advance the DAG in the same transaction.

Successes are written in one statement per batch: lock the runs of the jobs first (the
lock order, see :mod:`cyclone.states`), mark the jobs completed (guarded by state and
lease, so a rescued, handed back or cancelled job's late outcome is refused), decrement
the pending count of their dependents (a join node becomes available exactly once, even
when its predecessors finish concurrently, because each decrement locks the row), and
count the run's remaining steps down to completion.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
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
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone._store import queues as _queues
from cyclone._store.executor import among, const, one_of
from cyclone.schema import jobs, run_lock_order, runs
from cyclone.states import EDGES, JobState, RunState


@dataclass(frozen=True, slots=True)
class Success:
    job_id: int
    lease: int
    output: str


@dataclass(frozen=True, slots=True)
class Failure:
    job_id: int
    lease: int
    error: dict[str, Any]
    retry_in: float | None
    """Seconds until the next attempt, or None when the job fails for good."""
    report: Callable[[bool], None] | None = field(default=None, compare=False)
    """Called once the attempt is recorded: with True if retried, False if its run ended."""


def _items() -> Any:
    return (
        func.jsonb_to_recordset(cast(bindparam("items", type_=Text), JSONB))
        .table_valued(column("id", BigInteger), column("lease", BigInteger), column("output", Text))
        .render_derived("v", with_types=True)
    )


def runs_locked_first() -> Any:
    """A condition that locks the runs of ``:items`` (in the run lock order) before anything else.

    An uncorrelated scalar subquery is a one-time filter, evaluated before the scan it
    guards reads a row: a statement carrying it in every ``WHERE`` that locks rows takes
    its runs first, in the one lock order of :mod:`cyclone.states`.
    """
    items = _items()
    locked = (
        select(runs.c.id)
        .where(among(runs.c.id, select(jobs.c.run_id).where(among(jobs.c.id, select(items.c.id)))))
        .order_by(*run_lock_order())
        .with_for_update(key_share=True)
        .cte("locked_runs")
    )
    return select(func.count()).select_from(locked).scalar_subquery() >= const(0, Integer)


@dataclass(frozen=True, slots=True)
class Continuing:
    """The steps a recording worker runs itself: among those the successes it records make
    ready, that its claim could take (not limited, of ``queues`` and ``workflows``, due,
    not past their deadline, their queue not paused), the ones ``choose`` picks.

    They go from blocked to running for ``:me`` in the statement that records their last
    upstream step (``job.continue``): no version of them is ever available, no claim
    picks them, and no NOTIFY rings for them. ``choose`` is given the candidates (a CTE
    of ``id``, ``priority`` and ``scheduled_at``) and returns a select of the ids chosen:
    the claim ranks them with the jobs it picks and the runs it starts. ``returning``
    are the columns a claimed job's row returns.
    """

    queues: tuple[str, ...] | None
    workflows: tuple[str, ...]
    returning: tuple[Any, ...]
    choose: Callable[[Any], Any]


def complete_jobs_ctes(runs_locked: Any, continuing: Continuing | None = None) -> tuple[Any, ...]:
    """The CTEs that complete ``:items`` and advance the DAG: ``(done, advanced, counted,
    finished)`` (``counted``: the map nodes their items count down).

    They change rows when a statement carries them, whether or not it reads them, so the
    worker's claim statement carries them too: one statement records and claims.
    ``runs_locked`` is :func:`runs_locked_first`, shared with the claim's ``WHERE``.
    ``advanced`` returns the ``state`` it set; with ``continuing``, after its columns, and
    its running rows are the steps continued (see :class:`Continuing`).
    """
    done_items = _items()
    done = (
        update(jobs)
        .where(
            runs_locked,
            # Found by id: joined to the items alone, a generic plan hashed them against
            # a scan of the running jobs (cyclone_0028_heartbeat_index).
            among(jobs.c.id, select(_items().c.id)),
            jobs.c.id == done_items.c.id,
            jobs.c.lease == done_items.c.lease,
            jobs.c.state == const(JobState.RUNNING.value),
        )
        .values(
            state=const(JobState.COMPLETED.value),
            output=cast(done_items.c.output, JSONB),
            finalized_at=func.now(),
            heartbeat_at=None,
        )
        .returning(jobs.c.id, jobs.c.run_id, jobs.c.kind, jobs.c.item, jobs.c.output)
        .cte("done")
    )
    dependent = jobs.alias("dependent")
    counts: list[Any] = [dependent.c.id, func.count().label("n")]
    if continuing is not None:
        counts += [
            _could_continue(dependent, continuing).label("could"),
            dependent.c.priority,
            dependent.c.scheduled_at,
        ]
    unblocked_counts = (
        select(*counts)
        .select_from(
            dependent.join(
                done,
                and_(
                    dependent.c.run_id == done.c.run_id,
                    done.c.kind == func.any(dependent.c.deps),
                    done.c.item.is_(None),
                ),
            )
        )
        .where(dependent.c.state == const(JobState.BLOCKED.value), dependent.c.item.is_(None))
        .group_by(dependent.c.id)
        .cte("unblocked")
    )
    left = jobs.c.pending_deps - unblocked_counts.c.n
    ready = left == const(0, Integer)
    values: dict[str, Any] = {
        "pending_deps": left,
        "state": case(
            (ready, const(JobState.AVAILABLE.value)), else_=const(JobState.BLOCKED.value)
        ),
    }
    returning: tuple[Any, ...] = (jobs.c.state,)
    if continuing is not None:
        # Continued only when ready in the snapshot too, whose outputs the continued step
        # is given: the snapshot lags the row when a record of another upstream step
        # committed while this statement waited for the run's lock, and such a step is
        # made available, for a claim in a later snapshot.
        candidates = (
            select(
                unblocked_counts.c.id, unblocked_counts.c.priority, unblocked_counts.c.scheduled_at
            )
            .where(unblocked_counts.c.could)
            .cte("continuable")
        )
        mine = and_(among(jobs.c.id, continuing.choose(candidates)), ready)
        values = {
            "pending_deps": left,
            "state": case(
                (mine, const(JobState.RUNNING.value)),
                (ready, const(JobState.AVAILABLE.value)),
                else_=const(JobState.BLOCKED.value),
            ),
            "attempt": case((mine, jobs.c.attempt + 1), else_=jobs.c.attempt),
            "lease": case((mine, jobs.c.lease + 1), else_=jobs.c.lease),
            "worker_id": case((mine, bindparam("me", type_=Text)), else_=jobs.c.worker_id),
            "attempted_at": case((mine, func.now()), else_=jobs.c.attempted_at),
            "heartbeat_at": case((mine, func.now()), else_=jobs.c.heartbeat_at),
        }
        returning = (*continuing.returning, *returning)
    advanced = (
        update(jobs)
        .where(jobs.c.id == unblocked_counts.c.id, jobs.c.state == const(JobState.BLOCKED.value))
        .values(**values)
        .returning(*returning, _notify.when_available(jobs.c.state))
        .cte("advanced")
    )
    counted = _count_items_down(done)
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
    return done, advanced, counted, finished


def _could_continue(dependent: Any, continuing: Continuing) -> Any:
    """Whether a dependent made ready in the snapshot is one the recording worker could
    claim (grouped by the dependent: its columns are its row's)."""
    c = dependent.c
    return and_(
        c.pending_deps == func.count(),
        c.limit_name.is_(None),
        c.rate_name.is_(None),
        one_of(c.workflow, continuing.workflows),
        true() if continuing.queues is None else one_of(c.queue, continuing.queues),
        _queues.served(c.queue),
        c.scheduled_at <= func.now(),
        or_(c.deadline.is_(None), c.deadline > func.now()),
    )


def made_available(advanced: Any, counted: Any) -> Any:
    """How many jobs the CTEs of :func:`complete_jobs_ctes` made available: the claim in
    their statement cannot see them (its snapshot), so its worker claims again."""
    return sum(
        (
            select(func.count())
            .select_from(cte)
            .where(cte.c.state == const(JobState.AVAILABLE.value))
            .scalar_subquery()
            for cte in (advanced, counted)
        ),
        start=const(0, Integer),
    )


def upstream_outputs(source: Any, claimed: Any) -> Any:
    """The outputs in ``source`` (the jobs table, or the ``done`` CTE of the statement that
    records them) of the steps a ``claimed`` step comes after, as a jsonb object by step
    name; NULL for none."""
    return (
        select(func.jsonb_object_agg(source.c.kind, source.c.output))
        .where(
            source.c.run_id == claimed.c.run_id,
            source.c.kind == func.any(claimed.c.deps),
            source.c.item.is_(None),
        )
        .scalar_subquery()
    )


def _count_items_down(done: Any) -> Any:
    """The CTE that counts a map node down by its items in ``done``, making it available
    when the last completes (:mod:`cyclone._store.fanout`).

    The map node is found by its index whatever its state in this statement's snapshot,
    which may predate the run's lock this statement waits for: a worker deciding about
    the node meanwhile (holding the lock) may have parked it, having counted these items
    as not completed. Its state is read in ``SET``, on the row as it is once the lock is
    granted: a parked (blocked) node, or one being decided (running, whose decision sets
    the count anew), is counted down; a node in any other state is left as it is. A node
    made available rings for it, as the dependents a success makes available do.
    """
    node = jobs.alias("map_node")
    per_node = (
        select(node.c.id, func.count().label("n"))
        .select_from(
            node.join(
                done,
                and_(
                    node.c.run_id == done.c.run_id,
                    node.c.kind == done.c.kind,
                    node.c.item.is_(None),
                    done.c.item.is_not(None),
                ),
            )
        )
        .group_by(node.c.id)
        .subquery("m")
    )
    left = jobs.c.pending_deps - per_node.c.n
    counting = jobs.c.state.in_([const(JobState.BLOCKED.value), const(JobState.RUNNING.value)])
    return (
        update(jobs)
        .where(jobs.c.id == per_node.c.id)
        .values(
            pending_deps=case((counting, left), else_=jobs.c.pending_deps),
            state=case(
                (
                    and_(
                        jobs.c.state == const(JobState.BLOCKED.value),
                        left == const(0, Integer),
                    ),
                    const(JobState.AVAILABLE.value),
                ),
                else_=jobs.c.state,
            ),
        )
        .returning(jobs.c.id, jobs.c.state, _notify.when_available(jobs.c.state))
        .cte("items_counted")
    )


def run_over() -> Any:
    """True for a job of a run that is no longer running (cancelled, failed, completed)."""
    return exists().where(runs.c.id == jobs.c.run_id, runs.c.state != const(RunState.RUNNING.value))


def lock_runs_of_jobs_stmt() -> Any:
    """Lock the runs of the jobs ``:ids`` in the run lock order: the first statement of a
    transaction that then changes those jobs (the lock order of :mod:`cyclone.states`)."""
    return (
        select(runs.c.id)
        .where(
            runs.c.id.in_(
                select(jobs.c.run_id).where(
                    jobs.c.id == func.any(bindparam("ids", type_=ARRAY(BigInteger)))
                )
            )
        )
        .order_by(*run_lock_order())
        .with_for_update(key_share=True)
    )


def _owned() -> tuple[Any, ...]:
    """The fence: the job is still running under the lease the outcome was claimed with."""
    return (
        jobs.c.id == bindparam("job_id"),
        jobs.c.lease == bindparam("held_lease"),
        jobs.c.state == const(JobState.RUNNING.value),
    )


def retry_job_stmt() -> Any:
    """Record a failed attempt and make the job available again after its backoff.

    A job whose run ended meanwhile (cancelled, or failed by another step) is cancelled
    instead: a run that is over starts no new attempts.
    """
    over = run_over()
    return (
        update(jobs)
        .where(*_owned())
        .values(
            state=case(
                (over, const(JobState.CANCELLED.value)), else_=const(JobState.AVAILABLE.value)
            ),
            finalized_at=case((over, func.now()), else_=None),
            # As a release (cyclone._store.rescue.release_jobs_stmt): available, nothing pending.
            pending_deps=case((over, jobs.c.pending_deps), else_=0),
            worker_id=None,
            heartbeat_at=None,
            scheduled_at=func.now() + func.make_interval(0, 0, 0, 0, 0, 0, bindparam("delay")),
            errors=jobs.c.errors.op("||")(cast(bindparam("error", type_=Text), JSONB)),
        )
        .returning(jobs.c.id, jobs.c.state)
    )


def fail_job_stmt() -> Any:
    """Record the last failed attempt and fail the job; returns its id and run, if any."""
    return (
        update(jobs)
        .where(*_owned())
        .values(
            state=const(JobState.FAILED.value),
            finalized_at=func.now(),
            heartbeat_at=None,
            errors=jobs.c.errors.op("||")(cast(bindparam("error", type_=Text), JSONB)),
        )
        .returning(jobs.c.id, jobs.c.run_id, jobs.c.kind)
    )


def fail_run_stmt(*, rings: bool = False) -> Any:
    """Fail a running run because one of its steps failed for good.

    ``rings``: the ``RETURNING`` rings NOTIFY for a run under a workflow limit, whose slot
    it frees, so that a worker admits the key's next held run at once, as a cancel's
    does (:func:`cyclone._store.control.cancel_run_stmt`). The rescue's failure of a
    step lost too many times rings: no worker serving the workflow records it, where a
    worker that records a failure admits the key's held runs itself, next.
    """
    returned: list[Any] = [runs.c.id]
    if rings:
        returned.append(case((runs.c.limit_name.is_not(None), _notify.ring())).label("rang"))
    return (
        update(runs)
        .where(runs.c.id == bindparam("rid"), runs.c.state == const(RunState.RUNNING.value))
        .values(
            state=const(RunState.FAILED.value),
            finalized_at=func.now(),
            failed_step=bindparam("step", type_=Text),
            error=cast(bindparam("error", type_=Text), JSONB),
        )
        .returning(*returned)
    )


def fail_map_node_stmt() -> Any:
    """Fail the map node ``:step`` of run ``:rid`` because one of its items failed for good.

    The node is parked while its items run; after a retry it may not be parked again yet:
    available, or running for a worker deciding about it. Such a worker's lease moves on,
    so its park or end then changes nothing, and its claim is not counted as an attempt,
    as a park's is not. A step that failed itself is untouched (it is not a source).
    """
    return (
        update(jobs)
        .where(
            jobs.c.run_id == bindparam("rid"),
            jobs.c.kind == bindparam("step", type_=Text),
            jobs.c.item.is_(None),
            one_of(jobs.c.state, EDGES["job.fail_map_node"].sources),
        )
        .values(
            state=const(JobState.FAILED.value),
            finalized_at=func.now(),
            attempt=case(
                (
                    (jobs.c.state == const(JobState.RUNNING.value)) & (jobs.c.attempt > 0),
                    jobs.c.attempt - 1,
                ),
                else_=jobs.c.attempt,
            ),
            lease=jobs.c.lease + 1,
            worker_id=None,
            heartbeat_at=None,
        )
    )


def cancel_unstarted_stmt() -> Any:
    """Cancel the steps of the runs ``:rids`` that have not started."""
    return (
        update(jobs)
        .where(
            jobs.c.run_id == func.any(bindparam("rids", type_=ARRAY(Uuid))),
            jobs.c.state.in_([const(JobState.BLOCKED.value), const(JobState.AVAILABLE.value)]),
        )
        .values(state=const(JobState.CANCELLED.value), finalized_at=func.now())
    )


_LOCK_RUNS = lock_runs_of_jobs_stmt()
_RETRY = retry_job_stmt()
_FAIL_JOB = fail_job_stmt()
_FAIL_RUN = fail_run_stmt()
_FAIL_RUN_RINGING = fail_run_stmt(rings=True)
CANCEL_UNSTARTED = cancel_unstarted_stmt()
_FAIL_MAP_NODE = fail_map_node_stmt()


def items_payload(successes: Sequence[Success]) -> str:
    """The ``:items`` jsonb array of the complete statement, in job id order (lock order)."""
    return msgspec.json.encode(
        [
            {"id": s.job_id, "lease": s.lease, "output": s.output}
            for s in sorted(successes, key=lambda s: s.job_id)
        ]
    ).decode()


def record_failures(
    conn: Connection, failures: Sequence[Failure], ended: set[int] | None = None
) -> set[int]:
    """Write failed attempts in the caller's transaction; return the ids recorded.

    A failure whose lease is no longer the job's (the job was rescued, handed back,
    retried or cancelled meanwhile) is refused: its id is not in the result. A job to
    retry whose run has ended is cancelled instead; its id is added to ``ended``. The
    runs of the jobs are locked first, then the jobs in id order. Successes are recorded
    by the claim statement (:func:`cyclone._store.claim.record_and_claim`).
    """
    recorded: set[int] = set()
    if not failures:
        return recorded
    _executor.rows(conn, _LOCK_RUNS, {"ids": sorted(f.job_id for f in failures)})
    for failure in sorted(failures, key=lambda f: f.job_id):
        error = msgspec.json.encode(failure.error).decode()
        params = {"job_id": failure.job_id, "held_lease": failure.lease, "error": f"[{error}]"}
        if failure.retry_in is not None:
            retried = _executor.first(conn, _RETRY, {**params, "delay": failure.retry_in})
            if retried is not None:
                recorded.add(failure.job_id)
                if ended is not None and retried[1] == JobState.CANCELLED.value:
                    ended.add(failure.job_id)
            continue
        row = _executor.first(conn, _FAIL_JOB, params)
        if row is None:
            continue
        recorded.add(failure.job_id)
        _job_id, run_id, step = row
        if run_id is not None:
            fail_run(conn, run_id, step, failure.error)
    return recorded


def fail_run(
    conn: Connection, run_id: Any, step: str, error: dict[str, Any], *, rings: bool = False
) -> None:
    """Fail a running run because ``step`` failed for good, and cancel its unstarted steps;
    an item of the map node ``step`` failed it: that node fails too. ``rings``: ring for
    the slot of its workflow limit that it frees (:func:`fail_run_stmt`)."""
    params = {"rid": run_id, "step": step, "error": msgspec.json.encode(error).decode()}
    if _executor.first(conn, _FAIL_RUN_RINGING if rings else _FAIL_RUN, params) is not None:
        _executor.affected(conn, _FAIL_MAP_NODE, {"rid": run_id, "step": step})
        _executor.affected(conn, CANCEL_UNSTARTED, {"rids": [run_id]})
