"""Signals and parks against workers: no lock a worker waits on, no lost or false acceptance.

Each interleaving is forced with a lock a test transaction holds, and observed in
``pg_locks`` (``pg_blocking_pids``), never with sleeps.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import claim as _claim
from cyclone._store import executor as _executor
from cyclone._store import waits as _waits
from cyclone.schema import jobs, runs, signals
from tests.conftest import wait_until
from tests.support import invariants
from tests.support.workers import Background, job_rows

Release = threading.Event


def gated(name: str, gate: Release, entered: Release) -> cyclone.ResultWorkflow[int, str]:
    """reserve -> wait for "paid" -> ship; reserve of order 0 waits for ``gate``."""
    wf: cyclone.ResultWorkflow[int, str] = cyclone.ResultWorkflow(name, input=int, output=str)

    @wf.step()
    def reserve(ctx: cyclone.StepContext, order: int) -> int:
        if order == 0:
            entered.set()
            assert gate.wait(60)
        return order

    @wf.wait("paid", after=[reserve])
    def paid(ctx: cyclone.StepContext, payment: str) -> str:
        return payment

    @wf.result(after=[reserve, paid])
    def ship(ctx: cyclone.StepContext, order: int) -> str:
        return f"{ctx.output(reserve)} paid by {ctx.output(paid)}"

    return wf


def blocked_by(engine: sa.Engine, pid: int) -> list[str]:
    """The statements of the backends waiting for a lock that backend ``pid`` holds."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT query FROM pg_stat_activity "
                    "WHERE :pid = ANY (pg_blocking_pids(pid)) ORDER BY pid"
                ),
                {"pid": pid},
            ).scalars()
        )


def blocking_pids(engine: sa.Engine, pid: int) -> list[int]:
    """The backends waiting for a lock that backend ``pid`` holds."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity WHERE :pid = ANY (pg_blocking_pids(pid))"
                ),
                {"pid": pid},
            ).scalars()
        )


def backend_pid(conn: sa.Connection) -> int:
    return int(conn.execute(sa.select(sa.func.pg_backend_pid())).scalar_one())


def node_state(engine: sa.Engine, run_id: Any, kind: str = "paid") -> str:
    return job_rows(engine, run_id)[kind].state


def test_an_open_signal_tx_stalls_no_worker_and_commits_or_rolls_back_as_sent(
    engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    """A caller's transaction holding a signal_tx uncommitted: before, the worker's
    record-and-claim statement (completing the upstream of the signalled wait node, which
    unblocks it) waited for the caller's lock on that node's row, and the worker stopped."""
    gate, entered = Release(), Release()
    wf = gated(name, gate, entered)
    other: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        f"{name}_other", input=int, output=int
    )

    @other.result()
    def double(ctx: cyclone.StepContext, n: int) -> int:
        return 2 * n

    worker = cyclone.Worker(engine, workflows=[wf, other], concurrency=4, sweep=False)
    serving_worker = serving(worker)
    # Run "rolled": its node parked before the caller's transaction fills its marker.
    rolled, _ = wf.submit_once(engine, "rolled", 7)
    wait_until(lambda: node_state(engine, rolled.id) == "blocked")
    # Run "held": signalled while its upstream runs, which then completes.
    held, _ = wf.submit_once(engine, "held", 0)
    assert entered.wait(30)
    with engine.connect() as commit_conn, engine.connect() as rollback_conn:
        commit_tx, rollback_tx = commit_conn.begin(), rollback_conn.begin()
        assert wf.signal_tx(commit_conn, "held", "paid", "committed") is True
        assert wf.signal_tx(rollback_conn, "rolled", "paid", "rolled back") is True
        gate.set()
        others = [other.submit(engine, n) for n in range(5)]
        same = []
        for n in range(1, 6):
            run, _ = wf.submit_once(engine, f"same-{n}", n)
            wf.signal(engine, f"same-{n}", "paid", f"p{n}")
            same.append(run)
        assert [r.result(timeout=30) for r in others] == [0, 2, 4, 6, 8]
        assert [r.result(timeout=30) for r in same] == [f"{n} paid by p{n}" for n in range(1, 6)]
        assert blocked_by(engine, backend_pid(commit_conn)) == []
        assert blocked_by(engine, backend_pid(rollback_conn)) == []
        commit_tx.commit()
        rollback_tx.rollback()
    assert held.result(timeout=30) == "0 paid by committed"
    # The rolled back signal was never sent: its run keeps waiting, and can be sent it.
    assert rolled.status().state == cyclone.RunState.RUNNING
    # Parked again (a node that met the open transaction looks once more, then parks).
    wait_until(lambda: node_state(engine, rolled.id) == "blocked", message="not parked again")
    assert wf.signal(engine, "rolled", "paid", "later") is True
    assert rolled.result(timeout=30) == "7 paid by later"
    worker.stop()
    serving_worker.join(30)
    invariants.check(engine)


def test_a_database_error_while_parking_does_not_count_as_an_attempt_of_the_wait_node(
    engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    """The worker's connection is terminated in the middle of its park transaction: the
    wait node (one attempt) is handed back and parked again, and runs on its signal."""
    wf: cyclone.ResultWorkflow[Any, str] = cyclone.ResultWorkflow(name, output=str)

    @wf.wait("go")
    def go(ctx: cyclone.StepContext, payload: str) -> str:
        return payload

    @wf.result(after=[go])
    def done(ctx: cyclone.StepContext, _: Any) -> str:
        return ctx.output(go)

    run = wf.submit(engine, None)
    with engine.connect() as conn:
        # An uncommitted marker of the node's signal: the worker inserting its own waits.
        tx = conn.begin()
        conn.execute(sa.insert(signals).values(run_id=run.id, name="go"))
        holder = backend_pid(conn)
        worker = cyclone.Worker(engine, workflows=[wf], sweep=False)
        serving_worker = serving(worker)
        waiting = wait_until(lambda: blocked_by(engine, holder), timeout=30)
        with engine.connect() as admin:
            killed = admin.execute(
                sa.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE :pid = ANY (pg_blocking_pids(pid))"
                ),
                {"pid": holder},
            ).all()
        assert killed == [(True,)], waiting
        # The node comes back to the park (its attempt not counted), and waits again.
        wait_until(lambda: blocked_by(engine, holder) or run.status().done, timeout=30)
        assert run.status().state == cyclone.RunState.RUNNING
        tx.rollback()
    wait_until(lambda: node_state(engine, run.id, "go") == "blocked", timeout=30)
    assert run.signal("go", "after the failover") is True
    assert run.result(timeout=30) == "after the failover"
    row = job_rows(engine, run.id)["go"]
    assert (row.attempt, row.errors) == (1, [])
    worker.stop()
    serving_worker.join(30)
    invariants.check(engine)


def timed_wait(name: str) -> cyclone.ResultWorkflow[Any, str]:
    """A root wait node with a timeout an hour away, which the tests bring forward."""
    wf: cyclone.ResultWorkflow[Any, str] = cyclone.ResultWorkflow(name, output=str)

    @wf.wait("paid", timeout=timedelta(hours=1))
    def paid(ctx: cyclone.StepContext, payment: str) -> str:
        return payment

    @wf.result(after=[paid])
    def ship(ctx: cyclone.StepContext, _: Any) -> str:
        return f"shipped after {ctx.output(paid)}"

    return wf


def parked_past_its_timeout(engine: sa.Engine, wf: cyclone.Workflow[Any]) -> uuid.UUID:
    """Submit a run of ``wf``, park its wait node, and move its timeout to the past (the
    node itself stays parked until :func:`make_due`)."""
    run = wf.submit(engine, None)
    assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 0
    assert node_state(engine, run.id) == "available"  # parked until its timeout
    with engine.begin() as conn:
        conn.execute(
            sa.update(signals)
            .where(signals.c.run_id == run.id)
            .values(wait_until=sa.func.now() - timedelta(seconds=1))
        )
    return run.id


def make_due(engine: sa.Engine, run_id: uuid.UUID) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.run_id == run_id, jobs.c.kind == "paid")
            .values(scheduled_at=sa.func.now())
        )


def accepted_iff_delivered(wf: cyclone.Workflow[Any], run: cyclone.Run, sent: Any) -> None:
    """A send reported accepted is delivered: the run completes on it; a send not
    accepted says so (InvalidStateError), and the run fails by its timeout."""
    status = run.wait(timeout=30)
    if sent is True:
        assert status.state == cyclone.RunState.COMPLETED, (status.state, status.error)
    else:
        assert isinstance(sent, cyclone.InvalidStateError), sent
        assert status.state == cyclone.RunState.FAILED
        assert status.error is not None
        assert status.error["type"] == "SignalTimeout"


def send(engine: sa.Engine, wf: cyclone.Workflow[Any], run_id: uuid.UUID) -> Any:
    """The signal's result: True, False, or the InvalidStateError that refused it."""
    try:
        return wf.run(engine, run_id).signal("paid", "in time?")
    except cyclone.InvalidStateError as exc:
        return exc


def test_a_signal_sent_while_a_timeout_is_decided_is_refused_or_delivered(
    engine: sa.Engine, name: str
) -> None:
    """The worker has decided the node timed out and holds its decision (its delete of
    the marker waits for a test lock); a sender comes then: before, it was accepted
    (True) and the run then failed by the timeout."""
    wf = timed_wait(name)
    run_id = parked_past_its_timeout(engine, wf)
    run = wf.run(engine, run_id)
    with engine.connect() as conn:
        tx = conn.begin()
        conn.execute(sa.select(signals.c.name).where(signals.c.run_id == run_id).with_for_update())
        holder = backend_pid(conn)
        make_due(engine, run_id)
        worker = cyclone.Worker(engine, workflows=[wf], sweep=False)
        draining = Background(worker.drain, name="draining")
        wait_until(lambda: blocked_by(engine, holder), timeout=30)
        (deciding,) = blocking_pids(engine, holder)
        sender = Background(lambda: send(engine, wf, run_id), name="sender")
        # The sender waits for the worker's decision, which waits for the test.
        wait_until(lambda: blocked_by(engine, deciding), timeout=30)
        tx.rollback()
    sent = sender.join(30)
    draining.join(30)
    cyclone.Worker(engine, workflows=[wf], sweep=False).drain()
    accepted_iff_delivered(wf, run, sent)
    invariants.check(engine)


def test_a_signal_sent_before_a_timeout_is_decided_is_delivered(
    engine: sa.Engine, name: str
) -> None:
    """The worker reaches the node past its timeout while a test lock on the run holds
    it; a signal sent then is accepted, and the node runs on it (before, the worker had
    decided the timeout already, and the run failed after the signal was accepted)."""
    wf = timed_wait(name)
    run_id = parked_past_its_timeout(engine, wf)
    run = wf.run(engine, run_id)
    with engine.connect() as conn:
        tx = conn.begin()
        conn.execute(
            sa.select(runs.c.id).where(runs.c.id == run_id).with_for_update(key_share=True)
        )
        holder = backend_pid(conn)
        make_due(engine, run_id)
        worker = cyclone.Worker(engine, workflows=[wf], sweep=False)
        draining = Background(worker.drain, name="draining")
        wait_until(lambda: blocked_by(engine, holder), timeout=30)
        sent = send(engine, wf, run_id)
        tx.rollback()
    draining.join(30)
    cyclone.Worker(engine, workflows=[wf], sweep=False).drain()
    assert sent is True
    accepted_iff_delivered(wf, run, sent)
    invariants.check(engine)


@pytest.mark.parametrize("kind", ["wait", "sleep"])
def test_a_node_reached_after_its_run_ended_is_cancelled_not_parked(
    engine: sa.Engine, name: str, kind: str
) -> None:
    """Claimed, then its run cancelled, then looked at: before, the park put it back to
    blocked (wait) or available (sleep) inside the cancelled run."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    if kind == "wait":

        @wf.wait("go")
        def node(ctx: cyclone.StepContext, payload: Any) -> Any:
            return payload

    else:

        @wf.sleep(timedelta(hours=1))
        def node(ctx: cyclone.StepContext, _: Any) -> Any:
            return None

    run = wf.submit(engine, None)
    held = _executor.Held(engine)
    try:
        scope = _claim.Scope(queues=None, workflows=(name,), kinds=())
        _, (job,) = _claim.record_and_claim(held, worker_id="w", successes=[], scope=scope, limit=1)
    finally:
        held.close()
    run.cancel()

    def never_run(job: _claim.Claimed) -> Any:
        raise AssertionError("the node of a cancelled run ran")

    outcome = _waits.execute(engine, "w", job, wf.steps["node"], lambda n: 1.0, never_run)
    assert isinstance(outcome, _waits.Parked)
    row = job_rows(engine, run.id)["node"]
    assert (row.state, row.worker_id) == ("cancelled", None)
    invariants.check(engine)
