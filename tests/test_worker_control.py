"""Controlling runs while workers run them: cancel, retry, retry_all, deadlines."""

from __future__ import annotations

import contextlib
import logging
import random
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from tests.conftest import wait_until
from tests.support import invariants
from tests.support.workers import Background, job_rows, rescue_lost_jobs, start_runs


def no_backoff(attempt: int) -> float:
    return 0.0


def test_cancel_stops_a_running_run_and_its_unstarted_steps_never_run(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []
    started = threading.Event()
    release = threading.Event()

    @wf.step()
    def slow(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append("slow")
        started.set()
        assert release.wait(10)
        return 1

    @wf.step(after=[slow])
    def next_step(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append("next_step")
        return 2

    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf])
    draining = Background(worker.drain)
    assert started.wait(10)

    run.cancel()
    release.set()
    assert draining.join(10) == 1

    assert calls == ["slow"]
    status = run.status()
    assert status.state == cyclone.RunState.CANCELLED
    assert status.finished_at is not None
    assert job_rows(engine, run.id)["next_step"].state == "cancelled"
    assert worker.drain() == 0
    assert run.status().state == cyclone.RunState.CANCELLED


def test_cancel_before_any_worker_means_no_step_runs(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("only")

    run = wf.submit(engine, None)
    run.cancel()

    assert cyclone.Worker(engine, workflows=[wf]).drain() == 0
    assert calls == []
    assert run.wait(timeout=5).state == cyclone.RunState.CANCELLED


def test_cancel_of_a_completed_run_raises_invalid_state(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf]).drain()

    with pytest.raises(cyclone.InvalidStateError) as excinfo:
        run.cancel()
    assert excinfo.value.state == cyclone.RunState.COMPLETED
    assert run.status().state == cyclone.RunState.COMPLETED


class Switch:
    """A step that fails while ``broken`` is set, counting every call per step."""

    def __init__(self) -> None:
        self.broken = True
        self.calls: Counter[str] = Counter()


def chain(wf: cyclone.Workflow[Any], switch: Switch) -> None:
    @wf.step()
    def fetch(ctx: cyclone.StepContext, value: Any) -> int:
        switch.calls["fetch"] += 1
        return 10 * switch.calls["fetch"]

    @wf.step(after=[fetch], max_attempts=1)
    def transform(ctx: cyclone.StepContext, value: Any) -> int:
        switch.calls["transform"] += 1
        if switch.broken:
            raise RuntimeError("transform is broken")
        return ctx.output(fetch) + 1

    @wf.step(after=[transform])
    def store(ctx: cyclone.StepContext, value: Any) -> int:
        switch.calls["store"] += 1
        return ctx.output(transform) + 1


def test_retry_reruns_failed_and_cancelled_steps_and_keeps_completed_ones(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    chain(wf, switch)
    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf], backoff=no_backoff)
    worker.drain()
    assert run.status().state == cyclone.RunState.FAILED
    assert job_rows(engine, run.id)["store"].state == "cancelled"

    switch.broken = False
    run.retry()
    assert run.status().state == cyclone.RunState.RUNNING
    assert worker.drain() == 2

    status = run.status()
    assert status.state == cyclone.RunState.COMPLETED
    assert status.error is None
    assert status.failed_step is None
    assert switch.calls == {"fetch": 1, "transform": 2, "store": 1}
    rows = job_rows(engine, run.id)
    assert {kind: row.output for kind, row in rows.items()} == {
        "fetch": 10,
        "transform": 11,  # from the kept output of fetch
        "store": 12,
    }


def test_retry_of_a_cancelled_run_runs_its_cancelled_steps(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    switch.broken = False
    chain(wf, switch)
    run = wf.submit(engine, None)
    run.cancel()

    run.retry()
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 3
    assert run.status().state == cyclone.RunState.COMPLETED
    assert switch.calls == {"fetch": 1, "transform": 1, "store": 1}


def test_retry_of_a_running_or_completed_run_raises_invalid_state(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    switch.broken = False
    chain(wf, switch)
    run = wf.submit(engine, None)

    with pytest.raises(cyclone.InvalidStateError) as running:
        run.retry()
    assert running.value.state == cyclone.RunState.RUNNING
    with pytest.raises(cyclone.InvalidStateError):
        run.retry_all()

    cyclone.Worker(engine, workflows=[wf]).drain()
    with pytest.raises(cyclone.InvalidStateError) as completed:
        run.retry()
    assert completed.value.state == cyclone.RunState.COMPLETED
    assert run.status().state == cyclone.RunState.COMPLETED
    assert switch.calls == {"fetch": 1, "transform": 1, "store": 1}


def test_retry_all_reruns_every_step(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    switch.broken = False
    chain(wf, switch)
    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf])
    worker.drain()

    run.retry_all()
    assert run.status().state == cyclone.RunState.RUNNING
    assert worker.drain() == 3

    assert run.status().state == cyclone.RunState.COMPLETED
    assert switch.calls == {"fetch": 2, "transform": 2, "store": 2}
    rows = job_rows(engine, run.id)
    assert {kind: row.output for kind, row in rows.items()} == {
        "fetch": 20,
        "transform": 21,
        "store": 22,
    }


def test_retry_all_of_a_failed_run_reruns_its_completed_steps_too(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    chain(wf, switch)
    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf], backoff=no_backoff)
    worker.drain()
    assert run.status().state == cyclone.RunState.FAILED

    switch.broken = False
    run.retry_all()
    assert worker.drain() == 3
    assert run.status().state == cyclone.RunState.COMPLETED
    assert switch.calls == {"fetch": 2, "transform": 2, "store": 1}


def test_a_failed_run_keeps_its_key(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    chain(wf, switch)
    run, created = wf.submit_once(engine, "order:1", {"n": 1})
    assert created
    cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain()
    assert run.status().state == cyclone.RunState.FAILED

    again, created = wf.submit_once(engine, "order:1", {"n": 1})
    assert not created
    assert again.id == run.id
    assert again.status().state == cyclone.RunState.FAILED


def test_a_run_past_its_deadline_fails_and_its_steps_never_start(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def never(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("never")

    run = wf.submit(engine, None, deadline=timedelta(milliseconds=200))
    deadline = run.status().deadline
    assert deadline is not None
    wait_until(lambda: datetime.now(UTC) > deadline + timedelta(milliseconds=50), timeout=5)

    assert cyclone.Worker(engine, workflows=[wf]).drain() == 0

    assert calls == []
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline exceeded" in status.error["message"]
    assert job_rows(engine, run.id)["never"].state == "cancelled"


def test_a_deadline_in_the_past_fails_the_run_without_running_it(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def never(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("never")

    run = wf.submit(engine, None, deadline=datetime.now(UTC) - timedelta(seconds=1))

    assert cyclone.Worker(engine, workflows=[wf]).drain() == 0

    assert calls == []
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline exceeded" in status.error["message"]


def test_a_deadline_passing_mid_run_stops_the_steps_not_yet_started(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    seen: dict[str, Any] = {}

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> None:
        seen["deadline"] = ctx.deadline
        wait_until(lambda: ctx.deadline_passed, 30, message="the run's deadline did not pass")

    @wf.step(after=[first])
    def second(ctx: cyclone.StepContext, value: Any) -> None:
        seen["second"] = True

    # Two seconds: time enough for a loaded machine to claim "first" before the deadline.
    run = wf.submit(engine, None, deadline=timedelta(seconds=2))
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 1

    status = run.status()
    assert seen == {"deadline": status.deadline}
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline exceeded" in status.error["message"]
    rows = job_rows(engine, run.id)
    assert (rows["first"].state, rows["second"].state) == ("completed", "cancelled")


def test_run_applies_deadlines_too(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("first")
        wait_until(lambda: ctx.deadline_passed, 30, message="the run's deadline did not pass")

    @wf.step(after=[first])
    def second(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("second")

    # Two seconds: time enough for a loaded machine to claim "first" before the deadline.
    run = wf.submit(engine, None, deadline=timedelta(seconds=2))
    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=0.05)
    serving = Background(worker.run)
    try:
        status = run.wait(timeout=10)
    finally:
        worker.stop()
        serving.join(10)
    assert calls == ["first"]
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline exceeded" in status.error["message"]


def test_a_step_failing_after_its_run_was_cancelled_is_not_retried(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    attempts: list[int] = []
    started = threading.Event()
    release = threading.Event()

    @wf.step(max_attempts=3)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        attempts.append(ctx.attempt)
        started.set()
        assert release.wait(10)
        raise RuntimeError("fails after the run was cancelled")

    run = wf.submit(engine, None)
    draining = Background(cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain)
    assert started.wait(10)
    run.cancel()
    release.set()
    assert draining.join(10) == 1

    assert attempts == [1]
    assert run.status().state == cyclone.RunState.CANCELLED
    row = job_rows(engine, run.id)["flaky"]
    assert row.state == "cancelled"
    assert [e["attempt"] for e in row.errors] == [1]

    # retry() of the cancelled run runs it again.
    run.retry()
    assert cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain() == 3
    assert attempts == [1, 1, 2, 3]
    assert run.status().state == cyclone.RunState.FAILED


def test_retry_refuses_while_a_step_of_the_failed_run_is_still_running(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=1)
    def fails(ctx: cyclone.StepContext, value: Any) -> None:
        raise RuntimeError("boom")

    @wf.step()
    def other(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    run = wf.submit(engine, 1)
    start_runs(engine, wf)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cyclone_jobs SET state = 'running', attempt = 1, worker_id = 'gone',"
                " heartbeat_at = now(), attempted_at = now() WHERE run_id = :r AND kind = 'other'"
            ),
            {"r": run.id},
        )
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.status().state == cyclone.RunState.FAILED
    with pytest.raises(cyclone.InvalidStateError, match="still running"):
        run.retry()
    assert run.status().state == cyclone.RunState.FAILED
    rescue_lost_jobs(engine)  # the step of "gone" is cancelled: its run has failed


def test_a_last_step_ending_after_the_deadline_fails_the_run(engine: sa.Engine, name: str) -> None:
    # The step itself succeeds (no assertion inside it, which would fail the step and
    # hence the run for another reason): only the deadline can fail the run. It starts
    # well before its run's deadline, then moves that deadline into the past, so the
    # step ends after it however slow the machine is.
    wf = cyclone.Workflow(name)
    seen: list[Any] = []

    @wf.step()
    def outlives_the_deadline(ctx: cyclone.StepContext, value: Any) -> int:
        seen.append(ctx.deadline)
        with engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE cyclone_runs SET deadline = now() - interval '1 ms' WHERE id = :r"),
                {"r": ctx.run_id},
            )
        return 1

    run = wf.submit(engine, 1, deadline=timedelta(minutes=10))
    cyclone.Worker(engine, workflows=[wf]).drain()
    status = run.status()
    assert len(seen) == 1
    assert seen[0] is not None
    assert job_rows(engine, run.id)["outlives_the_deadline"].errors == []
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline exceeded" in status.error["message"]


def test_retry_of_a_run_past_its_deadline_is_refused(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def never(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("never")

    run = wf.submit(engine, 1, deadline=datetime.now(UTC) - timedelta(seconds=1))
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert calls == []  # asserted here: an assertion inside the step only fails the step
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline exceeded" in status.error["message"]
    with pytest.raises(cyclone.InvalidStateError, match="deadline"):
        run.retry()


def test_stop_before_run_makes_run_return_and_the_worker_stays_usable(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=30)
    worker.stop()
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive()
    run = wf.submit(engine, 1)
    assert worker.drain() == 1
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED


def test_a_step_lost_with_its_worker_max_attempts_times_fails_its_run(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=2)
    def crashes(ctx: cyclone.StepContext, value: Any) -> None:
        raise AssertionError("a job lost as often as its max_attempts must not run again")

    @wf.step(after=[crashes])
    def later(ctx: cyclone.StepContext, value: Any) -> None:
        raise AssertionError("a step after a failed one never starts")

    run = wf.submit(engine, 1)
    start_runs(engine, wf)
    # Lost twice before (counted in ``lost``), and now running on a worker that died.
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cyclone_jobs SET state = 'running', attempt = 1, lost = 2, lease = 3,"
                " worker_id = 'dead', heartbeat_at = now() - interval '1 hour'"
                " WHERE run_id = :r AND kind = 'crashes'"
            ),
            {"r": run.id},
        )
    cyclone.Worker(
        engine,
        workflows=[wf],
        rescue_after=timedelta(seconds=1),
        heartbeat_interval=timedelta(milliseconds=200),
    ).drain()
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.failed_step == "crashes"
    assert status.error is not None
    assert status.error["type"] == "WorkerLost"
    rows = job_rows(engine, run.id)
    assert (rows["crashes"].state, rows["later"].state) == ("failed", "cancelled")


def test_step_context_is_entered_around_every_step_and_its_error_is_the_steps(
    engine: sa.Engine, name: str
) -> None:
    from contextlib import contextmanager

    seen: list[str] = []
    inside = threading.local()

    @contextmanager
    def around() -> Any:
        seen.append("enter")
        inside.active = True
        try:
            yield
        finally:
            inside.active = False
            seen.append("exit")

    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=1)
    def first(ctx: cyclone.StepContext, _: Any) -> bool:
        assert getattr(inside, "active", False), "the step ran outside step_context"
        return True

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf], step_context=around).drain()
    assert run.status().state is cyclone.RunState.COMPLETED
    assert seen == ["enter", "exit"]

    @contextmanager
    def broken() -> Any:
        raise RuntimeError("no application context")
        yield

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf], step_context=broken).drain()
    status = run.status()
    assert status.state is cyclone.RunState.FAILED
    assert status.error is not None
    assert "no application context" in str(status.error)


@pytest.mark.parametrize(
    ("running", "operation"),
    [(1, "retry"), (2, "retry"), (1, "retry_all")],
    ids=["last-step-retry", "several-steps-retry", "last-step-retry_all"],
)
def test_a_retried_run_whose_steps_all_completed_completes_with_its_result(
    own_engine: sa.Engine, name: str, running: int, operation: str
) -> None:
    # Cancelled while its last steps ran, which then completed: nothing is left to run.
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)
    started = threading.Semaphore(0)
    release = threading.Event()

    def gated(n: int) -> int:
        started.release()
        assert release.wait(10)
        return n

    if running == 2:

        @wf.step()
        def side(ctx: cyclone.StepContext, n: int) -> int:
            return gated(n)

    @wf.result()
    def double(ctx: cyclone.StepContext, n: int) -> int:
        return 2 * gated(n)

    run = wf.submit(own_engine, 21)
    worker = cyclone.Worker(own_engine, workflows=[wf], concurrency=2)
    draining = Background(worker.drain)
    for _ in range(running):
        assert started.acquire(timeout=10)
    run.cancel()
    release.set()
    assert draining.join(10) == running
    assert {row.state for row in job_rows(own_engine, run.id).values()} == {"completed"}
    assert run.status().state == cyclone.RunState.CANCELLED

    getattr(run, operation)()
    if operation == "retry_all":
        assert worker.drain() == running
    assert run.result(timeout=10) == 42
    assert run.status().state == cyclone.RunState.COMPLETED
    invariants.check(own_engine)


def test_random_cancels_and_retries_against_a_live_worker_leave_every_run_terminal(
    own_engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)
    rand = random.Random()

    def work() -> None:
        # The steps' own work: short and uneven, so cancels land before, during and after.
        threading.Event().wait(rand.uniform(0, 0.01))

    @wf.step()
    def first(ctx: cyclone.StepContext, n: int) -> int:
        work()
        return n

    @wf.step()
    def second(ctx: cyclone.StepContext, n: int) -> int:
        work()
        return n

    @wf.result(after=[first, second])
    def total(ctx: cyclone.StepContext, n: int) -> int:
        work()
        return ctx.output(first) + ctx.output(second)

    runs = [wf.submit(own_engine, n) for n in range(60)]
    serving(cyclone.Worker(own_engine, workflows=[wf], concurrency=8, poll_interval=0.05))
    for _ in range(3):
        for run in rand.sample(runs, len(runs)):
            when = rand.choice(["at once", "a moment later", "while its last step runs"])
            if when == "a moment later":
                threading.Event().wait(rand.uniform(0, 0.01))
            elif when == "while its last step runs":
                wait_until(lambda run=run: last_step_runs_or_run_ended(own_engine, run))
            with contextlib.suppress(cyclone.InvalidStateError):
                run.cancel()
            # A cancelled run's running step ends on its own; retry once it has.
            wait_until(lambda run=run: retried_or_finished(run), timeout=10)

    # Each run was retried after its last cancel (or was not cancelled): all complete.
    for n, run in enumerate(runs):
        assert run.result(timeout=20) == 2 * n
    invariants.check(own_engine, at_rest=False)


def last_step_runs_or_run_ended(engine: sa.Engine, run: cyclone.ResultRun[int]) -> bool:
    rows = job_rows(engine, run.id)
    return "total" in rows and rows["total"].state in ("running", "completed")


def retried_or_finished(run: cyclone.ResultRun[int]) -> bool:
    """Retry ``run`` if it is cancelled or failed with no step running; True once done so
    (or once it completed)."""
    try:
        run.retry()
    except cyclone.InvalidStateError as exc:
        return exc.state in (cyclone.RunState.RUNNING, cyclone.RunState.COMPLETED)
    return True


def test_a_retried_then_cancelled_run_has_no_error(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    switch = Switch()
    chain(wf, switch)
    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain()
    assert run.status().error is not None

    run.retry()
    run.cancel()
    with engine.connect() as conn:
        error_is_null = conn.execute(
            sa.text("SELECT error IS NULL FROM cyclone_runs WHERE id = :id"), {"id": run.id}
        ).scalar_one()
    assert error_is_null  # SQL NULL, not a JSON null that shows as an empty error
    assert run.status().error is None


def test_a_step_failing_after_its_run_was_cancelled_logs_that_its_run_ended(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    wf = cyclone.Workflow(name)
    started = threading.Event()
    release = threading.Event()

    @wf.step(max_attempts=3)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        started.set()
        assert release.wait(10)
        raise RuntimeError("fails after the run was cancelled")

    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf], backoff=no_backoff)
    with caplog.at_level(logging.INFO, logger="cyclone.worker"):
        draining = Background(worker.drain)
        assert started.wait(10)
        run.cancel()
        release.set()
        assert draining.join(10) == 1

    lines = [r for r in caplog.records if getattr(r, "step", None) == "flaky"]
    assert [r.getMessage() for r in lines if "retrying" in r.getMessage()] == []
    (ended,) = [r for r in lines if getattr(r, "outcome", None) == "run ended"]
    assert ended.levelno == logging.WARNING
    assert "its run has ended, so it is not retried" in ended.getMessage()
    assert job_rows(engine, run.id)["flaky"].state == "cancelled"
