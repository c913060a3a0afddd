"""A step that raises: retries with backoff, recorded errors, failed runs, and logging."""

from __future__ import annotations

import logging
import sys
import textwrap
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone import runs as runs_module
from cyclone import worker as worker_module
from cyclone._retry import exponential
from cyclone.schema import jobs
from tests.support import processes
from tests.support.workers import job_rows


class Boom(Exception):
    pass


def no_backoff(attempt: int) -> float:
    return 0.0


def test_a_raising_step_is_retried_until_it_succeeds(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    attempts: list[int] = []
    backoffs: list[int] = []

    @wf.step(max_attempts=4)
    def flaky(ctx: cyclone.StepContext, value: Any) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise Boom(f"attempt {ctx.attempt} failed")
        return "ok"

    def backoff(attempt: int) -> float:
        backoffs.append(attempt)
        return 0.0

    run = wf.submit(engine, None)
    assert cyclone.Worker(engine, workflows=[wf], backoff=backoff).drain() == 3

    assert attempts == [1, 2, 3]
    assert backoffs == [1, 2]
    assert run.status().state == cyclone.RunState.COMPLETED
    row = job_rows(engine, run.id)["flaky"]
    assert (row.state, row.attempt, row.output) == ("completed", 3, "ok")


def test_each_failed_attempt_is_recorded_in_the_jobs_errors(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=3)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        if ctx.attempt < 3:
            raise Boom(f"attempt {ctx.attempt} failed")

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain()

    errors = job_rows(engine, run.id)["flaky"].errors
    assert [(e["type"], e["message"], e["attempt"]) for e in errors] == [
        ("Boom", "attempt 1 failed", 1),
        ("Boom", "attempt 2 failed", 2),
    ]
    for error in errors:
        assert "Traceback (most recent call last)" in error["traceback"]
        assert "raise Boom" in error["traceback"]


def test_a_step_out_of_attempts_fails_its_run_and_cancels_the_steps_not_run(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append("first")
        return 1

    @wf.step(after=[first], max_attempts=3)
    def broken(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append("broken")
        raise Boom("always")

    @wf.step(after=[broken])
    def after_broken(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append("after_broken")
        return 3

    @wf.step(after=[after_broken])
    def last(ctx: cyclone.StepContext, value: Any) -> int:
        calls.append("last")
        return 4

    run = wf.submit(engine, None)
    assert cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain() == 4

    assert calls == ["first", "broken", "broken", "broken"]
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.finished_at is not None
    assert status.failed_step == "broken"
    assert status.error is not None
    assert (status.error["type"], status.error["message"], status.error["attempt"]) == (
        "Boom",
        "always",
        3,
    )
    rows = job_rows(engine, run.id)
    assert {kind: row.state for kind, row in rows.items()} == {
        "first": "completed",
        "broken": "failed",
        "after_broken": "cancelled",
        "last": "cancelled",
    }
    assert [e["attempt"] for e in rows["broken"].errors] == [1, 2, 3]


def test_a_failed_step_cancels_parallel_steps_not_yet_started(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []

    @wf.step(max_attempts=1, priority=-1)
    def broken(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("broken")
        raise Boom("first to run, and fails")

    @wf.step(max_attempts=1, priority=1)
    def waiting(ctx: cyclone.StepContext, value: Any) -> None:
        calls.append("waiting")

    run = wf.submit(engine, None)
    assert cyclone.Worker(engine, workflows=[wf], concurrency=1).drain() == 1

    assert calls == ["broken"]
    assert run.status().state == cyclone.RunState.FAILED
    assert job_rows(engine, run.id)["waiting"].state == "cancelled"


def test_a_retry_scheduled_in_the_future_is_not_run_by_drain(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    attempts: list[int] = []

    @wf.step(max_attempts=3)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        attempts.append(ctx.attempt)
        raise Boom("later")

    run = wf.submit(engine, None)
    before = datetime.now(UTC)
    assert cyclone.Worker(engine, workflows=[wf], backoff=lambda n: 60.0).drain() == 1

    assert attempts == [1]
    assert run.status().state == cyclone.RunState.RUNNING
    row = job_rows(engine, run.id)["flaky"]
    assert (row.state, row.attempt) == ("available", 1)
    assert row.scheduled_at >= before + timedelta(seconds=55)
    assert cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain() == 0


def test_failures_are_logged_with_run_step_attempt_and_duration(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=2)
    def broken(ctx: cyclone.StepContext, value: Any) -> None:
        raise Boom("logged")

    run = wf.submit(engine, None)
    with caplog.at_level(logging.INFO, logger="cyclone.worker"):
        cyclone.Worker(engine, workflows=[wf], backoff=no_backoff).drain()

    failures = [
        r
        for r in caplog.records
        if r.name == "cyclone.worker" and getattr(r, "run_id", None) == str(run.id)
    ]
    assert [(r.step, r.attempt) for r in failures] == [("broken", 1), ("broken", 2)]
    for record in failures:
        assert record.levelno >= logging.INFO
        assert isinstance(record.duration, float)
        assert record.duration >= 0
        assert "Boom" in record.getMessage()


# The backoff function is pure: its randomness is injected.


def test_exponential_backoff_doubles_from_base() -> None:
    backoff = exponential(base=1.0, cap=1000.0, jitter=0.25, rand=lambda: 0.5)
    assert [backoff(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert backoff(0) == 1.0


def test_exponential_backoff_is_capped() -> None:
    backoff = exponential(base=2.0, cap=30.0, jitter=0.0, rand=lambda: 0.9)
    assert [backoff(n) for n in range(1, 7)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert backoff(1000) == 30.0


def test_exponential_backoff_jitter_stays_within_bounds() -> None:
    low = exponential(base=4.0, cap=300.0, jitter=0.25, rand=lambda: 0.0)
    high = exponential(base=4.0, cap=300.0, jitter=0.25, rand=lambda: 0.999999)
    assert low(1) == pytest.approx(3.0)
    assert high(1) == pytest.approx(5.0, abs=1e-4)
    assert low(100) == pytest.approx(225.0)
    assert high(100) == pytest.approx(375.0, abs=1e-3)
    values = iter([i / 100 for i in range(100)])
    sampled = exponential(base=8.0, cap=300.0, jitter=0.5, rand=lambda: next(values))
    for _ in range(100):
        assert 4.0 <= sampled(1) < 12.0


def test_exponential_backoff_is_never_negative() -> None:
    backoff = exponential(base=1.0, cap=10.0, jitter=2.0, rand=lambda: 0.0)
    assert backoff(1) == 0.0


def test_the_default_backoff_is_exponential_from_one_second() -> None:
    worker = cyclone.Worker(sa.create_engine("postgresql+psycopg://"), steps=[noop_kind])
    first = worker.backoff(1)
    assert 0.75 <= first <= 1.25
    assert 0.75 * 300 <= worker.backoff(50) <= 1.25 * 300


@cyclone.step("test_worker_failures.noop")
def noop_kind(ctx: cyclone.StepContext, value: Any) -> None:
    return None


def test_a_job_whose_input_no_longer_decodes_fails_without_retries(
    engine: sa.Engine, name: str
) -> None:
    class Order(msgspec.Struct):
        id: int

    old = cyclone.Workflow(name, input=int)
    calls: list[Any] = []

    @old.step("handle", max_attempts=3)
    def handle_int(ctx: cyclone.StepContext, value: int) -> None:
        calls.append(value)

    run = old.submit(engine, 5)
    new = cyclone.Workflow(name, input=Order)  # redeployed with another input type

    @new.step("handle", max_attempts=3)
    def handle_order(ctx: cyclone.StepContext, value: Order) -> None:
        calls.append(value)

    assert cyclone.Worker(engine, workflows=[new], backoff=no_backoff).drain() == 1

    assert calls == []
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert status.error["type"] == "InputNotDecodable"
    assert job_rows(engine, run.id)["handle"].attempt == 1


def test_an_error_message_jsonb_cannot_store_is_recorded_and_the_worker_goes_on(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=1)
    def nasty(ctx: cyclone.StepContext, value: Any) -> None:
        raise ValueError("NUL \x00 and a lone surrogate \ud800")

    good = cyclone.Workflow(f"{name}-good")

    @good.step()
    def fine(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    bad_run = wf.submit(engine, 1)
    good_run = good.submit(engine, 1)
    assert cyclone.Worker(engine, workflows=[wf, good], backoff=no_backoff).drain() == 2
    status = bad_run.wait(timeout=10)
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "NUL" in status.error["message"]
    assert good_run.wait(timeout=10).state == cyclone.RunState.COMPLETED


def test_a_worker_tries_the_database_again_after_a_delay_doubling_from_half_a_second() -> None:
    delays = [worker_module.backoff_delay(n) for n in range(1, 9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert worker_module.backoff_delay(0) == 0.5


def test_a_read_that_lost_its_connection_is_tried_again_after_a_doubling_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(runs_module.time, "sleep", pauses.append)
    failures = iter(range(7))

    def read() -> str:
        if next(failures, None) is not None:
            raise psycopg.OperationalError("the server closed the connection")
        return "read"

    assert runs_module.read_within(read, None, "a run") == "read"
    assert pauses == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


@pytest.mark.processes
def test_a_program_that_configures_no_logging_prints_nothing(database_url: URL, name: str) -> None:
    """The README: "Nothing is printed unless you configure logging". A failed step's
    WARNING and ERROR records must not reach stderr through the standard library's last
    resort handler, which prints them when no handler is found."""
    program = textwrap.dedent(
        """
        import sys
        import sqlalchemy as sa
        import cyclone

        wf = cyclone.Workflow(sys.argv[2])

        @wf.step(max_attempts=2)
        def broken(ctx, value):
            raise RuntimeError("logged, not printed")

        engine = sa.create_engine(sys.argv[1])
        run = wf.submit(engine, None)
        worker = cyclone.Worker(engine, workflows=[wf], backoff=lambda attempt: 0.0)
        with worker:
            assert worker.drain() == 2
        assert run.status().state == cyclone.RunState.FAILED
        cyclone.close(engine)
        """
    )
    done = processes.run(
        [sys.executable, "-c", program, database_url.render_as_string(hide_password=False), name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""


def test_a_step_retried_a_thousand_times_is_still_retried(engine: sa.Engine, name: str) -> None:
    # The backoff computed 2 ** (attempt - 1) before its cap: from attempt 1,025 of a step
    # with a large max_attempts the power no longer fit a float, the OverflowError left
    # the worker's job thread, and the job stayed claimed until rescued, then again.
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=5000)
    def flaky(ctx: cyclone.StepContext, value: Any) -> None:
        raise Boom(f"attempt {ctx.attempt}")

    run = wf.submit(engine, None)
    assert cyclone.Worker(engine, workflows=[wf], backoff=lambda n: 60.0).drain() == 1
    with engine.begin() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.run_id == run.id)
            .values(attempt=1024, scheduled_at=sa.func.now())
        )
    before = datetime.now(UTC)
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 1

    row = job_rows(engine, run.id)["flaky"]
    assert (row.state, row.attempt) == ("available", 1025)
    assert row.errors[-1]["message"] == "attempt 1025"
    assert row.scheduled_at >= before + timedelta(seconds=200)  # the cap, with jitter
