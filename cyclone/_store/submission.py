"""Submission: the insert-once statements of ``submit``, ``submit_once`` and their ``_tx`` forms.

A new key costs one statement writing one row: a CTE inserts the run ``ON CONFLICT DO
NOTHING`` and, in the same statement, reads an existing run of the key and compares its
input as ``jsonb``. The run's steps are not written here: the claim that starts the run
creates them (:mod:`cyclone._store.claim`), from the graph of the definition the run row
names (:mod:`cyclone._store.definitions`, stored once per process and version). A second
statement is needed only when another transaction committed the key after the first
statement's snapshot. When cyclone owns
the transaction (a bind), the statement is sent in autocommit mode: one statement is
atomic on its own, so no BEGIN or COMMIT round trips are needed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import msgspec
from sqlalchemy import (
    Engine,
    Integer,
    Interval,
    Select,
    Text,
    Uuid,
    bindparam,
    cast,
    column,
    exists,
    false,
    func,
    literal_column,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import JSONB, insert

from cyclone import _graph, _keys, _observe, _timing, errors
from cyclone._store import binds as _binds
from cyclone._store import definitions as _definitions
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone._store import notify as _notify
from cyclone.schema import runs
from cyclone.states import RunState

_MAX_RACE_RETRIES = 5


_const = _executor.const


@dataclass(frozen=True, slots=True)
class Plan:
    """What every run of one workflow inserts, built once per definition.

    The workflow's name and definition's id are rendered into its statements' text, so
    a prepared statement parses them once rather than on every submit; only the key,
    the input, the deadline and the retention are parameters.
    """

    workflow: str
    graph: str
    definition: uuid.UUID
    result_step: str | None
    step_count: int
    insert_run: Any
    insert_run_once: Any
    insert_runs_once: Any
    first_insert_runs_once: Any
    fast_insert_run: _executor.Compiled
    fast_insert_run_once: _executor.Compiled
    first_insert_run: _executor.Compiled
    first_insert_run_once: _executor.Compiled
    """The two statements above that also store the definition: a process's first autocommit
    submit of this version in a database sends one of them (see :meth:`statement`)."""

    limit: dict[str, Any] | None = None
    """The parameters of the workflow's limit's row (:func:`cyclone._store.limits.spec_params`):
    its runs are submitted held (``start_at = 'infinity'``) and admitted by a worker."""
    step_limits: dict[str, dict[str, Any]] | None = None
    """The parameters of each limited step's limit row, by step name: a run keeps their
    keys in ``step_limits``, and its jobs get them when it starts."""
    step_rates: dict[str, dict[str, Any]] | None = None
    """The parameters of the Rate a limited step has besides its Concurrency, by step name."""
    item_limits: frozenset[str] = frozenset()
    """The limited steps that are map nodes: their limits are their items', not their own."""

    @property
    def limited(self) -> bool:
        """Whether a submit first makes sure limit and key rows exist."""
        return self.limit is not None or bool(self.step_limits)

    @classmethod
    def build(
        cls,
        workflow: str,
        graph: _graph.GraphSnapshot,
        limit: dict[str, Any] | None = None,
        step_limits: dict[str, dict[str, Any]] | None = None,
        step_rates: dict[str, dict[str, Any]] | None = None,
    ) -> Plan:
        encoded = msgspec.json.encode(graph).decode()
        limit_name = None if limit is None else str(limit["name"])
        definition = _definitions.definition_id(workflow, encoded)
        consts = _Consts(
            workflow, definition, graph.result, len(graph.steps), limit_name, bool(step_limits)
        )
        insert_run = consts.insert_run_stmt()
        insert_run_once = consts.insert_run_once_stmt()
        stores = _definitions.insert_cte(definition, workflow, encoded)
        return cls(
            workflow=workflow,
            graph=encoded,
            definition=definition,
            result_step=graph.result,
            step_count=len(graph.steps),
            insert_run=insert_run,
            insert_run_once=insert_run_once,
            insert_runs_once=consts.insert_runs_once_stmt(),
            first_insert_runs_once=consts.insert_runs_once_stmt().add_cte(stores),
            fast_insert_run=_executor.Compiled(insert_run),
            fast_insert_run_once=_executor.Compiled(insert_run_once),
            first_insert_run=_executor.Compiled(insert_run.add_cte(stores)),
            first_insert_run_once=_executor.Compiled(insert_run_once.add_cte(stores)),
            limit=limit,
            step_limits=step_limits or None,
            step_rates=step_rates or None,
            item_limits=frozenset(
                node.name
                for node in graph.steps
                if node.over is not None and node.name in (step_limits or {})
            ),
        )

    def store(self, engine: Engine) -> None:
        """Store this definition in ``engine``'s database unless this process already did
        (a statement of its own, for a submit in a transaction)."""
        _definitions.ensure(engine, self.definition, self.workflow, self.graph)

    def statement(self, engine: Engine, once: bool) -> tuple[_executor.Compiled, bool]:
        """The insert (``once``: insert-or-read) statement of an autocommit submit on
        ``engine``, and whether it stores the definition too (then, once it has run, call
        :meth:`stored`)."""
        if _definitions.is_stored(engine, self.definition):
            return (self.fast_insert_run_once if once else self.fast_insert_run), False
        return (self.first_insert_run_once if once else self.first_insert_run), True

    def stored(self, engine: Engine) -> None:
        _definitions.stored(engine, self.definition)


@dataclass(frozen=True, slots=True)
class Submitted:
    """The outcome of one submit: the run, and whether this call created it."""

    engine: Engine
    run_id: uuid.UUID
    key: str | None
    created: bool
    started: float | None = None
    """``time.monotonic()`` before the statement that created the run, when this process
    committed it itself (the bind forms): a waiter whose listener was already listening
    then need not read the run before its notification."""


@dataclass(frozen=True, slots=True)
class _Consts:
    """Builds one workflow's insert statements around its constants."""

    workflow: str
    definition: uuid.UUID
    result_step: str | None
    step_count: int
    limit_name: str | None = None
    step_limited: bool = False

    def _run_values(self) -> dict[str, Any]:
        deadline = func.coalesce(
            bindparam("deadline_at", type_=runs.c.deadline.type),
            func.now() + bindparam("deadline_in", type_=Interval),
        )
        return {
            "workflow": _const(self.workflow, Text),
            "input": cast(bindparam("input", type_=Text), JSONB),
            "definition": cast(_const(str(self.definition), Text), Uuid),
            "result_step": _const(self.result_step, Text),
            "state": _const(RunState.RUNNING.value, Text),
            "steps_remaining": _const(self.step_count, Integer),
            "deadline": deadline,
            "start_at": _starts_at(),
            "retention": bindparam("retention", type_=Interval),
            "trace_context": bindparam("trace_context", None, type_=Text),
            **self._limit_values(),
        }

    def _limit_values(self) -> dict[str, Any]:
        """A limited workflow's run is held: it waits, ``start_at = 'infinity'``, past every
        claim's range, with the start it asked for in ``limit_start_at``, until a worker
        admits it (:func:`cyclone._store.limits.admit_runs`)."""
        steps = (
            {"step_limits": cast(bindparam("step_limits", type_=Text), JSONB)}
            if self.step_limited
            else {}
        )
        if self.limit_name is None:
            return steps
        return {
            **steps,
            "limit_name": _const(self.limit_name, Text),
            "limit_key": bindparam("limit_key", type_=Text),
            "start_at": literal_column("'infinity'::timestamptz"),
            "limit_start_at": _starts_at(),
        }

    def select_run_by_key_stmt(self) -> Select[Any]:
        return _select_run_by_key(_const(self.workflow, Text))

    def insert_run_stmt(self) -> Any:
        """Insert a keyless run and its steps; returns the run id."""
        return (
            insert(runs).values(submit_key=None, **self._run_values()).returning(runs.c.id, _ring())
        )

    def insert_run_once_stmt(self) -> Any:
        """Insert the run of a key unless one exists, else read that run and compare inputs.

        Rows: ``(id, created, same_input)``. The insert is skipped for a run of the key
        that no transaction can be deleting (:func:`_settled_run`), which spares a
        duplicate the insert's per-row work (its CHECK constraints, the speculative
        insertion): about 45 us, a duplicate then costs what a plain lookup does. Else
        the insert comes first: its conflict check waits for a transaction that holds
        the key (inserting or purging it) and sees the outcome, where a read would see
        the snapshot. No row means another transaction committed the key after this
        statement's snapshot: read it with :func:`select_run_by_key_stmt`.
        """
        values_ = {"submit_key": bindparam("key", type_=Text), **self._run_values()}
        inserted = (
            insert(runs)
            .from_select(
                list(values_),
                select(*(v.label(k) for k, v in values_.items())).where(
                    ~exists(_settled_run(_const(self.workflow, Text)))
                ),
            )
            .on_conflict_do_nothing(index_elements=[runs.c.workflow, runs.c.submit_key])
            .returning(runs.c.id, _ring())
            .cte("ins")
        )
        created = select(inserted.c.id, true().label("created"), true())
        existing = self.select_run_by_key_stmt().where(~exists(select(inserted.c.id)))
        return union_all(created, existing)

    def insert_runs_once_stmt(self) -> Any:
        """The batch form of :meth:`insert_run_once_stmt` over a jsonb array of ``{i, key, input}``.

        Rows: ``(i, id, created, same_input)``; an item of a key repeated in the batch gets
        the first item's run with created False.
        """
        items = (
            func.jsonb_to_recordset(cast(bindparam("items", type_=Text), JSONB))
            .table_valued(
                column("i", Integer),
                column("key", Text),
                column("input", JSONB),
                column("lk", Text),
                column("sl", JSONB),
            )
            .render_derived("it", with_types=True)
        )
        items_cte = select(items.c.i, items.c.key, items.c.input, items.c.lk, items.c.sl).cte(
            "items"
        )
        first_i = (
            select(func.min(items_cte.c.i).label("i")).group_by(items_cte.c.key).subquery("fi")
        )
        first = (
            select(*items_cte.c)
            .join_from(items_cte, first_i, first_i.c.i == items_cte.c.i)
            .cte("first")
        )
        values_ = self._run_values()
        del values_["input"]
        if "limit_key" in values_:
            values_["limit_key"] = first.c.lk
        if "step_limits" in values_:
            values_["step_limits"] = first.c.sl
        inserted = (
            insert(runs)
            .from_select(
                ["submit_key", "input", *values_],
                # Key order, the same in every batch, so overlapping batches cannot deadlock.
                select(
                    first.c.key, first.c.input, *(v.label(k) for k, v in values_.items())
                ).order_by(first.c.key),
            )
            .on_conflict_do_nothing(index_elements=[runs.c.workflow, runs.c.submit_key])
            .returning(runs.c.id, runs.c.submit_key, runs.c.input, _ring())
            .cte("ins")
        )
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
            false(),
            runs.c.input == items_cte.c.input,
        ).join_from(
            items_cte,
            runs,
            (runs.c.workflow == _const(self.workflow, Text))
            & (runs.c.submit_key == items_cte.c.key)
            & ~exists().where(inserted.c.submit_key == items_cte.c.key),
        )
        return union_all(created, existing)


def _ring() -> Any:
    """A ``RETURNING`` column of a run insert: NOTIFY the workers of the new run.

    A run due later rings too: a woken worker finds nothing to claim, reads when the
    run falls due and sleeps until then. PostgreSQL runs a data-modifying CTE, and its
    ``RETURNING``, to the end, so a column no one reads still rings; repeats within a
    transaction are folded into one.
    """
    return _notify.ring().label("notified")


def _starts_at() -> Any:
    """When a new run may start: ``run_at=``, else now plus ``delay=``, else now.

    The claim that starts the run creates its steps with it as their ``scheduled_at``:
    the roots wait for it, and a later step keeps the claim order by submission time.
    """
    return func.coalesce(
        bindparam("start_at", type_=runs.c.start_at.type),
        func.now() + bindparam("start_in", type_=Interval),
        func.now(),
    )


def _settled_run(workflow: Any) -> Select[Any]:
    """The run of ``(workflow, :key)`` in the snapshot, if no transaction can be deleting it.

    A deleting transaction, running or not, leaves its id in the row's ``xmax``. Here
    ``xmax`` is unset, or the inserting transaction's own (the lock its foreign-key
    check on the run's steps took; that transaction committed, the row being visible),
    so no purge of the run is in flight; any other value takes the insert's path,
    which waits for such a purge. A lock-only ``xmax`` of a live deleter cannot be
    either: a delete waits for the key lockers it conflicts with and then writes its
    own id.
    """
    held = runs.alias("held")
    return select(held.c.id).where(
        held.c.workflow == workflow,
        held.c.submit_key == bindparam("key", type_=Text),
        literal_column("held.xmax").in_([literal_column("'0'::xid"), literal_column("held.xmin")]),
    )


def _select_run_by_key(workflow: Any) -> Select[Any]:
    """The run of ``(workflow, key)`` with whether its input equals ``input`` as jsonb."""
    return select(
        runs.c.id,
        false().label("created"),
        (runs.c.input == cast(bindparam("input", type_=Text), JSONB)).label("same_input"),
    ).where(runs.c.workflow == workflow, runs.c.submit_key == bindparam("key", type_=Text))


def select_run_by_key_stmt() -> Select[Any]:
    """The run of ``(workflow, key)``, the workflow a parameter: the second statement of a race."""
    return _select_run_by_key(bindparam("workflow", type_=Text))


_SELECT_RUN_BY_KEY = select_run_by_key_stmt()
_FAST_SELECT_RUN_BY_KEY = _executor.Compiled(_SELECT_RUN_BY_KEY)


def check_start(run_at: datetime | None, delay: timedelta | None) -> None:
    """Reject a bad ``run_at=`` / ``delay=`` before anything is sent."""
    if run_at is not None and delay is not None:
        raise ValueError("give run_at= or delay=, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise TypeError(f"run_at= takes a datetime, not {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise ValueError("run_at= must be a timezone-aware datetime")
        _timing.check_instant(run_at, "run_at=")
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise TypeError(f"delay= takes a timedelta, not {type(delay).__name__}")
        _timing.check_duration(delay, "delay=")


class Timing(NamedTuple):
    """When a run is due to end, how long it is kept once ended, and when it may start:
    the ``deadline=``, ``retention=``, ``run_at=`` and ``delay=`` of a submit."""

    deadline: datetime | timedelta | None = None
    retention: timedelta | None = None
    run_at: datetime | None = None
    delay: timedelta | None = None


def _params(plan: Plan, input: str, timing: Timing) -> dict[str, Any]:
    deadline, retention, run_at, delay = timing
    check_start(run_at, delay)
    if deadline is not None and not isinstance(deadline, datetime | timedelta):
        raise TypeError("deadline= takes a datetime or a timedelta")
    if isinstance(deadline, datetime) and deadline.tzinfo is None:
        raise ValueError("deadline= must be a timezone-aware datetime")
    if isinstance(deadline, datetime):
        _timing.check_instant(deadline, "deadline=")
    elif deadline is not None:
        _timing.check_duration(deadline, "deadline=")
    if retention is not None and not isinstance(retention, timedelta):
        raise TypeError(f"retention= takes a timedelta, not {type(retention).__name__}")
    if retention is not None and retention < timedelta():
        raise ValueError("retention= takes a non-negative timedelta")
    if retention is not None:
        _timing.check_duration(retention, "retention=")
    return {
        "workflow": plan.workflow,
        "input": input,
        "deadline_at": deadline if isinstance(deadline, datetime) else None,
        "deadline_in": deadline if isinstance(deadline, timedelta) else None,
        "retention": retention,
        "trace_context": _observe.trace_context(),
        "start_at": run_at,
        "start_in": delay,
    }


def _once_params(plan: Plan, key: str, input: str, timing: Timing) -> dict[str, Any]:
    """The parameters of the run of ``key``; the key is checked before anything is sent."""
    _keys.check_key(key)
    params = _params(plan, input, timing)
    params["key"] = key
    return params


_Row = Sequence[Any] | None
_Once = Callable[[bool], _Row]
"""Runs the insert-or-read statement (True) or the read of the key (False); first row."""


def resolve_once(once: _Once, workflow: str, key: str) -> tuple[Any, bool]:
    """The run of ``key`` and whether this call created it, from the insert-or-read rows."""
    row = once(True)
    for _ in range(_MAX_RACE_RETRIES):
        if row is None:
            row = once(False)
        if row is None:
            # The committed run was purged between the two statements: try again.
            row = once(True)
            continue
        run_id, created, same_input = row
        if not same_input:
            raise errors.SubmitConflictError(workflow=workflow, key=key, run_id=run_id)
        return run_id, bool(created)
    raise RuntimeError(f"key {key!r} kept changing hands while submitting; try again")


def _insert_once(
    conn: _executor.Executor,
    plan: Plan,
    params: dict[str, Any],
    first: _executor.Compiled | None = None,
) -> tuple[Any, bool]:
    """The run of ``params["key"]`` and whether this call created it, on ``conn``; ``first``
    is the insert-or-read statement to send first, when not the plan's usual one."""
    sent: list[_executor.Compiled] = []

    def once(insert: bool) -> _Row:
        stmt = plan.fast_insert_run_once if insert else _FAST_SELECT_RUN_BY_KEY
        if insert and first is not None and not sent:
            stmt = first
        sent.append(stmt)
        rows = conn.rows(stmt, params)
        return rows[0] if rows else None

    return resolve_once(once, plan.workflow, params["key"])


@_observe.submits
def submit(
    bind: _binds.Bind, plan: Plan, input: str, timing: Timing, keys: LimitKeys | None = None
) -> Submitted:
    params = _params(plan, input, timing)
    engine = _binds.engine_of(bind)
    stmt, stores = plan.statement(engine, once=False)
    started = time.monotonic()
    if not plan.limited:
        rows = _executor.pooled_rows(engine, stmt, params)
    else:
        with _executor.connect(engine) as conn:
            _limited(conn, plan, params, keys)
            rows = conn.rows(stmt, params)
    if stores:
        plan.stored(engine)
    return Submitted(engine, rows[0][0], None, True, started)


@_observe.submits
def submit_tx(
    conn: _binds.Conn, plan: Plan, input: str, timing: Timing, keys: LimitKeys | None = None
) -> Submitted:
    params = _params(plan, input, timing)
    executor, engine = _binds.joined(conn)
    plan.store(engine)
    _limited(executor, plan, params, keys)
    rows = executor.rows(plan.fast_insert_run, params)
    return Submitted(engine, rows[0][0], None, True)


@_observe.submits
def submit_once(
    bind: _binds.Bind,
    plan: Plan,
    key: str,
    input: str,
    timing: Timing,
    keys: LimitKeys | None = None,
) -> Submitted:
    params = _once_params(plan, key, input, timing)
    engine = _binds.engine_of(bind)
    stmt, stores = plan.statement(engine, once=True)
    started = time.monotonic()
    with _executor.connect(engine) as conn:
        _limited(conn, plan, params, keys)
        run_id, created = _insert_once(conn, plan, params, stmt)
    if stores:
        plan.stored(engine)
    return Submitted(engine, run_id, key, created, started if created else None)


@_observe.submits
def submit_once_tx(
    conn: _binds.Conn,
    plan: Plan,
    key: str,
    input: str,
    timing: Timing,
    keys: LimitKeys | None = None,
) -> Submitted:
    params = _once_params(plan, key, input, timing)
    executor, engine = _binds.joined(conn)
    plan.store(engine)
    _limited(executor, plan, params, keys)
    run_id, created = _insert_once(executor, plan, params)
    return Submitted(engine, run_id, key, created)


class LimitKeys(NamedTuple):
    """A run's keys, evaluated on its input: under its workflow's limit, and under each
    limited step's (by step name)."""

    run: str | None
    steps: dict[str, str]
    rates: dict[str, str]
    """The key of each step's Rate given with its Concurrency."""


def _step_limits(plan: Plan, keys: LimitKeys) -> str | None:
    """The run's ``step_limits``: ``{step: {"n": limit name, "k": key}}`` as JSON text,
    with ``"rn"``, ``"rk"`` for the Rate of a step given both; a map node's under
    ``{"items": {...}}``, which its expansion gives each item (the node's own job, which
    runs none of the user's code, has no limit)."""
    if not plan.step_limits:
        return None
    rates = plan.step_rates or {}
    encoded: dict[str, Any] = {}
    for step, params in plan.step_limits.items():
        entry = {"n": params["name"], "k": keys.steps[step]}
        if step in rates:
            entry.update(rn=rates[step]["name"], rk=keys.rates[step])
        encoded[step] = {"items": entry} if step in plan.item_limits else entry
    return msgspec.json.encode(encoded).decode()


def _ensure_keys(conn: _executor.Executor, plan: Plan, many: Sequence[LimitKeys]) -> None:
    """Make sure the limit and key rows of ``many`` runs exist, each pair once, in order."""
    wanted: dict[tuple[str, str], dict[str, Any]] = {}
    for keys in many:
        if plan.limit is not None:
            assert keys.run is not None
            wanted[(plan.limit["name"], keys.run)] = plan.limit
        for step, params in (plan.step_limits or {}).items():
            wanted[(params["name"], keys.steps[step])] = params
        for step, params in (plan.step_rates or {}).items():
            wanted[(params["name"], keys.rates[step])] = params
    for (_name, key), params in sorted(wanted.items(), key=lambda item: item[0]):
        _limits.ensure_key(conn, params, key)


def _limited(
    conn: _executor.Executor, plan: Plan, params: dict[str, Any], keys: LimitKeys | None
) -> None:
    """For a limited workflow or step: the limits' and keys' rows exist, and the run keeps
    its keys."""
    if not plan.limited:
        return
    assert keys is not None
    _ensure_keys(conn, plan, [keys])
    if plan.limit is not None:
        params["limit_key"] = keys.run
    if plan.step_limits:
        params["step_limits"] = _step_limits(plan, keys)


def _items_payload(
    plan: Plan,
    items: Sequence[tuple[str, str]],
    indexes: Sequence[int],
    limit_keys: Sequence[LimitKeys] | None,
) -> str:
    """The jsonb array ``[{i, key, input, lk, sl}, ...]`` of the chosen items (inputs
    pre-encoded)."""
    payload = []
    for i in indexes:
        keys = None if limit_keys is None else limit_keys[i]
        sl = None if keys is None else _step_limits(plan, keys)
        payload.append(
            {
                "i": i,
                "key": items[i][0],
                "input": msgspec.Raw(items[i][1]),
                "lk": None if keys is None else keys.run,
                "sl": None if sl is None else msgspec.Raw(sl),
            }
        )
    return msgspec.json.encode(payload).decode()


@_observe.submits
def submit_once_many(
    bind: _binds.Bind,
    plan: Plan,
    items: Sequence[tuple[str, str]],
    timing: Timing,
    limit_keys: Sequence[LimitKeys] | None = None,
) -> list[Submitted]:
    for key, _input in items:
        _keys.check_key(key)
    if not items:
        return []
    params = _params(plan, "null", timing)
    del params["input"]
    results: dict[int, Submitted] = {}
    missing: list[int] = list(range(len(items)))
    engine = _binds.engine_of(bind)
    # The first batch of this version stores the definition in its statement, committed
    # with the batch's transaction.
    stores = not _definitions.is_stored(engine, plan.definition)
    stmt = plan.first_insert_runs_once if stores else plan.insert_runs_once
    done: list[Submitted] | None = None
    with _binds.transaction(bind) as conn:
        if plan.limited:
            assert limit_keys is not None
            _ensure_keys(_executor.executor_of(conn), plan, limit_keys)
        for _ in range(_MAX_RACE_RETRIES):
            payload = _items_payload(plan, items, missing, limit_keys)
            rows = _executor.rows(conn, stmt, {**params, "items": payload})
            stmt = plan.insert_runs_once
            for i, run_id, created, same_input in sorted(rows, key=lambda r: r[0]):
                key = items[i][0]
                if not same_input:
                    raise errors.SubmitConflictError(workflow=plan.workflow, key=key, run_id=run_id)
                results[i] = Submitted(conn.engine, run_id, key, bool(created))
            # An item with no row: another transaction committed its key after this
            # statement's snapshot; the next statement sees it.
            missing = [i for i in range(len(items)) if i not in results]
            if not missing:
                done = [results[i] for i in range(len(items))]
                break
    if done is None:
        raise RuntimeError("keys kept changing hands while submitting the batch; try again")
    if stores:
        plan.stored(engine)
    return done
