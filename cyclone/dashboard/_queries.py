"""The dashboard's read queries, built with SQLAlchemy Core against ``cyclone.schema``.

Every page reads through one short autocommit connection; listings are keyset-paginated
on ``(created_at, id)`` so a page costs the same at the end of a long table as at its start.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Text,
    and_,
    cast,
    func,
    literal_column,
    select,
    true,
    tuple_,
    union_all,
)

from cyclone import _unstarted
from cyclone.schema import LISTED_SINCE, jobs, runs
from cyclone.states import JobState, RunState

PAGE_SIZE = 50


@dataclass(frozen=True, slots=True)
class RunFilters:
    """The runs page's filters; every field optional."""

    workflow: str | None = None
    state: RunState | None = None
    key: str | None = None
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Cursor:
    """The last row of a page: the next page starts strictly after it."""

    created_at: datetime
    id: Any

    def encode(self) -> str:
        return f"{self.created_at.isoformat()}~{self.id}"


def decode_cursor(text: str, id_type: type[Any]) -> Cursor:
    """Parse :meth:`Cursor.encode` output; ValueError on anything else."""
    created, sep, ident = text.partition("~")
    if not sep:
        raise ValueError("bad page cursor")
    when = datetime.fromisoformat(created)
    if when.tzinfo is None:
        raise ValueError("bad page cursor")
    return Cursor(when, id_type(ident))


def runs_by_workflow(conn: Connection) -> list[tuple[str, dict[RunState, int]]]:
    """Runs per workflow and state, workflows by name."""
    rows = conn.execute(
        select(runs.c.workflow, runs.c.state, func.count())
        .group_by(runs.c.workflow, runs.c.state)
        .order_by(runs.c.workflow)
    )
    table: dict[str, dict[RunState, int]] = {}
    for workflow, state, count in rows:
        table.setdefault(workflow, dict.fromkeys(RunState, 0))[RunState(state)] = count
    return list(table.items())


@dataclass(frozen=True, slots=True)
class Active:
    """Active jobs of one queue and kind: due now, scheduled later, running.

    ``workflow`` is None for standalone jobs. Steps blocked on their upstream steps are
    not counted: they wait on their run, not on a queue.
    """

    queue: str
    workflow: str | None
    kind: str
    ready: int
    scheduled: int
    running: int


def active_jobs(conn: Connection) -> list[Active]:
    """Available and running jobs per queue, workflow and kind; a run not started yet counts
    its roots as available.

    Each arm states the predicate of a partial index (the two claim indexes, the
    heartbeat index and the index of runs to start), so the read costs the active jobs,
    never the finished history.
    """
    due = jobs.c.scheduled_at <= func.now()
    available = jobs.c.state == JobState.AVAILABLE.value
    arms = [
        select(jobs.c.queue, jobs.c.workflow, jobs.c.kind, due.label("due"), jobs.c.state).where(
            available, where
        )
        for where in (jobs.c.workflow.is_not(None), jobs.c.workflow.is_(None))
    ]
    running = select(jobs.c.queue, jobs.c.workflow, jobs.c.kind, true(), jobs.c.state).where(
        jobs.c.state == JobState.RUNNING.value
    )
    # The roots of runs not started yet: available jobs to be, read from their graphs.
    pending = _unstarted.pending_steps().subquery("pending")
    unstarted = select(
        pending.c.queue,
        pending.c.workflow,
        pending.c.kind,
        (pending.c.scheduled_at <= func.now()).label("due"),
        pending.c.state,
    ).where(pending.c.state == JobState.AVAILABLE.value)
    active = union_all(*arms, running, unstarted).subquery()
    is_available = active.c.state == JobState.AVAILABLE.value
    rows = conn.execute(
        select(
            active.c.queue,
            active.c.workflow,
            active.c.kind,
            func.count().filter(and_(is_available, active.c.due)),
            func.count().filter(and_(is_available, ~active.c.due)),
            func.count().filter(active.c.state == JobState.RUNNING.value),
        )
        .group_by(active.c.queue, active.c.workflow, active.c.kind)
        .order_by(active.c.queue, active.c.workflow.nulls_first(), active.c.kind)
    )
    return [Active(*row) for row in rows]


@dataclass(frozen=True, slots=True)
class Backlog:
    """Active jobs of one queue: due now, scheduled later, running."""

    queue: str
    ready: int
    scheduled: int
    running: int


def backlog_by_queue(active: list[Active]) -> list[Backlog]:
    """:func:`active_jobs` summed per queue."""
    queues: dict[str, list[int]] = {}
    for a in active:
        total = queues.setdefault(a.queue, [0, 0, 0])
        total[0] += a.ready
        total[1] += a.scheduled
        total[2] += a.running
    return [Backlog(queue, *counts) for queue, counts in sorted(queues.items())]


def finished_per_minute(conn: Connection, minutes: int = 60) -> list[tuple[datetime, int, int]]:
    """Per minute of the last ``minutes``: (minute, completed, failed) runs and standalone jobs.

    Both reads use the partial ``finalized_at`` indexes; minutes without any are included.
    """
    since = func.date_trunc("minute", func.now()) - timedelta(minutes=minutes - 1)
    minute_of_run = func.date_trunc("minute", runs.c.finalized_at)
    minute_of_job = func.date_trunc("minute", jobs.c.finalized_at)
    ended = (
        select(minute_of_run.label("minute"), runs.c.state.label("state"))
        .where(runs.c.finalized_at >= since, runs.c.finalized_at.is_not(None))
        .union_all(
            select(minute_of_job, jobs.c.state).where(
                jobs.c.run_id.is_(None),
                jobs.c.finalized_at.is_not(None),
                jobs.c.finalized_at >= since,
            )
        )
        .subquery()
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
            func.count(ended.c.state).filter(ended.c.state == "completed"),
            func.count(ended.c.state).filter(ended.c.state == "failed"),
        )
        .select_from(series)
        .outerjoin(ended, ended.c.minute == minute)
        .group_by(minute)
        .order_by(minute)
    )
    return [(m, completed, failed) for m, completed, failed in conn.execute(stmt)]


@dataclass(frozen=True, slots=True)
class RunRow:
    """One line of the runs list."""

    id: uuid.UUID
    workflow: str
    key: str | None
    state: RunState
    created_at: datetime
    finished_at: datetime | None
    failed_step: str | None


SCAN_LIMIT = 10_000
"""Runs a listing reads, at most, to fill a page with filters no index serves."""


@dataclass(frozen=True, slots=True)
class RunPage:
    """A page of runs and where the next one starts.

    ``next`` is None on the last page. ``searched_to`` is set when the page stopped short
    because it read :data:`SCAN_LIMIT` runs without filling up: the next page goes on
    with the runs created before that moment.
    """

    rows: list[RunRow]
    next: Cursor | None
    searched_to: datetime | None = None


_RUN_ROW = (
    runs.c.id,
    runs.c.workflow,
    runs.c.submit_key,
    runs.c.state,
    runs.c.created_at,
    runs.c.finalized_at,
    runs.c.failed_step,
)


def list_runs(
    conn: Connection,
    filters: RunFilters,
    after: Cursor | None,
    limit: int = PAGE_SIZE,
    scan: int | None = None,
) -> RunPage:
    """A page of runs newest first.

    The workflow, an exact key, the time range and the cursor are served by indexes. A
    state or a key prefix is not: those filters are applied to at most ``scan`` runs
    (default :data:`SCAN_LIMIT`) in the order of the listing, so a state that few runs
    are in costs a bounded read per page instead of a read of the whole table.
    """
    stmt = select(*_RUN_ROW)
    if filters.workflow is not None:
        stmt = stmt.where(
            runs.c.workflow == filters.workflow,
            runs.c.created_at > literal_column(LISTED_SINCE, runs.c.created_at.type),
        )
    exact_key = filters.key is not None and not filters.key.endswith("*")
    if exact_key:
        stmt = stmt.where(runs.c.submit_key == filters.key)
        if filters.workflow is None:
            # The key index leads with the workflow: naming every workflow turns the
            # lookup into one index probe per workflow instead of a scan of the runs.
            stmt = stmt.where(runs.c.workflow == func.any(_workflow_names_array()))
    if filters.since is not None:
        stmt = stmt.where(runs.c.created_at >= filters.since)
    if filters.until is not None:
        stmt = stmt.where(runs.c.created_at < filters.until)
    if after is not None:
        stmt = stmt.where(tuple_(runs.c.created_at, runs.c.id) < (after.created_at, after.id))
    newest_first = (runs.c.created_at.desc(), runs.c.id.desc())
    state, key = filters.state, filters.key

    def unindexed(c: Any) -> list[Any]:
        """The filters no index serves, on the columns ``c`` of the runs or of a window."""
        found = [] if state is None else [c.state == state.value]
        if key is not None and not exact_key:
            found.append(c.submit_key.startswith(key[:-1], autoescape=True))
        return found

    if not unindexed(runs.c) or exact_key:
        page = stmt.where(*unindexed(runs.c)).order_by(*newest_first).limit(limit + 1)
        return _page(list(conn.execute(page)), limit)
    budget = SCAN_LIMIT if scan is None else scan
    window = stmt.order_by(*newest_first).limit(budget).subquery()
    page = (
        select(*window.c)
        .where(*unindexed(window.c))
        .order_by(window.c.created_at.desc(), window.c.id.desc())
        .limit(limit + 1)
    )
    found = _page(list(conn.execute(page)), limit)
    if found.next is not None:
        return found
    edge = conn.execute(stmt.order_by(*newest_first).offset(budget - 1).limit(1)).first()
    if edge is None:
        return found
    return RunPage(found.rows, Cursor(edge.created_at, edge.id), edge.created_at)


def _page(rows: list[Any], limit: int) -> RunPage:
    found = [RunRow(r[0], r[1], r[2], RunState(r[3]), r[4], r[5], r[6]) for r in rows]
    if len(found) <= limit:
        return RunPage(found, None)
    last = found[limit - 1]
    return RunPage(found[:limit], Cursor(last.created_at, last.id))


def _workflow_names() -> Any:
    """The distinct workflow names of the runs, by a loose scan of the key index.

    A recursive CTE steps from one name to the next with ``min(workflow) > previous``, so
    it reads one index entry per workflow, not one per run.
    """
    name = runs.c.workflow
    first = select(func.min(name).label("name")).cte("names", recursive=True)
    following = select(select(func.min(name)).where(name > first.c.name).scalar_subquery()).where(
        first.c.name.is_not(None)
    )
    names = first.union_all(following)
    return select(names.c.name).where(names.c.name.is_not(None))


def _workflow_names_array() -> Any:
    return func.array(_workflow_names().scalar_subquery())


def workflow_names(conn: Connection) -> list[str]:
    """The workflows that have runs, for the filter's choices."""
    return [n for (n,) in conn.execute(_workflow_names())]


@dataclass(frozen=True, slots=True)
class RunDetail:
    """Everything the run page shows of the run itself."""

    id: uuid.UUID
    workflow: str
    key: str | None
    state: RunState
    input: str
    graph: str
    result_step: str | None
    error: str | None
    failed_step: str | None
    deadline: datetime | None
    retention: timedelta | None
    created_at: datetime
    finished_at: datetime | None
    steps_remaining: int
    now: datetime


@dataclass(frozen=True, slots=True)
class StepRow:
    """One step (job) of a run."""

    kind: str
    state: JobState
    queue: str
    attempt: int
    max_attempts: int
    errors: str
    output: str | None
    created_at: datetime
    scheduled_at: datetime
    attempted_at: datetime | None
    finished_at: datetime | None
    worker_id: str | None


def get_run(conn: Connection, run_id: uuid.UUID) -> RunDetail | None:
    row = conn.execute(
        select(
            runs.c.id,
            runs.c.workflow,
            runs.c.submit_key,
            runs.c.state,
            cast(runs.c.input, Text),
            cast(runs.c.graph, Text),
            runs.c.result_step,
            cast(runs.c.error, Text),
            runs.c.failed_step,
            runs.c.deadline,
            runs.c.retention,
            runs.c.created_at,
            runs.c.finalized_at,
            runs.c.steps_remaining,
            func.now(),
        ).where(runs.c.id == run_id)
    ).first()
    if row is None:
        return None
    values: list[Any] = list(row)
    values[3] = RunState(values[3])
    return RunDetail(*values)


_STEP_ROW_COLUMNS = (
    "kind",
    "state",
    "queue",
    "attempt",
    "max_attempts",
    "errors",
    "output",
    "created_at",
    "scheduled_at",
    "attempted_at",
    "finalized_at",
    "worker_id",
)


def _as_text(col: Any) -> Any:
    """The jsonb columns of a step as text, the others as they are."""
    return cast(col, Text).label(col.name) if col.name in ("errors", "output") else col


def run_steps(conn: Connection, run_id: uuid.UUID) -> list[StepRow]:
    """A run's steps: its jobs, or, for a run not started yet, the steps of its graph."""
    unstarted = _unstarted.steps_of(run_id).subquery("unstarted")
    rows = conn.execute(
        union_all(
            select(*(_as_text(jobs.c[n]) for n in _STEP_ROW_COLUMNS)).where(
                jobs.c.run_id == run_id
            ),
            select(*(_as_text(unstarted.c[n]) for n in _STEP_ROW_COLUMNS)),
        )
    )
    return [StepRow(row[0], JobState(row[1]), *row[2:]) for row in rows]


@dataclass(frozen=True, slots=True)
class JobRow:
    """A standalone job, as the jobs list and the job page show it."""

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
    attempted_at: datetime | None
    finished_at: datetime | None
    errors: str
    args: str | None
    output: str | None
    worker_id: str | None


_JOB_COLUMNS = (
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
    jobs.c.attempted_at,
    jobs.c.finalized_at,
    cast(jobs.c.errors, Text),
    cast(jobs.c.args, Text),
    cast(jobs.c.output, Text),
    jobs.c.worker_id,
)


def _job(row: Any) -> JobRow:
    values: list[Any] = list(row)
    values[5] = JobState(values[5])
    return JobRow(*values)


def list_jobs(
    conn: Connection,
    *,
    queue: str | None,
    kind: str | None,
    state: JobState | None,
    after: Cursor | None,
    limit: int = PAGE_SIZE,
) -> tuple[list[JobRow], Cursor | None]:
    """A page of standalone jobs newest first and the next page's cursor."""
    stmt = select(*_JOB_COLUMNS).where(jobs.c.run_id.is_(None))
    if queue is not None:
        stmt = stmt.where(jobs.c.queue == queue)
    if kind is not None:
        stmt = stmt.where(jobs.c.kind == kind)
    if state is not None:
        stmt = stmt.where(jobs.c.state == state.value)
    if after is not None:
        stmt = stmt.where(tuple_(jobs.c.created_at, jobs.c.id) < (after.created_at, after.id))
    stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit + 1)
    rows = [_job(row) for row in conn.execute(stmt)]
    if len(rows) <= limit:
        return rows, None
    last = rows[limit - 1]
    return rows[:limit], Cursor(last.created_at, last.id)


def get_job(conn: Connection, job_id: int) -> JobRow | None:
    row = conn.execute(
        select(*_JOB_COLUMNS).where(jobs.c.id == job_id, jobs.c.run_id.is_(None))
    ).first()
    return None if row is None else _job(row)
