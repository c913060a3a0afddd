"""Map nodes (``@wf.map``): one job per item of the list their ``over`` node returned.

A map node is a step like any other until a worker claims it; then, instead of calling
its function, the worker decides about it in one transaction that locks the run, then
the job (the lock order of :mod:`cyclone.states`), as for a wait node:

- no items yet: it *expands*. One ``INSERT ... SELECT FROM jsonb_array_elements(...) WITH
  ORDINALITY`` creates every item's job, available, with the node's queue, priority,
  attempts, deadline and upstreams but ``over`` (an item reads them with ``ctx.output``;
  the list itself, read with each item's claim, would make a map's cost quadratic in its
  length), its index in ``item``, and the limits and keys the run keeps for the node's
  items (``@wf.map(concurrency=, rate=)``; the node's own job has none); the same
  statement adds their number to the run's ``steps_remaining`` and rings NOTIFY once.
  The node is then parked blocked (``job.fan_out``) with ``pending_deps`` the number of
  items: each item's completion counts it down (the
  record-and-claim statement, :func:`cyclone._store.completion.complete_jobs_ctes`), and
  the last one makes it available again. An empty list completes the node at once with
  ``[]``; an output that is not a list fails it.
- items, all completed: it *collects*: one ``jsonb_agg(output ORDER BY item)`` reads the
  node's output, recorded as any step's success.
- items, some not completed (a retry reset the failed items and the node): it parks again
  with ``pending_deps`` the items not completed, counted under the run's lock, which
  every recording of an outcome takes first.

Whatever the list's length, an expansion costs the same five statements, a collection
four (then the node's success, recorded as any step's). The upstream's output is read
from the claim (its ``upstream`` outputs), so the expansion is generic over whatever node
produced the list.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import (
    Connection,
    Engine,
    Integer,
    Text,
    Uuid,
    bindparam,
    case,
    cast,
    delete,
    func,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, aggregate_order_by, insert

from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone._store import waits as _waits
from cyclone._store.claim import Claimed
from cyclone._store.completion import Failure, Success
from cyclone._store.executor import const
from cyclone.schema import STEP_JOB_COLUMNS, jobs, runs
from cyclone.states import JobState, RunState

if TYPE_CHECKING:
    from cyclone.workflow import Step, Workflow

log = logging.getLogger("cyclone.worker")

_list_decoder = msgspec.json.Decoder(list[msgspec.Raw])


def node_of(workflows: Mapping[str, Workflow[Any]], job: Claimed) -> Step[Any] | None:
    """The map node ``job`` is (not one of its items), or None for any other job."""
    if job.item is not None:
        return None
    wf = workflows.get(job.workflow or "")
    node = wf.steps.get(job.kind) if wf is not None else None
    return node if node is not None and node.over is not None else None


def fan_out_stmt() -> Any:
    """Park a claimed map node until its ``:items`` items not completed have completed
    (blocked, that many pending), its attempt not counted and its lease moved on."""
    return (
        update(jobs)
        .where(_waits.GUARD)
        .values(
            state=const(JobState.BLOCKED.value),
            pending_deps=bindparam("items", type_=Integer),
            attempt=case((jobs.c.attempt > 0, jobs.c.attempt - 1), else_=0),
            lease=jobs.c.lease + 1,
            worker_id=None,
            heartbeat_at=None,
        )
    )


def expand_stmt() -> Any:
    """Insert one available job per element of ``:list`` (a JSON array) for the map node
    ``:job_id`` of run ``:rid`` (upstreams: the node's but ``:over``; limits and keys: the
    node's items' in the run's ``step_limits``, so the limited claim serves each item),
    add their number to the run's steps, ring NOTIFY; returns the number inserted."""
    node = jobs.alias("node")
    item_limit = runs.c.step_limits.op("->", return_type=JSONB)(node.c.kind).op(
        "->", return_type=JSONB
    )(const("items"))
    elements = (
        func.jsonb_array_elements(cast(bindparam("list", type_=Text), JSONB))
        .table_valued("value", with_ordinality="ord")
        .render_derived("e")
    )
    rows = (
        select(
            node.c.run_id,
            node.c.workflow,
            node.c.kind,
            node.c.queue,
            node.c.priority,
            const(JobState.AVAILABLE.value),
            func.array_remove(node.c.deps, bindparam("over", type_=Text)),
            const(0, Integer),
            node.c.max_attempts,
            node.c.deadline,
            node.c.trace_context,
            elements.c.value,
            cast(elements.c.ord - 1, Integer),
            *(item_limit.op("->>", return_type=Text)(const(f)) for f in ("n", "k", "rn", "rk")),
        )
        .select_from(node)
        .join(runs, runs.c.id == node.c.run_id)
        .join(elements, true())
        .where(node.c.id == bindparam("job_id"))
        .order_by(elements.c.ord)
    )
    items = (
        insert(jobs)
        .from_select(
            [
                *STEP_JOB_COLUMNS,
                jobs.c.deadline,
                jobs.c.trace_context,
                jobs.c.args,
                jobs.c.item,
                jobs.c.limit_name,
                jobs.c.limit_key,
                jobs.c.rate_name,
                jobs.c.rate_key,
            ],
            rows,
        )
        .returning(jobs.c.id)
        .cte("map_items")
    )
    made = select(func.count()).select_from(items).scalar_subquery()
    counted = (
        update(runs)
        .where(runs.c.id == bindparam("rid", type_=Uuid))
        .values(steps_remaining=runs.c.steps_remaining + made)
        .returning(runs.c.id)
        .cte("map_counted")
    )
    return select(
        select(func.count()).select_from(items).scalar_subquery(),
        select(func.count()).select_from(counted).scalar_subquery(),
        _notify.ring(),
    )


def _of_node() -> tuple[Any, ...]:
    """The items of the map node ``:kind`` of run ``:rid`` (a range of their unique index)."""
    return (
        jobs.c.run_id == bindparam("rid", type_=Uuid),
        jobs.c.kind == bindparam("kind", type_=Text),
        jobs.c.item.is_not(None),
    )


_COUNT = select(
    func.count(),
    func.count().filter(jobs.c.state != const(JobState.COMPLETED.value)),
).where(*_of_node())
_COLLECT = select(cast(func.jsonb_agg(aggregate_order_by(jobs.c.output, jobs.c.item)), Text)).where(
    *_of_node()
)
_FAN_OUT = fan_out_stmt()
_EXPAND = expand_stmt()
_FORGET = delete(jobs).where(
    jobs.c.run_id == func.any(bindparam("rids", type_=ARRAY(Uuid))), jobs.c.item.is_not(None)
)


def forget_items(conn: Connection, run_ids: Sequence[Any]) -> None:
    """Delete the items of every map node of ``run_ids`` (a ``retry_all``: each map node
    expands anew, over what its upstream returns this time). Before the steps' reset."""
    _executor.affected(conn, _FORGET, {"rids": list(run_ids)})


def _not_a_list(job: Claimed, node: Step[Any], got: str) -> Failure:
    error = {
        "type": "MapError",
        "message": (
            f"map node {job.kind!r} maps over the output of {node.over!r}, "
            f"which is not a list (got {got})"
        ),
        "attempt": job.attempt,
        "step": job.kind,
        "at": datetime.now(UTC).isoformat(),
    }
    return Failure(job.id, job.lease, error, None)


def _kind_of_json(raw: bytes) -> str:
    text = raw.strip()[:1]
    return {b"{": "an object", b'"': "a string", b"n": "null", b"t": "a bool", b"f": "a bool"}.get(
        text, "a number"
    )


def execute(engine: Engine, worker_id: str, job: Claimed, node: Step[Any]) -> _waits.Outcome:
    """Expand, park or collect the claimed map node ``job`` (see the module's docstring).

    A database error in its transaction is cyclone's, not the node's: the job is handed
    back (:class:`cyclone._store.waits.HandBack`), its attempt not counted, unless the
    database refused a value, which fails the node (:func:`cyclone._store.waits.undecided`).
    """
    try:
        return _decide(engine, worker_id, job, node)
    except Exception as exc:
        return _waits.undecided(worker_id, job, "map node", exc, None)


def _decide(engine: Engine, worker_id: str, job: Claimed, node: Step[Any]) -> _waits.Outcome:
    guard = {"job_id": job.id, "lease": job.lease, "attempt_no": job.attempt, "me": worker_id}
    with engine.begin() as conn:
        state = _executor.value(conn, _waits.LOCK_RUN, {"rid": job.run_id})
        if _executor.first(conn, _waits.LOCK_JOB, guard) is None:
            return _waits.Parked(job.id)  # rescued, handed back or cancelled meanwhile
        if state != RunState.RUNNING.value:
            _executor.affected(conn, _waits.END, guard)
            return _waits.Parked(job.id)
        where = {"rid": job.run_id, "kind": job.kind}
        total, left = _executor.one(conn, _COUNT, where)
        if total == 0:
            return _expand(conn, job, node, guard)
        if left > 0:
            _executor.affected(conn, _FAN_OUT, {**guard, "items": left})
            return _waits.Parked(job.id)
        output = _executor.value(conn, _COLLECT, where)
        return Success(job.id, job.lease, output)


def _expand(
    conn: Connection, job: Claimed, node: Step[Any], guard: dict[str, Any]
) -> _waits.Outcome:
    assert node.over is not None
    raw = bytes(job.upstream[node.over]) if node.over in job.upstream else b"null"
    try:
        elements = _list_decoder.decode(raw)
    except msgspec.ValidationError:
        return _not_a_list(job, node, _kind_of_json(raw))
    if not elements:
        return Success(job.id, job.lease, "[]")
    made, _counted, _rang = _executor.one(
        conn,
        _EXPAND,
        {"list": raw.decode(), "job_id": job.id, "rid": job.run_id, "over": node.over},
    )
    _executor.affected(conn, _FAN_OUT, {**guard, "items": made})
    return _waits.Parked(job.id)
