"""Fork: a new run of a workflow's current graph that keeps the outputs of a finished run's steps.

A fork is one transaction of three statements: the first locks the source run
(``FOR SHARE``: a retry or purge of it waits until the fork commits, and no step of it can
be recorded meanwhile; the key of its workflow limit before it, if any) and reads its
state and graph; the second reads the state of each of its steps, in a snapshot taken
once the lock is held; the
caller (:func:`fork`) decides which steps are kept, and the third statement inserts the
run of the key ``ON CONFLICT DO NOTHING`` and, only if it was inserted, every step of
the current graph at once: kept steps ``completed`` with the source's output copied in
SQL (never through Python), a kept map node with its completed items, the others
``available`` or ``blocked`` with their ``pending_deps`` counting their upstream steps
not kept. The run is inserted started (``start_at`` NULL, its jobs written), so the
claim that starts runs never sees it. A key whose run exists already is read in the same
statement and its input compared as ``jsonb`` with the source's, as ``submit_once``
does. Nothing is written before the
third statement, and that statement is atomic: a crash at any point leaves either no
fork or the whole fork.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from sqlalchemy import (
    Boolean,
    Integer,
    Text,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    false,
    func,
    null,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from cyclone import _graph, _keys, _observe, errors
from cyclone._store import binds as _binds
from cyclone._store import definitions as _definitions
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone._store import notify as _notify
from cyclone._store import submission as _submission
from cyclone._store.executor import const
from cyclone.schema import STEP_JOB_COLUMNS, jobs, runs
from cyclone.states import TERMINAL_RUN_STATES, JobState, RunState

_step_states = jobs.alias("source_step")

_SOURCE = (
    select(
        runs.c.workflow,
        runs.c.state,
        cast(_definitions.graph_of(runs), Text),
        runs.c.limit_name,
        runs.c.limit_key,
    )
    .where(
        _limits.keys_locked_first(bindparam("source", type_=runs.c.id.type)),
        runs.c.id == bindparam("source", type_=runs.c.id.type),
    )
    .with_for_update(read=True, of=runs)
)
"""Lock the source run ``FOR SHARE`` (after its workflow limit's key, the lock order of
keys and runs: :func:`cyclone._store.limits.keys_locked_first`) and read its workflow,
state, graph, and the workflow limit and key it ran under."""

_SOURCE_STEPS = select(
    select(cast(func.jsonb_object_agg(_step_states.c.kind, _step_states.c.state), Text))
    .where(_step_states.c.run_id == bindparam("source"), _step_states.c.item.is_(None))
    .scalar_subquery(),
    select(_step_states.c.kind)
    .where(
        _step_states.c.run_id == bindparam("source"),
        _step_states.c.item.is_not(None),
        _step_states.c.state == const(JobState.RUNNING.value),
    )
    .limit(const(1, Integer))
    .scalar_subquery(),
)
"""The states of the source's steps (not of map items, which share their node's name) and
a map node with an item still running, if any. Read in a statement after the one that
locks the source: a statement's snapshot is taken before it waits for its locks, so the
locking statement would see the steps as they were before the transactions it waited
for (a retry, a claim, a cancel) changed them, while seeing the run as they left it."""

_STEP_FIELDS = (
    column("ord", Integer),
    column("name", Text),
    column("after", ARRAY(Text)),
    column("max_attempts", Integer),
    column("queue", Text),
    column("priority", Integer),
    column("signal", Text),
    column("kept", Boolean),
    column("pending", Integer),
)


def insert_fork_stmt() -> Any:
    """Insert the fork of ``:source`` under ``(:workflow, :key)`` and its steps ``:steps``.

    Rows: ``(id, created, same_input)``, as :mod:`cyclone._store.submission`'s
    insert-once statement returns them; no row when another transaction committed the
    key after this statement's snapshot.
    """
    source = runs.alias("source")
    source_id = bindparam("source", type_=runs.c.id.type)
    remaining = bindparam("remaining", type_=Integer)
    done = remaining == const(0, Integer)
    values = {
        "workflow": bindparam("workflow", type_=Text),
        "submit_key": bindparam("key", type_=Text),
        "input": source.c.input,
        "definition": bindparam("definition", type_=runs.c.definition.type),
        "result_step": bindparam("result_step", type_=Text),
        "state": case((done, const(RunState.COMPLETED.value)), else_=const(RunState.RUNNING.value)),
        "steps_remaining": remaining,
        "retention": source.c.retention,
        "trace_context": bindparam("trace_context", type_=Text),
        "forked_from": source.c.id,
        "finalized_at": case((done, func.now()), else_=null()),
        "step_limits": source.c.step_limits,
        "limit_name": bindparam("limit_name", type_=Text),
        "limit_key": bindparam("limit_key", type_=Text),
    }
    inserted = (
        insert(runs)
        .from_select(
            list(values),
            select(*(v.label(k) for k, v in values.items())).where(source.c.id == source_id),
        )
        .on_conflict_do_nothing(index_elements=[runs.c.workflow, runs.c.submit_key])
        .returning(runs.c.id)
        .cte("forked")
    )
    step = (
        func.jsonb_to_recordset(cast(bindparam("steps", type_=Text), JSONB))
        .table_valued(*_STEP_FIELDS)
        .render_derived("s", with_types=True)
    )
    kept_job = jobs.alias("kept_job")
    # The source run's limited steps keep their limits and keys (evaluated on the same input).
    step_limits = select(runs.c.step_limits).where(runs.c.id == source_id).scalar_subquery()
    step_limit = step_limits.op("->", return_type=JSONB)(step.c.name)
    state = case(
        (step.c.kept, const(JobState.COMPLETED.value)),
        (step.c.pending == const(0, Integer), const(JobState.AVAILABLE.value)),
        else_=const(JobState.BLOCKED.value),
    )
    rows = (
        select(
            inserted.c.id,
            bindparam("workflow", type_=Text),
            step.c.name,
            step.c.queue,
            step.c.priority,
            state,
            step.c.after,
            step.c.pending,
            step.c.max_attempts,
            case(
                (
                    step.c.signal.is_not(None),
                    func.jsonb_build_object(const("signal"), step.c.signal),
                ),
            ),
            kept_job.c.output,
            kept_job.c.attempted_at,
            kept_job.c.finalized_at,
            step_limit.op("->>", return_type=Text)(const("n")),
            step_limit.op("->>", return_type=Text)(const("k")),
            step_limit.op("->>", return_type=Text)(const("rn")),
            step_limit.op("->>", return_type=Text)(const("rk")),
        )
        .select_from(inserted)
        .join(step, true())
        .outerjoin(
            kept_job,
            and_(
                step.c.kept,
                kept_job.c.run_id == source_id,
                kept_job.c.kind == step.c.name,
                kept_job.c.item.is_(None),
                kept_job.c.state == const(JobState.COMPLETED.value),
            ),
        )
        .order_by(step.c.ord)
    )
    new_jobs = (
        insert(jobs)
        .from_select(
            [
                *STEP_JOB_COLUMNS,
                jobs.c.args,
                jobs.c.output,
                jobs.c.attempted_at,
                jobs.c.finalized_at,
                jobs.c.limit_name,
                jobs.c.limit_key,
                jobs.c.rate_name,
                jobs.c.rate_key,
            ],
            rows,
        )
        .returning(_notify.when_available(jobs.c.state))
        .cte("forked_steps")
    )
    kept_item = jobs.alias("kept_item")
    kept_node = (
        func.jsonb_to_recordset(cast(bindparam("steps", type_=Text), JSONB))
        .table_valued(*_STEP_FIELDS)
        .render_derived("kept_node", with_types=True)
    )
    item_rows = (
        select(
            inserted.c.id,
            kept_item.c.workflow,
            kept_item.c.kind,
            kept_item.c.queue,
            kept_item.c.priority,
            kept_item.c.state,
            kept_item.c.deps,
            const(0, Integer),
            kept_item.c.max_attempts,
            kept_item.c.args,
            kept_item.c.item,
            kept_item.c.output,
            kept_item.c.attempted_at,
            kept_item.c.finalized_at,
            kept_item.c.limit_name,  # the fork keeps the source's step_limits
            kept_item.c.limit_key,
            kept_item.c.rate_name,
            kept_item.c.rate_key,
        )
        .select_from(inserted)
        .join(kept_item, kept_item.c.run_id == source_id)
        .join(kept_node, and_(kept_node.c.kept, kept_node.c.name == kept_item.c.kind))
        .where(
            kept_item.c.item.is_not(None),
            kept_item.c.state == const(JobState.COMPLETED.value),
        )
        .order_by(kept_item.c.kind, kept_item.c.item)
    )
    # A kept map node keeps its items (completed, outputs copied), so that it still has
    # one completed item per element of its output.
    new_items = (
        insert(jobs)
        .from_select(
            [
                *STEP_JOB_COLUMNS,
                jobs.c.args,
                jobs.c.item,
                jobs.c.output,
                jobs.c.attempted_at,
                jobs.c.finalized_at,
                jobs.c.limit_name,
                jobs.c.limit_key,
                jobs.c.rate_name,
                jobs.c.rate_key,
            ],
            item_rows,
        )
        .returning(jobs.c.id)
        .cte("forked_items")
    )
    source_input = select(runs.c.input).where(runs.c.id == source_id).scalar_subquery()
    created = select(
        inserted.c.id,
        true().label("created"),
        # Reads the steps' CTEs, so that the data-modifying CTEs are part of the statement.
        (
            select(func.count()).select_from(new_jobs).scalar_subquery()
            + select(func.count()).select_from(new_items).scalar_subquery()
            >= 0
        ).label("same_input"),
    )
    existing = select(runs.c.id, false(), runs.c.input == source_input).where(
        runs.c.workflow == bindparam("workflow", type_=Text),
        runs.c.submit_key == bindparam("key", type_=Text),
        ~exists(select(inserted.c.id)),
    )
    return union_all(created, existing)


_INSERT_FORK = insert_fork_stmt()
_SELECT_RUN_BY_KEY = _submission.select_run_by_key_stmt()
_SOURCE_INPUT = select(cast(runs.c.input, Text)).where(
    runs.c.id == bindparam("source", type_=runs.c.id.type)
)


@dataclass(frozen=True, slots=True)
class Forked:
    """The fork of a key: its run, whether this call created it, and the steps it keeps."""

    run_id: uuid.UUID
    created: bool
    kept: tuple[str, ...]


def _downstream(start: set[str], edges: dict[str, set[str]]) -> set[str]:
    """``start`` and every step downstream of them, over ``edges`` (step -> its upstreams)."""
    below: dict[str, set[str]] = {}
    for name, ups in edges.items():
        for up in ups:
            below.setdefault(up, set()).add(name)
    found, todo = set(start), list(start)
    while todo:
        for name in below.get(todo.pop(), ()):
            if name not in found:
                found.add(name)
                todo.append(name)
    return found


@dataclass(frozen=True, slots=True)
class _Plan:
    kept: tuple[str, ...]
    steps: str
    remaining: int


def plan_steps(
    *,
    source_id: uuid.UUID,
    workflow: str,
    old: _graph.GraphSnapshot,
    new: _graph.GraphSnapshot,
    completed: set[str],
    rerun: Sequence[str],
) -> _Plan:
    """Which steps of ``new`` a fork keeps, and the rows of its steps (pure).

    A step is kept when the source completed it and it is neither in ``rerun`` nor
    downstream of one of them (over the edges of both graphs). A kept step must still be
    in ``new`` with the same upstream steps, else DefinitionError names it. A step of the
    source that is not completed (failed, cancelled, never started) runs again, and so
    does everything downstream of it (none of which can have completed).
    """
    old_after = {s.name: set(s.after) for s in old.steps}
    new_after = {s.name: set(s.after) for s in new.steps}
    unknown = [name for name in rerun if name not in old_after and name not in new_after]
    if unknown:
        raise errors.DefinitionError(
            f"rerun= names {', '.join(repr(n) for n in unknown)}, not a step of workflow "
            f"{workflow!r} (neither of its current definition nor of run {source_id})"
        )
    names = old_after.keys() | new_after.keys()
    edges = {n: old_after.get(n, set()) | new_after.get(n, set()) for n in names}
    again = _downstream(set(rerun), edges)
    kept = [name for name in old_after if name in completed and name not in again]
    for name in kept:
        if name not in new_after:
            raise errors.DefinitionError(
                f"step {name!r} of run {source_id} would be kept (it completed and is not "
                f"in rerun=), but workflow {workflow!r} no longer defines it: name it in "
                "rerun= to drop its output"
            )
        if new_after[name] != old_after[name]:
            raise errors.DefinitionError(
                f"step {name!r} of run {source_id} would be kept (it completed and is not "
                f"in rerun=), but its upstream steps changed in workflow {workflow!r} "
                f"(from {sorted(old_after[name])} to {sorted(new_after[name])}): name it "
                "in rerun= to run it again"
            )
    keep = set(kept)
    rows = [
        {
            "ord": i,
            "name": s.name,
            "after": list(s.after),
            "max_attempts": s.max_attempts,
            "queue": s.queue,
            "priority": s.priority,
            "signal": s.signal,
            "kept": s.name in keep,
            "pending": sum(1 for up in s.after if up not in keep),
        }
        for i, s in enumerate(new.steps)
    ]
    return _Plan(
        kept=tuple(s.name for s in new.steps if s.name in keep),
        steps=msgspec.json.encode(rows).decode(),
        remaining=sum(1 for s in new.steps if s.name not in keep),
    )


_graph_decoder = msgspec.json.Decoder(_graph.GraphSnapshot)
_states_decoder = msgspec.json.Decoder(dict[str, str])


def fork(
    bind: _binds.Bind,
    *,
    source_id: uuid.UUID,
    workflow: str,
    graph: _graph.GraphSnapshot,
    key: str,
    rerun: Sequence[str],
) -> Forked:
    """Fork run ``source_id`` of ``workflow`` onto ``graph`` under ``key``: one transaction.

    Raises:
        InvalidKeyError: a bad key (nothing is sent).
        NotFoundError: the source run does not exist or is of another workflow.
        InvalidStateError: the source is running, or one of its steps still is, or the
            source's workflow limit has no room for the fork in the source's key.
        DefinitionError: a step to keep is gone or changed, or ``rerun`` names no step.
        SubmitConflictError: the key's run has another input than the source.
    """
    _keys.check_key(key)
    encoded = msgspec.json.encode(graph).decode()
    definition = _definitions.definition_id(workflow, encoded)
    with _binds.transaction(bind) as conn:
        row = _executor.first(conn, _SOURCE, {"source": source_id})
        if row is None or row[0] != workflow:
            raise errors.NotFoundError(f"workflow {workflow!r} has no run {source_id}")
        state = RunState(row[1])
        steps = _executor.one(conn, _SOURCE_STEPS, {"source": source_id})
        step_states = {} if steps[0] is None else _states_decoder.decode(steps[0])
        if state not in TERMINAL_RUN_STATES:
            raise errors.InvalidStateError(
                operation="fork", run_id=source_id, state=f"{state}: cancel it or let it end first"
            )
        if JobState.RUNNING.value in step_states.values() or steps[1] is not None:
            raise errors.InvalidStateError(
                operation="fork",
                run_id=source_id,
                state=f"{state} with steps still running; fork once they end",
            )
        completed = {k for k, v in step_states.items() if v == JobState.COMPLETED.value}
        plan = plan_steps(
            source_id=source_id,
            workflow=workflow,
            old=_graph_decoder.decode(row[2]),
            new=graph,
            completed=completed,
            rerun=rerun,
        )
        limit_name, limit_key = row[3], row[4]
        if limit_name is not None:
            # Under its workflow's limit, the fork is a run in progress of the source's key
            # (the input is the same): it needs room there, as a retry does.
            _limits.room_for_fork(
                conn,
                source_id=source_id,
                name=limit_name,
                key=limit_key,
                workflow=workflow,
                fork_key=key,
                starts=plan.remaining > 0,
            )
        # Once the fork is known to be valid; in a statement of its own (see definitions).
        _definitions.ensure(conn.engine, definition, workflow, encoded)
        params = {
            "source": source_id,
            "workflow": workflow,
            "key": key,
            "definition": definition,
            "result_step": graph.result,
            "remaining": plan.remaining,
            "trace_context": _observe.trace_context(),
            "steps": plan.steps,
            "limit_name": limit_name,
            "limit_key": limit_key,
        }

        def once(insert: bool) -> Sequence[Any] | None:
            if insert:
                return _executor.first(conn, _INSERT_FORK, params)
            # Another transaction committed the key after the insert's snapshot.
            source_input = _executor.value(conn, _SOURCE_INPUT, params)
            return _executor.first(conn, _SELECT_RUN_BY_KEY, {**params, "input": source_input})

        run_id, created = _submission.resolve_once(once, workflow, key)
    return Forked(run_id, created, plan.kept if created else ())
