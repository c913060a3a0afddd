"""Wait nodes, sleep nodes and the signals sent to runs.

A wait node (``@wf.wait(signal)``) or sleep node (``@wf.sleep(duration)``) is a job like
any step, but a worker that claims it first looks whether it may run: a wait node once
its signal's payload is stored in ``cyclone_signals``, a sleep node once its duration has
passed since its upstreams completed (or since the submit, for a root). If not, the job
is *parked*: the attempt is given back, the lease moves on and no worker is recorded,
so a waiting run holds no worker, no thread and no connection. A node waiting until a
time (a sleep, or a wait with a timeout) goes back to ``available`` with
``scheduled_at`` at that time, and an idle worker sleeps until the earliest one falls
due (see :mod:`cyclone._due`). A wait without a timeout goes back to ``blocked`` with
no upstream pending, outside the claim index. A signal makes its node available and
due now, and rings NOTIFY.

Locks: both a worker deciding to park and a sender take the wait node's job row lock
before they touch the signal row, so a signal committed while a worker parks the node
always wakes it, and the two never deadlock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Engine,
    Integer,
    Interval,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert

from cyclone import _fastpath, _notify, errors
from cyclone._claim import Claimed
from cyclone._completion import Failure, Success
from cyclone._fastpath import const
from cyclone.schema import jobs, runs, signals
from cyclone.states import TERMINAL_RUN_STATES, JobState, RunState

if TYPE_CHECKING:
    from cyclone.workflow import Step, Workflow

log = logging.getLogger("cyclone.worker")

PARK_FOR = timedelta(days=365 * 100)
"""How far ahead a wait node without a timeout is parked; a signal brings it back to now."""


@dataclass(frozen=True, slots=True)
class Parked:
    """A wait or sleep node that went back to waiting (or is no longer ours): nothing to record."""

    job_id: int


def node_of(workflows: Mapping[str, Workflow[Any]], job: Claimed) -> Step[Any] | None:
    """The wait or sleep node ``job`` is a step of, or None for any other job."""
    wf = workflows.get(job.workflow or "")
    node = wf.steps.get(job.kind) if wf is not None else None
    if node is None or (node.signal is None and node.sleep is None):
        return None
    return node


# -- the worker's side -----------------------------------------------------------------

_GUARD = and_(
    jobs.c.id == bindparam("job_id"),
    jobs.c.lease == bindparam("lease", type_=BigInteger),
    jobs.c.attempt == bindparam("attempt_no"),
    jobs.c.state == const(JobState.RUNNING.value),
    jobs.c.worker_id == bindparam("me", type_=Text),
)
_LOCK_JOB = select(jobs.c.id).where(_GUARD).with_for_update()
_SIGNAL_KEY = and_(
    signals.c.run_id == bindparam("rid"), signals.c.name == bindparam("signal", type_=Text)
)
_READ_SIGNAL = select(
    cast(signals.c.payload, Text), signals.c.wait_until, signals.c.wait_until <= func.now()
).where(_SIGNAL_KEY)
_MARK = (
    insert(signals)
    .values(
        run_id=bindparam("rid"),
        name=bindparam("signal", type_=Text),
        wait_until=func.now() + bindparam("timeout", type_=Interval),
    )
    .on_conflict_do_nothing(index_elements=[signals.c.run_id, signals.c.name])
    .returning(signals.c.wait_until)
)
_UNMARK = delete(signals).where(_SIGNAL_KEY, signals.c.payload.is_(None))
_UNTIL = bindparam("until", type_=jobs.c.scheduled_at.type)
_PARK = (
    update(jobs)
    .where(_GUARD)
    .values(
        # Until a time: available then (the claim picks it up at its timeout or wake-up
        # time). Until a signal only: blocked with no pending upstream, out of the claim
        # index, so any number of such runs cost the claims nothing.
        state=case(
            (_UNTIL.is_(None), const(JobState.BLOCKED.value)),
            else_=const(JobState.AVAILABLE.value),
        ),
        # As a hand-back (cyclone._rescue): the attempt is not counted, and the lease
        # moves on, so this claim's heartbeats and outcomes no longer match the job.
        attempt=case((jobs.c.attempt > 0, jobs.c.attempt - 1), else_=0),
        lease=jobs.c.lease + 1,
        worker_id=None,
        heartbeat_at=None,
        scheduled_at=func.coalesce(
            _UNTIL, func.now() + cast(const(f"{PARK_FOR.days} days"), Interval)
        ),
    )
)
_upstream = jobs.alias("upstream")
_SLEEP_DUE = select(
    func.coalesce(
        select(func.max(_upstream.c.finalized_at))
        .where(_upstream.c.run_id == jobs.c.run_id, _upstream.c.kind == func.any(jobs.c.deps))
        .scalar_subquery(),
        jobs.c.created_at,
    )
    + bindparam("duration", type_=Interval),
    func.now(),
).where(jobs.c.id == bindparam("job_id"))


def _timed_out(job: Claimed, signal: str, backoff: Callable[[int], float]) -> Failure:
    error = {
        "type": "SignalTimeout",
        "message": f"timed out waiting for {signal!r}",
        "attempt": job.attempt,
        "step": job.kind,
        "at": datetime.now(UTC).isoformat(),
    }
    retry_in = None if job.attempt >= job.max_attempts else backoff(job.attempt)
    return Failure(job.id, job.lease, error, retry_in)


Outcome = Success | Failure | Parked


def execute(
    engine: Engine,
    worker_id: str,
    job: Claimed,
    node: Step[Any],
    backoff: Callable[[int], float],
    run: Callable[[Claimed], Success | Failure],
) -> Outcome:
    """Run a claimed wait or sleep node if it may run now (``run``), else park it.

    Statements, in one transaction: lock the job row (guarded by lease, attempt, state
    and worker), then for a sleep node read when it is due, for a wait node read its signal
    row (inserting the waiting marker, with the timeout, the first time); then park the
    job, or commit and run it. A wait node past its timeout fails with a
    ``SignalTimeout`` error naming the signal (retried as any step; the next attempt
    waits anew).
    """
    guard = {"job_id": job.id, "lease": job.lease, "attempt_no": job.attempt, "me": worker_id}
    payload: str | None = None
    with engine.begin() as conn:
        if conn.execute(_LOCK_JOB, guard).first() is None:
            return Parked(job.id)  # rescued or cancelled meanwhile: no longer ours
        if node.sleep is not None:
            due, now = conn.execute(_SLEEP_DUE, {"job_id": job.id, "duration": node.sleep}).one()
            if due > now:
                conn.execute(_PARK, {**guard, "until": due})
                return Parked(job.id)
        else:
            assert node.signal is not None
            key = {"rid": job.run_id, "signal": node.signal}
            row = conn.execute(_READ_SIGNAL, key).first()
            if row is not None and row[0] is not None:
                payload = row[0]
            elif row is not None and row[2]:
                conn.execute(_UNMARK, key)
                return _timed_out(job, node.signal, backoff)
            else:
                until = row[1] if row is not None else _mark(conn, key, node.timeout)
                conn.execute(_PARK, {**guard, "until": until})
                return Parked(job.id)
    return run(job if payload is None else replace(job, input=payload))


def _mark(conn: Connection, key: dict[str, Any], timeout: timedelta | None) -> datetime | None:
    marked = conn.execute(_MARK, {**key, "timeout": timeout}).first()
    return None if marked is None else marked[0]


# -- the sender's side -----------------------------------------------------------------

_NODE_ARGS = cast(func.jsonb_build_object(const("signal"), bindparam("signal", type_=Text)), JSONB)
_LIVE_JOB_STATES = [
    const(JobState.BLOCKED.value),
    const(JobState.AVAILABLE.value),
    const(JobState.RUNNING.value),
]


def _read_stmt(by_key: bool) -> Any:
    """The run, whether it has a wait node for the signal, and the signal already sent."""
    # From the graph, which a run not started yet has already (its steps have no rows).
    node_exists = runs.c.graph.op("->", return_type=JSONB)(const("steps")).op("@>")(
        func.jsonb_build_array(_NODE_ARGS)
    )
    sent = signals.alias("sent")
    stmt = (
        select(
            runs.c.id,
            runs.c.state,
            node_exists,
            sent.c.payload.is_not(None),
            sent.c.payload == cast(bindparam("payload", type_=Text), JSONB),
        )
        .select_from(runs)
        .outerjoin(
            sent,
            and_(sent.c.run_id == runs.c.id, sent.c.name == bindparam("signal", type_=Text)),
        )
    )
    if by_key:
        return stmt.where(
            runs.c.workflow == bindparam("workflow", type_=Text),
            runs.c.submit_key == bindparam("key", type_=Text),
        )
    return stmt.where(runs.c.id == bindparam("rid"))


_READ_BY_KEY = _fastpath.Compiled(_read_stmt(by_key=True))
_READ_BY_ID = _fastpath.Compiled(_read_stmt(by_key=False))
_WAKE = (
    update(jobs)
    .where(
        jobs.c.run_id == bindparam("rid"),
        jobs.c.args == _NODE_ARGS,
        jobs.c.state.in_(_LIVE_JOB_STATES),
    )
    .values(
        scheduled_at=func.now(),
        # A node parked until its signal (blocked, no upstream pending) becomes available;
        # one still blocked by its upstreams stays blocked, and is due once they complete.
        state=case(
            (
                and_(
                    jobs.c.state == const(JobState.BLOCKED.value),
                    jobs.c.pending_deps == const(0, Integer),
                ),
                const(JobState.AVAILABLE.value),
            ),
            else_=jobs.c.state,
        ),
    )
    .returning(_notify.when_available(jobs.c.state))
)
_SEND = (
    insert(signals)
    .values(
        run_id=bindparam("rid"),
        name=bindparam("signal", type_=Text),
        payload=cast(bindparam("payload", type_=Text), JSONB),
        sent_at=func.now(),
    )
    .on_conflict_do_update(
        index_elements=[signals.c.run_id, signals.c.name],
        set_={"payload": cast(bindparam("payload", type_=Text), JSONB), "sent_at": func.now()},
        where=signals.c.payload.is_(None),
    )
    .returning(signals.c.run_id)
)
_SAME_PAYLOAD = select(
    case(
        (signals.c.payload.is_(None), None),
        else_=signals.c.payload == cast(bindparam("payload", type_=Text), JSONB),
    )
).where(_SIGNAL_KEY)


_FAST_WAKE = _fastpath.Compiled(_WAKE)
_FAST_SEND = _fastpath.Compiled(_SEND)
_FAST_SAME_PAYLOAD = _fastpath.Compiled(_SAME_PAYLOAD)


def send(
    conn: _fastpath.Executor,
    *,
    workflow: str,
    key: str | None,
    run_id: Any,
    signal: str,
    payload: str,
) -> bool:
    """Send ``signal`` with ``payload`` (JSON text) to a run, on ``conn``, the executor of
    the caller's transaction (never committed here).

    Returns True when this call stored the signal, False when the same payload was
    stored already (a no-op). Statements: a read of the run, its wait node and the
    signal already sent; then, for a new signal, an ``UPDATE`` that wakes the wait node
    (taking its row lock first, as a parking worker does) and the ``INSERT`` of the
    signal; a fourth reads the payload when a concurrent sender stored it first.

    Raises:
        NotFoundError: no such run, or the run has no wait node for ``signal``.
        SubmitConflictError: the signal was sent already with another payload.
        InvalidStateError: the run has finished and was never sent this signal.
    """
    params: dict[str, Any] = {"signal": signal, "payload": payload}
    if key is not None:
        rows = conn.execute(_READ_BY_KEY, {**params, "workflow": workflow, "key": key})
        where = f"key {key!r} of workflow {workflow!r}"
    else:
        rows = conn.execute(_READ_BY_ID, {**params, "rid": run_id})
        where = f"run {run_id}"
    row = rows[0] if rows else None
    if row is None:
        raise errors.NotFoundError(f"{where} has no run (never submitted, or purged)")
    rid, state, has_node, was_sent, same = row
    params["rid"] = rid
    if was_sent:
        return _same_or_conflict(bool(same), workflow, key, rid, signal)
    if not has_node:
        raise errors.NotFoundError(
            f"run {rid} of workflow {workflow!r} has no wait node for {signal!r}"
        )
    if RunState(state) in TERMINAL_RUN_STATES:
        raise errors.InvalidStateError(operation=f"send {signal!r} to", run_id=rid, state=state)
    conn.execute(_FAST_WAKE, params)
    if conn.execute(_FAST_SEND, params):
        return True
    stored = conn.execute(_FAST_SAME_PAYLOAD, params)
    return _same_or_conflict(bool(stored and stored[0][0]), workflow, key, rid, signal)


def _same_or_conflict(same: bool, workflow: str, key: str | None, rid: Any, signal: str) -> bool:
    if same:
        return False
    raise errors.SubmitConflictError(
        workflow=workflow, key=key if key is not None else str(rid), run_id=rid, signal=signal
    )
