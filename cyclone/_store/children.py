"""Child nodes (``@wf.child``): a node that submits a run of another workflow and waits for it.

A worker that claims a child node first looks for the node's child: the run of the child
workflow whose key is :func:`child_key` (the parent run's id and the node's name). With
none yet, it calls the node's function for the child's input; then, in one transaction,
it locks the parent run, then the node's job (the lock order of :mod:`cyclone.states`;
before them, the key of the workflow limit of a child it will retry: keys before runs),
submits the child with ``submit_once`` semantics under that key (or finds it), records
the parent on the child's row, and records the node's outcome: *parked* as a wait node
without timeout parks (``job.park_blocked``: blocked, no upstream pending, out of the
claim index, holding no worker), or, for a child already ended, its result or its
failure. A crash before the commit leaves neither the child nor the park; after it,
both: the node's next attempt finds the child by its key, so no node makes two.

The child's row says that the node waits for it (``parent_waits``). Its end, by any path
(completed, failed, cancelled, past its deadline), touches nothing of the parent's: the
ended children whose parent's node waits are a range of ``ix_cyclone_runs_child_ended``,
which a worker serving child nodes reads when woken by a run's end (``cyclone_run_finished``)
or on its poll, and wakes their nodes (:func:`deliver`, ``job.wake_parent``, locks
skipped, so a busy node is woken by the next delivery). The woken node is claimed as any
step, reads its child's end and clears ``parent_waits`` in the transaction that records
its outcome: a completed child's result is its output; a failed or cancelled child
fails it, the error naming the child run. A later attempt of the node (``max_attempts``
above 1, or a retry of the parent, which forgets that its nodes wait) finds its child
ended and not awaited: it retries the child (its failed steps) and parks again.

A map of children (``@wf.child(workflow, over=node)``) is a map node (:mod:`fanout`)
whose items are child nodes: each item does all of the above for its own child, keyed by
the item's index too, the child's ``parent_item`` naming the item, so that a child's end
wakes its item alone. A retry of the parent makes every failed item available again,
each to retry its child; the first claimed does so for the next items too, in its
transaction, under the parent's lock it holds already (:func:`siblings_stmt`,
:func:`repark_stmt`): one transaction per :data:`REPARK_PER_BATCH` items, not one each,
every one of which would lock the parent in turn.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    Interval,
    Text,
    Uuid,
    and_,
    bindparam,
    cast,
    exists,
    func,
    literal_column,
    or_,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from cyclone import errors
from cyclone._store import completion as _completion
from cyclone._store import control as _control
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone._store import notify as _notify
from cyclone._store import submission as _submission
from cyclone._store import waits as _waits
from cyclone._store.claim import Claimed, available
from cyclone._store.completion import Failure, Success
from cyclone._store.executor import among, const
from cyclone.schema import jobs, runs
from cyclone.states import EDGES, JobState, RunState

if TYPE_CHECKING:
    from cyclone.workflow import Step, Workflow

log = logging.getLogger("cyclone.worker")

DELIVER_PER_CALL = 100
"""How many ended children one delivery looks at; the rest wait for the next."""

REPARK_PER_BATCH = 200
"""How many other items of its map an item that retries its child re-parks with it."""


def child_key(parent_run_id: uuid.UUID | str, node: str, item: int | None = None) -> str:
    """The submit key of the child of ``node`` in run ``parent_run_id``: one per node, or,
    in a map of children, one per ``item`` of the node."""
    return f"{parent_run_id}/{node}" if item is None else f"{parent_run_id}/{node}/{item}"


def node_of(workflows: Mapping[str, Workflow[Any]], job: Claimed) -> Step[Any] | None:
    """The child node ``job`` is a step of (or an item of, in a map of children), or None
    for any other job (a map of children's own job is a map node's)."""
    wf = workflows.get(job.workflow or "")
    node = wf.steps.get(job.kind) if wf is not None else None
    if node is None or node.child is None or (node.over is not None and job.item is None):
        return None
    return node


_OF_KEY = (
    runs.c.workflow == bindparam("cw", type_=Text),
    runs.c.submit_key == bindparam("key", Text),
)
_FIND = select(runs.c.id).where(*_OF_KEY)
_READ = select(
    runs.c.id,
    runs.c.limit_name,
    runs.c.limit_key,
    runs.c.state.in_([const(s) for s in EDGES["run.retry"].sources]) & ~runs.c.parent_waits,
).where(*_OF_KEY)
"""The node's child, if any (no lock): its id, its workflow limit's name and key, and
whether it ended and is not awaited (the node retries it)."""
_result = jobs.alias("result")
_parent = runs.alias("parent")
_ADOPT = (
    update(runs)
    .where(runs.c.id == bindparam("cid"))
    .values(
        parent_id=bindparam("rid"),
        parent_node=bindparam("node", type_=Text),
        parent_item=bindparam("item", type_=Integer),
        # After the parent in the lock order (cyclone.schema.run_lock_order) even if the
        # server's clock stepped back since the parent was made.
        created_at=func.greatest(
            runs.c.created_at,
            select(_parent.c.created_at + literal_column("interval '1 microsecond'"))
            .where(_parent.c.id == bindparam("rid"))
            .scalar_subquery(),
        ),
    )
    .returning(
        runs.c.state,
        runs.c.parent_waits,
        runs.c.error.op("->>")(const("message")),
        select(_result.c.output.cast(Text))
        .where(
            _result.c.run_id == runs.c.id,
            _result.c.kind == runs.c.result_step,
            _result.c.item.is_(None),  # a map node's own job, not its items
        )
        .scalar_subquery(),
        runs.c.limit_name,
        runs.c.limit_key,
    )
)
_SET_WAITS = update(runs).where(runs.c.id == bindparam("cid")).values(parent_waits=bindparam("w"))


def siblings_stmt() -> Any:
    """Lock the items of run ``:rid``'s map of children ``:kind`` after item ``:item`` that a
    claim would take now and whose child a retry would restart, with their children; up
    to ``:n`` rows ``(job id, child id)``, in item order, locked rows skipped.

    An item qualifies as its own attempt would retry its child: the child of its key
    (:func:`child_key`) is this run's, failed or cancelled, no longer awaited, not past
    its deadline, with no step running. Left to their own attempts: items gated by a
    limit or a Rate of the node (their attempts are what those bound) and children of a
    limited workflow (whose key is locked before the parent, and its room checked per
    run). Items before ``:item`` are not looked at: the claim takes items in order, so
    those are taken or parked, and the range read starts at the claimed item.
    """
    child = runs.alias("child")
    step = jobs.alias("child_step")
    key = (
        cast(jobs.c.run_id, Text) + const("/") + jobs.c.kind + const("/") + cast(jobs.c.item, Text)
    )
    running = (
        select(step.c.id)
        .where(step.c.run_id == child.c.id, step.c.state == const(JobState.RUNNING.value))
        .exists()
    )
    return (
        select(jobs.c.id, child.c.id)
        .join(
            child,
            and_(child.c.workflow == bindparam("cw", type_=Text), child.c.submit_key == key),
        )
        .where(
            jobs.c.run_id == bindparam("rid", type_=Uuid),
            jobs.c.kind == bindparam("kind", type_=Text),
            jobs.c.item > bindparam("item", type_=Integer),
            *available(jobs, None),
            jobs.c.limit_name.is_(None),
            jobs.c.rate_name.is_(None),
            child.c.parent_id == jobs.c.run_id,
            child.c.state.in_([const(s) for s in EDGES["run.retry"].sources]),
            ~child.c.parent_waits,
            child.c.limit_name.is_(None),
            or_(child.c.deadline.is_(None), child.c.deadline > func.now()),
            ~running,
        )
        .order_by(jobs.c.item)
        .limit(bindparam("n", type_=Integer))
        .with_for_update(of=[jobs, child], key_share=True, skip_locked=True)
    )


def repark_stmt() -> Any:
    """Park the map items ``:jids`` (available, locked by :func:`siblings_stmt`), whose
    children were just retried, as their own attempts would have parked them
    (``job.park_blocked``): blocked, no upstream pending, out of the claim index, the lease
    moved on, until their child's end wakes them. They were never claimed: no attempt to
    give back."""
    return (
        update(jobs)
        .where(
            jobs.c.id == func.any(bindparam("jids", type_=ARRAY(BigInteger))),
            jobs.c.state == const(JobState.AVAILABLE.value),
        )
        .values(
            state=const(JobState.BLOCKED.value),
            lease=jobs.c.lease + 1,
            worker_id=None,
            heartbeat_at=None,
            scheduled_at=func.now() + cast(const(f"{_waits.PARK_FOR.days} days"), Interval),
        )
    )


_SIBLINGS = siblings_stmt()
_AWAIT_ALL = (
    update(runs)
    .where(runs.c.id == func.any(bindparam("cids", type_=ARRAY(Uuid))))
    .values(parent_waits=True)
)
_REPARK = repark_stmt()


def _repark_siblings(conn: Connection, job: Claimed, workflow: str) -> int:
    """Retry, with the claimed item ``job``'s child, the children of the next items of its
    map that wait to do the same (:func:`siblings_stmt`), and park those items: what each
    item's own attempt would do, for up to :data:`REPARK_PER_BATCH` items in three
    statements and the five of the children's restart. How many it parked.

    The caller's transaction holds the parent run's lock and the claimed item's job: the
    items and children are locked after them, skipping any that another transaction
    holds (an item being claimed, a child being cancelled), which is left to its own
    attempt. So each item's child is retried once, by whoever holds that item, and a
    cancel of the parent, which waits for the parent's lock, finds the retried children
    running and cancels them.
    """
    params = {
        "rid": job.run_id,
        "kind": job.kind,
        "item": job.item,
        "cw": workflow,
        "n": REPARK_PER_BATCH,
    }
    pairs = _executor.rows(conn, _SIBLINGS, params)
    if not pairs:
        return 0
    _control.restart_children(conn, [row[1] for row in pairs])
    _executor.affected(conn, _AWAIT_ALL, {"cids": [row[1] for row in pairs]})
    return _executor.affected(conn, _REPARK, {"jids": [row[0] for row in pairs]})


def _node_of(child: Any, *where: Any, lock: bool = False) -> Any:
    """The job of the node (or, in a map of children, the item) that ``child`` (a row
    with ``parent_id``, ``parent_node``, ``parent_item``) names, and ``where``: a probe of
    ``ix_cyclone_jobs_run_id_kind_item`` for an item's child, of
    ``ix_cyclone_jobs_run_id_kind`` for a child node's; with ``lock``, locked, rows
    locked elsewhere skipped.

    Two probes, not one join on "both items NULL or equal": its ``OR`` can use neither
    index's item, so a plan made while few items were parked compared every parked item (every
    waiting item) with each child, and a map of 3,000 children did not drain in ten
    minutes. A set operation is never flattened into a join: each stays a probe."""

    def probe(*match: Any) -> Any:
        job = jobs.alias("job")
        found = (
            select(job.c.id)
            .where(*[m(job) for m in match], *[w(job) for w in where])
            .correlate(child)
        )
        if not lock:
            return found
        locked = found.with_for_update(skip_locked=True).subquery("locked")
        return select(locked.c.id)

    def run(job: Any) -> Any:
        return job.c.run_id == child.c.parent_id

    def kind(job: Any) -> Any:
        return job.c.kind == child.c.parent_node

    return union_all(
        probe(run, kind, lambda job: job.c.item == child.c.parent_item),
        probe(
            run, kind, lambda job: job.c.item.is_(None), lambda job: child.c.parent_item.is_(None)
        ),
    )


def _parked(node: Any) -> Any:
    return and_(
        node.c.state == const(JobState.BLOCKED.value), node.c.pending_deps == const(0, Integer)
    )


def wake_stmt() -> Any:
    """Make the parked child nodes of ended children available and due now (``job.wake_parent``).

    The ended children whose node waits are read from ``ix_cyclone_runs_child_ended``,
    up to the first :data:`DELIVER_PER_CALL` whose node is parked (a node woken already
    waits for its claim, its child still awaited until it records); each node is found
    by its key (:func:`_node_of`) and locked there, nodes locked elsewhere skipped (the
    next delivery takes them); a node blocked for its upstreams (a retried parent not
    there yet) is left alone.
    """
    ended = (
        select(runs.c.parent_id, runs.c.parent_node, runs.c.parent_item)
        .where(runs.c.parent_waits, runs.c.state != const(RunState.RUNNING.value))
        .subquery("ended")
    )
    found = _node_of(ended, _parked, lock=True).lateral("found")
    parked = (
        select(found.c.id)
        .select_from(ended)
        .join(found, true())
        .limit(const(DELIVER_PER_CALL, Integer))
    )
    return (
        update(jobs)
        .where(jobs.c.state == const(JobState.BLOCKED.value), among(jobs.c.id, parked))
        .values(state=const(JobState.AVAILABLE.value), scheduled_at=func.now())
        .returning(jobs.c.id, _notify.when_available(jobs.c.state))
    )


def forget_stmt() -> Any:
    """Forget the ended children whose node no longer waits (ended with its run, which a
    retry of the parent reads anew), so the index of ended children stays small. Each
    child's node is probed by its key (:func:`_node_of`)."""
    ended = runs.alias("ended")
    waiting = (
        JobState.BLOCKED.value,
        JobState.AVAILABLE.value,
        JobState.RUNNING.value,
    )
    awaited = exists(_node_of(ended, lambda node: node.c.state.in_([const(s) for s in waiting])))
    doomed = (
        select(ended.c.id)
        .where(ended.c.parent_waits, ended.c.state != const(RunState.RUNNING.value), ~awaited)
        .limit(const(DELIVER_PER_CALL, Integer))
        .with_for_update(of=ended, skip_locked=True)
    )
    return (
        update(runs).where(among(runs.c.id, doomed)).values(parent_waits=False).returning(runs.c.id)
    )


_WAKE = wake_stmt()
_FORGET = forget_stmt()


def deliver(engine: Engine) -> int:
    """Wake the child nodes whose children ended; how many it woke (each rings NOTIFY)."""
    with engine.begin() as conn:  # neither statement waits for a lock: both skip them
        woken = len(_executor.rows(conn, _WAKE))
        _executor.rows(conn, _FORGET)
    return woken


# -- the worker's side -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Child:
    """What the worker knows of a child node's child: the workflow's submit plan, and how
    to tell the input's limit key (for a limited child workflow)."""

    plan: _submission.Plan
    limit_key: Callable[[str], _submission.LimitKeys | None]


def execute(
    engine: Engine,
    worker_id: str,
    job: Claimed,
    child: Child,
    backoff: Callable[[int], float],
    run: Callable[[Claimed], Success | Failure],
) -> _waits.Outcome:
    """Run a claimed child node: submit its child (calling ``run`` for its input, the
    first time) and park, or read its ended child. See the module's docstring.

    Statements: a read of the child by key (none: the node's function runs first, out of
    any transaction); then one transaction: lock the parent run, then the job; submit the
    child (the insert-or-read of ``submit_once``), record its parent (locking it); then
    park, retry the child and park (a map's item: with the next items waiting to do the
    same, :func:`_repark_siblings`), or record the child's failure. A database error is
    cyclone's, not the step's: the job is handed back, its attempt not counted.
    """
    assert job.run_id is not None
    key = child_key(job.run_id, job.kind, job.item)
    try:
        with engine.connect() as conn:
            found = _executor.first(conn, _READ, {"cw": child.plan.workflow, "key": key})
    except Exception as exc:
        return _waits.undecided(worker_id, job, "child node", exc, backoff)
    # The key of a child to retry is locked first: keys before runs (an admission locks
    # keys, then cancels runs in progress, this node's run among them).
    retried_key = None
    if found is not None and found[1] is not None and found[3]:
        retried_key = (str(found[1]), str(found[2]))
    input_: str | None = None
    limit_key: _submission.LimitKeys | None = None
    if found is None:
        made = run(job)
        if isinstance(made, Failure):
            return made
        input_ = made.output
        try:
            limit_key = child.limit_key(input_)
        except Exception as exc:  # the child workflow's key function: the node's error
            return _child_failed(
                job,
                None,
                child.plan.workflow,
                f"not submitted: its limit key failed: {exc!r}",
                backoff,
            )
    try:
        return _decide(engine, worker_id, job, child, key, input_, limit_key, retried_key, backoff)
    except Exception as exc:
        return _waits.undecided(worker_id, job, "child node", exc, backoff)


def _child_failed(
    job: Claimed, cid: Any, workflow: str, why: str, backoff: Callable[[int], float]
) -> Failure:
    run = "the child run" if cid is None else f"child run {cid}"
    of_item = "" if job.item is None else f" (of item {job.item})"
    error = {
        "type": "ChildRunFailed",
        "message": f"{run} of workflow {workflow!r}{of_item} {why}",
        "child_run_id": None if cid is None else str(cid),
        "attempt": job.attempt,
        "step": job.kind,
        **({} if job.item is None else {"item": job.item}),
        "at": datetime.now(UTC).isoformat(),
    }
    retry_in = None if job.attempt >= job.max_attempts else backoff(job.attempt)
    return Failure(job.id, job.lease, error, retry_in)


def _decide(
    engine: Engine,
    worker_id: str,
    job: Claimed,
    child: Child,
    key: str,
    input_: str | None,
    limit_key: _submission.LimitKeys | None,
    retried_key: tuple[str, str] | None,
    backoff: Callable[[int], float],
) -> _waits.Outcome:
    guard = {"job_id": job.id, "lease": job.lease, "attempt_no": job.attempt, "me": worker_id}
    workflow = child.plan.workflow
    with engine.begin() as conn:
        if retried_key is not None:
            _limits.lock_key(conn, retried_key[0], retried_key[1])
        state = _executor.value(conn, _waits._LOCK_RUN, {"rid": job.run_id})
        if _executor.first(conn, _waits._LOCK_JOB, guard) is None:
            return _waits.Parked(job.id)  # rescued, handed back or cancelled meanwhile
        if state != RunState.RUNNING.value:
            _executor.affected(conn, _waits._END, guard)
            return _waits.Parked(job.id)
        if input_ is None:
            cid = _executor.value(conn, _FIND, {"cw": workflow, "key": key})
            if cid is None:  # purged since the read: the next attempt makes it anew
                raise errors.NotFoundError(f"child run of key {key!r} vanished")
        else:
            try:
                submitted = _submission.submit_once_tx(
                    conn, child.plan, key, input_, _submission.Timing(), limit_key
                )
                cid = submitted.run_id
            except errors.SubmitConflictError as exc:
                cid = exc.run_id  # made by an earlier attempt with another input: it is the one
        adopted = _executor.one(
            conn, _ADOPT, {"cid": cid, "rid": job.run_id, "node": job.kind, "item": job.item}
        )
        child_state, waits, message, result, limit_name, limit = adopted
        if child_state == RunState.COMPLETED.value:
            _executor.affected(conn, _SET_WAITS, {"cid": cid, "w": False})
            return Success(job.id, job.lease, result if result is not None else "null")
        if child_state != RunState.RUNNING.value:
            if waits:  # it ended while the node waited: the node fails, naming it
                _executor.affected(conn, _SET_WAITS, {"cid": cid, "w": False})
                why = f"{child_state}" + (f": {message}" if message else "")
                failure = _child_failed(job, cid, workflow, why, backoff)
                _completion.record_failures(conn, [failure])
                return _waits.Parked(job.id, failure)
            if limit_name is not None and retried_key != (limit_name, limit):
                # It ended, or stopped being awaited, after the read: its key is not
                # locked, and may not be now (under the run). The next attempt locks it.
                raise errors.InvalidStateError(
                    operation="retry",
                    run_id=cid,
                    state=f"{child_state}, its limit's key not locked first",
                )
            refused = _control.restart_child(conn, cid)
            if refused is not None:
                failure = _child_failed(
                    job, cid, workflow, f"{child_state}; not retried: {refused}", backoff
                )
                _completion.record_failures(conn, [failure])
                return _waits.Parked(job.id, failure)
            if job.item is not None and limit_name is None and job.slot is None:
                _repark_siblings(conn, job, workflow)
        _executor.affected(conn, _SET_WAITS, {"cid": cid, "w": True})
        _executor.affected(conn, _waits._PARK, {**guard, "until": None})
        return _waits.Parked(job.id)
