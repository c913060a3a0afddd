"""Maintenance by one leader, elected through the database; heartbeats beside the pool.

Rescue, deadline expiry and retention sweeps run in the worker holding a session advisory
lock on a connection of its own; when that session ends another worker takes over at its
next try (every ``LEADER_INTERVAL``). Heartbeats use a connection of their own too, so an
application holding every pooled connection cannot get its worker's live jobs rescued.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone._leader import LEADER_INTERVAL
from tests.conftest import wait_until
from tests.support.workers import Background, job_rows, start_runs
from tests.test_worker_fence import QUICK, leader_pids


def idle_workflow(name: str) -> cyclone.Workflow[Any]:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    return wf


def test_of_two_workers_one_leads_and_another_takes_over_when_its_session_ends(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    wf = idle_workflow(name)
    workers = [cyclone.Worker(engine, workflows=[wf], sweep=False, **QUICK) for _ in range(2)]
    serving = [Background(w.run) for w in workers]
    try:
        first = wait_until(lambda: leader_pids(engine), timeout=10)
        wait_until(lambda: sum(w._leader is not None and w._leader.leading for w in workers))
        # Both keep trying; still exactly one leads.
        time.sleep(3 * LEADER_INTERVAL)  # the behaviour under test is what happens meanwhile
        assert leader_pids(engine) == first
        assert sum(bool(w._leader and w._leader.leading) for w in workers) == 1

        with engine.connect() as conn:
            conn.execute(sa.select(sa.func.pg_terminate_backend(first[0])))
        took_over = time.monotonic()
        second = wait_until(
            lambda: [p for p in leader_pids(engine) if p != first[0]], timeout=10 * LEADER_INTERVAL
        )
        assert time.monotonic() - took_over < 5 * LEADER_INTERVAL
        assert len(second) == 1
    finally:
        for w in workers:
            w.stop()
        for s in serving:
            s.join(30)
    # A closed session's backend ends (and releases the lock) a moment after the close.
    wait_until(lambda: leader_pids(engine) == [], timeout=10)


def test_a_leader_rescues_the_jobs_of_a_worker_that_stopped_beating(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    wf = idle_workflow(name)
    run = wf.submit(engine, None)
    start_runs(engine, wf)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cyclone_jobs SET state = 'running', attempt = 1, lease = 1,"
                " worker_id = 'gone', heartbeat_at = now() - interval '1 hour'"
                " WHERE run_id = :r"
            ),
            {"r": run.id},
        )
    worker = cyclone.Worker(
        engine, workflows=[wf], rescue_after=timedelta(seconds=1), sweep=False, **QUICK
    )
    serving = Background(worker.run)
    try:
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    finally:
        worker.stop()
        serving.join(30)
    row = job_rows(engine, run.id)["only"]
    assert row.attempt == 1
    assert row.errors[0]["type"] == "WorkerLost"


def test_an_app_holding_every_pooled_connection_longer_than_rescue_after_keeps_its_live_jobs(
    own_engine: sa.Engine, own_url: URL, name: str
) -> None:
    engine = own_engine
    database_url = own_url
    other = idle_workflow(f"{name}-other")
    wf = cyclone.Workflow(name)
    executions = 0
    started = threading.Event()
    release = threading.Event()

    @wf.step()
    def long(ctx: cyclone.StepContext, value: Any) -> int:
        nonlocal executions
        executions += 1
        started.set()
        assert release.wait(30)
        return executions

    rescue = {"rescue_after": timedelta(seconds=1), "sweep": False, **QUICK}
    # Another process's worker leads maintenance and would rescue a job not beaten for 1 s.
    rescuer = cyclone.Worker(engine, workflows=[other], **rescue)
    rescuing = Background(rescuer.run)
    small = sa.create_engine(database_url, pool_size=2, max_overflow=0, pool_timeout=30)
    worker = cyclone.Worker(small, workflows=[wf], concurrency=1, **rescue)
    serving = None
    held: list[sa.Connection] = []
    try:
        wait_until(lambda: leader_pids(engine), timeout=10)
        run = wf.submit(engine, None)
        serving = Background(worker.run)
        assert started.wait(30)
        held = [small.connect() for _ in range(2)]
        for conn in held:
            conn.execute(sa.text("SELECT 1"))
        time.sleep(3)  # longer than rescue_after: the behaviour under test is meanwhile
        assert job_rows(engine, run.id)["long"].state == "running"
        for conn in held:
            conn.close()
        release.set()
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    finally:
        release.set()
        for conn in held:
            conn.close()
        worker.stop()
        rescuer.stop()
        if serving is not None:
            serving.join(30)
        rescuing.join(30)
        small.dispose()
    assert executions == 1
    row = job_rows(engine, run.id)["long"]
    assert (row.state, row.output, row.errors) == ("completed", 1, [])


def test_a_drain_runs_its_maintenance_passes_on_one_connection(
    own_engine: sa.Engine, name: str
) -> None:
    # A drain's passes (the first, the leader thread's, the last) share one session: a
    # drain opens at most three connections (its held one, unless the pool has one to
    # give, its heartbeat's, and maintenance's), not one more a pass.
    wf = idle_workflow(name)
    worker = cyclone.Worker(own_engine, workflows=[wf], sweep=False)
    worker.drain()  # the engine's own first connection is not the worker's
    opened: list[object] = []

    def on_connect(dbapi_conn: object, record: object) -> None:
        opened.append(dbapi_conn)

    sa.event.listen(own_engine.pool, "connect", on_connect)
    try:
        for _ in range(3):
            opened.clear()
            assert worker.drain() == 0
            assert len(opened) <= 3, opened
        wf.submit_once(own_engine, "k", 1)
        opened.clear()
        assert worker.drain() == 1
        assert len(opened) <= 3, opened
    finally:
        sa.event.remove(own_engine.pool, "connect", on_connect)
