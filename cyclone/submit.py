"""Submission: the insert-once statements of ``submit``, ``submit_once`` and their ``_tx`` forms.

A new key costs one statement: a CTE inserts the run ``ON CONFLICT DO NOTHING``, inserts
its steps from the inserted row, and, in the same statement, reads an existing run of the
key and compares its input as ``jsonb``. A second statement is needed only when another
transaction committed the key after the first statement's snapshot. When cyclone owns
the transaction (a bind), the statement is sent in autocommit mode: one statement is
atomic on its own, so no BEGIN or COMMIT round trips are needed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
from sqlalchemy import (
    Boolean,
    Connection,
    Engine,
    Integer,
    Interval,
    Select,
    Text,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    literal,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from cyclone import _binds, _graph, _keys, errors
from cyclone.schema import jobs, runs
from cyclone.states import JobState, RunState

_MAX_RACE_RETRIES = 5


class _StepRow(msgspec.Struct):
    kind: str
    queue: str
    priority: int
    deps: list[str]
    max_attempts: int


@dataclass(frozen=True, slots=True)
class Plan:
    """What every run of one workflow inserts, encoded once per definition."""

    workflow: str
    graph: str
    steps: str
    result_step: str | None
    step_count: int

    @classmethod
    def build(cls, workflow: str, graph: _graph.GraphSnapshot) -> Plan:
        rows = [
            _StepRow(
                kind=node.name,
                queue=node.queue,
                priority=node.priority,
                deps=list(node.after),
                max_attempts=node.max_attempts,
            )
            for node in graph.steps
        ]
        return cls(
            workflow=workflow,
            graph=msgspec.json.encode(graph).decode(),
            steps=msgspec.json.encode(rows).decode(),
            result_step=graph.result,
            step_count=len(rows),
        )


@dataclass(frozen=True, slots=True)
class Submitted:
    """The outcome of one submit: the run, and whether this call created it."""

    engine: Engine
    run_id: uuid.UUID
    key: str | None
    created: bool


def _step_rows() -> Any:
    return (
        func.jsonb_to_recordset(cast(bindparam("steps", type_=Text), JSONB))
        .table_valued(
            column("kind", Text),
            column("queue", Text),
            column("priority", Integer),
            column("deps", ARRAY(Text)),
            column("max_attempts", Integer),
        )
        .render_derived("s", with_types=True)
    )


def _insert_jobs_stmt(inserted: Any) -> Any:
    """Insert one job per step of every run in ``inserted`` (a CTE with id and deadline)."""
    steps = _step_rows()
    pending = func.cardinality(steps.c.deps)
    return insert(jobs).from_select(
        [
            jobs.c.run_id,
            jobs.c.workflow,
            jobs.c.kind,
            jobs.c.queue,
            jobs.c.priority,
            jobs.c.state,
            jobs.c.deps,
            jobs.c.pending_deps,
            jobs.c.max_attempts,
            jobs.c.deadline,
        ],
        select(
            inserted.c.id,
            inserted.c.workflow,
            steps.c.kind,
            steps.c.queue,
            steps.c.priority,
            case(
                (pending == 0, literal(JobState.AVAILABLE.value)),
                else_=literal(JobState.BLOCKED.value),
            ),
            steps.c.deps,
            pending,
            steps.c.max_attempts,
            inserted.c.deadline,
        ).select_from(inserted.join(steps, true())),
    )


def _run_values() -> dict[str, Any]:
    deadline = func.coalesce(
        bindparam("deadline_at", type_=runs.c.deadline.type),
        func.now() + bindparam("deadline_in", type_=Interval),
    )
    return {
        "workflow": bindparam("workflow", type_=Text),
        "input": cast(bindparam("input", type_=Text), JSONB),
        "graph": cast(bindparam("graph", type_=Text), JSONB),
        "result_step": bindparam("result_step", type_=Text),
        "state": literal(RunState.RUNNING.value, Text),
        "steps_remaining": bindparam("step_count", type_=Integer),
        "deadline": deadline,
        "retention": bindparam("retention", type_=Interval),
    }


def insert_run_stmt() -> Select[Any]:
    """Insert a keyless run and its steps; returns the run id."""
    inserted = (
        insert(runs)
        .values(submit_key=None, **_run_values())
        .returning(runs.c.id, runs.c.workflow, runs.c.deadline)
        .cte("ins")
    )
    new_jobs = _insert_jobs_stmt(inserted).cte("new_jobs")
    return select(inserted.c.id).add_cte(new_jobs)


def insert_run_once_stmt() -> Any:
    """Insert the run of a key unless one exists, else read that run and compare inputs.

    Rows: ``(id, created, same_input)``. No row means another transaction committed the
    key after this statement's snapshot: read it with :func:`select_run_by_key_stmt`.
    """
    inserted = (
        insert(runs)
        .values(submit_key=bindparam("key", type_=Text), **_run_values())
        .on_conflict_do_nothing(index_elements=[runs.c.workflow, runs.c.submit_key])
        .returning(runs.c.id, runs.c.workflow, runs.c.deadline)
        .cte("ins")
    )
    new_jobs = _insert_jobs_stmt(inserted).cte("new_jobs")
    created = select(inserted.c.id, literal(True, Boolean).label("created"), literal(True, Boolean))
    existing = select_run_by_key_stmt().where(~exists(select(inserted.c.id)))
    return union_all(created, existing).add_cte(new_jobs)


def select_run_by_key_stmt() -> Select[Any]:
    """The run of ``(workflow, key)`` with whether its input equals ``input`` as jsonb."""
    return select(
        runs.c.id,
        literal(False, Boolean).label("created"),
        (runs.c.input == cast(bindparam("input", type_=Text), JSONB)).label("same_input"),
    ).where(
        runs.c.workflow == bindparam("workflow", type_=Text),
        runs.c.submit_key == bindparam("key", type_=Text),
    )


def insert_runs_once_stmt() -> Any:
    """The batch form of :func:`insert_run_once_stmt` over a jsonb array of ``{i, key, input}``.

    Rows: ``(i, id, created, same_input)``; an item of a key repeated in the batch gets
    the first item's run with created False.
    """
    items = (
        func.jsonb_to_recordset(cast(bindparam("items", type_=Text), JSONB))
        .table_valued(column("i", Integer), column("key", Text), column("input", JSONB))
        .render_derived("it", with_types=True)
    )
    items_cte = select(items.c.i, items.c.key, items.c.input).cte("items")
    first_i = select(func.min(items_cte.c.i).label("i")).group_by(items_cte.c.key).subquery("fi")
    first = (
        select(items_cte.c.i, items_cte.c.key, items_cte.c.input)
        .join_from(items_cte, first_i, first_i.c.i == items_cte.c.i)
        .cte("first")
    )
    values = _run_values()
    del values["input"]
    inserted = (
        insert(runs)
        .from_select(
            ["submit_key", "input", *values],
            # Key order, the same in every batch, so overlapping batches cannot deadlock.
            select(first.c.key, first.c.input, *values.values()).order_by(first.c.key),
        )
        .on_conflict_do_nothing(index_elements=[runs.c.workflow, runs.c.submit_key])
        .returning(runs.c.id, runs.c.workflow, runs.c.deadline, runs.c.submit_key, runs.c.input)
        .cte("ins")
    )
    new_jobs = _insert_jobs_stmt(inserted).cte("new_jobs")
    created = (
        select(
            items_cte.c.i,
            inserted.c.id,
            (items_cte.c.i == first.c.i).label("created"),
            (items_cte.c.input == inserted.c.input).label("same_input"),
        )
        .join_from(items_cte, inserted, inserted.c.submit_key == items_cte.c.key)
        .join(first, first.c.key == items_cte.c.key)
    )
    existing = select(
        items_cte.c.i,
        runs.c.id,
        literal(False, Boolean),
        runs.c.input == items_cte.c.input,
    ).join_from(
        items_cte,
        runs,
        (runs.c.workflow == bindparam("workflow", type_=Text))
        & (runs.c.submit_key == items_cte.c.key)
        & ~exists().where(inserted.c.submit_key == items_cte.c.key),
    )
    return union_all(created, existing).add_cte(new_jobs)


_INSERT_RUN = insert_run_stmt()
_INSERT_RUN_ONCE = insert_run_once_stmt()
_SELECT_RUN_BY_KEY = select_run_by_key_stmt()
_INSERT_RUNS_ONCE = insert_runs_once_stmt()


def _params(
    plan: Plan,
    input: str,
    deadline: datetime | timedelta | None,
    retention: timedelta | None,
) -> dict[str, Any]:
    if deadline is not None and not isinstance(deadline, datetime | timedelta):
        raise TypeError("deadline= takes a datetime or a timedelta")
    if isinstance(deadline, datetime) and deadline.tzinfo is None:
        raise ValueError("deadline= must be a timezone-aware datetime")
    if retention is not None and (not isinstance(retention, timedelta) or retention < timedelta()):
        raise ValueError("retention= takes a non-negative timedelta")
    return {
        "workflow": plan.workflow,
        "input": input,
        "graph": plan.graph,
        "steps": plan.steps,
        "result_step": plan.result_step,
        "step_count": plan.step_count,
        "deadline_at": deadline if isinstance(deadline, datetime) else None,
        "deadline_in": deadline if isinstance(deadline, timedelta) else None,
        "retention": retention,
    }


def _insert(conn: Connection, params: dict[str, Any], key: str | None) -> Submitted:
    run_id = conn.execute(_INSERT_RUN, params).scalar_one()
    return Submitted(conn.engine, run_id, key, True)


def _insert_once(conn: Connection, params: dict[str, Any], key: str) -> Submitted:
    params = {**params, "key": key}
    row = conn.execute(_INSERT_RUN_ONCE, params).first()
    for _ in range(_MAX_RACE_RETRIES):
        if row is None:
            row = conn.execute(_SELECT_RUN_BY_KEY, params).first()
        if row is None:
            # The committed run was purged between the two statements: try again.
            row = conn.execute(_INSERT_RUN_ONCE, params).first()
            continue
        run_id, created, same_input = row
        if not same_input:
            raise errors.SubmitConflictError(workflow=params["workflow"], key=key, run_id=run_id)
        return Submitted(conn.engine, run_id, key, bool(created))
    raise RuntimeError(f"key {key!r} kept changing hands while submitting; try again")


def submit(
    bind: _binds.Bind,
    plan: Plan,
    input: str,
    deadline: datetime | timedelta | None,
    retention: timedelta | None,
) -> Submitted:
    params = _params(plan, input, deadline, retention)
    with _binds.autocommit(bind) as conn:
        return _insert(conn, params, None)


def submit_tx(
    conn: _binds.Conn,
    plan: Plan,
    input: str,
    deadline: datetime | timedelta | None,
    retention: timedelta | None,
) -> Submitted:
    params = _params(plan, input, deadline, retention)
    return _insert(_binds.joined(conn), params, None)


def submit_once(
    bind: _binds.Bind,
    plan: Plan,
    key: str,
    input: str,
    deadline: datetime | timedelta | None,
    retention: timedelta | None,
) -> Submitted:
    _keys.check_key(key)
    params = _params(plan, input, deadline, retention)
    with _binds.autocommit(bind) as conn:
        return _insert_once(conn, params, key)


def submit_once_tx(
    conn: _binds.Conn,
    plan: Plan,
    key: str,
    input: str,
    deadline: datetime | timedelta | None,
    retention: timedelta | None,
) -> Submitted:
    _keys.check_key(key)
    params = _params(plan, input, deadline, retention)
    return _insert_once(_binds.joined(conn), params, key)


def _items_payload(items: Sequence[tuple[str, str]], indexes: Sequence[int]) -> str:
    """The jsonb array ``[{i, key, input}, ...]`` of the chosen items (inputs pre-encoded)."""
    return (
        "["
        + ",".join(
            f'{{"i":{i},"key":{msgspec.json.encode(items[i][0]).decode()},"input":{items[i][1]}}}'
            for i in indexes
        )
        + "]"
    )


def submit_once_many(
    bind: _binds.Bind,
    plan: Plan,
    items: Sequence[tuple[str, str]],
    deadline: datetime | timedelta | None,
    retention: timedelta | None,
) -> list[Submitted]:
    for key, _input in items:
        _keys.check_key(key)
    if not items:
        return []
    params = _params(plan, "null", deadline, retention)
    del params["input"]
    results: dict[int, Submitted] = {}
    missing: list[int] = list(range(len(items)))
    with _binds.transaction(bind) as conn:
        for _ in range(_MAX_RACE_RETRIES):
            payload = _items_payload(items, missing)
            rows = conn.execute(_INSERT_RUNS_ONCE, {**params, "items": payload}).all()
            for i, run_id, created, same_input in sorted(rows, key=lambda r: r[0]):
                key = items[i][0]
                if not same_input:
                    raise errors.SubmitConflictError(workflow=plan.workflow, key=key, run_id=run_id)
                results[i] = Submitted(conn.engine, run_id, key, bool(created))
            # An item with no row: another transaction committed its key after this
            # statement's snapshot; the next statement sees it.
            missing = [i for i in range(len(items)) if i not in results]
            if not missing:
                return [results[i] for i in range(len(items))]
    raise RuntimeError("keys kept changing hands while submitting the batch; try again")
