"""The reads of runs and jobs behind the public read API: statuses, listings and details.

Each function sends its statements on the connection it is given and returns the rows'
values; :mod:`cyclone.runs`, :mod:`cyclone.jobs` and :mod:`cyclone.client` build their
public types from them. Listings are keyset-paginated on ``(created_at, id)``, so a page
costs the same at the end of a long table as at its start. Nothing here writes.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    null,
    select,
    true,
    tuple_,
    union_all,
)

from cyclone import _codec
from cyclone._store import binds as _binds
from cyclone._store import definitions as _definitions
from cyclone._store import executor as _executor
from cyclone._store import parked as _parked
from cyclone._store import unstarted as _unstarted
from cyclone._store.executor import const
from cyclone.schema import LISTED_SINCE, jobs, runs
from cyclone.states import JobState, Parked, RunState

_STATUS_OF_TABLE = (
    runs.c.id,
    runs.c.workflow,
    runs.c.submit_key,
    runs.c.state,
    runs.c.created_at,
    runs.c.finalized_at,
    runs.c.deadline,
    runs.c.error,
    runs.c.failed_step,
    runs.c.retention,
    runs.c.forked_from,
    runs.c.parent_id,
    runs.c.parent_node,
    runs.c.parent_item,
)
STATUS_COLUMNS = (
    *(cast(c, Text) if c is runs.c.error else c for c in _STATUS_OF_TABLE),
    _parked.run_parked(runs).label("parked"),
)
"""A run's status, in the order of ``RunStatus``'s fields."""

RunStatusFields = tuple[
    uuid.UUID,
    str,
    str | None,
    RunState,
    datetime,
    datetime | None,
    datetime | None,
    dict[str, Any] | None,
    str | None,
    timedelta | None,
    uuid.UUID | None,
    Parked | None,
    uuid.UUID | None,
    str | None,
    int | None,
]


def run_status_fields(row: Sequence[Any]) -> RunStatusFields:
    """The fields of a ``RunStatus`` from a row that starts with :data:`STATUS_COLUMNS`."""
    error = None if row[7] is None else _codec.decode(row[7])
    parked = None if row[14] is None else Parked(row[14])
    state = RunState(row[3])
    return (
        *(row[0], row[1], row[2], state, *row[4:7], error, row[8], row[9], row[10], parked),
        *(row[11], row[12], row[13]),
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
"""A standalone job's status, in the order of ``JobStatus``'s fields."""

JobStatusFields = tuple[
    int,
    str,
    str | None,
    str,
    int,
    JobState,
    int,
    int,
    datetime,
    datetime,
    datetime | None,
    list[dict[str, Any]],
]


def job_status_fields(row: Sequence[Any]) -> JobStatusFields:
    """The fields of a ``JobStatus`` from a row that starts with :data:`JOB_STATUS_COLUMNS`."""
    return (*row[0:5], JobState(row[5]), *row[6:11], _codec.decode(row[11]))


def select_status_stmt() -> Select[Any]:
    """A run's status by id (``:rid``)."""
    return select(*STATUS_COLUMNS).where(runs.c.id == bindparam("rid"))


def select_result_stmt() -> Select[Any]:
    """The run's state, result node and the result node's output as JSON text."""
    return (
        select(runs.c.state, runs.c.result_step, cast(jobs.c.output, Text))
        .select_from(
            runs.outerjoin(
                jobs,
                and_(
                    jobs.c.run_id == runs.c.id,
                    jobs.c.kind == runs.c.result_step,
                    jobs.c.item.is_(None),  # a map node's own job, not its items
                ),
            )
        )
        .where(runs.c.id == bindparam("rid"))
    )


def select_job_stmt() -> Select[Any]:
    """A job's status by id (``:job_id``)."""
    return select(*JOB_STATUS_COLUMNS).where(jobs.c.id == bindparam("job_id"))


def select_job_output_stmt() -> Select[Any]:
    """A job's state and output as JSON text, by id (``:job_id``)."""
    return select(jobs.c.state, cast(jobs.c.output, Text)).where(jobs.c.id == bindparam("job_id"))


_SELECT_STATUS = select_status_stmt()
_SELECT_STANDALONE = select(*JOB_STATUS_COLUMNS).where(
    jobs.c.id == bindparam("job_id"), jobs.c.run_id.is_(None)
)


def run_status(conn: Connection, run_id: uuid.UUID) -> RunStatusFields | None:
    """The status of run ``run_id``, or None."""
    row = _executor.first(conn, _SELECT_STATUS, {"rid": run_id})
    return None if row is None else run_status_fields(row)


_FAST_SELECT_STATUS = _executor.Compiled(_SELECT_STATUS)
_FAST_SELECT_RESULT = _executor.Compiled(select_result_stmt())


def _child_order() -> tuple[Any, ...]:
    """A run's children by node, in the order the nodes made their first child, and a map
    of children's in item order: its items' children are made in any order."""
    return (
        func.min(runs.c.created_at).over(partition_by=runs.c.parent_node),
        runs.c.parent_node,
        runs.c.parent_item.nulls_first(),
        runs.c.created_at,
        runs.c.id,
    )


_CHILDREN = (
    select(runs.c.id, runs.c.workflow, runs.c.submit_key, runs.c.parent_node)
    .where(runs.c.parent_id == bindparam("rid"))
    .order_by(*_child_order())
)


def children(engine: Engine, run_id: uuid.UUID) -> list[tuple[uuid.UUID, str, str | None, str]]:
    """The child runs of run ``run_id`` (id, workflow, key, parent node), in the order of
    :func:`_child_order`: a range of ``ix_cyclone_runs_parent``."""
    with engine.connect() as conn:
        return [
            (row[0], row[1], row[2], row[3])
            for row in _executor.rows(conn, _CHILDREN, {"rid": run_id})
        ]


def run_status_now(engine: Engine, run_id: uuid.UUID) -> RunStatusFields | None:
    """The status of run ``run_id``, or None: one autocommit statement on the fast path."""
    rows = _executor.pooled_rows(engine, _FAST_SELECT_STATUS, {"rid": run_id})
    return run_status_fields(rows[0]) if rows else None


def run_result(engine: Engine, run_id: uuid.UUID) -> Sequence[Any] | None:
    """Run ``run_id``'s state, result step and that step's output, or None: one
    autocommit statement on the fast path."""
    rows = _executor.pooled_rows(engine, _FAST_SELECT_RESULT, {"rid": run_id})
    return rows[0] if rows else None


_SELECT_JOB = select_job_stmt()
_SELECT_OUTPUT = select_job_output_stmt()


def job_status_now(engine: Engine, job_id: int) -> JobStatusFields | None:
    """The status of job ``job_id`` (a :class:`cyclone.Job` handle's), or None."""
    with _binds.autocommit(engine) as conn:
        row = _executor.first(conn, _SELECT_JOB, {"job_id": job_id})
    return None if row is None else job_status_fields(row)


def job_output(engine: Engine, job_id: int) -> str | None:
    """The output of job ``job_id``, which has ended."""
    with _binds.autocommit(engine) as conn:
        output: str | None = _executor.one(conn, _SELECT_OUTPUT, {"job_id": job_id})[1]
    return output


def job_status(conn: Connection, job_id: int) -> JobStatusFields | None:
    """The status of standalone job ``job_id``, or None (a step of a run is not one)."""
    row = _executor.first(conn, _SELECT_STANDALONE, {"job_id": job_id})
    return None if row is None else job_status_fields(row)


# Listings


def _listed(
    stmt: Select[Any],
    *,
    workflow: str | None,
    key: str | None,
    since: datetime | None,
    until: datetime | None,
    parked: Parked | None,
) -> Select[Any]:
    """``stmt`` kept to the runs :func:`list_runs` lists with these filters, the states
    aside: :func:`_newest_first` (or :func:`count_listed`) applies them."""
    if parked is not None:
        stmt = stmt.where(*_parked.filters(parked))
    stmt = _listing(stmt, workflow)
    if key is not None:
        stmt = stmt.where(runs.c.submit_key == key)
    if since is not None:
        stmt = stmt.where(runs.c.created_at >= since)
    if until is not None:
        stmt = stmt.where(runs.c.created_at < until)
    return stmt


def list_runs(
    conn: Connection,
    *,
    workflow: str | None,
    state: RunState | None,
    key: str | None,
    since: datetime | None,
    after: tuple[datetime, Any] | None,
    limit: int,
    parked: Parked | None = None,
    until: datetime | None = None,
) -> list[RunStatusFields]:
    """Runs newest first, strictly after the position ``after`` (created_at, id).

    ``parked`` keeps the runs parked so (:mod:`cyclone._store.parked`): its candidates are
    read from an index, so the listing costs the parked runs, not the history.
    """
    stmt = _listed(
        select(*_STATUS_OF_TABLE),
        workflow=workflow,
        key=key,
        since=since,
        until=until,
        parked=parked,
    )
    if after is not None:
        stmt = stmt.where(tuple_(runs.c.created_at, runs.c.id) < after)
    page = _newest_first(stmt, None if state is None else (state,), limit)
    return [run_status_fields(row) for row in _executor.rows(conn, _statuses_of(page))]


def _statuses_of(page: Select[Any]) -> Select[Any]:
    """The statuses of the runs ``page`` selects (the columns of :data:`_STATUS_OF_TABLE`,
    newest first, limited), why each is parked read after the limit, by its id.

    Read under the limit, ``parked``'s subqueries would be planned for every run the scan
    may pass, and PostgreSQL hashes every busy job of the table once instead of probing
    the page's few runs by id (hundreds of milliseconds at a million runs).
    """
    rows = page.subquery("page")
    of_page = runs.alias("of_page")
    parked = select(_parked.run_parked(of_page)).where(of_page.c.id == rows.c.id)
    return select(
        *(cast(c, Text) if c.name == "error" else c for c in rows.c),
        parked.scalar_subquery().label("parked"),
    ).order_by(rows.c.created_at.desc(), rows.c.id.desc())


def listed_run_ids(
    conn: Connection,
    *,
    workflow: str | None,
    states: Sequence[RunState],
    key: str | None,
    since: datetime | None,
    until: datetime | None,
    parked: Parked | None,
    after: tuple[datetime, Any] | None,
    limit: int,
) -> list[tuple[datetime, uuid.UUID]]:
    """``(created_at, id)`` of the next ``limit`` runs :func:`list_runs` lists in ``states``,
    newest first, strictly after ``after``: a batch of a bulk action."""
    stmt = _listed(
        select(runs.c.created_at, runs.c.id),
        workflow=workflow,
        key=key,
        since=since,
        until=until,
        parked=parked,
    )
    if after is not None:
        stmt = stmt.where(tuple_(runs.c.created_at, runs.c.id) < after)
    page = _newest_first(stmt, states, limit)
    return [(created_at, run_id) for created_at, run_id in _executor.rows(conn, page)]


def count_listed(
    conn: Connection,
    *,
    workflow: str | None,
    states: Sequence[RunState],
    key: str | None,
    since: datetime | None,
    until: datetime | None,
    parked: Parked | None,
) -> int:
    """How many runs :func:`list_runs` lists in ``states`` with these filters."""
    stmt = _listed(
        select(func.count()).select_from(runs),
        workflow=workflow,
        key=key,
        since=since,
        until=until,
        parked=parked,
    )
    if len(states) == 1:
        stmt = stmt.where(runs.c.state == states[0].value)
    elif set(states) != set(RunState):
        stmt = stmt.where(runs.c.state.in_([s.value for s in states]))
    return int(_executor.value(conn, stmt))


def _listing(stmt: Select[Any], workflow: str | None) -> Select[Any]:
    """``stmt`` filtered by workflow, stating the listing indexes' predicate (always true), so
    the planner may use the partial ``(state, created_at, id)`` and ``(workflow, state,
    created_at, id)`` indexes (revision cyclone_0013) once a state is filtered on."""
    stmt = stmt.where(runs.c.created_at > literal_column(LISTED_SINCE, runs.c.created_at.type))
    if workflow is not None:
        stmt = stmt.where(runs.c.workflow == workflow)
    return stmt


def _newest_first(
    stmt: Select[Any],
    states: Sequence[RunState] | None,
    limit: int,
    offset: int = 0,
    *,
    merge: bool = True,
) -> Select[Any]:
    """The runs of ``stmt`` (a :func:`_listing`) in ``states`` (None: every state), newest
    first, ``limit`` of them after the first ``offset``.

    The runs have no index on ``(created_at, id)`` nor on ``(workflow, created_at, id)``
    (revision cyclone_0020_definitions dropped them, two index entries less per run
    written): a listing of several states reads each state's range of the state indexes
    newest first, at most ``offset + limit`` runs each, and PostgreSQL merges them (a
    Merge Append), so a page costs a few index probes per state, not a sort of the runs.
    ``merge=False`` orders ``stmt`` as it is (a key's runs: a few rows to sort).
    """
    newest = (runs.c.created_at.desc(), runs.c.id.desc())
    if states is not None and len(states) == 1:
        one = stmt.where(runs.c.state == states[0].value).order_by(*newest)
        return one.offset(offset).limit(limit) if offset else one.limit(limit)
    if not merge:
        if states is not None:
            stmt = stmt.where(runs.c.state.in_([s.value for s in states]))
        stmt = stmt.order_by(*newest)
        return stmt.offset(offset).limit(limit) if offset else stmt.limit(limit)
    branches = [
        stmt.where(runs.c.state == state.value).order_by(*newest).limit(offset + limit)
        for state in (RunState if states is None else states)
    ]
    merged = union_all(*branches).subquery("merged")
    page = select(*merged.c).order_by(merged.c.created_at.desc(), merged.c.id.desc())
    return page.offset(offset).limit(limit) if offset else page.limit(limit)


def page_runs(
    conn: Connection,
    *,
    workflow: str | None,
    state: RunState | None,
    key: str | None,
    since: datetime | None,
    until: datetime | None,
    after: tuple[datetime, Any] | None,
    limit: int,
    scan: int,
    parked: Parked | None = None,
) -> tuple[list[RunStatusFields], RunStatusFields | None]:
    """At most ``limit + 1`` runs newest first, and the run a page stopped at because it read
    ``scan`` runs without filling up (else None).

    The workflow, the state, an exact key, the time range and the position are served by
    indexes, and so is ``parked`` (see :func:`list_runs`). A key prefix (a key ending in
    ``*``) is not: it is applied to at most ``scan`` runs in the order of the listing, so a
    prefix that few runs match costs a bounded read per page instead of a read of the whole
    table. Send it in one snapshot: the page and the run it stopped at are read by two
    statements.
    """
    # Filtered on the table's own columns: the window below casts only the runs it keeps.
    stmt = _listing(select(*_STATUS_OF_TABLE), workflow)
    states = None if state is None else (state,)
    if parked is not None:
        stmt = stmt.where(*_parked.filters(parked))
    exact_key = key is not None and not key.endswith("*")
    if exact_key:
        stmt = stmt.where(runs.c.submit_key == key)
        if workflow is None:
            # The key index leads with the workflow: naming every workflow turns the
            # lookup into one index probe per workflow instead of a scan of the runs.
            stmt = stmt.where(runs.c.workflow == func.any(_workflow_names_array()))
    if since is not None:
        stmt = stmt.where(runs.c.created_at >= since)
    if until is not None:
        stmt = stmt.where(runs.c.created_at < until)
    if after is not None:
        stmt = stmt.where(tuple_(runs.c.created_at, runs.c.id) < after)

    def unindexed(c: Any) -> list[Any]:
        """The filters no index serves, on the columns ``c`` of the runs or of a window."""
        found = []
        if key is not None and not exact_key:
            found.append(c.submit_key.startswith(key[:-1], autoescape=True))
        return found

    if not unindexed(runs.c) or exact_key:
        page = _newest_first(stmt.where(*unindexed(runs.c)), states, limit + 1, merge=not exact_key)
        return [run_status_fields(r) for r in _executor.rows(conn, _statuses_of(page))], None
    window = _newest_first(stmt, states, scan).subquery()
    page = (
        select(*window.c)
        .where(*unindexed(window.c))
        .order_by(window.c.created_at.desc(), window.c.id.desc())
        .limit(limit + 1)
    )
    found = [run_status_fields(r) for r in _executor.rows(conn, _statuses_of(page))]
    if len(found) > limit:
        return found, None
    edge_page = _newest_first(stmt, states, 1, scan - 1)
    edge = _executor.first(conn, _statuses_of(edge_page))
    return found, None if edge is None else run_status_fields(edge)


def workflow_names_stmt() -> Select[Any]:
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
    return func.array(workflow_names_stmt().scalar_subquery())


def workflow_names(conn: Connection) -> list[str]:
    """The workflows that have runs, by name."""
    return [n for (n,) in _executor.rows(conn, workflow_names_stmt())]


def list_jobs(
    conn: Connection,
    *,
    kind: str | None,
    state: JobState | None,
    queue: str | None,
    after: tuple[datetime, Any] | None,
    limit: int,
) -> list[JobStatusFields]:
    """Standalone jobs newest first, strictly after the position ``after`` (created_at, id)."""
    stmt = select(*JOB_STATUS_COLUMNS).where(jobs.c.run_id.is_(None))
    if kind is not None:
        stmt = stmt.where(jobs.c.kind == kind)
    if state is not None:
        stmt = stmt.where(jobs.c.state == state.value)
    if queue is not None:
        stmt = stmt.where(jobs.c.queue == queue)
    if after is not None:
        stmt = stmt.where(tuple_(jobs.c.created_at, jobs.c.id) < after)
    stmt = stmt.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit)
    return [job_status_fields(row) for row in _executor.rows(conn, stmt)]


# Details

_RUN_DETAIL = select(
    *STATUS_COLUMNS,
    cast(runs.c.input, Text),
    runs.c.result_step,
    cast(_definitions.graph_of(runs), Text),
    runs.c.steps_remaining,
    func.now(),
).where(runs.c.id == bindparam("id"))
_STEP_COLUMNS = (
    "kind",
    "id",
    "state",
    "queue",
    "attempt",
    "max_attempts",
    "scheduled_at",
    "attempted_at",
    "finalized_at",
    "errors",
    "output",
    "worker_id",
)
_PARKED_COLUMNS = ("waiting_for", "wakes_at", "parked")
"""Why a step waits, after :data:`_STEP_COLUMNS`: its signal, when it wakes, how it is parked."""
_ITEMS_COLUMNS = ("items_done", "items_total")
"""A map node's items completed and all its items (NULL for other steps), after
:data:`_PARKED_COLUMNS`."""
_item = jobs.alias("item")
_ITEMS = (
    select(
        func.count().filter(_item.c.state == const(JobState.COMPLETED.value)),
        func.count(),
    )
    .where(_item.c.run_id == jobs.c.run_id, _item.c.kind == jobs.c.kind, _item.c.item.is_not(None))
    .subquery("items")
    .lateral()
)
_STEPS_CREATED = (
    select(
        *(jobs.c[n] for n in _STEP_COLUMNS),
        case((_parked.waiting_step(jobs), _parked.signal_of(jobs))).label("waiting_for"),
        _parked.wakes_at(jobs).label("wakes_at"),
        _parked.step_parked(jobs).label("parked"),
        jobs.c.id.label("ord"),
        case((_ITEMS.c[1] > 0, _ITEMS.c[0])).label("items_done"),
        case((_ITEMS.c[1] > 0, _ITEMS.c[1])).label("items_total"),
    )
    .select_from(jobs.join(_ITEMS, true()))
    .where(jobs.c.run_id == bindparam("id"), jobs.c.item.is_(None))
)
_UNSTARTED = _unstarted.steps_of(bindparam("id")).subquery("unstarted")
_STEPS_ALL = union_all(
    _STEPS_CREATED,
    select(
        *(_UNSTARTED.c[n] for n in _STEP_COLUMNS),
        cast(null(), Text).label("waiting_for"),
        _parked.wakes_at(_UNSTARTED),
        _parked.unstarted_step_parked(_UNSTARTED),
        _UNSTARTED.c.ord,
        cast(null(), BigInteger),
        cast(null(), BigInteger),
    ),
).subquery("steps")
_STEPS = select(
    *(
        cast(_STEPS_ALL.c[n], Text) if n in ("errors", "output") else _STEPS_ALL.c[n]
        for n in (*_STEP_COLUMNS, *_PARKED_COLUMNS, *_ITEMS_COLUMNS)
    )
).order_by(_STEPS_ALL.c.ord)
"""A run's steps in order: its jobs, or, for a run not started yet, its graph's steps."""


def run_detail(
    conn: Connection, run_id: uuid.UUID
) -> tuple[Sequence[Any], list[_executor.Row]] | None:
    """Run ``run_id``'s row (its status, then input, result step, graph as JSON text, steps
    remaining and the database's clock) and its steps' rows (:data:`_STEP_COLUMNS` with JSON
    as text, then :data:`_PARKED_COLUMNS` and :data:`_ITEMS_COLUMNS`; a map node's items are
    counted, not listed), or None. Send it in one snapshot, so that the
    steps match the run."""
    row = _executor.first(conn, _RUN_DETAIL, {"id": run_id})
    if row is None:
        return None
    return row, _executor.rows(conn, _STEPS, {"id": run_id})


_CHILD_STATUSES = (
    select(*STATUS_COLUMNS)
    .where(runs.c.parent_id == bindparam("id"))
    .order_by(*_child_order())
    .limit(bindparam("n", type_=Integer))
)
_COUNT_CHILDREN = select(func.count()).where(runs.c.parent_id == bindparam("id"))


def child_statuses(
    conn: Connection, run_id: uuid.UUID, limit: int | None = None
) -> tuple[list[RunStatusFields], int]:
    """The statuses of run ``run_id``'s first ``limit`` child runs (``@wf.child``; None:
    all) in the order of :func:`_child_order`, and how many it has: a second read, a range
    of ``ix_cyclone_runs_parent``, only when ``limit`` cut the list."""
    if limit is not None and limit <= 0:
        rows: list[_executor.Row] = []
    else:
        rows = _executor.rows(conn, _CHILD_STATUSES, {"id": run_id, "n": limit})
    shown = [run_status_fields(row) for row in rows]
    if limit is None or len(shown) < limit:
        return shown, len(shown)
    return shown, int(_executor.value(conn, _COUNT_CHILDREN, {"id": run_id}))


_JOB_DETAIL = (
    select(
        *JOB_STATUS_COLUMNS,
        # What the job runs with: a map item its item, any other step its run's input.
        cast(
            case(
                (jobs.c.item.is_not(None), jobs.c.args),
                else_=func.coalesce(runs.c.input, jobs.c.args),
            ),
            Text,
        ),
        cast(jobs.c.output, Text),
        jobs.c.attempted_at,
        jobs.c.worker_id,
        jobs.c.run_id,
        runs.c.workflow,
        jobs.c.item,
    )
    .select_from(jobs.outerjoin(runs, runs.c.id == jobs.c.run_id))
    .where(jobs.c.id == bindparam("id"))
)


def job_detail(conn: Connection, job_id: int) -> Sequence[Any] | None:
    """Job ``job_id``'s status (standalone, or a step of a run), then its arguments (a
    step's: its run's input, a map item's: its item) and output as JSON text, when its last
    attempt started, the worker that ran it, and its run's id, workflow and item (NULL for
    a standalone job); or None. One row of the primary key and of the run's."""
    return _executor.first(conn, _JOB_DETAIL, {"id": job_id})
