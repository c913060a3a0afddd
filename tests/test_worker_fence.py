"""The fence: every claim takes a lease that is never reused, and only its holder records.

A worker that lost a job (rescued after ``rescue_after``, handed back, or its run retried)
has its late outcome refused and logged; ``ctx.cancelled()`` tells its step so; and a run
is never restarted while one of its steps still runs, so no step runs twice at once.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import claim as _claim
from cyclone._store import completion as _completion
from cyclone._store import executor as _executor
from cyclone._store import rescue as _rescue
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support import invariants
from tests.support.workers import Background, job_rows, lease, waiting_on_locks

QUICK = {"heartbeat_interval": timedelta(milliseconds=200), "poll_interval": 0.05}


def _job_of(engine: sa.Engine, kind: str, run_id: Any = None) -> Any:
    row = _created_job_of(engine, kind, run_id)
    assert row is not None
    return row


def _created_job_of(engine: sa.Engine, kind: str, run_id: Any = None) -> Any:
    """The job's row, or None while its run has not started (its steps not created yet)."""
    with engine.connect() as conn:
        return conn.execute(
            sa.select(jobs.c.state, jobs.c.lease, jobs.c.attempt, jobs.c.lost, jobs.c.output).where(
                jobs.c.kind == kind,
                jobs.c.run_id.is_(None) if run_id is None else jobs.c.run_id == run_id,
            )
        ).one_or_none()


def test_a_stale_owners_outcome_is_refused_even_when_the_same_worker_claimed_the_job_again(
    engine: sa.Engine, name: str
) -> None:
    @cyclone.step(name)
    def step(ctx: cyclone.StepContext, value: int) -> int:
        return value

    step.enqueue(engine, 1)
    scope = _claim.Scope(queues=None, workflows=(), kinds=(name,))
    held = _executor.Held(engine)
    try:
        _, (first,) = _claim.record_and_claim(
            held, worker_id="w", successes=[], scope=scope, limit=1
        )
        with engine.begin() as conn:
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == first.id)
                .values(heartbeat_at=sa.func.now() - sa.text("interval '1 hour'"))
            )
            assert _rescue.rescue(conn, timedelta(minutes=1)) == [first.id]
        _, (second,) = _claim.record_and_claim(
            held, worker_id="w", successes=[], scope=scope, limit=1
        )
        assert second.id == first.id
        assert second.lease > first.lease
        # The same worker, the same attempt number: only the lease tells them apart.
        assert second.attempt == first.attempt

        stale = _completion.Success(first.id, first.lease, "111")
        recorded, _ = _claim.record_and_claim(
            held, worker_id="w", successes=[stale], scope=scope, limit=0
        )
        assert recorded == set()
        assert _job_of(engine, name)[:2] == ("running", second.lease)
        with engine.begin() as conn:
            failure = _completion.Failure(first.id, first.lease, {"type": "Late"}, 0.0)
            assert _completion.record_failures(conn, [failure]) == set()
        assert _job_of(engine, name)[:2] == ("running", second.lease)

        current = _completion.Success(second.id, second.lease, "2")
        recorded, _ = _claim.record_and_claim(
            held, worker_id="w", successes=[current], scope=scope, limit=0
        )
        assert recorded == {second.id}
        state, _lease, _attempt, lost, output = _job_of(engine, name)
        assert (state, lost, output) == ("completed", 1, 2)
    finally:
        held.close()


@pytest.mark.parametrize("rescues", [1, 2])
def test_a_rescued_jobs_old_executions_see_cancelled_and_their_outcomes_are_refused_and_logged(
    own_engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture, rescues: int
) -> None:
    """Only the execution holding the newest lease records; every older one is refused.

    With two rescues the worker runs three executions of one job, and the last two end
    together, so their outcomes meet in the same record statement.
    """
    engine = own_engine
    other = cyclone.Workflow(f"{name}-other")

    @other.step()
    def nothing(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    wf = cyclone.Workflow(name)
    executions: list[str] = []
    lock = threading.Lock()
    rescuer_gone = threading.Event()

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> str:
        with lock:
            executions.append("started")
            first = len(executions) == 1
        if not first:
            assert rescuer_gone.wait(30)
            return "later"
        # Until the job is no longer this execution's.
        wait_until(ctx.cancelled, 30, 0.05, "ctx.cancelled() never saw the lease move on")
        return "first"

    # The rescuer leads maintenance; the worker beats every 20 s, and its row says it
    # promised 2 s (as a worker stalled past its rescue_after), so each of its executions
    # is rescued until the rescuer leaves. (With 1 s, the rescuer's maintenance
    # transaction may sit idle past half its 1 s lease on a loaded machine: the server
    # ends it, and the worker may take the lease, rescuing after 30 s.)
    rescuer = cyclone.Worker(
        engine, workflows=[other], rescue_after=timedelta(seconds=2), sweep=False, **QUICK
    )
    rescuing = Background(rescuer.run)
    worker = cyclone.Worker(
        engine,
        workflows=[wf],
        concurrency=3,
        heartbeat_interval=timedelta(seconds=20),
        rescue_after=timedelta(seconds=30),
        poll_interval=0.05,
        sweep=False,
    )
    serving = None
    try:
        wait_until(lambda: (lease(engine) or ("",))[0] == rescuer.id, timeout=10)
        run = wf.submit(engine, None)
        with caplog.at_level(logging.WARNING, logger="cyclone.worker"):
            serving = Background(worker.run)
            wait_until(lambda: promised(engine, worker.id, timedelta(seconds=2)), timeout=30)
            wait_until(
                lambda: getattr(_created_job_of(engine, "only", run.id), "lost", 0) >= rescues,
                timeout=30,
            )
            wait_until(lambda: len(executions) > rescues, timeout=30)
            rescuer.stop()
            rescuing.join(30)
            rescuer_gone.set()
            assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
            settled = lambda: worker.stats.refused + worker.stats.completed  # noqa: E731
            wait_until(lambda: settled() == len(executions), timeout=30)
    finally:
        rescuer_gone.set()
        worker.stop()
        rescuer.stop()
        if serving is not None:
            serving.join(30)
        rescuing.join(30)
    state, _lease, _attempt, lost, output = _job_of(engine, "only", run.id)
    assert (state, output) == ("completed", "later")
    assert len(executions) == lost + 1 > rescues
    assert worker.stats.completed == 1
    assert worker.stats.refused == len(executions) - 1
    # Outcomes refused, not a maintenance pass's term refused (the rescuer's transaction
    # may sit idle past its lease on a loaded machine, which logs its own "refused").
    refused = [r for r in caplog.records if "refused: lease" in r.getMessage()]
    assert len(refused) == len(executions) - 1
    assert all(r.levelno == logging.WARNING for r in refused)


def promised(engine: sa.Engine, worker_id: str, rescue_after: timedelta) -> bool:
    """Make the registered worker's row record ``rescue_after``; False before it registered."""
    with engine.begin() as conn:
        done = conn.execute(
            sa.text("UPDATE cyclone_workers SET rescue_after = :after WHERE worker_id = :id"),
            {"after": rescue_after, "id": worker_id},
        )
    return done.rowcount == 1


def test_retry_all_refuses_a_cancelled_run_whose_step_is_still_running(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    release = threading.Event()
    started = threading.Semaphore(0)
    running = 0
    most = 0
    lock = threading.Lock()

    @wf.step()
    def slow(ctx: cyclone.StepContext, value: Any) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        started.release()
        try:
            assert release.wait(30)
            return 1
        finally:
            with lock:
                running -= 1

    worker = cyclone.Worker(engine, workflows=[wf], concurrency=2, sweep=False, **QUICK)
    serving = Background(worker.run)
    try:
        run = wf.submit(engine, None)
        assert started.acquire(timeout=30)
        run.cancel()
        for restart in (run.retry_all, run.retry):
            with pytest.raises(cyclone.InvalidStateError, match="still running"):
                restart()
        assert run.status().state == cyclone.RunState.CANCELLED
        release.set()
        wait_until(lambda: job_rows(engine, run.id)["slow"].state != "running", timeout=30)
        run.retry_all()
        assert started.acquire(timeout=30)
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    finally:
        release.set()
        worker.stop()
        serving.join(30)
    assert most == 1


def test_a_heartbeat_interval_not_below_rescue_after_is_refused(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    for beat in (timedelta(seconds=60), timedelta(seconds=61)):
        with pytest.raises(ValueError, match="heartbeat_interval"):
            cyclone.Worker(
                engine, workflows=[wf], heartbeat_interval=beat, rescue_after=timedelta(seconds=60)
            )


def test_a_hand_back_racing_a_cancel_leaves_no_job_to_run_in_the_cancelled_run(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    run = wf.submit(engine, None)
    scope = _claim.Scope(queues=None, workflows=(name,), kinds=())
    held = _executor.Held(engine)
    try:
        claimed = wait_until(
            lambda: _claim.record_and_claim(
                held, worker_id="w", successes=[], scope=scope, limit=1
            )[1]
        )
    finally:
        held.close()
    (job,) = claimed

    def hand_back() -> set[int]:
        with engine.begin() as conn:
            return _rescue.hand_back(conn, [(job.id, job.lease)])

    # A transaction holds the job's row, so the hand-back waits for it once it has begun;
    # meanwhile the run is cancelled (or the cancel waits for the hand-back's run lock).
    with engine.connect() as holder:
        holder.execute(sa.select(jobs.c.id).where(jobs.c.id == job.id).with_for_update(read=True))
        handing = Background(hand_back, name="hand-back")
        wait_until(lambda: waiting_on_locks(engine) == 1)
        cancelling = Background(run.cancel, name="cancel")
        wait_until(lambda: not cancelling.alive() or waiting_on_locks(engine) == 2)
        holder.rollback()
    assert handing.join(10) == {job.id}
    cancelling.join(10)

    assert run.status().state == cyclone.RunState.CANCELLED
    assert _job_of(engine, "only", run.id)[0] == "cancelled"
    invariants.check(engine)
