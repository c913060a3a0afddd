"""Waiting for runs: wait(), result(), the errors they raise, and the NOTIFY wake-ups."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import msgspec
import pytest
import sqlalchemy as sa

import cyclone
from cyclone import runs as _runs
from cyclone._store import notify as _notify
from tests.conftest import wait_until
from tests.support.counting import Recorder
from tests.support.workers import Background, IdleWatch


class Cart(msgspec.Struct):
    items: list[int]


class Quote(msgspec.Struct):
    total: int
    count: int


def pricing(name: str) -> cyclone.ResultWorkflow[Cart, Quote]:
    wf: cyclone.ResultWorkflow[Cart, Quote] = cyclone.ResultWorkflow(name, input=Cart, output=Quote)

    @wf.step()
    def subtotal(ctx: cyclone.StepContext, cart: Cart) -> int:
        return sum(cart.items)

    @wf.result(after=[subtotal])
    def quote(ctx: cyclone.StepContext, cart: Cart) -> Quote:
        return Quote(total=ctx.output(subtotal), count=len(cart.items))

    return wf


@pytest.fixture
def thread_statements(engine: sa.Engine) -> Iterator[dict[str, list[str]]]:
    """The statements the engine sends, by the name of the thread that sends them."""
    seen: dict[str, list[str]] = {}
    lock = threading.Lock()

    class ByThread(Recorder):
        def record(self, thread: str, statement: str) -> None:
            with lock:
                seen.setdefault(thread, []).append(statement)

    with ByThread():
        yield seen


def test_result_returns_the_decoded_output(engine: sa.Engine, name: str) -> None:
    wf = pricing(name)
    run = wf.submit(engine, Cart(items=[2, 3, 5]))
    cyclone.Worker(engine, workflows=[wf]).drain()

    result = run.result(timeout=5)
    assert result == Quote(total=10, count=3)
    assert type(result) is Quote


def test_wait_returns_the_terminal_status(engine: sa.Engine, name: str) -> None:
    wf = pricing(name)
    run = wf.submit(engine, Cart(items=[1]))
    cyclone.Worker(engine, workflows=[wf]).drain()

    status = run.wait(timeout=5)
    assert status.id == run.id
    assert status.state == cyclone.RunState.COMPLETED
    assert status.finished_at is not None


def test_wait_raises_timeout_error_when_nothing_runs_the_run(engine: sa.Engine, name: str) -> None:
    wf = pricing(name)
    run = wf.submit(engine, Cart(items=[1]))

    started = time.monotonic()
    with pytest.raises(TimeoutError):
        run.wait(timeout=0.3)
    assert time.monotonic() - started >= 0.3
    with pytest.raises(TimeoutError):
        run.result(timeout=0.2)
    assert run.status().state == cyclone.RunState.RUNNING


def test_result_of_a_run_first_made_by_a_plain_workflow_raises_no_output_error(
    engine: sa.Engine, name: str
) -> None:
    plain = cyclone.Workflow(name, input=Cart)

    @plain.step()
    def subtotal(ctx: cyclone.StepContext, cart: Cart) -> int:
        return sum(cart.items)

    first, created = plain.submit_once(engine, "cart:1", Cart(items=[4]))
    assert created
    cyclone.Worker(engine, workflows=[plain]).drain()

    run, created = pricing(name).submit_once(engine, "cart:1", Cart(items=[4]))
    assert not created
    assert run.id == first.id
    with pytest.raises(cyclone.NoOutputError) as excinfo:
        run.result(timeout=5)
    assert excinfo.value.run_id == run.id


def test_result_of_a_failed_run_raises_run_failed_error(engine: sa.Engine, name: str) -> None:
    wf: cyclone.ResultWorkflow[Cart, int] = cyclone.ResultWorkflow(name, input=Cart, output=int)

    @wf.step(max_attempts=1)
    def check(ctx: cyclone.StepContext, cart: Cart) -> None:
        raise ValueError("empty cart")

    @wf.result(after=[check])
    def total(ctx: cyclone.StepContext, cart: Cart) -> int:
        return 0

    run = wf.submit(engine, Cart(items=[]))
    cyclone.Worker(engine, workflows=[wf]).drain()

    with pytest.raises(cyclone.RunFailedError) as excinfo:
        run.result(timeout=5)
    error = excinfo.value
    assert error.run_id == run.id
    assert error.state == "failed"
    assert error.step == "check"
    assert error.error is not None
    assert (error.error["type"], error.error["message"]) == ("ValueError", "empty cart")


def test_result_of_a_cancelled_run_raises_run_failed_error(engine: sa.Engine, name: str) -> None:
    wf = pricing(name)
    run = wf.submit(engine, Cart(items=[1]))
    run.cancel()

    with pytest.raises(cyclone.RunFailedError) as excinfo:
        run.result(timeout=5)
    assert excinfo.value.state == "cancelled"


WOKEN_WITHIN = _runs.DEFAULT_POLL_INTERVAL - 0.5
"""A waiter woken by the run's notification returns before its poll would have read the
run; on a loaded machine the drain that finishes the run may itself take seconds."""


def test_a_waiter_is_woken_by_notify(
    engine: sa.Engine, name: str, thread_statements: dict[str, list[str]]
) -> None:
    wf = pricing(name)
    with engine.begin() as conn:  # a handle that must read first: see the test below
        run = wf.submit_tx(conn, Cart(items=[20, 22]))
    waiter_name = f"waiter-{name}"
    waiter = Background(lambda: run.result(timeout=30), name=waiter_name)
    # The waiter has read the run at least twice (before and inside its wait loop): it now
    # sleeps until a notification or its 5 s poll.
    wait_until(lambda: len(thread_statements.get(waiter_name, [])) >= 2, timeout=10)
    assert waiter.alive()

    started = time.monotonic()
    worker = Background(cyclone.Worker(engine, workflows=[wf]).drain)

    assert waiter.join(10) == Quote(total=42, count=2)
    assert waiter.finished_at is not None
    assert waiter.finished_at - started < WOKEN_WITHIN
    assert worker.join(10) == 2


def test_a_fresh_submit_waits_for_its_notification_and_reads_once(
    engine: sa.Engine, name: str, thread_statements: dict[str, list[str]]
) -> None:
    # This process listened before the submit, so the run cannot have finished unseen:
    # result() waits for the notification instead of reading a run that is not done.
    wf = pricing(name)
    warm = wf.submit(engine, Cart(items=[1]))
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert warm.result(timeout=10) == Quote(total=1, count=1)

    run = wf.submit(engine, Cart(items=[20, 22]))
    waiter_name = f"waiter-{name}"
    waiter = Background(lambda: run.result(timeout=30), name=waiter_name)
    time.sleep(0.5)  # a window in which the waiter must send nothing: nothing marks "not yet"
    assert waiter.alive()
    assert thread_statements.get(waiter_name, []) == []

    started = time.monotonic()
    worker = Background(cyclone.Worker(engine, workflows=[wf]).drain)
    assert waiter.join(10) == Quote(total=42, count=2)
    assert waiter.finished_at is not None
    assert waiter.finished_at - started < WOKEN_WITHIN
    assert len(thread_statements[waiter_name]) == 1
    assert worker.join(10) == 2


def test_result_of_a_run_that_finished_before_the_call_returns_at_once(
    engine: sa.Engine, name: str
) -> None:
    wf = pricing(name)
    warm = wf.submit(engine, Cart(items=[1]))  # this process listens from here on
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert warm.result(timeout=10) == Quote(total=1, count=1)
    run = wf.submit(engine, Cart(items=[2, 3]))
    cyclone.Worker(engine, workflows=[wf]).drain()
    started = time.monotonic()
    assert run.result(timeout=30) == Quote(total=5, count=2)
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    assert time.monotonic() - started < 2.0


def test_a_timeout_is_raised_only_after_reading_the_run(
    engine: sa.Engine, name: str, thread_statements: dict[str, list[str]]
) -> None:
    wf = pricing(name)
    warm = wf.submit(engine, Cart(items=[1]))  # this process listens from here on
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert warm.result(timeout=10) == Quote(total=1, count=1)
    run = wf.submit(engine, Cart(items=[4]))
    waiter_name = f"waiter-{name}"
    waiter = Background(lambda: run.wait(timeout=0), name=waiter_name)
    with pytest.raises(TimeoutError):
        waiter.join(10)
    assert len(thread_statements[waiter_name]) == 1


def test_a_run_whose_notification_was_forgotten_is_read_not_awaited(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listener remembers only the last RECENT_FINISHED notifications: once it has
    # forgotten one that arrived after a submit, it can no longer vouch for that run.
    monkeypatch.setattr(_notify, "RECENT_FINISHED", 2)
    wf = pricing(name)
    warm = wf.submit(engine, Cart(items=[1]))
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert warm.result(timeout=10) == Quote(total=1, count=1)
    run = wf.submit(engine, Cart(items=[2, 3]))
    listener = _notify.listener(engine)
    token, since = str(run.id), run._started
    assert since is not None
    assert listener.surely_unfinished(token, since)
    cyclone.Worker(engine, workflows=[wf]).drain()
    wait_until(lambda: not listener.surely_unfinished(token, since), 10)
    others = [wf.submit(engine, Cart(items=[i])) for i in range(3)]
    cyclone.Worker(engine, workflows=[wf]).drain()
    for other in others:
        other.result(timeout=10)
    assert not listener.finished_recently(token)
    assert not listener.surely_unfinished(token, since)

    started = time.monotonic()
    assert run.result(timeout=30) == Quote(total=5, count=2)
    assert time.monotonic() - started < _runs.DEFAULT_POLL_INTERVAL


def test_an_idle_worker_is_woken_by_notify_not_its_poll_interval(
    engine: sa.Engine,
    name: str,
    thread_statements: dict[str, list[str]],
) -> None:
    # With a 30 s poll interval, only a notification makes the idle worker claim again.
    wf = pricing(name)
    worker = cyclone.Worker(
        engine,
        workflows=[wf],
        poll_interval=30,
        heartbeat_interval=timedelta(seconds=30),
        sweep=False,
    )
    worker_name = f"worker-{name}"
    idle = IdleWatch(worker)
    serving = Background(worker.run, name=worker_name)
    try:
        # The worker has claimed once, found nothing, and gone idle.
        wait_until(
            lambda: any("SKIP LOCKED" in s for s in list(thread_statements.get(worker_name, []))),
            timeout=10,
        )
        wait_until(lambda: idle.waiting)

        started = time.monotonic()
        run = wf.submit(engine, Cart(items=[1, 2]))
        assert run.result(timeout=10) == Quote(total=3, count=2)
        assert time.monotonic() - started < 2.0
    finally:
        worker.stop()
    serving.join(10)


def test_cursor_event_listeners_see_submit_claim_record_and_result(
    database_url: sa.URL, name: str
) -> None:
    # An engine with cursor-event listeners (SQL logging, OpenTelemetry) gets the hot
    # statements through a Connection, so that its listeners see every one of them.
    engine = sa.create_engine(database_url)
    seen: list[str] = []
    sa.event.listen(
        engine, "before_cursor_execute", lambda _c, _cur, statement, *_: seen.append(statement)
    )
    try:
        wf = pricing(name)
        run, created = wf.submit_once(engine, "order:1", Cart(items=[2, 3]))
        assert created
        assert any("INSERT INTO cyclone_runs" in s for s in seen)
        assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 2
        assert any("SKIP LOCKED" in s and "UPDATE cyclone_jobs" in s for s in seen)
        assert any(s.startswith("WITH locked_runs AS") for s in seen)  # a success recorded
        before = len(seen)
        assert run.result(timeout=10) == Quote(total=5, count=2)
        assert run.status().state == cyclone.RunState.COMPLETED
        assert len(seen) >= before + 2
        fairy = engine.raw_connection()  # handed back as the pool lends it: no autocommit
        try:
            assert getattr(fairy.driver_connection, "autocommit", None) is False
        finally:
            fairy.close()
    finally:
        _notify.listener(engine).stop()
        engine.dispose()


def test_an_engine_that_logs_its_sql_logs_the_submit_statement(
    database_url: sa.URL, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = sa.create_engine(database_url)
    try:
        with caplog.at_level(logging.INFO, logger="sqlalchemy.engine.Engine"):
            _run, created = pricing(name).submit_once(engine, "order:1", Cart(items=[1]))
        assert created
        assert any("INSERT INTO cyclone_runs" in r.getMessage() for r in caplog.records)
    finally:
        engine.dispose()
