"""Retention: delete terminal runs and finished standalone jobs in bounded batches.

The maintenance leader (:mod:`cyclone._leader`) sweeps, so one worker sweeps at a time.
Each batch locks its runs in id order (skipping locked ones), then the delete cascades
to their jobs: the lock order of :mod:`cyclone.states`. A child run (``@wf.child``) is
never purged on its own: purging its parent purges it (and its children), whatever its
own retention, so a parent never names a child that is gone; the counts are of parents.
A parent is not purged while a run of its tree still runs.

A purge walks the table once, in id order: each batch starts after the last row the one
before it deleted (``:after``). Started from the first id, every batch would step over
the index entries of every row the purge had deleted so far (they stay in the index
until a vacuum), so a purge's cost grew with the square of its size. A row a batch
skipped (locked, or a parent whose tree still runs) is left for the next purge.

Each batch is planned without JIT compilation. A batch's plan is costed past
``jit_above_cost`` once the table holds millions of rows, and compiling it took over a
second of each batch of 10,000 runs, for a statement that reads one range of an index
(the maintenance leader's fence already turns JIT off in its transactions).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Interval,
    Uuid,
    bindparam,
    delete,
    exists,
    func,
    or_,
    select,
)

from cyclone import _timing
from cyclone._store import executor as _executor
from cyclone._store.executor import const
from cyclone.schema import jobs, runs
from cyclone.states import TERMINAL_JOB_STATES, TERMINAL_RUN_STATES, RunState

DEFAULT_BATCH = 1000
DEFAULT_KEEP = timedelta(days=7)
DEFAULT_INTERVAL = timedelta(minutes=5)

FIRST_RUN = uuid.UUID(int=0)
"""Below every run id (PostgreSQL orders uuids bytewise): a purge's first ``:after``."""
FIRST_JOB = 0
"""Below every job id (an identity from 1): a purge's first ``:after``."""


def _runs_due() -> list[Any]:
    keep = func.coalesce(runs.c.retention, bindparam("older_than", type_=Interval))
    # A child run (``parent_id`` set) goes with its parent: the foreign key cascades.
    # The age is compared as an interval: ``finalized_at < now() - keep`` computed a time,
    # and a run kept longer than the timestamps' range (stored before retentions were
    # bounded) failed every purge, for every run.
    return [
        runs.c.state.in_([s.value for s in TERMINAL_RUN_STATES]),
        func.now() - runs.c.finalized_at > keep,
        runs.c.parent_id.is_(None),
        ~_runs_below(runs),
    ]


def _runs_below(parent: Any) -> Any:
    """Whether a run of ``parent``'s tree of child runs still runs: a parent that failed
    or passed its deadline leaves its children running, and purging it would delete them
    under their workers; it is purged once they have ended. One probe of
    ``ix_cyclone_runs_parent`` per run of the tree (none for a run without children)."""
    child, deeper = runs.alias("child"), runs.alias("deeper")
    tree = (
        select(child.c.id, child.c.state)
        .where(child.c.parent_id == parent.c.id)
        .correlate(parent)
        .cte("tree", recursive=True, nesting=True)
    )
    tree = tree.union_all(
        select(deeper.c.id, deeper.c.state).where(deeper.c.parent_id == tree.c.id)
    )
    return exists(select(tree.c.id).where(tree.c.state == const(RunState.RUNNING.value)))


def _jobs_due() -> list[Any]:
    return [
        jobs.c.run_id.is_(None),
        jobs.c.state.in_([s.value for s in TERMINAL_JOB_STATES]),
        jobs.c.finalized_at < func.now() - bindparam("older_than", type_=Interval),
    ]


def _tree_size(parent: Any) -> Any:
    """How many runs ``parent``'s purge deletes: itself and every run of its tree of child
    runs (one probe of ``ix_cyclone_runs_parent`` per run, as :func:`_runs_below`)."""
    child, deeper = runs.alias("sized_child"), runs.alias("sized_deeper")
    tree = (
        select(child.c.id)
        .where(child.c.parent_id == parent.c.id)
        .correlate(parent)
        .cte("sized_tree", recursive=True, nesting=True)
    )
    tree = tree.union_all(select(deeper.c.id).where(deeper.c.parent_id == tree.c.id))
    return 1 + select(func.count()).select_from(tree).scalar_subquery()


def purge_runs_stmt() -> Any:
    """Delete one batch of terminal runs past their retention (their steps and their trees
    of child runs cascade), the first due after the run ``:after`` in id order; returns
    (parents deleted, parents that were due in the batch, the last parent deleted).

    The batch is bounded in runs, not only in parents: the parents due, in id order, are
    taken while the runs deleted (each parent with its tree) add up to at most ``batch``,
    and the first one whatever its tree. A batch of a thousand parents of 10,000 child runs
    each deleted ten million runs in one statement.
    """
    due = (
        select(runs.c.id, _tree_size(runs).label("size"))
        .where(runs.c.id > bindparam("after", type_=Uuid), *_runs_due())
        .order_by(runs.c.id)
        .limit(bindparam("batch"))
        .with_for_update(of=runs, skip_locked=True)
        .cte("due")
    )
    upto = func.sum(due.c.size).over(order_by=due.c.id).label("upto")
    ranked = select(due.c.id, due.c.size, upto).cte("ranked")
    gone = (
        delete(runs)
        .where(
            runs.c.id.in_(
                select(ranked.c.id).where(
                    or_(ranked.c.upto <= bindparam("batch"), ranked.c.upto == ranked.c.size)
                )
            )
        )
        .returning(runs.c.id)
        .cte("gone")
    )
    return select(
        select(func.count()).select_from(gone).scalar_subquery(),
        select(func.count()).select_from(due).scalar_subquery(),
        select(gone.c.id).order_by(gone.c.id.desc()).limit(1).scalar_subquery(),  # no max(uuid)
    )


def purge_jobs_stmt() -> Any:
    """Delete one batch of finished standalone jobs older than ``older_than``, the first
    after the job ``:after`` in id order; returns (deleted, the last deleted)."""
    doomed = (
        select(jobs.c.id)
        .where(jobs.c.id > bindparam("after", type_=BigInteger), *_jobs_due())
        .order_by(jobs.c.id)
        .limit(bindparam("batch"))
        .with_for_update(skip_locked=True)
    )
    gone = (
        delete(jobs).where(jobs.c.id.in_(doomed.scalar_subquery())).returning(jobs.c.id).cte("gone")
    )
    return select(func.count(), func.max(gone.c.id)).select_from(gone)


_NO_JIT = select(func.set_config("jit", "off", True))
_PURGE_RUNS = purge_runs_stmt()
_PURGE_JOBS = purge_jobs_stmt()
_COUNT_RUNS = select(func.count()).select_from(runs).where(*_runs_due())
_COUNT_JOBS = select(func.count()).select_from(jobs).where(*_jobs_due())

Progress = Callable[[int], None]
Fence = Callable[[Connection], None]


def count_due(engine: Engine, older_than: timedelta) -> tuple[int, int]:
    """How many runs and standalone jobs a purge with ``older_than`` would delete now."""
    _check_age(older_than)
    with engine.connect() as conn:
        params = {"older_than": older_than}
        return int(_executor.one(conn, _COUNT_RUNS, params)[0]), int(
            _executor.one(conn, _COUNT_JOBS, params)[0]
        )


def _check_age(older_than: timedelta) -> None:
    if not isinstance(older_than, timedelta):
        raise TypeError(f"older_than takes a timedelta, not {type(older_than).__name__}")
    if older_than < timedelta():
        raise ValueError("older_than must be a non-negative timedelta")
    _timing.check_duration(older_than, "older_than")


def _purge(
    bind: Engine | Connection,
    batch: Batch,
    first: Any,
    older_than: timedelta,
    batch_size: int,
    progress: Progress | None = None,
    fence: Fence | None = None,
) -> int:
    _check_age(older_than)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size takes an int, not {type(batch_size).__name__}")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    params = {"older_than": older_than, "batch": batch_size, "after": first}
    total = 0
    while True:
        if isinstance(bind, Connection):
            with bind.begin():
                if fence is not None:
                    fence(bind)
                deleted, taken, last = batch(bind, params)
        else:
            with bind.begin() as conn:
                _executor.one(conn, _NO_JIT, {})
                deleted, taken, last = batch(conn, params)
        total += deleted
        if progress is not None:
            progress(deleted)
        # Done when nothing was deleted, or the batch deleted every parent it found due
        # and found fewer than it could take; parents left out by the bound come next.
        if deleted == 0 or (deleted == taken and taken < batch_size):
            return total
        params["after"] = last


Batch = Callable[[Connection, dict[str, Any]], tuple[int, int, Any]]
"""One batch of a purge: (deleted, taken, last), ``taken`` the rows it found due (up to
``batch``; fewer means nothing more was due) and ``last`` the id of the last row it
deleted, where the next batch starts."""


def _runs_batch(conn: Connection, params: dict[str, Any]) -> tuple[int, int, Any]:
    deleted, taken, last = _executor.one(conn, _PURGE_RUNS, params)
    return int(deleted), int(taken), last


def _jobs_batch(conn: Connection, params: dict[str, Any]) -> tuple[int, int, Any]:
    deleted, last = _executor.one(conn, _PURGE_JOBS, params)
    return int(deleted), int(deleted), last


def purge_runs(
    engine: Engine,
    older_than: timedelta,
    batch_size: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> int:
    return _purge(engine, _runs_batch, FIRST_RUN, older_than, batch_size, progress)


def purge_jobs(
    engine: Engine,
    older_than: timedelta,
    batch_size: int = DEFAULT_BATCH,
    progress: Progress | None = None,
) -> int:
    return _purge(engine, _jobs_batch, FIRST_JOB, older_than, batch_size, progress)


def sweep_on(
    conn: Connection, keep: timedelta, batch_size: int = DEFAULT_BATCH, *, fence: Fence
) -> tuple[int, int]:
    """One sweep on the leader's connection: (runs deleted, jobs deleted).

    ``fence`` runs first in each batch's transaction; it raises when the leader's term is
    over, so a batch never runs under a stale term.
    """
    return (
        _purge(conn, _runs_batch, FIRST_RUN, keep, batch_size, fence=fence),
        _purge(conn, _jobs_batch, FIRST_JOB, keep, batch_size, fence=fence),
    )
