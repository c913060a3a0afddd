"""Workers in several processes, crash recovery, heartbeats, and graceful shutdown."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone.schema import jobs
from cyclone.schema import leader as leader_table
from tests.conftest import wait_until
from tests.support import worker_proc
from tests.support.workers import (
    Background,
    job_rows,
    lease,
    spawn_worker,
    stop_all,
    waiting_advisory_locks,
)

RUNS = 50


def lock_key() -> int:
    return random.randrange(1, 2**31)


@pytest.mark.processes
@pytest.mark.parametrize("processes", [2, 4])
def test_worker_processes_run_every_job_exactly_once(
    engine: sa.Engine, name: str, processes: int
) -> None:
    wf = worker_proc.pipeline(name)
    worker_proc.create_results_table(engine, name)
    runs = [
        run
        for run, _ in wf.submit_once_many(
            engine, [(f"item:{i}", worker_proc.Item(n=i)) for i in range(RUNS)]
        )
    ]
    gate = lock_key()
    with engine.connect() as holder:
        holder.execute(sa.select(sa.func.pg_advisory_lock(gate)))
        procs = [spawn_worker("drain", name, str(gate)) for _ in range(processes)]
        try:
            # Start gate: every child waits for the lock; releasing it starts them together.
            wait_until(lambda: waiting_advisory_locks(engine, gate) == processes, timeout=30)
            holder.execute(sa.select(sa.func.pg_advisory_unlock(gate)))
            outputs = [proc.communicate(timeout=60) for proc in procs]
        finally:
            stop_all(procs)

    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    reports = [json.loads(out) for out, _ in outputs]
    assert sum(report["jobs"] for report in reports) == RUNS * 3

    with engine.connect() as conn:
        executed = conn.execute(
            sa.text(f'SELECT count(*) FROM "{worker_proc.results_table(name)}"')
        ).scalar_one()
    assert executed == RUNS * 3
    for run in runs:
        assert run.status().state == cyclone.RunState.COMPLETED
        for row in job_rows(engine, run.id).values():
            assert (row.state, row.attempt, row.errors) == ("completed", 1, [])


@pytest.mark.processes
def test_a_job_of_a_killed_worker_is_rescued_and_the_run_completes(
    engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    flag = tmp_path / "mid-step"
    wf = worker_proc.crashy(name, flag)
    run = wf.submit(engine, worker_proc.Item(n=7))
    proc = spawn_worker("crash", name, str(flag))
    try:
        wait_until(flag.exists, timeout=30)  # the child is mid-step
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        stop_all([proc])
    with engine.connect() as conn:
        state, last_beat = conn.execute(
            sa.select(jobs.c.state, jobs.c.heartbeat_at).where(jobs.c.run_id == run.id)
        ).one()
    assert state == "running"

    rescuer = cyclone.Worker(
        engine,
        workflows=[wf],
        rescue_after=timedelta(seconds=1),
        heartbeat_interval=timedelta(milliseconds=200),
        poll_interval=0.1,
        sweep=False,
    )
    serving = Background(rescuer.run)
    try:
        status = run.wait(timeout=20)
    finally:
        rescuer.stop()
    serving.join(10)

    assert status.state == cyclone.RunState.COMPLETED
    row = job_rows(engine, run.id)["stuck"]
    assert (row.state, row.output, row.worker_id) == ("completed", 7, rescuer.id)
    assert row.attempt == 1  # a lost worker does not use up an attempt
    assert [e["type"] for e in row.errors] == ["WorkerLost"]
    assert str(proc.pid) in row.errors[0]["message"]
    # Handed back only after rescue_after without a heartbeat.
    assert datetime.fromisoformat(row.errors[0]["at"]) - last_beat >= timedelta(seconds=1)


@pytest.mark.processes
def test_a_job_of_a_killed_worker_in_a_cancelled_run_is_not_run_again(
    engine: sa.Engine, name: str, tmp_path: Path
) -> None:
    flag = tmp_path / "mid-step"
    wf = worker_proc.crashy(name, flag)
    run = wf.submit(engine, worker_proc.Item(n=7))
    proc = spawn_worker("crash", name, str(flag))
    try:
        wait_until(flag.exists, timeout=30)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
    finally:
        stop_all([proc])
    run.cancel()

    rescuer = cyclone.Worker(
        engine,
        workflows=[wf],
        rescue_after=timedelta(seconds=1),
        heartbeat_interval=timedelta(milliseconds=200),
        poll_interval=0.1,
        sweep=False,
    )
    serving = Background(rescuer.run)
    try:
        wait_until(lambda: job_rows(engine, run.id)["stuck"].state == "cancelled", timeout=20)
    finally:
        rescuer.stop()
    serving.join(10)

    assert run.status().state == cyclone.RunState.CANCELLED
    row = job_rows(engine, run.id)["stuck"]
    assert (row.state, row.output) == ("cancelled", None)
    assert [e["type"] for e in row.errors] == ["WorkerLost"]


def test_a_long_step_that_heartbeats_is_not_rescued(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)
    calls: list[str] = []
    started = threading.Event()

    @wf.step(max_attempts=1)
    def long(ctx: cyclone.StepContext, value: Any) -> str:
        calls.append(ctx.step)
        started.set()
        time.sleep(2.5)  # longer than rescue_after
        return "done"

    run = wf.submit(engine, None)
    quick = {"heartbeat_interval": timedelta(milliseconds=200), "poll_interval": 0.1}
    busy = cyclone.Worker(engine, workflows=[wf], sweep=False, **quick)
    draining = Background(busy.drain)
    assert started.wait(10)
    # Another worker that would run the step again if it rescued it.
    rescuer = cyclone.Worker(
        engine, workflows=[wf], rescue_after=timedelta(seconds=1), sweep=False, **quick
    )
    serving = Background(rescuer.run)
    try:
        assert draining.join(10) == 1
    finally:
        rescuer.stop()
    serving.join(10)

    assert calls == ["long"]
    assert run.status().state == cyclone.RunState.COMPLETED
    row = job_rows(engine, run.id)["long"]
    assert (row.attempt, row.errors, row.worker_id) == (1, [], busy.id)


def test_run_in_a_thread_stops_on_stop_after_its_in_flight_job(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    started = threading.Event()
    release = threading.Event()
    calls: list[int] = []

    @wf.step()
    def gated(ctx: cyclone.StepContext, value: int) -> int:
        calls.append(value)
        started.set()
        assert release.wait(10)
        return value

    first = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=1, poll_interval=0.1, sweep=False)
    serving = Background(worker.run)
    assert started.wait(10)
    second = wf.submit(engine, 2)

    worker.stop()
    time.sleep(0.2)  # a window in which stop() must NOT end the run: no event marks "not yet"
    assert serving.alive()  # still finishing the in-flight job
    release.set()
    serving.join(10)

    assert calls == [1]
    assert first.status().state == cyclone.RunState.COMPLETED
    assert second.status().state == cyclone.RunState.RUNNING
    assert job_rows(engine, second.id)["gated"].state == "available"


def test_a_stopping_worker_says_which_running_jobs_it_still_waits_for(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With no grace, a step that does not return keeps a stopping worker up until a second
    signal: it says so, and names the step, every STOPPING_REPORT seconds (it was silent)."""
    monkeypatch.setattr(cyclone.worker, "STOPPING_REPORT", 0.2)
    wf = cyclone.Workflow(name)
    started = threading.Event()
    release = threading.Event()

    @wf.step()
    def gated(ctx: cyclone.StepContext, value: int) -> int:
        started.set()
        assert release.wait(20)
        return value

    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=1, sweep=False)
    serving = Background(worker.run)
    assert started.wait(10)
    caplog.set_level(logging.INFO, logger="cyclone.worker")
    worker.stop()
    said = (
        f"worker {worker.id} stopping: still waiting for 1 running job (workflow {name} "
        f"step gated run {run.id}); a second signal hands them back"
    )

    def reported() -> bool:
        assert serving.alive()
        return said in caplog.messages

    wait_until(reported, timeout=10)
    release.set()
    serving.join(10)
    assert run.status().state == cyclone.RunState.COMPLETED


@pytest.mark.processes
def test_a_worker_process_exits_zero_on_sigterm_after_its_in_flight_step(
    engine: sa.Engine, name: str
) -> None:
    lock = lock_key()
    wf = worker_proc.gated(name, lock)
    with engine.connect() as holder:
        holder.execute(sa.select(sa.func.pg_advisory_lock(lock)))
        first = wf.submit(engine, worker_proc.Item(n=1))
        second = wf.submit(engine, worker_proc.Item(n=2))
        proc = spawn_worker("serve", name, str(lock))
        try:
            # The step is in flight: it waits for the lock the test holds.
            wait_until(lambda: waiting_advisory_locks(engine, lock) == 1, timeout=30)
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # a window in which the worker must NOT exit: nothing marks "not yet"
            assert proc.poll() is None  # finishing the step first
            holder.execute(sa.select(sa.func.pg_advisory_unlock(lock)))
            out, err = proc.communicate(timeout=30)
        finally:
            stop_all([proc])

    assert proc.returncode == 0, err
    assert json.loads(out)["stopped"] is True
    assert first.status().state == cyclone.RunState.COMPLETED
    assert job_rows(engine, first.id)["wait_for_lock"].output == 1
    assert second.status().state == cyclone.RunState.RUNNING  # not claimed after SIGTERM
    assert job_rows(engine, second.id)["wait_for_lock"].state == "available"


@pytest.mark.processes
def test_an_idle_worker_process_exits_on_sigterm_while_its_maintenance_pass_waits_for_a_lock(
    own_url: URL, name: str
) -> None:
    # The leader's pass renews the lease with the row locked; a transaction frozen in it
    # (a leader SIGSTOPped or cut off mid-pass) holds that lock. A SIGTERM meanwhile does
    # not wait for it: the worker cuts its pass short and exits.
    engine = sa.create_engine(own_url, poolclass=sa.NullPool)
    proc = spawn_worker(
        "serve", name, str(lock_key()), database_url=own_url.render_as_string(hide_password=False)
    )
    try:
        wait_until(lambda: lease(engine) is not None, timeout=30)  # it leads
        with engine.connect() as holder:
            holder.execute(sa.select(leader_table).with_for_update())
            # Its next pass (within a second) waits for the row.
            wait_until(lambda: waiting_for_the_lease(engine) == 1, timeout=30)
            proc.send_signal(signal.SIGTERM)
            # It has no job: it exits with the row still locked.
            out, err = proc.communicate(timeout=20)
            holder.rollback()
    finally:
        stop_all([proc])
        engine.dispose()
    assert proc.returncode == 0, err
    assert json.loads(out)["stopped"] is True


def waiting_for_the_lease(engine: sa.Engine) -> int:
    """How many backends wait for a lock in a statement on the lease's table."""
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock' AND query LIKE '%cyclone_leader%'"
            )
        ).scalar_one()
    return int(count)
