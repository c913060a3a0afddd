"""Wait nodes, sleep nodes and the signals sent to runs.

A wait node (``@wf.wait(signal)``) or sleep node (``@wf.sleep(duration)``) is a job like
any step, but a worker that claims it first looks whether it may run: a wait node once
its signal's payload is stored in ``cyclone_signals``, a sleep node once its duration has
passed since its upstreams completed (or since the submit, for a root). If not, the job
is *parked*: the attempt is given back, the lease moves on and no worker is recorded,
so a waiting run holds no worker, no thread and no connection. A node waiting until a
time (a sleep, or a wait with a timeout) goes back to ``available`` with
``scheduled_at`` at that time, and an idle worker sleeps until the earliest one falls
due (see :mod:`cyclone._store.due`). A wait without a timeout goes back to ``blocked`` with
no upstream pending, outside the claim index. A parked wait node leaves a *marker*, its
signal row without a payload (with its timeout in ``wait_until``).

A sender writes the signal row only, in the caller's transaction, which may stay open
for as long as the caller likes: it holds no lock a worker's statement waits on. A
signal that fills a marker (its node had parked) is marked ``wake_pending`` and rings
NOTIFY; the claim of a worker serving workflows that it wakes (or the next poll's, were
it lost) delivers it, making the node available and due now
(:func:`cyclone._store.claim.deliver_signals_ctes`, locks skipped, never waited for). A
signal sent before its node parked needs no delivery: the node reads it when reached.

Locks: a sender takes the transaction advisory lock of its (run, signal) before it reads
the run; a worker deciding about a wait node only tries it. So a worker never waits for
a sender, and a sender waits at most for a worker's short decision, after which it sees
that decision: the marker a park left (and fills it, for delivery), or the run a timeout
failed (and refuses the signal). A worker that finds the lock held (a sender in flight,
which may commit or roll back) parks the node to look again shortly. The worker's
transaction locks the run first, then the job (the lock order of :mod:`cyclone.states`),
so a node parked as its run ends is cancelled instead, by whichever comes second.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
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
    exists,
    func,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert

from cyclone import _codec, _observe, errors
from cyclone._store import completion as _completion
from cyclone._store import definitions as _definitions
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from cyclone._store.claim import Claimed
from cyclone._store.completion import Failure, Success
from cyclone._store.executor import const
from cyclone.schema import jobs, runs, signals
from cyclone.states import TERMINAL_RUN_STATES, JobState, RunState

if TYPE_CHECKING:
    from cyclone.workflow import Step, Workflow

log = logging.getLogger("cyclone.worker")

PARK_FOR = timedelta(days=365 * 100)
"""How far ahead a wait node without a timeout is parked; a signal brings it back to now."""

RECHECK_IN_FLIGHT = timedelta(seconds=1)
"""When a wait node whose signal is being sent (not yet committed) is looked at again."""

SIGNAL_LOCK_CLASS = 0x63796331
"""The first key of the advisory locks of (run, signal) pairs (``cyc1``)."""


@dataclass(frozen=True, slots=True)
class Parked:
    """A wait or sleep node that went back to waiting, was ended, or is no longer ours:
    whatever there was to record is recorded."""

    job_id: int
    timed_out: Failure | None = None
    """The timeout failure the decision recorded, if that is what it decided."""


@dataclass(frozen=True, slots=True)
class HandBack:
    """cyclone could not decide about a wait or sleep node (a database error): the job
    goes back to available under a new lease, its attempt not counted."""

    job_id: int
    lease: int


def node_of(workflows: Mapping[str, Workflow[Any]], job: Claimed) -> Step[Any] | None:
    """The wait or sleep node ``job`` is a step of, or None for any other job."""
    wf = workflows.get(job.workflow or "")
    node = wf.steps.get(job.kind) if wf is not None else None
    if node is None or (node.signal is None and node.sleep is None):
        return None
    return node


def encode_payload(payload_types: Mapping[str, Any] | None, signal: str, payload: Any) -> str:
    """The JSON text of ``payload`` for ``signal``, checked before anything is sent.

    ``payload_types`` maps each wait node's signal to its payload type (None when the
    sender does not know the workflow's definition: then the database's copy of the
    graph alone says whether the run waits for ``signal``). Every send form encodes its
    payload here.

    Raises:
        TypeError: ``signal`` is not a str.
        ValueError: ``signal`` is empty.
        NotFoundError: the workflow has no wait node for ``signal``.
        InputError: the payload cannot be encoded as JSON or does not match the type.
    """
    if not isinstance(signal, str):
        raise TypeError(f"a signal name is a str, not {type(signal).__name__}")
    if not signal:
        raise ValueError("a signal name is a non-empty str")
    type_: Any = Any
    if payload_types is not None:
        if signal not in payload_types:
            raise errors.NotFoundError(f"the workflow has no wait node for {signal!r}")
        type_ = payload_types[signal]
    return _codec.encode(payload, what=f"payload of signal {signal!r}", type_=type_)


def _signal_lock(run_id: Any, signal: Any) -> tuple[Any, Any]:
    """The two keys of the advisory lock a sender takes and a deciding worker tries."""
    key = func.hashtext(cast(run_id, Text).op("||")(const(":")).op("||")(signal))
    return const(SIGNAL_LOCK_CLASS, Integer), key


# -- the worker's side -----------------------------------------------------------------

_GUARD = and_(
    jobs.c.id == bindparam("job_id"),
    jobs.c.lease == bindparam("lease", type_=BigInteger),
    jobs.c.attempt == bindparam("attempt_no"),
    jobs.c.state == const(JobState.RUNNING.value),
    jobs.c.worker_id == bindparam("me", type_=Text),
)
_LOCK_RUN = (
    select(runs.c.state).where(runs.c.id == bindparam("rid")).with_for_update(key_share=True)
)
_LOCK_JOB = select(jobs.c.id).where(_GUARD).with_for_update()
_SIGNAL_KEY = and_(
    signals.c.run_id == bindparam("rid"), signals.c.name == bindparam("signal", type_=Text)
)
_TRY_SIGNAL_LOCK = select(
    func.pg_try_advisory_xact_lock(*_signal_lock(bindparam("rid"), bindparam("signal", Text))),
    func.now(),
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


def park_stmt() -> Any:
    """Park a claimed wait or sleep node: blocked until a signal (``park_blocked``), or
    available at its timeout or wake-up time (``park``), its attempt not counted."""
    return (
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
            # As a hand-back (cyclone._store.rescue): the attempt is not counted, and the lease
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


def end_parked_stmt() -> Any:
    """End a claimed wait or sleep node whose run has ended, instead of parking it.

    The caller holds the run's lock and has read it ended: the job is cancelled, its
    attempt not counted, as a hand-back in an ended run is.
    """
    return (
        update(jobs)
        .where(_GUARD)
        .values(
            state=const(JobState.CANCELLED.value),
            finalized_at=func.now(),
            attempt=case((jobs.c.attempt > 0, jobs.c.attempt - 1), else_=0),
            lease=jobs.c.lease + 1,
            worker_id=None,
            heartbeat_at=None,
        )
    )


_PARK = park_stmt()
_END = end_parked_stmt()
GUARD, LOCK_RUN, LOCK_JOB, END = _GUARD, _LOCK_RUN, _LOCK_JOB, _END
"""The guard of a claimed node's job, and the statements that lock its run, then the job,
and end it in a run that has ended: shared with map nodes (:mod:`cyclone._store.fanout`)."""
_upstream = jobs.alias("upstream")
_SLEEP_DUE = select(
    func.coalesce(
        select(func.max(_upstream.c.finalized_at))
        .where(
            _upstream.c.run_id == jobs.c.run_id,
            _upstream.c.kind == func.any(jobs.c.deps),
            _upstream.c.item.is_(None),  # a map node's own job, not its items
        )
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


Outcome = Success | Failure | Parked | HandBack


def undecided(
    worker_id: str,
    job: Claimed,
    what: str,
    exc: Exception,
    backoff: Callable[[int], float] | None,
) -> HandBack | Failure:
    """What a node's decision that raised ``exc`` comes to.

    A data error (SQLSTATE class 22, a value the server refuses, or a value the driver
    cannot load, such as a time after year 9999) is the same at every try: handed back, the node
    would be claimed and refused again at once, for ever. It is the attempt's failure
    instead, retried after ``backoff`` (None: not retried) until its attempts run out,
    then its run's. Any other error (a lost connection, a deadlock, a statement
    cancelled, a schema a deploy has not migrated yet) hands the job back, its attempt
    not counted.
    """
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    if isinstance(getattr(exc, "orig", exc), psycopg.DataError):
        log.error(
            "worker %s could not decide about %s %r of run %s (%s); it fails this attempt",
            worker_id,
            what,
            job.kind,
            job.run_id,
            first,
        )
        error = {
            "type": type(getattr(exc, "orig", exc)).__qualname__,
            "message": f"cyclone could not decide about this {what}: {first}",
            "attempt": job.attempt,
            "step": job.kind,
            **({} if job.item is None else {"item": job.item}),
            "at": datetime.now(UTC).isoformat(),
        }
        retry_in = (
            None if backoff is None or job.attempt >= job.max_attempts else backoff(job.attempt)
        )
        return Failure(job.id, job.lease, error, retry_in)
    log.warning(
        "worker %s could not decide about %s %r of run %s (%s); handing it back",
        worker_id,
        what,
        job.kind,
        job.run_id,
        first,
    )
    return HandBack(job.id, job.lease)


def execute(
    engine: Engine,
    worker_id: str,
    job: Claimed,
    node: Step[Any],
    backoff: Callable[[int], float],
    run: Callable[[Claimed], Success | Failure],
) -> Outcome:
    """Run a claimed wait or sleep node if it may run now (``run``), else park it.

    Statements, in one transaction: lock the run, then the job (guarded by lease,
    attempt, state and worker); a job whose run has ended is cancelled. Then for a sleep
    node read when it is due; for a wait node try the advisory lock of its signal (held:
    a sender is in flight, look again shortly), read its signal row (inserting the
    marker, with the timeout, the first time); then park the job, or commit and run it.
    A wait node past its timeout fails with a ``SignalTimeout`` error naming the signal,
    recorded in the same transaction, so that no signal is accepted for it once decided
    (retried as any step; the next attempt waits anew).

    A database error in this transaction is cyclone's, not the step's: the job is
    handed back (:class:`HandBack`), its attempt not counted, unless the database
    refused a value, which fails the attempt (:func:`undecided`).
    """
    try:
        payload = _decide(engine, worker_id, job, node, backoff)
    except Exception as exc:
        what = "wait node" if node.signal is not None else "sleep node"
        return undecided(worker_id, job, what, exc, backoff)
    if isinstance(payload, Parked):
        return payload
    return run(job if payload is None else replace(job, input=payload))


def _decide(
    engine: Engine,
    worker_id: str,
    job: Claimed,
    node: Step[Any],
    backoff: Callable[[int], float],
) -> str | Parked | None:
    """The payload to run the node with (None: a sleep node), or Parked (committed)."""
    guard = {"job_id": job.id, "lease": job.lease, "attempt_no": job.attempt, "me": worker_id}
    with engine.begin() as conn:
        state = _executor.value(conn, _LOCK_RUN, {"rid": job.run_id})
        if _executor.first(conn, _LOCK_JOB, guard) is None:
            return Parked(job.id)  # rescued, handed back or cancelled meanwhile: not ours
        if state != RunState.RUNNING.value:
            _executor.affected(conn, _END, guard)
            return Parked(job.id)
        if node.sleep is not None:
            due, now = _executor.one(conn, _SLEEP_DUE, {"job_id": job.id, "duration": node.sleep})
            if due > now:
                _executor.affected(conn, _PARK, {**guard, "until": due})
                return Parked(job.id)
            return None
        assert node.signal is not None
        key = {"rid": job.run_id, "signal": node.signal}
        free, now = _executor.one(conn, _TRY_SIGNAL_LOCK, key)
        if not free:
            _executor.affected(conn, _PARK, {**guard, "until": now + RECHECK_IN_FLIGHT})
            return Parked(job.id)
        row = _executor.first(conn, _READ_SIGNAL, key)
        if row is not None and row[0] is not None:
            payload: str = row[0]
            return payload
        if row is not None and row[2]:
            _executor.affected(conn, _UNMARK, key)
            failure = _timed_out(job, node.signal, backoff)
            _completion.record_failures(conn, [failure])
            return Parked(job.id, failure)
        until = row[1] if row is not None else _mark(conn, key, node.timeout)
        _executor.affected(conn, _PARK, {**guard, "until": until})
        return Parked(job.id)


def _mark(conn: Connection, key: dict[str, Any], timeout: timedelta | None) -> datetime | None:
    marked = _executor.first(conn, _MARK, {**key, "timeout": timeout})
    return None if marked is None else marked[0]


# -- the sender's side -----------------------------------------------------------------

_NODE_ARGS = cast(func.jsonb_build_object(const("signal"), bindparam("signal", type_=Text)), JSONB)


def _read_stmt(by_key: bool) -> Any:
    """The run, whether it has a wait node for the signal, and the signal already sent.

    Reading the run takes the advisory lock of its (run, signal): a worker deciding about
    the wait node meanwhile is waited for, and the statements after this one see what
    it decided.
    """
    # From the graph, which a run not started yet has already (its steps have no rows).
    node_exists = (
        _definitions.graph_of(runs)
        .op("->", return_type=JSONB)(const("steps"))
        .op("@>")(func.jsonb_build_array(_NODE_ARGS))
    )
    sent = signals.alias("sent")
    stmt = (
        select(
            runs.c.id,
            runs.c.state,
            node_exists,
            sent.c.payload.is_not(None),
            sent.c.payload == cast(bindparam("payload", type_=Text), JSONB),
            cast(
                func.pg_advisory_xact_lock(
                    *_signal_lock(runs.c.id, bindparam("signal", type_=Text))
                ),
                Text,
            ),
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


_READ_BY_KEY = _executor.Compiled(_read_stmt(by_key=True))
_READ_BY_ID = _executor.Compiled(_read_stmt(by_key=False))
_PAYLOAD = cast(bindparam("payload", type_=Text), JSONB)
_excluded = insert(signals).excluded
_SEND = (
    insert(signals)
    .from_select(
        [signals.c.run_id, signals.c.name, signals.c.payload, signals.c.sent_at],
        select(
            bindparam("rid", type_=runs.c.id.type),
            bindparam("signal", type_=Text),
            _PAYLOAD,
            func.now(),
        ).where(
            exists().where(
                runs.c.id == bindparam("rid"), runs.c.state == const(RunState.RUNNING.value)
            )
        ),
    )
    .on_conflict_do_update(
        index_elements=[signals.c.run_id, signals.c.name],
        # A marker filled: its node parked, and a claim delivers the signal.
        set_={"payload": _excluded.payload, "sent_at": func.now(), "wake_pending": True},
        where=signals.c.payload.is_(None),
    )
    .returning(
        signals.c.run_id,
        case((signals.c.wake_pending, _notify.ring())),
    )
)
_FAST_SEND = _executor.Compiled(_SEND)


@_observe.signals
def send(
    conn: _executor.Executor,
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
    signal already sent (taking the advisory lock of the run's signal); then, for a new
    signal, the ``INSERT`` of the signal, if the run is still running; a third reads
    why when it stored nothing (a concurrent sender, or the run ended meanwhile).
    Only the signal row is written: the caller's transaction holds no lock a worker
    waits on.

    Raises:
        NotFoundError: no such run, or the run has no wait node for ``signal``.
        SubmitConflictError: the signal was sent already with another payload.
        InvalidStateError: the run has finished (or its wait node timed out and failed
            it) and was never sent this signal.
    """
    params: dict[str, Any] = {"signal": signal, "payload": payload}
    if key is not None:
        rows = conn.rows(_READ_BY_KEY, {**params, "workflow": workflow, "key": key})
        where = f"key {key!r} of workflow {workflow!r}"
    else:
        rows = conn.rows(_READ_BY_ID, {**params, "rid": run_id})
        where = f"run {run_id}"
    row = rows[0] if rows else None
    if row is None:
        raise errors.NotFoundError(f"{where} has no run (never submitted, or purged)")
    rid, state, has_node, was_sent, same, _locked = row
    params["rid"] = rid
    _observe.found(rid)
    if was_sent:
        return _same_or_conflict(bool(same), workflow, key, rid, signal)
    if not has_node:
        raise errors.NotFoundError(
            f"run {rid} of workflow {workflow!r} has no wait node for {signal!r}"
        )
    if RunState(state) not in TERMINAL_RUN_STATES and conn.rows(_FAST_SEND, params):
        return True
    # Stored nothing: the run had ended, or ended since the read (a wait node's timeout
    # decided before this sender took the lock), or a concurrent sender stored first.
    _rid, state, _node, was_sent, same, _locked = conn.rows(_READ_BY_ID, params)[0]
    if was_sent:
        return _same_or_conflict(bool(same), workflow, key, rid, signal)
    raise errors.InvalidStateError(operation=f"send {signal!r} to", run_id=rid, state=state)


def _same_or_conflict(same: bool, workflow: str, key: str | None, rid: Any, signal: str) -> bool:
    if same:
        return False
    raise errors.SubmitConflictError(
        workflow=workflow, key=key if key is not None else str(rid), run_id=rid, signal=signal
    )
