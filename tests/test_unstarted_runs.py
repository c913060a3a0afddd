"""Runs no worker has touched yet: a submit writes the run row only, and the claim that
starts the run creates its steps. Every rule holds for such a run as for a started one:
cancel, retry, deadlines, purge, listings, signals, and a start happens exactly once."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

import cyclone
from cyclone.schema import jobs, runs
from tests.conftest import wait_until
from tests.support.factories import workflow
from tests.support.workers import job_rows


def deadline_passed(engine: sa.Engine, run_id: Any) -> bool:
    """Whether the run's deadline has passed by the database's clock (the one cyclone reads)."""
    with engine.connect() as conn:
        stmt = sa.select(runs.c.deadline < sa.func.now()).where(runs.c.id == run_id)
        return bool(conn.execute(stmt).scalar_one())


def created_steps(engine: sa.Engine, run_id: Any) -> int:
    with engine.connect() as conn:
        stmt = sa.select(sa.func.count()).where(jobs.c.run_id == run_id)
        return int(conn.execute(stmt).scalar_one())


def test_a_run_cancelled_before_it_started_never_starts_and_retry_runs_all_its_steps(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name, 3)
    run = wf.submit(engine, 1)
    run.cancel()
    assert run.status().state == cyclone.RunState.CANCELLED
    assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 0
    assert created_steps(engine, run.id) == 0
    run.retry()
    assert run.status().state == cyclone.RunState.RUNNING
    assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 3
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert {k: r.state for k, r in job_rows(engine, run.id).items()} == dict.fromkeys(
        ("s0", "s1", "s2"), "completed"
    )


def test_a_run_past_its_deadline_before_it_started_fails_and_its_steps_never_start(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name, 2)
    run = wf.submit(engine, 1, deadline=timedelta(milliseconds=50))
    wait_until(lambda: deadline_passed(engine, run.id))
    assert cyclone.Worker(engine, workflows=[wf], sweep=False).drain() == 0
    status = run.status()
    assert status.state == cyclone.RunState.FAILED
    assert status.error is not None
    assert "deadline" in str(status.error).lower()
    assert created_steps(engine, run.id) == 0


def test_purge_removes_a_terminal_run_that_never_started_and_frees_its_key(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    run.cancel()
    client = cyclone.Client(engine)
    assert client.purge_terminal_runs(older_than=timedelta(0)) >= 1
    assert client.get_run(run.id) is None
    again, created = wf.submit_once(engine, "k", 1)
    assert created
    assert again.id != run.id


def test_listings_and_lookups_show_a_run_no_worker_has_touched(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name, 2)
    run, _ = wf.submit_once(engine, "k", 1)
    client = cyclone.Client(engine)
    assert [s.id for s in client.list_runs(workflow=name)] == [run.id]
    assert wf.get_run(engine, "k") == run
    status = client.get_run_by_key(name, "k")
    assert status is not None
    assert status.state == cyclone.RunState.RUNNING
    detail = client.get_run_detail(run.id)
    assert detail is not None
    assert [(s.name, s.state) for s in detail.steps] == [("s0", "available"), ("s1", "blocked")]


def test_a_signal_sent_before_the_run_started_reaches_its_wait_node(
    engine: sa.Engine, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.wait("go")
    def gate(ctx: cyclone.StepContext, payload: int) -> int:
        return payload * 2

    run, _ = wf.submit_once(engine, "k", 1)
    assert created_steps(engine, run.id) == 0
    assert wf.signal(engine, "k", "go", 21) is True
    assert wf.signal(engine, "k", "go", 21) is False  # the same payload again: a no-op
    cyclone.Worker(engine, workflows=[wf], sweep=False).drain()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    assert job_rows(engine, run.id)["gate"].output == 42


def test_many_workers_start_each_run_exactly_once(engine: sa.Engine, name: str) -> None:
    ran: list[tuple[Any, str]] = []
    lock = threading.Lock()
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    def record(ctx: cyclone.StepContext, value: int) -> None:
        with lock:
            ran.append((ctx.run_id, ctx.step))

    wf.step("a")(record)
    wf.step("b")(record)
    wf.step("c", after=["a", "b"])(record)
    submitted = [wf.submit(engine, i) for i in range(60)]
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            barrier.wait()
            cyclone.Worker(engine, workflows=[wf], concurrency=3, sweep=False).drain()
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    cyclone.Worker(engine, workflows=[wf], sweep=False).drain()  # whatever a race left
    assert sorted(ran, key=str) == sorted(
        ((r.id, step) for r in submitted for step in "abc"), key=str
    )
    with engine.connect() as conn:
        left = conn.execute(
            sa.select(sa.func.count()).where(runs.c.workflow == name, runs.c.start_at.is_not(None))
        ).scalar_one()
    assert left == 0
    assert all(r.status().state == cyclone.RunState.COMPLETED for r in submitted)


def test_downgrade_to_0007_creates_the_steps_of_runs_not_started(
    engine: sa.Engine, name: str, fresh_database: Any
) -> None:
    fresh = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    try:
        cyclone.upgrade(fresh)
        wf = workflow(name, 2)
        run = wf.submit(fresh, 1)
        cyclone.downgrade(fresh, "cyclone_0007")
        with fresh.connect() as conn:
            rows = conn.execute(
                sa.select(jobs.c.kind, jobs.c.state, jobs.c.pending_deps)
                .where(jobs.c.run_id == run.id)
                .order_by(jobs.c.kind)
            ).all()
        assert [tuple(r) for r in rows] == [("s0", "available", 0), ("s1", "blocked", 1)]
        cyclone.upgrade(fresh)
        assert cyclone.Worker(fresh, workflows=[wf], sweep=False).drain() == 2
        assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    finally:
        cyclone.close(fresh)
        fresh.dispose()


def test_a_worker_serving_several_workflows_starts_the_runs_of_each_oldest_first(
    engine: sa.Engine, name: str
) -> None:
    order: list[str] = []
    flows: list[cyclone.Workflow[Any]] = []
    for suffix in ("a", "b", "c"):
        wf: cyclone.Workflow[Any] = cyclone.Workflow(f"{name}{suffix}")
        wf.step("only")(lambda ctx, value: order.append(value))
        flows.append(wf)
    for i in range(6):
        flows[i % 3].submit(engine, f"{i}")
    with cyclone.Worker(engine, workflows=flows, concurrency=1, sweep=False) as worker:
        assert worker.drain() == 6
    assert order == [f"{i}" for i in range(6)]
