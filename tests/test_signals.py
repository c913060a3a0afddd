"""Wait nodes and signals: ``@wf.wait``, ``wf.signal``, ``wf.signal_tx`` and ``run.signal``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import claim as _claim
from cyclone._store import executor as _executor
from cyclone._store import rescue as _rescue
from cyclone._store import waits as _waits
from cyclone.schema import jobs, runs, signals
from tests.conftest import StatementCounter, wait_until
from tests.support import invariants
from tests.support.workers import Background, job_rows


class Order(msgspec.Struct):
    id: int
    amount: int


class Payment(msgspec.Struct):
    ref: str
    amount: int


def checkout(name: str, *, timeout: timedelta | None = None) -> cyclone.ResultWorkflow[Order, str]:
    """reserve -> wait for "paid" -> ship (the result); each node records what it saw."""
    wf: cyclone.ResultWorkflow[Order, str] = cyclone.ResultWorkflow(name, input=Order, output=str)

    @wf.step()
    def reserve(ctx: cyclone.StepContext, order: Order) -> int:
        return order.id

    @wf.wait("paid", after=[reserve], timeout=timeout)
    def paid(ctx: cyclone.StepContext, payment: Payment) -> Payment:
        assert isinstance(payment, Payment)
        return payment

    @wf.result(after=[reserve, paid])
    def ship(ctx: cyclone.StepContext, order: Order) -> str:
        payment = ctx.output(paid)
        return f"order {ctx.output(reserve)} paid by {payment.ref} ({payment.amount})"

    return wf


def node_row(engine: sa.Engine, run_id: Any, kind: str = "paid") -> tuple[str, int, Any]:
    row = job_rows(engine, run_id)[kind]
    return row.state, row.attempt, row.errors


def stored_signals(engine: sa.Engine, run_id: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(signals.c.name, signals.c.payload).where(signals.c.run_id == run_id)
        ).all()
    return {name: payload for name, payload in rows}


def test_a_signal_after_the_node_is_reached_completes_the_run(engine: sa.Engine, name: str) -> None:
    wf = checkout(name)
    worker = cyclone.Worker(engine, workflows=[wf])
    run, _ = wf.submit_once(engine, "order-1", Order(1, 30))
    # reserve ran; the wait node was reached and parked, which is no attempt: not counted
    assert worker.drain() == 1
    assert run.status().state == cyclone.RunState.RUNNING
    state, attempt, _ = node_row(engine, run.id)
    # Parked until its signal: blocked with no upstream pending (outside the claim index),
    # no attempt used, no worker held.
    assert (state, attempt) == ("blocked", 0)
    assert wf.signal(engine, "order-1", "paid", Payment("pay_9", 30)) is True
    assert worker.drain() == 2
    assert run.result(timeout=10) == "order 1 paid by pay_9 (30)"


def test_a_signal_before_the_node_is_reached_is_kept_and_used(engine: sa.Engine, name: str) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "order-2", Order(2, 5))
    assert wf.signal(engine, "order-2", "paid", Payment("early", 5)) is True
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 3
    assert run.result(timeout=10) == "order 2 paid by early (5)"


def test_the_same_signal_twice_with_the_same_payload_is_a_no_op(
    engine: sa.Engine, name: str
) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(3, 1))
    assert wf.signal(engine, "k", "paid", {"ref": "a", "amount": 1}) is True
    assert wf.signal(engine, "k", "paid", {"amount": 1, "ref": "a"}) is False
    assert run.signal("paid", Payment("a", 1)) is False
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.result(timeout=10) == "order 3 paid by a (1)"
    # After the run finished, a repeat of the same signal is still a no-op.
    assert wf.signal(engine, "k", "paid", Payment("a", 1)) is False


def test_a_signal_with_another_payload_is_a_conflict_and_the_first_wins(
    engine: sa.Engine, name: str
) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(4, 1))
    wf.signal(engine, "k", "paid", Payment("first", 1))
    with pytest.raises(cyclone.SubmitConflictError, match="'paid'") as caught:
        wf.signal(engine, "k", "paid", Payment("second", 1))
    assert (caught.value.run_id, caught.value.key, caught.value.signal) == (run.id, "k", "paid")
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.result(timeout=10) == "order 4 paid by first (1)"


def test_signal_tx_rolled_back_sends_nothing(engine: sa.Engine, name: str) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(5, 1))
    worker = cyclone.Worker(engine, workflows=[wf])
    worker.drain()
    with engine.connect() as conn, conn.begin() as tx:
        assert wf.signal_tx(conn, "k", "paid", Payment("rolled-back", 1)) is True
        tx.rollback()
    assert stored_signals(engine, run.id).get("paid") is None
    assert worker.drain() == 0
    assert run.status().state == cyclone.RunState.RUNNING
    with engine.begin() as conn:
        wf.signal_tx(conn, "k", "paid", Payment("committed", 1))
    worker.drain()
    assert run.result(timeout=10) == "order 5 paid by committed (1)"


def test_a_conflict_in_signal_tx_does_not_abort_the_callers_transaction(
    engine: sa.Engine, name: str
) -> None:
    wf = checkout(name)
    wf.submit_once(engine, "k", Order(6, 1))
    wf.signal(engine, "k", "paid", Payment("a", 1))
    with engine.begin() as conn:
        with pytest.raises(cyclone.SubmitConflictError):
            wf.signal_tx(conn, "k", "paid", Payment("b", 1))
        assert conn.execute(sa.text("SELECT 1")).scalar() == 1


def test_a_signal_to_an_unknown_run_raises_not_found(engine: sa.Engine, name: str) -> None:
    wf = checkout(name)
    with pytest.raises(cyclone.NotFoundError, match="no run"):
        wf.signal(engine, "nobody", "paid", Payment("x", 1))


def test_a_signal_no_node_waits_for_raises_not_found(engine: sa.Engine, name: str) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(7, 1))
    with pytest.raises(cyclone.NotFoundError, match="no wait node for 'refunded'"):
        wf.signal(engine, "k", "refunded", {"x": 1})
    with pytest.raises(cyclone.NotFoundError, match="no wait node"):
        run.signal("refunded", {"x": 1})
    assert stored_signals(engine, run.id) == {}


def test_a_signal_to_a_finished_run_raises(engine: sa.Engine, name: str) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(8, 1))
    run.cancel()
    with pytest.raises(cyclone.InvalidStateError, match="cancelled"):
        wf.signal(engine, "k", "paid", Payment("late", 1))
    assert stored_signals(engine, run.id) == {}


def test_a_payload_that_does_not_match_the_declared_type_raises_before_sending(
    engine: sa.Engine, name: str
) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(9, 1))
    with pytest.raises(cyclone.InputError):
        wf.signal(engine, "k", "paid", {"ref": 1})
    assert stored_signals(engine, run.id) == {}


def test_a_timeout_fails_the_node_naming_the_signal(engine: sa.Engine, name: str) -> None:
    wf = checkout(name, timeout=timedelta(milliseconds=500))
    run, _ = wf.submit_once(engine, "k", Order(10, 1))
    worker = cyclone.Worker(engine, workflows=[wf])
    # Reserve, then the wait node parks until its timeout; on a slow machine the timeout
    # may pass within the first drain.
    wait_until(
        lambda: worker.drain() >= 0 and run.status().state != cyclone.RunState.RUNNING,
        timeout=20,
        interval=0.1,
    )
    status = run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.failed_step == "paid"
    assert status.error is not None
    assert status.error["message"] == "timed out waiting for 'paid'"
    state, _, errors = node_row(engine, run.id)
    assert state == "failed"
    assert errors[-1]["type"] == "SignalTimeout"
    with pytest.raises(cyclone.InvalidStateError):
        wf.signal(engine, "k", "paid", Payment("too late", 1))


def test_a_timed_out_node_retried_waits_again_for_its_signal(engine: sa.Engine, name: str) -> None:
    # Long enough that the drain after the retry parks the node before its new timeout.
    wf = checkout(name, timeout=timedelta(seconds=2))
    run, _ = wf.submit_once(engine, "k", Order(11, 1))
    worker = cyclone.Worker(engine, workflows=[wf])
    wait_until(
        lambda: worker.drain() >= 0 and run.status().state != cyclone.RunState.RUNNING,
        timeout=20,
        interval=0.1,
    )
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    run.retry()
    worker.drain()
    assert node_row(engine, run.id)[0] == "available"  # parked again, a new timeout
    wf.signal(engine, "k", "paid", Payment("retried", 1))
    worker.drain()
    assert run.result(timeout=10) == "order 11 paid by retried (1)"


def test_a_waiting_run_survives_every_worker_stopping_and_completes_on_the_signal(
    engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(12, 2))
    first = [cyclone.Worker(engine, workflows=[wf], poll_interval=60, sweep=False) for _ in "ab"]
    running = [serving(w) for w in first]
    wait_until(
        lambda: (
            node_row(engine, run.id)[0] == "blocked"
            and node_row(engine, run.id, "reserve")[0] == "completed"
        )
    )
    for worker, background in zip(first, running, strict=True):
        worker.stop()
        background.join(30)
    # No worker runs now; the run waits in the database only.
    with engine.connect() as conn:
        held = conn.execute(
            sa.select(sa.func.count()).where(jobs.c.run_id == run.id, jobs.c.state == "running")
        ).scalar()
    assert held == 0
    serving(cyclone.Worker(engine, workflows=[wf], poll_interval=60, sweep=False))
    wf.signal(engine, "k", "paid", Payment("after-restart", 2))
    # The poll interval is a minute: the signal's NOTIFY wakes the worker.
    assert run.result(timeout=30) == "order 12 paid by after-restart (2)"


def test_a_signal_racing_a_worker_that_reaches_the_node_is_never_lost(
    engine: sa.Engine, name: str
) -> None:
    """Rounds of a signal sent while a worker runs the upstream step and parks the node."""
    for i in range(15):
        wf = checkout(f"{name}_{i}")
        run, _ = wf.submit_once(engine, "k", Order(i, 1))
        worker = cyclone.Worker(engine, workflows=[wf])
        sender = threading.Thread(target=wf.signal, args=(engine, "k", "paid", Payment("r", 1)))
        sender.start()
        worker.drain()
        sender.join(10)
        wait_until(lambda w=worker, r=run: w.drain() >= 0 and r.status().done, timeout=20)
        assert run.result(timeout=10) == f"order {i} paid by r (1)"


def test_definition_rules_of_wait_nodes() -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow("defs")

    @wf.wait("paid")
    def first(ctx: cyclone.StepContext, payment: dict[str, Any]) -> None: ...

    with pytest.raises(cyclone.DefinitionError, match="one wait node per signal"):

        @wf.wait("paid")
        def second(ctx: cyclone.StepContext, payment: dict[str, Any]) -> None: ...

    with pytest.raises(cyclone.DefinitionError, match="positive timedelta"):
        wf.wait("other", timeout=timedelta(0))
    with pytest.raises(cyclone.DefinitionError, match="non-empty"):
        wf.wait("")
    # Accepted here, these made every submit of the workflow fail in the driver (NUL in
    # the graph's jsonb) or in the encoder (UnicodeEncodeError).
    with pytest.raises(cyclone.DefinitionError, match="NUL"):
        wf.wait("paid\x00")
    with pytest.raises(cyclone.DefinitionError, match="UTF-8"):
        wf.wait("paid\ud800")
    # A timeout this long made a worker reaching the node hand it back forever ("timestamp
    # out of range" as it computed when the wait ends): drain() never returned.
    with pytest.raises(cyclone.DefinitionError, match="1,000 years"):
        wf.wait("other", timeout=timedelta(days=3_000_000))
    with pytest.raises(cyclone.DefinitionError, match="1,000 years"):
        wf.wait("other", timeout=timedelta.max)
    assert first.signal == "paid"
    assert first.max_attempts == 1


def test_output_declares_the_type_of_an_unannotated_wait_node(engine: sa.Engine, name: str) -> None:
    wf: cyclone.ResultWorkflow[Any, int] = cyclone.ResultWorkflow(name, output=int)

    @wf.wait("count", output=Payment)
    def counted(ctx, payload):  # type: ignore[no-untyped-def]
        return Payment(ref=payload["ref"], amount=payload["amount"] * 2)

    @wf.result(after=[counted])
    def total(ctx: cyclone.StepContext, value: Any) -> int:
        payment = ctx.output(counted)
        assert isinstance(payment, Payment)
        return payment.amount

    run = wf.submit(engine, None)
    run.signal("count", {"ref": "r", "amount": 21})
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.result(timeout=10) == 42


def test_a_new_signal_is_two_statements_and_a_repeat_one(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = checkout(name)
    wf.submit_once(engine, "k", Order(13, 1))
    statements.reset()
    assert wf.signal(engine, "k", "paid", Payment("s", 1)) is True
    assert statements.count == 2, statements.statements
    statements.reset()
    assert wf.signal(engine, "k", "paid", Payment("s", 1)) is False
    assert statements.count == 1, statements.statements


def test_a_park_presents_the_claims_lease_and_moves_it_on(engine: sa.Engine, name: str) -> None:
    """Parking is guarded by the claim's lease, as every outcome is, and ends that lease.

    The claim the job was handed back from (same worker, same attempt, older lease)
    parks nothing; the current claim parks it as a hand-back does (attempt not counted,
    lease moved on), so that claim's heartbeats no longer match the job.
    """
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.wait("go")
    def go(ctx: cyclone.StepContext, payload: Any) -> Any:
        return payload

    wf.submit(engine, None)
    scope = _claim.Scope(queues=None, workflows=(name,), kinds=())
    held = _executor.Held(engine)

    def never_run(job: _claim.Claimed) -> Any:
        raise AssertionError("a parked node's function ran")

    def row() -> tuple[str, int, int, str | None]:
        with engine.connect() as conn:
            state, attempt, lease, worker_id = conn.execute(
                sa.select(jobs.c.state, jobs.c.attempt, jobs.c.lease, jobs.c.worker_id).where(
                    jobs.c.workflow == name, jobs.c.kind == "go"
                )
            ).one()
        return state, attempt, lease, worker_id

    try:
        _, (stale,) = _claim.record_and_claim(
            held, worker_id="w", successes=[], scope=scope, limit=1
        )
        with engine.begin() as conn:
            assert _rescue.hand_back(conn, [(stale.id, stale.lease)]) == {stale.id}
        _, (current,) = _claim.record_and_claim(
            held, worker_id="w", successes=[], scope=scope, limit=1
        )
        assert (current.id, current.attempt) == (stale.id, stale.attempt)
        assert current.lease > stale.lease
        node = _waits.node_of({name: wf}, current)
        assert node is not None

        outcome = _waits.execute(engine, "w", stale, node, lambda n: 1.0, never_run)
        assert isinstance(outcome, _waits.Parked)
        assert row() == ("running", current.attempt, current.lease, "w")

        outcome = _waits.execute(engine, "w", current, node, lambda n: 1.0, never_run)
        assert isinstance(outcome, _waits.Parked)
        assert row() == ("blocked", current.attempt - 1, current.lease + 1, None)
        with engine.begin() as conn:
            conn.execute(sa.update(jobs).where(jobs.c.id == current.id).values(state="running"))
            assert _rescue.heartbeat(conn, [(current.id, current.lease)]) == set()
            # Put back the parked state faked away above: no worker runs the node.
            conn.execute(sa.update(jobs).where(jobs.c.id == current.id).values(state="blocked"))
    finally:
        held.close()
        with engine.begin() as conn:  # the row forced to running above breaks invariants
            conn.execute(sa.delete(runs).where(runs.c.workflow == name))


def wait_deadline(engine: sa.Engine, run_id: Any) -> Any:
    """``(wait_until, now())`` of the run's "paid" marker, or None when there is none."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(signals.c.wait_until, sa.func.now()).where(
                signals.c.run_id == run_id, signals.c.name == "paid"
            )
        ).first()


@pytest.mark.parametrize("operation", ["retry", "retry_all"])
def test_a_retried_wait_node_starts_its_timeout_over(
    engine: sa.Engine, name: str, operation: str
) -> None:
    wf = checkout(name, timeout=timedelta(seconds=1))
    run, _ = wf.submit_once(engine, "k", Order(12, 1))
    worker = cyclone.Worker(engine, workflows=[wf])
    assert worker.drain() == 1  # reserve; the wait node parks until its timeout
    first = wait_deadline(engine, run.id)
    assert first is not None
    run.cancel()
    # The wait's first deadline passes while the run is cancelled.
    wait_until(lambda: (lambda row: row[0] <= row[1])(wait_deadline(engine, run.id)), timeout=10)

    getattr(run, operation)()
    worker.drain()
    assert run.status().state == cyclone.RunState.RUNNING
    state, attempt, errors = node_row(engine, run.id)
    assert (state, attempt, errors) == ("available", 0, [])  # parked again, no timeout
    again = wait_deadline(engine, run.id)
    assert again is not None
    assert again[0] > first[0]
    assert wf.signal(engine, "k", "paid", Payment("retried", 1)) is True
    worker.drain()
    assert run.result(timeout=10) == "order 12 paid by retried (1)"


def test_a_retried_wait_node_runs_with_the_signal_its_run_was_sent(
    engine: sa.Engine, name: str
) -> None:
    # A run receives a signal once: a retried wait node sees the payload already sent.
    wf = checkout(name, timeout=timedelta(seconds=30))
    run, _ = wf.submit_once(engine, "k", Order(13, 1))
    worker = cyclone.Worker(engine, workflows=[wf])
    assert wf.signal(engine, "k", "paid", Payment("first", 1)) is True
    worker.drain()
    assert run.result(timeout=10) == "order 13 paid by first (1)"
    run.retry_all()
    assert worker.drain() == 3
    assert run.result(timeout=10) == "order 13 paid by first (1)"
    assert stored_signals(engine, run.id) == {"paid": {"ref": "first", "amount": 1}}


def test_every_send_form_checks_the_payload_against_the_wait_nodes_type_before_writing(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    """Before, ``run.signal`` stored a payload of the wrong type (the run then failed,
    and the right payload was refused as a conflict)."""
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(14, 1))
    wrong = {"ref": 1}
    statements.reset()
    with pytest.raises(cyclone.InputError, match="payload of signal 'paid'"):
        run.signal("paid", wrong)
    with pytest.raises(cyclone.InputError, match="payload of signal 'paid'"):
        wf.run(engine, run.id).signal("paid", wrong)
    with pytest.raises(cyclone.InputError, match="payload of signal 'paid'"):
        wf.signal(engine, "k", "paid", wrong)
    assert statements.count <= 1, statements.statements  # wf.run's lookup of the run
    with (
        engine.begin() as conn,
        pytest.raises(cyclone.InputError, match="payload of signal 'paid'"),
    ):
        wf.signal_tx(conn, "k", "paid", wrong)
    assert stored_signals(engine, run.id) == {}
    assert run.signal("paid", Payment("right", 1)) is True
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.result(timeout=10) == "order 14 paid by right (1)"
    invariants.check(engine)


def test_a_signal_the_workflow_has_no_wait_node_for_is_refused_before_any_statement(
    engine: sa.Engine, name: str, statements: StatementCounter
) -> None:
    wf = checkout(name)
    run, _ = wf.submit_once(engine, "k", Order(15, 1))
    statements.reset()
    with pytest.raises(cyclone.NotFoundError, match="no wait node for 'refunded'"):
        run.signal("refunded", {"x": 1})
    with pytest.raises(cyclone.NotFoundError, match="no wait node for 'refunded'"):
        wf.signal(engine, "k", "refunded", {"x": 1})
    assert statements.count == 0, statements.statements
    assert stored_signals(engine, run.id) == {}


def test_one_drain_delivers_every_signal_sent_in_bulk_not_one_claims_worth(
    engine: sa.Engine, name: str
) -> None:
    """A claim delivers at most ``DELIVER_PER_CLAIM`` pending signals; a drain (and a
    woken worker) claims again at once after a full batch, until none is pending, instead
    of leaving the rest to its poll."""
    wf = checkout(name)
    worker = cyclone.Worker(engine, workflows=[wf])
    count = 3 * _claim.DELIVER_PER_CLAIM + 1
    wf.submit_once_many(engine, [(f"bulk-{i}", Order(i, i)) for i in range(count)])
    assert worker.drain() == count  # every reserve ran; every wait node parked
    with engine.begin() as conn:
        for i in range(count):
            wf.signal_tx(conn, f"bulk-{i}", "paid", Payment(f"pay-{i}", i))
    assert worker.drain() == 2 * count
    with engine.connect() as conn:
        states = conn.execute(
            sa.select(runs.c.state, sa.func.count())
            .where(runs.c.workflow == name)
            .group_by(runs.c.state)
        ).all()
    assert states == [("completed", count)]


def test_a_serving_worker_delivers_every_signal_sent_in_bulk_before_its_poll(
    engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    """Signals sent in one transaction ring once; the worker the ring wakes delivers them
    all, a claim's batch after another (and the nodes each batch wakes ring again), not
    one batch and the rest at its poll."""
    wf = checkout(name)
    count = 3 * _claim.DELIVER_PER_CLAIM + 1
    wf.submit_once_many(engine, [(f"bulk-{i}", Order(i, i)) for i in range(count)])
    assert cyclone.Worker(engine, workflows=[wf]).drain() == count
    serving(cyclone.Worker(engine, workflows=[wf], poll_interval=600, sweep=False))
    with engine.begin() as conn:
        for i in range(count):
            wf.signal_tx(conn, f"bulk-{i}", "paid", Payment(f"pay-{i}", i))

    def completed() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.select(sa.func.count()).where(
                        runs.c.workflow == name, runs.c.state == "completed"
                    )
                ).scalar_one()
            )

    wait_until(lambda: completed() == count, timeout=60)
