"""An application role that owns nothing, with the grants of docs/deployment.md, runs everything."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from tests.conftest import admin_url, wait_until
from tests.support import docs

DOC = "docs/deployment.md"


def grants(role: str) -> list[str]:
    """The grant statements of the doc, for ``role``."""
    block = docs.snippet(DOC, "grants")
    return [line.replace("app_role", f'"{role}"') for line in block.splitlines() if line]


@pytest.fixture
def app_url(fresh_database: URL) -> Iterator[URL]:
    """The fresh database migrated by its owner, and a URL of a role that owns nothing."""
    role = f"cyclone_app_{uuid.uuid4().hex[:8]}"
    owner = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    cyclone.upgrade(owner)
    admin = sa.create_engine(admin_url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE ROLE "{role}" LOGIN'))
    with owner.begin() as conn:
        for statement in grants(role):
            conn.exec_driver_sql(statement)
    owner.dispose()
    try:
        yield fresh_database.set(username=role, password=None)
    finally:
        with admin.connect() as conn:
            conn.execute(
                sa.text(f'DROP DATABASE IF EXISTS "{fresh_database.database}" WITH (FORCE)')
            )
            conn.execute(sa.text(f'DROP ROLE "{role}"'))
        admin.dispose()


def owns_nothing(engine: sa.Engine) -> bool:
    with engine.connect() as conn:
        owned = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_class WHERE relowner = "
                "(SELECT oid FROM pg_roles WHERE rolname = current_user)"
            )
        )
        return owned.scalar_one() == 0


def test_an_application_role_with_the_documented_grants_runs_everything(
    app_url: URL, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cyclone")
    engine = sa.create_engine(app_url)
    client = cyclone.Client(engine)
    assert owns_nothing(engine)
    cyclone.check_schema(engine)
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, output=int)

    @wf.result("double")
    def double(ctx: cyclone.StepContext, value: int) -> int:
        return value * 2

    @cyclone.step(f"{name}_kind")
    def kind(ctx: cyclone.StepContext, args: int) -> int:
        return args + 1

    old, _ = wf.submit_once(engine, "old", 1)
    with cyclone.Worker(engine, workflows=[wf]) as drainer:
        drainer.drain()
    owner = sa.create_engine(app_url.set(username=admin_url().username), poolclass=sa.NullPool)
    with owner.begin() as conn:  # ended long ago: the sweeper's to delete
        conn.execute(
            sa.text(
                "UPDATE cyclone_runs SET finalized_at = now() - interval '400 days' WHERE id = :id"
            ),
            {"id": old.id},
        )
    owner.dispose()

    run, _ = wf.submit_once(engine, "k", 21)
    with engine.connect() as conn:
        tx_run = wf.submit_tx(conn, 1)
        conn.commit()
    job = kind.enqueue(engine, 1, unique="u")
    worker = cyclone.Worker(engine, workflows=[wf], steps=[kind], poll_interval=0.05, sweep=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert run.result(timeout=30) == 42
        assert tx_run.result(timeout=30) == 2
        assert job.result(timeout=30) == 2
        wait_until(lambda: not client.list_runs(workflow=name, key="old"), timeout=30)
    finally:
        worker.close()
        thread.join(30)
    assert not thread.is_alive()

    cancelled, _ = wf.submit_once(engine, "to-cancel", 1)
    cancelled.cancel()
    cancelled.retry()
    with cyclone.Worker(engine, workflows=[wf]) as drainer:
        drainer.drain()
    assert cancelled.result(timeout=10) == 2

    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert {status.id for status in client.list_runs(workflow=name)} >= {run.id, tx_run.id}
    assert client.list_jobs(kind=f"{name}_kind")
    assert client.count_runs(workflow=name)[cyclone.RunState.COMPLETED] >= 3
    assert client.purge_terminal_runs(older_than=timedelta()) >= 3
    client.purge_finished_jobs(older_than=timedelta())
    assert client.list_runs(workflow=name) == []
    cyclone.close(engine)
    engine.dispose()


def test_the_grants_a_worker_checks_are_the_documented_ones() -> None:
    documented: dict[str, set[str]] = {}
    for line in docs.snippet(DOC, "grants").splitlines():
        match = re.fullmatch(r"GRANT (.+) ON (.+) TO app_role;", line)
        if match is None or match[1] == "USAGE":
            continue
        for table in match[2].split(", "):
            documented.setdefault(table, set()).update(match[1].split(", "))
    documented.pop("cyclone_alembic_version")  # read by the schema check, before the grants
    assert {table: set(grants) for table, grants in cyclone.migrations.GRANTS.items()} == (
        documented
    )


def test_a_worker_whose_role_lacks_a_documented_grant_names_it_at_start(
    app_url: URL, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """It runs jobs, but could never lead maintenance (no rescue, no deadlines, no sweep)
    and said so only in a failure of every pass: it names what it lacks at once."""
    owner = sa.create_engine(app_url.set(username=admin_url().username), poolclass=sa.NullPool)
    with owner.begin() as conn:
        conn.exec_driver_sql(f'REVOKE UPDATE ON cyclone_leader FROM "{app_url.username}"')
    owner.dispose()
    engine = sa.create_engine(app_url)
    wf = cyclone.Workflow(name)
    wf.step("only")(lambda ctx, value: value)
    run = wf.submit(engine, 1)
    caplog.set_level(logging.INFO, logger="cyclone")
    worker = cyclone.Worker(engine, workflows=[wf], sweep=False)
    assert worker.drain() == 1
    assert run.status().state == cyclone.RunState.COMPLETED
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [
        f"worker {worker.id}: the database role lacks UPDATE on cyclone_leader: the statements "
        "that need them will fail (the grants are in cyclone's docs/deployment.md)"
    ]
    worker.close()
    engine.dispose()


def test_a_worker_whose_role_cannot_register_does_not_start(
    app_url: URL, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Without INSERT on cyclone_workers it would run unseen by operators (and fail every
    heartbeat): it names what it lacks, then fails before its first claim."""
    owner = sa.create_engine(app_url.set(username=admin_url().username), poolclass=sa.NullPool)
    with owner.begin() as conn:
        conn.exec_driver_sql(f'REVOKE INSERT ON cyclone_workers FROM "{app_url.username}"')
    owner.dispose()
    engine = sa.create_engine(app_url)
    wf = cyclone.Workflow(name)
    wf.step()(lambda ctx, value: value)
    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], sweep=False)
    with pytest.raises(
        sa.exc.ProgrammingError, match="permission denied for table cyclone_workers"
    ):
        worker.drain()
    assert worker.stats.total == 0
    assert run.status().state == cyclone.RunState.RUNNING
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors[0] == (
        f"worker {worker.id}: the database role lacks INSERT on cyclone_workers: the statements "
        "that need them will fail (the grants are in cyclone's docs/deployment.md)"
    )
    assert errors[1].startswith(f"worker {worker.id} cannot register in cyclone_workers (")
    assert errors[1].endswith("): it does not start")
    worker.close()
    cyclone.close(engine)
    engine.dispose()


def parked(engine: sa.Engine, run_id: uuid.UUID) -> bool:
    """Whether the run's wait node was claimed and parked to wait for its signal (a signal
    sent while the worker parks it is not seen: that race is not what this test is about)."""
    with engine.connect() as conn:
        parked = conn.execute(
            sa.text(
                "SELECT 1 FROM cyclone_jobs WHERE run_id = :id AND kind = 'go'"
                " AND state = 'blocked' AND lease > 0"
            ),
            {"id": run_id},
        )
        return parked.first() is not None


def test_an_application_role_with_the_documented_grants_signals_runs_and_registers_schedules(
    app_url: URL, name: str
) -> None:
    engine = sa.create_engine(app_url)
    client = cyclone.Client(engine)
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, input=int, output=int)

    @wf.wait("go")
    def go(ctx: cyclone.StepContext, payload: int) -> int:
        return payload

    @wf.result(after=[go])
    def done(ctx: cyclone.StepContext, value: int) -> int:
        return ctx.output(go) + value

    wf.schedule(f"{name}-hourly", every=timedelta(hours=1), input=1)
    run, _ = wf.submit_once(engine, "k", 1)
    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=0.05, sweep=False)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_until(lambda: client.list_schedules(), timeout=30)
        wait_until(lambda: parked(engine, run.id), timeout=30)
        assert wf.signal(engine, "k", "go", 41)
        assert run.result(timeout=30) == 42
    finally:
        worker.close()
        thread.join(30)
    assert not thread.is_alive()
    assert [schedule.name for schedule in client.list_schedules()] == [f"{name}-hourly"]
    cyclone.close(engine)
    engine.dispose()


def test_an_application_role_with_the_documented_grants_pauses_queues_and_acts_in_bulk(
    app_url: URL, name: str
) -> None:
    engine = sa.create_engine(app_url)
    client = cyclone.Client(engine)
    wf = cyclone.Workflow(name)
    failing = threading.Event()
    failing.set()

    @wf.step(max_attempts=1, queue=f"{name}_q")
    def charge(ctx: cyclone.StepContext, value: int) -> None:
        if failing.is_set():
            raise RuntimeError("declined")

    @cyclone.step(f"{name}_kind", max_attempts=1, queue=f"{name}_q")
    def kind(ctx: cyclone.StepContext, args: int) -> None:
        if failing.is_set():
            raise RuntimeError("down")

    assert client.pause_queue(f"{name}_q")
    runs = [wf.submit(engine, i) for i in range(3)]
    job = kind.enqueue(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], steps=[kind])
    assert worker.drain() == 0
    assert [q.available for q in client.list_queues() if q.name == f"{name}_q"] == [4]
    assert client.resume_queue(f"{name}_q")
    worker.drain()
    assert job.status().state == cyclone.JobState.FAILED
    failing.clear()
    client.retry_job(job.id)
    assert client.retry_runs(workflow=name) == 3
    worker.drain()
    assert {r.status().state for r in runs} == {cyclone.RunState.COMPLETED}
    assert job.status().state == cyclone.JobState.COMPLETED
    more = [wf.submit(engine, i) for i in range(2)]
    assert client.cancel_runs(workflow=name) == 2
    assert {r.status().state for r in more} == {cyclone.RunState.CANCELLED}
    cyclone.close(engine)
    engine.dispose()


def test_an_application_role_with_the_documented_grants_runs_limited_work_and_sets_limits(
    app_url: URL, name: str
) -> None:
    engine = sa.create_engine(app_url)
    client = cyclone.Client(engine)
    wf = cyclone.Workflow(name, concurrency=cyclone.Concurrency(1, key=lambda value: "all"))

    @wf.step()
    def charge(ctx: cyclone.StepContext, value: int) -> int:
        return value

    @cyclone.step(f"{name}_kind", concurrency=cyclone.Concurrency(2, name=f"{name}_limit"))
    def kind(ctx: cyclone.StepContext, args: int) -> int:
        return args

    runs = [wf.submit(engine, i) for i in range(2)]
    jobs = [kind.enqueue(engine, i) for i in range(3)]
    worker = cyclone.Worker(engine, workflows=[wf], steps=[kind])
    worker.drain()
    worker.drain()
    assert {r.status().state for r in runs} == {cyclone.RunState.COMPLETED}
    assert {j.status().state for j in jobs} == {cyclone.JobState.COMPLETED}
    client.set_limit(f"{name}_limit", 3)
    assert {limit.name: limit.max for limit in client.list_limits()}[f"{name}_limit"] == 3
    cyclone.close(engine)
    engine.dispose()
