"""Run control: cancel, retry and retry_all, each one transaction in the lock order.

The run's row is locked first (``FOR NO KEY UPDATE``), then its jobs, then the signal
rows of its wait nodes: the one lock order of :mod:`cyclone.states` (and of
:mod:`cyclone._store.waits`, which locks a wait node's job before its signal), which every
recording of an outcome follows too, so a user's call never deadlocks with a worker. A
retry, which may take the key of its run's workflow limit, locks that key before the run
(as an admission does, which locks keys, then the runs it cancels).

A retried wait node sees a signal already sent to its run (a run receives each signal
once): it runs at once with that payload. A wait node whose signal was never sent waits
anew, its timeout counted from when it parks again.

Each statement takes the runs it acts on as an array, ``:rids``: a single run's cancel or
retry passes one, and the bulk forms (:func:`cancel_many`, :func:`restart_many`) pass a
batch of runs, locked first in the run lock order (a bulk retry's with the children it
stops waiting for), so that a bulk action takes each run through the very same guarded
statements, one bounded transaction per batch.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    delete,
    false,
    func,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from cyclone import errors
from cyclone._store import completion as _completion
from cyclone._store import definitions as _definitions
from cyclone._store import executor as _executor
from cyclone._store import fanout as _fanout
from cyclone._store import limits as _limits
from cyclone._store import notify as _notify
from cyclone._store.executor import among, const
from cyclone.schema import jobs, run_lock_order, runs, signals
from cyclone.states import EDGES, TERMINAL_RUN_STATES, JobState, RunState


def _rids() -> Any:
    """``= ANY(:rids)``'s operand: the ids of the runs a statement acts on."""
    return func.any(bindparam("rids", type_=ARRAY(Uuid)))


def _running_trees() -> Any:
    """The running runs of ``:rids`` (``seed``) and their running children, recursively,
    as a recursive CTE ``tree`` (columns ``id``, ``seed``), read in the statement's
    snapshot."""
    child = runs.alias("child")
    tree = (
        select(runs.c.id, true().label("seed"))
        .where(runs.c.id == _rids(), runs.c.state == const(RunState.RUNNING.value))
        .cte("tree", recursive=True)
    )
    return tree.union_all(
        select(child.c.id, false()).where(
            child.c.parent_id == tree.c.id, child.c.state == const(RunState.RUNNING.value)
        )
    )


def lock_trees_stmt() -> Any:
    """Lock the running runs of ``:rids`` and their running children, recursively, in the
    run lock order, as :func:`cancel_run_stmt` locks them; returns their ids.

    An admission acts on the runs of several keys (it cancels some, with their trees,
    and admits others): this statement locks them all before it acts on any, so that
    they are taken in the one order of every statement that locks several runs, not key
    by key.
    """
    return _locking(_running_trees())


def _locking(tree: Any) -> Any:
    """Lock the runs of ``tree`` (:func:`_running_trees`) in the run lock order; their ids."""
    return (
        select(runs.c.id)
        .where(runs.c.id.in_(select(tree.c.id)))
        .order_by(*run_lock_order())
        .with_for_update(key_share=True)
    )


def cancel_run_stmt(*, cascaded: bool = False) -> Any:
    """Move the running runs of ``:rids`` and their running children, recursively, to
    cancelled, locking them first in the run lock order; returns the ids it moved.

    The tree is read in the statement's snapshot, then locked (creation time, then id: a
    child after its parent, the order of every statement that locks several runs), and
    a run that ended meanwhile is left as it is. ``:error`` (JSON text, or None: SQL
    NULL) says why, when a limit cancelled the runs of ``:rids``
    (``on_limit="cancel_newest"`` / ``"cancel_in_progress"``); their children get none,
    and their parent's node no longer waits for them (``parent_waits``), the parent being
    cancelled too (``cascaded``: the runs of ``:rids`` too, children of runs cancelled by
    an earlier statement). The ``RETURNING`` rings NOTIFY for a limited run: a run that
    ends frees its limit's slot, and a worker admits the next.
    """
    tree = _running_trees()
    locked = _locking(tree).cte("locked")
    below = true() if cascaded else runs.c.id.in_(select(tree.c.id).where(~tree.c.seed))
    return (
        update(runs)
        .where(among(runs.c.id, select(locked.c.id)), runs.c.state == const(RunState.RUNNING.value))
        .values(
            state=const(RunState.CANCELLED.value),
            finalized_at=func.now(),
            error=case(
                (runs.c.id == _rids(), cast(bindparam("error", None, type_=Text), JSONB)),
            ),
            parent_waits=case((below, false()), else_=runs.c.parent_waits),
        )
        .returning(
            runs.c.id,
            case(
                (
                    runs.c.limit_name.is_not(None),
                    _notify.ring(),
                )
            ),
        )
    )


def reset_jobs_stmt(*, every_step: bool) -> Any:
    """Make the chosen steps of the runs ``:rids`` runnable again, counting their unfinished
    predecessors."""
    upstream = jobs.alias("upstream")
    pending = (
        select(func.count())
        .where(
            upstream.c.run_id == jobs.c.run_id,
            upstream.c.kind == func.any(jobs.c.deps),
            upstream.c.item.is_(None),
            upstream.c.state != const(JobState.COMPLETED.value),
        )
        .scalar_subquery()
    )
    pending_all = func.cardinality(jobs.c.deps)
    count = pending_all if every_step else pending
    edge = EDGES["job.reset_all" if every_step else "job.reset"]
    return (
        update(jobs)
        .where(jobs.c.run_id == _rids(), jobs.c.state.in_([const(s) for s in edge.sources]))
        .values(
            pending_deps=count,
            state=case(
                (count == 0, const(JobState.AVAILABLE.value)),
                else_=const(JobState.BLOCKED.value),
            ),
            attempt=0,
            lost=0,
            worker_id=None,
            heartbeat_at=None,
            finalized_at=None,
            scheduled_at=func.now(),
            **({"output": None} if every_step else {}),
        )
    )


def restart_run_stmt(*, from_states: tuple[RunState, ...]) -> Any:
    """Put the terminal runs ``:rids`` back to running with their counts of unfinished steps.

    A run that never started is startable again: it rings for it, as its submit did (a
    started run's steps made available ring through the jobs' trigger).
    """
    # A run cancelled or expired before it started has no step rows: all its steps remain.
    remaining = case(
        (
            runs.c.start_at.is_not(None),
            func.jsonb_array_length(
                _definitions.graph_of(runs).op("->", return_type=JSONB)(const("steps"))
            ),
        ),
        else_=select(func.count())
        .where(jobs.c.run_id == runs.c.id, jobs.c.state != const(JobState.COMPLETED.value))
        .scalar_subquery(),
    )
    return (
        update(runs)
        .where(runs.c.id == _rids(), runs.c.state.in_([const(s.value) for s in from_states]))
        .values(
            state=const(RunState.RUNNING.value),
            finalized_at=None,
            error=null(),  # SQL NULL, not the JSON null a None binds to in a jsonb column
            failed_step=None,
            steps_remaining=remaining,
        )
        .returning(
            runs.c.id,
            case((runs.c.start_at.is_not(None), _notify.ring())).label("notified"),
        )
    )


def complete_restarted_run_stmt() -> Any:
    """Complete each restarted run of ``:rids`` that has none of its steps left to run.

    A run cancelled while its last steps ran keeps them completed when they end (a
    cancelled run counts nothing down); a retry then finds nothing to run, and no
    outcome would ever be recorded to complete it.
    """
    return (
        update(runs)
        .where(
            runs.c.id == _rids(),
            runs.c.state == const(RunState.RUNNING.value),
            runs.c.start_at.is_(None),
            runs.c.steps_remaining == 0,
        )
        .values(state=const(RunState.COMPLETED.value), finalized_at=func.now())
        .returning(runs.c.id)
    )


def clear_unsent_signals_stmt() -> Any:
    """Forget when the wait nodes of the runs ``:rids`` began waiting for a signal not sent.

    The marker holds the wait's deadline (``wait_until``); a node restarted by a retry
    parks again and starts its timeout over. Signals already sent keep their payload.
    """
    return delete(signals).where(signals.c.run_id == _rids(), signals.c.payload.is_(None))


def lock_run_stmt(*, keys_first: bool = False) -> Any:
    """Lock the run ``:rid`` (first, as the lock order says): its state and deadline.

    ``keys_first``: lock the key of its workflow limit before it, if any (a retry, which
    may take that key: keys before runs, see :func:`cyclone._store.limits.keys_locked_first`).
    """
    rid = bindparam("rid", type_=runs.c.id.type)
    first = (_limits.keys_locked_first(rid),) if keys_first else ()
    return (
        select(runs.c.state, runs.c.deadline <= func.now())
        .where(*first, runs.c.id == rid)
        .with_for_update(key_share=True)
    )


def lock_tops_stmt() -> Any:
    """Lock ``FOR KEY SHARE`` the top run of the tree of child runs that each child run of
    ``:rids`` belongs to (none for a run that is no child), in the run lock order.

    A purge deletes a tree from its top run (``FOR UPDATE SKIP LOCKED``), having read in
    its snapshot that no run of the tree runs: a retry of a run below, committed while
    the purge's delete waited for that run, was deleted running. Locked by a retry, the
    top run is skipped by the purge; deleted by a purge first, the retry waits, then
    finds its run gone. The one lock a retry takes before its limit's keys (the lock
    order of :mod:`cyclone.states`): it conflicts only with a purge's delete, which
    takes no key.
    """
    child, above = runs.alias("below_top"), runs.alias("above")
    up = (
        select(child.c.parent_id.label("id"))
        .where(child.c.id == _rids(), child.c.parent_id.is_not(None))
        .cte("up", recursive=True)
    )
    up = up.union_all(
        select(above.c.parent_id).where(above.c.id == up.c.id, above.c.parent_id.is_not(None))
    )
    return (
        select(runs.c.id)
        .where(among(runs.c.id, select(up.c.id)), runs.c.parent_id.is_(None))
        .order_by(*run_lock_order())
        .with_for_update(read=True, key_share=True)
    )


def any_running_stmt() -> Any:
    """A step of the run ``:rid`` still running, if any."""
    return (
        select(jobs.c.id)
        .where(jobs.c.run_id == bindparam("rid"), jobs.c.state == const(JobState.RUNNING.value))
        .limit(1)
    )


def _step_running(run: Any) -> Any:
    """Whether a step of ``run`` still runs."""
    return (
        select(jobs.c.id)
        .where(jobs.c.run_id == run, jobs.c.state == const(JobState.RUNNING.value))
        .exists()
    )


def _running_in_ended_children(parent: Any) -> Any:
    """Whether a step still runs in an ended child run of ``parent`` (one cancelled with it,
    say). A retry of the parent runs the child's node again, which retries the child and
    refuses while a step of it runs: the parent would fail again at once."""
    child = runs.alias("ended_child")
    return (
        select(jobs.c.id)
        .join_from(child, jobs, jobs.c.run_id == child.c.id)
        .where(
            child.c.parent_id == parent,
            child.c.state.in_([const(s) for s in EDGES["run.retry"].sources]),
            jobs.c.state == const(JobState.RUNNING.value),
        )
        .exists()
    )


def lock_retryable_stmt() -> Any:
    """Lock the runs of ``:rids`` that a retry may restart (failed or cancelled), with the
    children their nodes wait for, all in the run lock order, after the keys of the limits
    of the runs of ``:rids``; returns each run's id and whether it is one of the batch.

    A restarted run's nodes stop waiting for their ended children
    (:func:`forget_ended_children_stmt`): those children are locked here, in order with the
    batch (a child may sort before a run of the batch, and a worker recording a step of
    it and one of that run locks them in that order), not after the batch. Every child
    whose node waits is locked, running or not: one that ends meanwhile is forgotten too.
    A retried run's node makes no new child while the retry holds the run (a node's
    transaction locks its run, which it finds ended).
    """
    retryable = [const(s) for s in EDGES["run.retry"].sources]
    parent = runs.alias("parent")
    batch = and_(runs.c.id == _rids(), runs.c.state.in_(retryable))
    retried = select(parent.c.id).where(parent.c.id == _rids(), parent.c.state.in_(retryable))
    awaited = and_(among(runs.c.parent_id, retried), runs.c.parent_waits)
    return (
        select(runs.c.id, batch.label("batch"))
        .where(_limits.keys_locked_first(_rids()), or_(batch, awaited))
        .order_by(*run_lock_order())
        .with_for_update(key_share=True)
    )


def running_children_stmt() -> Any:
    """The running children of the runs ``:rids`` (no lock): read once they are locked and
    cancelled, when no child of theirs can be made any more, to find a child made while
    the statement that cancelled them waited for their locks."""
    return select(runs.c.id).where(
        runs.c.parent_id == _rids(), runs.c.state == const(RunState.RUNNING.value)
    )


def restartable_stmt() -> Any:
    """Of the runs ``:rids`` (locked), those neither past their deadline nor with a step
    still running, in them or in an ended child run of theirs: the runs a retry may
    restart."""
    return (
        select(runs.c.id)
        .where(
            runs.c.id == _rids(),
            or_(runs.c.deadline.is_(None), runs.c.deadline > func.now()),
            ~_step_running(runs.c.id),
            ~_running_in_ended_children(runs.c.id),
        )
        .order_by(runs.c.id)
    )


def forget_ended_children_stmt() -> Any:
    """Forget that the nodes of the restarted runs ``:rids`` wait for their ended children.

    A retried parent's child node reads its child anew: a failed or cancelled child is
    retried, not reported again.
    """
    return (
        update(runs)
        .where(
            runs.c.parent_id == _rids(),
            runs.c.parent_waits,
            runs.c.state != const(RunState.RUNNING.value),
        )
        .values(parent_waits=False)
    )


def forget_item_children_stmt() -> Any:
    """Forget that the items of the map nodes of the runs ``:rids`` wait for their
    children, the running ones included, locking those children first in the run lock
    order: a ``retry_all`` deletes the items (:func:`cyclone._store.fanout.forget_items`),
    and each item of the node's new expansion reads the child of its index anew (a
    running child: it waits for it again; an ended one, as a retried parent's ended
    child). A child left awaited would name an item the run no longer has, for good over
    a shorter list.

    Run under the lock of each run of ``:rids``, before any job of theirs: runs (a child
    after its parent), then jobs, the lock order of :mod:`cyclone.states`. No item can
    await a child meanwhile (an item locks its run first).
    """
    awaited = (
        select(runs.c.id)
        .where(runs.c.parent_id == _rids(), runs.c.parent_item.is_not(None), runs.c.parent_waits)
        .order_by(*run_lock_order())
        .with_for_update(key_share=True)
        .cte("awaited_by_items")
    )
    return update(runs).where(among(runs.c.id, select(awaited.c.id))).values(parent_waits=False)


_CANCEL_RUN = cancel_run_stmt()
_LOCK_TREES = lock_trees_stmt()
_CANCEL_CASCADED = cancel_run_stmt(cascaded=True)
_RUNNING_CHILDREN = running_children_stmt()
_FORGET_ENDED_CHILDREN = forget_ended_children_stmt()
_FORGET_ITEM_CHILDREN = forget_item_children_stmt()
_RESET_FAILED = reset_jobs_stmt(every_step=False)
_RESET_ALL = reset_jobs_stmt(every_step=True)
_RESTART_FAILED = restart_run_stmt(from_states=(RunState.FAILED, RunState.CANCELLED))
_RESTART_ANY = restart_run_stmt(from_states=tuple(TERMINAL_RUN_STATES))
_COMPLETE_RESTARTED = complete_restarted_run_stmt()
_CLEAR_UNSENT_SIGNALS = clear_unsent_signals_stmt()
_LOCK_RUN = lock_run_stmt()
_LOCK_RUN_KEYS_FIRST = lock_run_stmt(keys_first=True)
_ANY_RUNNING = any_running_stmt()
_STATE = select(runs.c.state).where(runs.c.id == bindparam("rid"))
_RID = bindparam("rid", type_=Uuid)
_STILL_RUNNING = select(_step_running(_RID), _running_in_ended_children(_RID))
"""Whether a step of the run ``:rid`` still runs, and one of an ended child run of its."""
_LOCK_RETRYABLE = lock_retryable_stmt()
_LOCK_TOPS = lock_tops_stmt()
_RESTARTABLE = restartable_stmt()


def cancel(engine: Engine, run_id: uuid.UUID) -> None:
    """Cancel a running run and its steps not yet started (running ones finish)."""
    with engine.begin() as conn:
        if not _cancel_locked(conn, [run_id]):
            state = _executor.value(conn, _STATE, {"rid": run_id})
            if state is None:
                raise errors.NotFoundError(f"run {run_id} does not exist")
            raise errors.InvalidStateError(operation="cancel", run_id=run_id, state=RunState(state))


def _cancel_locked(
    conn: Connection, run_ids: list[uuid.UUID], error: str | None = None
) -> list[uuid.UUID]:
    """Cancel those of ``run_ids`` still running, their unstarted steps, and their running
    children (child runs, ``@wf.child``), recursively; the ones of ``run_ids`` it cancelled.

    One statement locks and cancels the trees in the run lock order (see
    :func:`cancel_run_stmt`), so their runs are locked in the order every other statement
    locks several runs (a worker recording steps of a parent and of its child, another
    cancel). A child made by a transaction that held its parent while that statement
    waited is not in its snapshot: the running children of the runs cancelled are read
    again, and cancelled the same way, until none is left.
    ``error`` (JSON text) says why, when a limit cancels them (the children get none).
    """
    seeds = set(run_ids)
    cancelled: list[uuid.UUID] = []
    statement, todo, why = _CANCEL_RUN, run_ids, error
    while todo:
        moved = _executor.column(conn, statement, {"rids": todo, "error": why})
        if not moved:
            break
        _executor.affected(conn, _completion.CANCEL_UNSTARTED, {"rids": moved})
        cancelled += [rid for rid in moved if rid in seeds]
        todo = _executor.column(conn, _RUNNING_CHILDREN, {"rids": moved})
        statement, why = _CANCEL_CASCADED, None
    return cancelled


def cancel_many(engine: Engine, run_ids: Sequence[uuid.UUID]) -> int:
    """Cancel those of ``run_ids`` that are running, in one transaction; how many it cancelled.

    The runs are locked one by one in the run lock order (see :func:`_cancel_locked`); a
    run no longer running is left as it is.
    """
    with engine.begin() as conn:
        return len(_cancel_locked(conn, list(run_ids)))


def _restart_locked(conn: Connection, run_ids: list[uuid.UUID], *, every_step: bool) -> None:
    """Restart the runs ``run_ids``, locked and checked: their steps, signals and state."""
    params = {"rids": run_ids}
    if every_step:
        _executor.affected(conn, _FORGET_ITEM_CHILDREN, params)
        _fanout.forget_items(conn, run_ids)
    _executor.affected(conn, _RESET_ALL if every_step else _RESET_FAILED, params)
    _executor.affected(conn, _CLEAR_UNSENT_SIGNALS, params)
    _executor.affected(conn, _RESTART_ANY if every_step else _RESTART_FAILED, params)
    _executor.affected(conn, _COMPLETE_RESTARTED, params)
    _executor.affected(conn, _FORGET_ENDED_CHILDREN, params)


def restart_child(conn: Connection, run_id: uuid.UUID) -> str | None:
    """``retry`` the failed or cancelled child run ``run_id`` in the caller's transaction,
    which holds its parent's lock and then the child's (and, before them, the key of the
    child's workflow limit, if any); None when restarted, else why not (as
    :func:`restart` refuses)."""
    row = _executor.first(conn, _LOCK_RUN, {"rid": run_id})
    if row is None:
        return "it no longer exists"
    state, deadline_passed = RunState(row[0]), bool(row[1])
    if state.value not in EDGES["run.retry"].sources:
        return f"it is {state}"
    if deadline_passed:
        return "it is past its deadline"
    if _executor.first(conn, _ANY_RUNNING, {"rid": run_id}) is not None:
        return "a step of it is still running"
    try:
        _limits.hold_for_restart(conn, run_id, "retry")
    except errors.InvalidStateError as exc:
        return str(exc)
    _restart_locked(conn, [run_id], every_step=False)
    return None


def restart_children(conn: Connection, run_ids: list[uuid.UUID]) -> None:
    """``retry`` the failed or cancelled child runs ``run_ids`` at once, in the caller's
    transaction: :func:`restart_child` for many, five statements however many.

    The caller holds their parent's lock, then each child's, and has checked under those
    locks what :func:`restart_child` checks one by one: each is failed or cancelled, not
    past its deadline, with no step running, and has no workflow limit (whose key would
    have to be locked before the parent, and its room checked run by run).
    """
    _restart_locked(conn, run_ids, every_step=False)


def lock_for_limit(conn: Connection, run_ids: list[uuid.UUID]) -> None:
    """Lock, in the caller's transaction, the running runs of ``run_ids`` (every run an
    admission cancels or admits, over all its keys) and their running children,
    recursively, in the run lock order, before the admission acts on any of them
    (:func:`lock_trees_stmt`)."""
    _executor.rows(conn, _LOCK_TREES, {"rids": run_ids})


def cancel_for_limit(conn: Connection, run_ids: list[uuid.UUID], error: str) -> list[uuid.UUID]:
    """Cancel the running runs ``run_ids`` (locked by :func:`lock_for_limit`) in the
    caller's transaction, ``error`` (JSON text) naming the limit that cancelled them; those
    it cancelled (a run no longer running is left as it is)."""
    return _cancel_locked(conn, run_ids, error)


def restart(engine: Engine, run_id: uuid.UUID, *, every_step: bool) -> None:
    """``retry`` (failed and cancelled steps) or ``retry_all`` (every step) of a run.

    Refused (``InvalidStateError``) for a run not in a state the edge starts from, past
    its deadline, or with a step still running: such a step would record into the
    restarted run and be claimed again while it runs. So is a run with a step still
    running in an ended child run of its: the child's node, run again, would retry the
    child and refuse. Under the run's lock, which every
    recording of an outcome takes first, no step can end meanwhile. A run whose steps
    had all completed (cancelled while its last steps ran) is completed at once.

    A child run still running is no reason to refuse: the node, run again, finds it and
    waits for it again. A ``retry_all`` forgets the items of its map nodes, and that they
    wait for their children (:func:`forget_item_children_stmt`); each item of the new
    expansion reads its child anew.
    """
    operation = "retry_all" if every_step else "retry"
    with engine.begin() as conn:
        _executor.rows(conn, _LOCK_TOPS, {"rids": [run_id]})
        row = _executor.first(conn, _LOCK_RUN_KEYS_FIRST, {"rid": run_id})
        if row is None:
            raise errors.NotFoundError(f"run {run_id} does not exist")
        state, deadline_passed = RunState(row[0]), bool(row[1])
        if state.value not in EDGES[f"run.{operation}"].sources:
            raise errors.InvalidStateError(operation=operation, run_id=run_id, state=state)
        if deadline_passed:
            raise errors.InvalidStateError(
                operation=operation, run_id=run_id, state=f"{state} and past its deadline"
            )
        own, in_child = _executor.one(conn, _STILL_RUNNING, {"rid": run_id})
        if own:
            raise errors.InvalidStateError(
                operation=operation,
                run_id=run_id,
                state=f"{state} with steps still running; {operation} once they end",
            )
        if in_child:
            raise errors.InvalidStateError(
                operation=operation,
                run_id=run_id,
                state=f"{state} with steps of a child run still running; {operation} once they end",
            )
        _limits.hold_for_restart(conn, run_id, operation)
        _restart_locked(conn, [run_id], every_step=every_step)


def restart_many(engine: Engine, run_ids: Sequence[uuid.UUID]) -> int:
    """``retry`` those of ``run_ids`` that it may restart, in one transaction; how many.

    The failed and cancelled runs among them are locked first, in the run lock order with
    the children their nodes wait for (:func:`lock_retryable_stmt`), after the keys of
    their limits; those past their deadline or with a step still running are left as
    they are (as ``retry`` refuses them), and so is every run in another state.
    """
    with engine.begin() as conn:
        _executor.rows(conn, _LOCK_TOPS, {"rids": list(run_ids)})
        rows = _executor.rows(conn, _LOCK_RETRYABLE, {"rids": list(run_ids)})
        locked = [row[0] for row in rows if row[1]]
        if not locked:
            return 0
        chosen = []
        for run_id in _executor.column(conn, _RESTARTABLE, {"rids": locked}):
            try:
                _limits.hold_for_restart(conn, run_id, "retry")  # writes nothing if refused
            except errors.InvalidStateError:
                continue  # its limit's key has no room: left as retry would leave it
            chosen.append(run_id)
        if chosen:
            _restart_locked(conn, chosen, every_step=False)
        return len(chosen)


_SET_RETENTION = (
    update(runs)
    .where(runs.c.id == bindparam("rid"))
    .values(retention=bindparam("retention"))
    .returning(runs.c.id)
)


def set_retention(engine: Engine, run_id: uuid.UUID, retention: timedelta | None) -> bool:
    """Keep run ``run_id`` for ``retention`` after it ends; False if it does not exist."""
    with engine.begin() as conn:
        found = _executor.first(conn, _SET_RETENTION, {"rid": run_id, "retention": retention})
        return found is not None
