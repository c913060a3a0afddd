"""The aggregate reads behind ``Client``'s counts: runs and jobs per state, active jobs per
queue and kind, and the runs and jobs that ended per minute.

A run not started yet has no job rows (:mod:`cyclone._store.unstarted`); each read here counts
its steps as a worker will create them, roots available and the others blocked.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, literal, literal_column, select, true, union_all
from sqlalchemy.dialects.postgresql import array

from cyclone._store import executor as _executor
from cyclone._store import parked as _parked
from cyclone._store import reads as _reads
from cyclone._store import unstarted as _unstarted
from cyclone._store.executor import const
from cyclone.schema import LISTED_SINCE, jobs, runs
from cyclone.states import JobState, Parked, RunState


def runs_per_state(conn: Connection, workflow: str | None) -> dict[RunState, int]:
    """Runs per state (every state present, zero included), of ``workflow`` or of all."""
    stmt = select(runs.c.state, func.count()).group_by(runs.c.state)
    if workflow is not None:
        stmt = stmt.where(runs.c.workflow == workflow)
    counts = dict.fromkeys(RunState, 0)
    for state, count in _executor.rows(conn, stmt):
        counts[RunState(state)] = count
    return counts


def parked_runs(conn: Connection, workflow: str | None) -> dict[str, dict[Parked, int]]:
    """Running runs parked, per workflow (those that have any) and way (every one present),
    of ``workflow`` or of all.

    Each way reads its candidates from an index (:func:`cyclone._store.parked.filters`),
    so the read costs the parked runs, never the history.
    """

    def arm(kind: Parked) -> Any:
        stmt = select(runs.c.workflow, const(kind.value).label("parked"), func.count())
        stmt = stmt.where(*_parked.filters(kind)).group_by(runs.c.workflow)
        return stmt if workflow is None else stmt.where(runs.c.workflow == workflow)

    table: dict[str, dict[Parked, int]] = {}
    for name, kind, count in _executor.rows(conn, union_all(*(arm(kind) for kind in Parked))):
        table.setdefault(name, dict.fromkeys(Parked, 0))[Parked(kind)] = count
    return dict(sorted(table.items()))


def runs_per_workflow(conn: Connection, up_to: int | None) -> dict[str, dict[RunState, int]]:
    """Runs per workflow and state, workflows by name; each count stops at ``up_to``.

    Without ``up_to`` it reads every run. With it, each pair of a workflow (found by a
    loose scan of the key index) and a state counts at most ``up_to`` entries of the
    ``(workflow, state, created_at, id)`` index (revision cyclone_0013), so the read costs
    at most ``up_to`` index entries per workflow and state, whatever the table holds.
    """
    if up_to is None:
        rows = _executor.rows(
            conn,
            select(runs.c.workflow, runs.c.state, func.count())
            .group_by(runs.c.workflow, runs.c.state)
            .order_by(runs.c.workflow),
        )
    else:
        names = _reads.workflow_names_stmt().subquery("workflows")
        states = (
            func.unnest(array([s.value for s in RunState]))
            .table_valued("state")
            .render_derived(name="states")
        )
        capped = (
            select(literal(1))
            .where(
                runs.c.created_at > literal_column(LISTED_SINCE, runs.c.created_at.type),
                runs.c.workflow == names.c.name,
                runs.c.state == states.c.state,
            )
            .limit(up_to)
            .correlate_except(runs)
            .subquery("capped")
        )
        count = select(func.count()).select_from(capped).scalar_subquery()
        rows = _executor.rows(
            conn,
            select(names.c.name, states.c.state, count)
            .select_from(names)
            .join(states, true())
            .order_by(names.c.name),
        )
    table: dict[str, dict[RunState, int]] = {}
    for workflow, state, count in rows:
        table.setdefault(workflow, dict.fromkeys(RunState, 0))[RunState(state)] = count
    return table


def jobs_per_state(conn: Connection, queue: str | None) -> dict[JobState, int]:
    """Jobs (workflow steps and standalone) per state, of ``queue`` or of all."""
    pending = _unstarted.pending_steps().subquery("pending")
    every = union_all(select(jobs.c.state, jobs.c.queue), select(pending.c.state, pending.c.queue))
    rows = every.subquery("every")
    stmt = select(rows.c.state, func.count()).group_by(rows.c.state)
    if queue is not None:
        stmt = stmt.where(rows.c.queue == queue)
    counts = dict.fromkeys(JobState, 0)
    for state, count in _executor.rows(conn, stmt):
        counts[JobState(state)] = count
    return counts


def due_per_queue(conn: Connection) -> dict[str, int]:
    """Jobs available and due, per queue that has any."""
    pending = _unstarted.pending_steps().subquery("pending")
    waiting = union_all(
        select(jobs.c.queue).where(
            jobs.c.state == JobState.AVAILABLE.value, jobs.c.scheduled_at <= func.now()
        ),
        select(pending.c.queue).where(
            pending.c.state == JobState.AVAILABLE.value, pending.c.scheduled_at <= func.now()
        ),
    ).subquery("waiting")
    stmt = select(waiting.c.queue, func.count()).group_by(waiting.c.queue)
    return {queue: count for queue, count in _executor.rows(conn, stmt)}


def active_jobs(conn: Connection) -> list[tuple[str, str | None, str, int, int, int]]:
    """(queue, workflow, kind, due now, scheduled later, running) of the available and
    running jobs, by queue, workflow (standalone first) and kind.

    Each arm states the predicate of a partial index (the index of available jobs, the
    heartbeat index and the index of runs to start), so the read costs the active jobs,
    never the finished history; each is counted on its own before they are added up, the
    available jobs from their index alone, in its order (revision cyclone_0013).
    """
    due = jobs.c.scheduled_at <= func.now()
    group = (jobs.c.queue, jobs.c.workflow, jobs.c.kind)
    available = (
        select(
            *group,
            func.count().filter(due).label("ready"),
            func.count().filter(~due).label("scheduled"),
            literal(0).label("running"),
        )
        .where(jobs.c.state == JobState.AVAILABLE.value)
        .group_by(*group)
    )
    running = (
        select(*group, literal(0), literal(0), func.count())
        .where(jobs.c.state == JobState.RUNNING.value)
        .group_by(*group)
    )
    # The roots of runs not started yet: available jobs to be, read from their graphs.
    pending = _unstarted.pending_steps().subquery("pending")
    pending_due = pending.c.scheduled_at <= func.now()
    unstarted = (
        select(
            pending.c.queue,
            pending.c.workflow,
            pending.c.kind,
            func.count().filter(pending_due),
            func.count().filter(~pending_due),
            literal(0),
        )
        .where(pending.c.state == JobState.AVAILABLE.value)
        .group_by(pending.c.queue, pending.c.workflow, pending.c.kind)
    )
    counted = union_all(available, running, unstarted).subquery()
    rows = _executor.rows(
        conn,
        select(
            counted.c.queue,
            counted.c.workflow,
            counted.c.kind,
            func.sum(counted.c.ready),
            func.sum(counted.c.scheduled),
            func.sum(counted.c.running),
        )
        .group_by(counted.c.queue, counted.c.workflow, counted.c.kind)
        .order_by(counted.c.queue, counted.c.workflow.nulls_first(), counted.c.kind),
    )
    return [
        (q, w, k, int(ready), int(scheduled), int(running))
        for q, w, k, ready, scheduled, running in rows
    ]


def _minute_number(moment: Any) -> Any:
    """The minutes since the epoch of a timestamp: arithmetic, no time zone looked up."""
    return func.floor(func.date_part("epoch", moment) / 60)


def finished_per_minute(conn: Connection, minutes: int) -> list[tuple[datetime, int, int]]:
    """Per minute of the last ``minutes``: (minute, completed, failed) runs and standalone jobs.

    The runs are read from the ``(finalized_at, state)`` index alone (revision
    cyclone_0013), the standalone jobs from their partial ``finalized_at`` index; each
    is counted per minute number before the (at most ``minutes``) minutes are joined to
    the series, so that minutes without any are included.
    """
    since = func.date_trunc("minute", func.now()) - timedelta(minutes=minutes - 1)
    ended = (
        select(_minute_number(runs.c.finalized_at).label("number"), runs.c.state.label("state"))
        .where(runs.c.finalized_at >= since, runs.c.finalized_at.is_not(None))
        .union_all(
            select(_minute_number(jobs.c.finalized_at), jobs.c.state).where(
                jobs.c.run_id.is_(None),
                jobs.c.finalized_at.is_not(None),
                jobs.c.finalized_at >= since,
            )
        )
        .subquery("ended")
    )
    per_minute = (
        select(
            ended.c.number,
            func.count().filter(ended.c.state == "completed").label("completed"),
            func.count().filter(ended.c.state == "failed").label("failed"),
        )
        .group_by(ended.c.number)
        .subquery("per_minute")
    )
    series = (
        func.generate_series(since, func.date_trunc("minute", func.now()), timedelta(minutes=1))
        .table_valued("minute")
        .render_derived()
    )
    minute = series.c.minute
    stmt = (
        select(
            minute,
            func.coalesce(per_minute.c.completed, 0),
            func.coalesce(per_minute.c.failed, 0),
        )
        .select_from(series)
        .outerjoin(per_minute, per_minute.c.number == _minute_number(minute))
        .order_by(minute)
    )
    return [(m, completed, failed) for m, completed, failed in _executor.rows(conn, stmt)]
