"""Worker operability: a log line per finished step, counts by outcome, a database that
goes away and comes back, and signals that finish, or hand back, the jobs in flight."""

from __future__ import annotations

import json
import logging
import random
import signal
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from tests.conftest import wait_until
from tests.support import invariants, worker_proc
from tests.support.cluster import Cluster
from tests.support.workers import job_rows, spawn_worker, stop_all, waiting_advisory_locks


def no_backoff(attempt: int) -> float:
    return 0.0


def test_each_finished_attempt_logs_one_line_at_the_level_of_its_outcome(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    wf = cyclone.Workflow(name)
    calls = 0

    @wf.step(max_attempts=2)
    def flaky(ctx: cyclone.StepContext, value: Any) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("first try fails")
        return 1

    @wf.step(max_attempts=1, after=[flaky])
    def broken(ctx: cyclone.StepContext, value: Any) -> None:
        raise ValueError("always fails")

    @cyclone.step(f"{name}.job")
    def job(ctx: cyclone.StepContext, value: int) -> int:
        return value

    run = wf.submit(engine, None)
    standalone = job.enqueue(engine, 7)
    worker = cyclone.Worker(engine, workflows=[wf], steps=[job], backoff=no_backoff)
    with caplog.at_level(logging.INFO, logger="cyclone.worker"):
        assert worker.drain() == 4
    assert (worker.stats.completed, worker.stats.retried, worker.stats.failed) == (2, 1, 1)
    assert worker.stats.total == 4

    lines = [r for r in caplog.records if getattr(r, "outcome", None) is not None]
    seen = [(r.levelno, r.step, r.attempt, r.outcome) for r in lines]
    assert sorted(seen, key=str) == sorted(
        [
            (logging.WARNING, "flaky", 1, "retrying"),
            (logging.INFO, "flaky", 2, "completed"),
            (logging.ERROR, "broken", 1, "failed"),
            (logging.INFO, f"{name}.job", 1, "completed"),
        ],
        key=str,
    )
    for record in lines:
        message = record.getMessage()
        assert isinstance(record.duration, float)
        if record.step == f"{name}.job":
            assert f"job {name}.job #{standalone.id}" in message
        else:
            assert f"workflow {name} step {record.step} run {run.id}" in message
    final = next(r for r in lines if r.outcome == "failed")
    assert "always fails" in final.getMessage()
    assert final.exc_info is not None


@pytest.mark.processes
@pytest.mark.parametrize("second_signal", [False, True])
def test_sigterm_finishes_within_grace_then_hands_the_step_back_and_a_second_signal_at_once(
    engine: sa.Engine, name: str, second_signal: bool
) -> None:
    lock = random.randrange(1, 2**31)
    wf = worker_proc.gated(name, lock)
    grace = 60.0 if second_signal else 1.0
    with engine.connect() as holder:
        holder.execute(sa.select(sa.func.pg_advisory_lock(lock)))
        holder.commit()
        run = wf.submit(engine, worker_proc.Item(n=1))
        proc = spawn_worker("grace", name, f"{lock},{grace}")
        try:
            wait_until(lambda: waiting_advisory_locks(engine, lock) == 1, timeout=30)
            before = job_rows(engine, run.id)["wait_for_lock"]
            proc.send_signal(signal.SIGTERM)
            if second_signal:
                time.sleep(0.5)  # a first signal alone: the step keeps its grace
                assert proc.poll() is None
                proc.send_signal(signal.SIGTERM)
            # The step still waits for the lock held here: the worker hands it back.
            out, err = proc.communicate(timeout=30)
        finally:
            stop_all([proc])
        assert proc.returncode == 0, err
        assert json.loads(out.splitlines()[-1])["handed_back"] == 1
        with engine.connect() as conn:
            state, attempt, lease, lost, worker_id = conn.execute(
                sa.text(
                    "SELECT state, attempt, lease, lost, worker_id FROM cyclone_jobs"
                    " WHERE run_id = :r"
                ),
                {"r": run.id},
            ).one()
        assert (state, attempt, lost, worker_id) == ("available", 0, 0, None)
        assert before.attempt == 1
        holder.execute(sa.select(sa.func.pg_advisory_unlock(lock)))
        holder.commit()
    with engine.connect() as conn:
        assert lease == 2  # claimed (1), handed back (2): the old execution is fenced off
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 1
    assert run.status().state == cyclone.RunState.COMPLETED


@pytest.mark.processes
def test_a_worker_rides_out_a_database_restart_with_few_log_lines_and_runs_new_jobs(
    name: str,
) -> None:
    cluster = Cluster()
    proc = None
    try:
        cluster.start()
        engine = sa.create_engine(cluster.url, poolclass=sa.NullPool)
        cyclone.upgrade(engine)
        worker_proc.create_results_table(engine, name)
        wf = worker_proc.pipeline(name)
        first = wf.submit(engine, worker_proc.Item(n=1))
        url = cluster.url.render_as_string(hide_password=False)
        proc = spawn_worker("ops", name, "-", database_url=url)
        assert first.wait(timeout=60).state == cyclone.RunState.COMPLETED

        cluster.stop()
        down = time.monotonic()
        time.sleep(8)  # the server is away meanwhile: what the worker logs is under test
        cluster.start()
        second = wf.submit(engine, worker_proc.Item(n=2))
        assert second.wait(timeout=60).state == cyclone.RunState.COMPLETED
        elapsed = time.monotonic() - down
        engine.dispose()
        # Down again: a worker waiting for the database still stops at once on SIGTERM.
        cluster.stop()
        time.sleep(2)  # the outage under test: the worker meets the dead server meanwhile
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        _out, err = proc.communicate(timeout=30)
        stopped_in = time.monotonic() - signalled
        cluster.start()  # the private cluster is removed below: check it at rest first
        invariants.check(engine)
        engine.dispose()
    finally:
        if proc is not None:
            stop_all([proc])
        cluster.remove()
    assert proc.returncode == 0, err
    assert stopped_in < 10
    lines = err.splitlines()
    outage = [line for line in lines if " WARNING " in line or " ERROR " in line]
    # Each of the worker's connections retries with capped backoff, one line a try.
    assert 0 < len(outage) <= 5 * (elapsed + 2 + stopped_in), "\n".join(lines)
    assert len(lines) < 200, "\n".join(lines)
    assert any("completed on attempt 1/1" in line for line in lines)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        # One run of the sweeper with this retention failed in the driver ("timestamp out
        # of range"), and every later sweep again: nothing was ever purged.
        ({"retention": timedelta.max}, ValueError, "1,000 years"),
        ({"retention": 5}, TypeError, "retention= takes a timedelta"),
        # A NUL in a queue name made every claim fail in the driver.
        ({"queues": {"a\x00": 1}}, ValueError, "NUL"),
        ({"queues": {"": 1}}, ValueError, "non-empty"),
        ({"queues": {"q": "1"}}, ValueError, "limits from 1 to 10,000"),
        # Ten thousand threads at most: concurrency=10**20 hung starting threads.
        ({"queues": {"q": 10_001}}, ValueError, "limits from 1 to 10,000"),
        ({"concurrency": 10**20}, ValueError, "concurrency must be from 1 to 10,000"),
        ({"concurrency": 0}, ValueError, "concurrency must be from 1 to 10,000"),
        ({"concurrency": "4"}, TypeError, "concurrency= takes an int"),
        ({"poll_interval": float("nan")}, ValueError, "poll_interval"),
        ({"heartbeat_interval": 5}, TypeError, "heartbeat_interval= takes a timedelta"),
        ({"sweep_interval": timedelta(0)}, ValueError, "sweep_interval= takes a positive"),
    ],
)
def test_bad_worker_options_are_refused_when_it_is_made(
    engine: sa.Engine, name: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None: ...

    with pytest.raises(error, match=message):
        cyclone.Worker(engine, workflows=[wf], **options)


def test_a_grace_that_is_not_a_number_of_seconds_is_refused_when_given(
    engine: sa.Engine, name: str
) -> None:
    # NaN handed nothing back, ever; a str failed later, inside the signal handler.
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step()(lambda ctx, value: None)
    worker = cyclone.Worker(engine, workflows=[wf])
    for bad, error in ((float("nan"), ValueError), (-1, ValueError), ("5", TypeError)):
        with pytest.raises(error, match="grace= takes"):
            worker.stop(grace=bad)  # type: ignore[arg-type]
        with pytest.raises(error, match="grace= takes"):
            worker.run(grace=bad)  # type: ignore[arg-type]
    worker.close()
