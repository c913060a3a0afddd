"""Retrying standalone jobs, and retrying and cancelling every run a filter lists.

``Client.retry_job`` runs a failed or cancelled standalone job again from its first
attempt; ``Client.retry_runs`` and ``Client.cancel_runs`` act on every run that
``list_runs`` lists with the same filters, batch by batch, through the statements of
``Run.retry`` and ``Run.cancel``. The invariants are checked after every test.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import completion as _completion
from tests.conftest import wait_until
from tests.support.workers import Background, job_rows, start_runs


def flaky_kind(kind: str, failing: threading.Event) -> cyclone.StandaloneStep[Any, str]:
    @cyclone.step(kind, max_attempts=1)
    def work(ctx: cyclone.StepContext, args: Any) -> str:
        if failing.is_set():
            raise RuntimeError("not today")
        return f"done {args}"

    return work


# -- retry_job --------------------------------------------------------------------------


def test_retry_job_runs_a_failed_standalone_job_again_from_its_first_attempt(
    engine: sa.Engine, name: str
) -> None:
    failing = threading.Event()
    failing.set()
    work = flaky_kind(name, failing)
    job = work.enqueue(engine, "x")
    worker = cyclone.Worker(engine, steps=[work])
    assert worker.drain() == 1
    failed = job.status()
    assert failed.state == cyclone.JobState.FAILED
    assert (failed.attempt, len(failed.errors)) == (1, 1)

    client = cyclone.Client(engine)
    client.retry_job(job.id)

    again = job.status()
    assert again.state == cyclone.JobState.AVAILABLE
    assert (again.attempt, again.errors, again.finished_at) == (0, [], None)
    failing.clear()
    assert worker.drain() == 1
    assert job.result(timeout=5) == "done x"
    assert job.status().attempt == 1


def test_retry_job_runs_a_cancelled_standalone_job(engine: sa.Engine, name: str) -> None:
    work = flaky_kind(name, threading.Event())
    job = work.enqueue(engine, "y", run_at=datetime.now(UTC) + timedelta(hours=1))
    job.cancel()
    cyclone.Client(engine).retry_job(job.id)
    status = job.status()
    assert status.state == cyclone.JobState.AVAILABLE
    assert status.scheduled_at <= datetime.now(UTC)  # at once, not at its old run_at
    assert cyclone.Worker(engine, steps=[work]).drain() == 1
    assert job.result(timeout=5) == "done y"


def test_retry_job_refuses_a_job_that_is_not_failed_or_cancelled(
    engine: sa.Engine, name: str
) -> None:
    work = flaky_kind(name, threading.Event())
    client = cyclone.Client(engine)
    waiting = work.enqueue(engine, "a")
    with pytest.raises(cyclone.InvalidStateError, match="it is available") as raised:
        client.retry_job(waiting.id)
    assert (raised.value.what, raised.value.state) == ("job", "available")
    cyclone.Worker(engine, steps=[work]).drain()
    with pytest.raises(cyclone.InvalidStateError, match="it is completed"):
        client.retry_job(waiting.id)
    with pytest.raises(cyclone.NotFoundError):
        client.retry_job(2**62)


def test_retry_job_refuses_a_step_of_a_run_and_names_the_run(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)

    @wf.step(max_attempts=1)
    def boom(ctx: cyclone.StepContext, value: Any) -> None:
        raise RuntimeError("boom")

    run = wf.submit(engine, None)
    cyclone.Worker(engine, workflows=[wf]).drain()
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert detail.steps[0].job_id is not None
    with pytest.raises(cyclone.InvalidStateError, match=f"a step of run {run.id}"):
        cyclone.Client(engine).retry_job(detail.steps[0].job_id)
    assert run.status().state == cyclone.RunState.FAILED


def test_retry_job_whose_unique_key_another_active_job_holds_raises_duplicate(
    engine: sa.Engine, name: str
) -> None:
    failing = threading.Event()
    failing.set()
    work = flaky_kind(name, failing)
    first = work.enqueue(engine, "1", unique="only-one")
    cyclone.Worker(engine, steps=[work]).drain()
    assert first.status().state == cyclone.JobState.FAILED
    second = work.enqueue(engine, "2", unique="only-one")  # the key is free once it failed

    with pytest.raises(cyclone.DuplicateError) as raised:
        cyclone.Client(engine).retry_job(first.id)
    assert (raised.value.key, raised.value.job_id) == ("only-one", second.id)
    assert first.status().state == cyclone.JobState.FAILED


def test_a_retried_job_wakes_an_idle_worker_at_once(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    failing = threading.Event()
    failing.set()
    work = flaky_kind(name, failing)
    job = work.enqueue(engine, "z")
    serving(cyclone.Worker(engine, steps=[work], poll_interval=60))
    assert job.wait(timeout=10).state == cyclone.JobState.FAILED
    failing.clear()
    cyclone.Client(engine).retry_job(job.id)
    # The worker polls every 60 s: only the NOTIFY of the retry can wake it this soon.
    assert job.result(timeout=10) == "done z"


# -- cancel_runs and retry_runs ---------------------------------------------------------


def test_cancel_runs_cancels_every_running_run_the_filters_list_batch_by_batch(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    other = cyclone.Workflow(f"{name}_other")

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> None: ...

    @wf.step(after=[first])
    def second(ctx: cyclone.StepContext, value: Any) -> None: ...

    @other.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None: ...

    runs = [wf.submit(engine, i) for i in range(5)]
    start_runs(engine, wf)  # these have steps (available and blocked), cancelled with them
    runs += [wf.submit(engine, i) for i in range(2)]  # these are not started yet
    kept = other.submit(engine, 0)
    client = cyclone.Client(engine)

    assert client.cancel_runs(workflow=name, dry_run=True) == 7
    batches: list[int] = []
    assert client.cancel_runs(workflow=name, batch_size=3, progress=batches.append) == 7
    assert batches == [3, 3, 1]
    assert {r.status().state for r in runs} == {cyclone.RunState.CANCELLED}
    assert kept.status().state == cyclone.RunState.RUNNING
    assert {s.state for r in runs[:5] for s in job_rows(engine, r.id).values()} == {"cancelled"}
    assert client.cancel_runs(workflow=name) == 0
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 0
    kept.cancel()


def test_cancel_runs_takes_the_filters_of_list_runs(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None: ...

    runs = [wf.submit_once(engine, f"k{i}", i)[0] for i in range(4)]
    client = cyclone.Client(engine)
    middle = runs[1].status().created_at
    assert client.cancel_runs(workflow=name, key="k3") == 1
    assert client.cancel_runs(workflow=name, state="completed") == 0
    listed = client.list_runs(workflow=name, until=runs[2].status().created_at, since=middle)
    assert [r.id for r in listed] == [runs[1].id]
    assert client.cancel_runs(workflow=name, since=middle, until=runs[2].status().created_at) == 1
    states = [r.status().state.value for r in runs]
    assert states == ["running", "cancelled", "running", "cancelled"]
    assert client.cancel_runs(workflow=name, state=cyclone.RunState.RUNNING) == 2


def test_retry_runs_retries_the_failed_and_cancelled_runs_and_leaves_the_others(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    failing = threading.Event()
    failing.set()

    @wf.step(max_attempts=1)
    def charge(ctx: cyclone.StepContext, value: int) -> int:
        if failing.is_set() and value % 2:
            raise RuntimeError("card declined")
        return value

    runs = [wf.submit(engine, i) for i in range(6)]  # 1, 3, 5 fail
    cancelled = wf.submit(engine, 10)
    cancelled.cancel()
    worker = cyclone.Worker(engine, workflows=[wf])
    worker.drain()
    states = [r.status().state for r in runs]
    assert states.count(cyclone.RunState.FAILED) == 3
    client = cyclone.Client(engine)

    assert client.retry_runs(workflow=name, state="completed") == 0
    assert client.retry_runs(workflow=name, state="failed", dry_run=True) == 3
    assert client.retry_runs(workflow=name, dry_run=True) == 4
    assert client.retry_runs(workflow=name, batch_size=2) == 4
    assert {r.status().state for r in [*runs, cancelled]} == {
        cyclone.RunState.RUNNING,
        cyclone.RunState.COMPLETED,
    }
    failing.clear()
    worker.drain()
    assert {r.wait(timeout=5).state for r in [*runs, cancelled]} == {cyclone.RunState.COMPLETED}
    assert client.retry_runs(workflow=name) == 0


def test_retry_runs_skips_a_run_with_a_step_still_running_as_retry_refuses_it(
    engine: sa.Engine, name: str
) -> None:
    wf = cyclone.Workflow(name)
    started, release = threading.Event(), threading.Event()

    @wf.step()
    def slow(ctx: cyclone.StepContext, value: Any) -> None:
        started.set()
        assert release.wait(10)

    run = wf.submit(engine, None)
    worker = cyclone.Worker(engine, workflows=[wf])
    draining = Background(worker.drain)
    assert started.wait(10)
    run.cancel()
    client = cyclone.Client(engine)
    with pytest.raises(cyclone.InvalidStateError, match="steps still running"):
        run.retry()
    assert client.retry_runs(workflow=name, dry_run=True) == 1
    assert client.retry_runs(workflow=name) == 0  # skipped: its step still runs
    release.set()
    assert draining.join(10) == 1
    assert client.retry_runs(workflow=name) == 1
    # Its only step completed while it was cancelled: nothing is left to run.
    assert run.wait(timeout=5).state == cyclone.RunState.COMPLETED


def test_retry_runs_skips_a_run_past_its_deadline(engine: sa.Engine, name: str) -> None:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None: ...

    late = wf.submit(engine, None, deadline=datetime.now(UTC) + timedelta(milliseconds=50))
    fine = wf.submit(engine, None)
    late.cancel()
    fine.cancel()
    deadline = late.status().deadline

    def deadline_passed() -> bool:
        with engine.connect() as c:
            return bool(c.execute(sa.select(sa.func.now() > deadline)).scalar())

    wait_until(deadline_passed, timeout=5)
    assert cyclone.Client(engine).retry_runs(workflow=name) == 1
    assert (late.status().state, fine.status().state) == (
        cyclone.RunState.CANCELLED,
        cyclone.RunState.RUNNING,
    )
    fine.cancel()


def _running(engine: sa.Engine, run_id: Any, kind: str) -> tuple[int, int]:
    """Make the step ``kind`` of a started run running for a worker that is not there; its
    id and lease, for recording its outcome as that worker would."""
    with engine.begin() as conn:
        job_id, lease = conn.execute(
            sa.text(
                "UPDATE cyclone_jobs SET state = 'running', attempt = 1, lease = lease + 1,"
                " worker_id = 'gone', heartbeat_at = now(), attempted_at = now()"
                " WHERE run_id = :r AND kind = :k RETURNING id, lease"
            ),
            {"r": run_id, "k": kind},
        ).one()
    return int(job_id), int(lease)


def test_a_bulk_retry_leaves_a_parent_whose_cancelled_child_still_runs_a_step_and_waits_for_none(
    own_engine: sa.Engine, name: str
) -> None:
    # Found by a review: a bulk retry locked its batch (the failed parent P, then a run R
    # made after P's child C), then, restarting P, forgot that P's node waits for C, locking
    # C last; a worker recording a step of C and one of R locks C, then R: a deadlock. It
    # then locked those children with its batch, in the run lock order. A later review
    # found the retry of P pointless while C's step runs (P's node, run again, cannot
    # retry C and fails P at once): the bulk retry now leaves P, as it leaves R, and locks
    # nothing a worker recording their steps waits for.
    kid: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-kid", input=int)

    @kid.step()
    def work(ctx: cyclone.StepContext, n: int) -> int:
        return n

    top: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @top.child(kid)
    def sub(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @top.step(max_attempts=1, queue="later")
    def boom(ctx: cyclone.StepContext, n: int) -> None:
        raise RuntimeError("boom")

    other: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-other", input=int)

    @other.step(max_attempts=1)
    def fails(ctx: cyclone.StepContext, n: int) -> None:
        raise RuntimeError("fails")

    @other.step()
    def slow(ctx: cyclone.StepContext, n: int) -> None: ...

    parent = top.submit(own_engine, 1)
    with cyclone.Worker(own_engine, workflows=[top], queues={"default": 1}, sweep=False) as worker:
        worker.drain()  # sub submits the child and parks; boom waits on its queue
    (child,) = parent.children()
    start_runs(own_engine, kid)
    in_child = _running(own_engine, child.id, "work")
    with cyclone.Worker(own_engine, workflows=[top], queues={"later": 1}, sweep=False) as worker:
        worker.drain()  # boom fails the parent; its node no longer waits, its child runs on
    child.cancel()  # its step still runs, and the parent's node is still said to wait for it
    late = other.submit(own_engine, 2)  # made after the child
    start_runs(own_engine, other)
    in_late = _running(own_engine, late.id, "slow")
    with cyclone.Worker(own_engine, workflows=[other], sweep=False) as worker:
        worker.drain()  # fails fails the run; slow still runs
    assert [r.status().state.value for r in (parent, child, late)] == [
        "failed",
        "cancelled",
        "failed",
    ]
    client = cyclone.Client(own_engine)

    def record_late_failures() -> set[int]:
        # As a worker records the failures of the steps of two runs: their runs first.
        error = {"type": "RuntimeError", "message": "late", "attempt": 1}
        with own_engine.begin() as conn:
            return _completion.record_failures(
                conn,
                [_completion.Failure(j, lease, error, None) for j, lease in (in_child, in_late)],
            )

    with own_engine.connect() as holder:
        # The parent's failed step held, where the bulk retry resets it: it never gets there.
        holder.execute(
            sa.text("SELECT id FROM cyclone_jobs WHERE run_id = :r AND kind = 'boom' FOR UPDATE"),
            {"r": parent.id},
        )
        assert client.retry_runs(state="failed") == 0
        recording = Background(record_late_failures, name="record-failures")
        assert recording.join(30) == {in_child[0], in_late[0]}
        holder.rollback()
    assert [r.status().state.value for r in (parent, child, late)] == [
        "failed",
        "cancelled",
        "failed",
    ]
    # The child's step ended: the bulk retry takes the parent, and forgets its child.
    assert client.retry_runs(workflow=top) == 1
    assert parent.status().state == cyclone.RunState.RUNNING
    with own_engine.connect() as conn:
        waits = conn.execute(
            sa.text("SELECT parent_waits FROM cyclone_runs WHERE id = :r"), {"r": child.id}
        ).scalar_one()
    assert waits is False  # forgotten: the parent's node retries its child
    parent.cancel()


def test_bulk_actions_reject_bad_filters_before_touching_anything(
    engine: sa.Engine, name: str
) -> None:
    client = cyclone.Client(engine)
    with pytest.raises(ValueError, match="since must be an aware datetime"):
        client.cancel_runs(workflow=name, since=datetime(2026, 1, 1))
    with pytest.raises(ValueError, match="batch_size"):
        client.retry_runs(workflow=name, batch_size=0)
    with pytest.raises(ValueError, match="'paused' is not a valid RunState"):
        client.retry_runs(workflow=name, state="paused")
