"""Maintenance by one leader, elected through a lease in the database; heartbeats beside the pool.

Rescue, deadline expiry and retention sweeps run in the worker holding the lease of
``cyclone_leader`` (renewed every pass, for ``rescue_after``), on a connection of its own;
when it stops or its lease lapses another worker takes the next term, and a stale term
acts on nothing. Heartbeats use a connection of their own too, so an application holding
every pooled connection cannot get its worker's live jobs rescued. Frozen leaders (SIGSTOP,
a frozen network): tests/reliability/test_leader.py.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.engine import URL

import cyclone
from cyclone import _leader
from cyclone._store import leadership as _leadership
from cyclone._store.leadership import LEADERSHIP
from cyclone.schema import leader as leader_table
from tests.conftest import wait_until
from tests.support.workers import Background, job_rows, lease, start_runs, wait_for_passes
from tests.test_worker_fence import QUICK


def idle_workflow(name: str) -> cyclone.Workflow[Any]:
    wf = cyclone.Workflow(name)

    @wf.step()
    def only(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    return wf


def test_of_two_workers_one_leads_and_the_other_takes_the_next_term_when_it_stops(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    wf = idle_workflow(name)
    workers = [cyclone.Worker(engine, workflows=[wf], sweep=False, **QUICK) for _ in range(2)]
    serving = [Background(w.run) for w in workers]
    try:
        holder, term = wait_until(lambda: lease(engine), timeout=10)
        wait_until(lambda: sum(w._leader is not None and w._leader.leading for w in workers))
        # Both keep trying: three more tries of the other one; still exactly one leads,
        # under the same term.
        wait_for_passes(next(w for w in workers if w.id != holder), 3)
        assert lease(engine) == (holder, term)
        assert sum(bool(w._leader and w._leader.leading) for w in workers) == 1

        (first,) = [w for w in workers if w.id == holder]
        (other,) = [w for w in workers if w is not first]
        first.stop()
        serving[workers.index(first)].join(30)
        # A worker that stops gives the lease up: the other takes it at its next try.
        assert wait_until(lambda: lease(engine) == (other.id, term + 1), timeout=10)
    finally:
        for w in workers:
            w.stop()
        for s in serving:
            s.join(30)
    assert lease(engine) is None


def test_a_leader_whose_connection_is_terminated_reconnects_and_keeps_its_term(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    wf = idle_workflow(name)
    worker = cyclone.Worker(engine, workflows=[wf], sweep=False, **QUICK)
    serving = Background(worker.run)
    try:
        term = wait_until(lambda: lease(engine), timeout=10)[1]
        leader = worker._leader
        assert leader is not None
        conn = leader._conn
        assert conn is not None
        pid = conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        with engine.connect() as admin:
            admin.execute(sa.select(sa.func.pg_terminate_backend(pid)))
            terminated_at = admin.execute(sa.select(sa.func.clock_timestamp())).scalar_one()
        # The lease is renewed after the termination, from a new connection, same term.
        wait_until(lambda: lease_expiry(engine) > terminated_at + worker.rescue_after, timeout=30)
        assert lease(engine) == (worker.id, term)
        assert leader._conn is not None
        assert leader._conn is not conn
    finally:
        worker.stop()
        serving.join(30)


def lease_expiry(engine: sa.Engine) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            sa.select(leader_table.c.expires_at).where(leader_table.c.name == LEADERSHIP)
        ).scalar_one()


def candidate(engine: sa.Engine, worker_id: str, rescue_after: float = 30) -> _leader.Leader:
    """A worker's candidacy, driven by the test one pass at a time (``once()``)."""
    return _leader.Leader(
        engine,
        worker_id,
        rescue_after=timedelta(seconds=rescue_after),
        sweep=False,
        sweep_keep=timedelta(days=1),
        sweep_interval=60.0,
    )


def orphaned_run(engine: sa.Engine, name: str) -> Any:
    """A run whose only job is running on a worker gone an hour ago: a leader rescues it."""
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
    return run


def set_lease(engine: sa.Engine, holder: str, term: int) -> None:
    """A lease held by ``holder`` under ``term`` that has just expired: its holder froze."""
    with engine.begin() as conn:
        conn.execute(
            pg_insert(leader_table)
            .values(
                name=LEADERSHIP,
                term=term,
                holder=holder,
                expires_at=sa.func.now(),
                backend_pid=sa.func.pg_backend_pid(),
            )
            .on_conflict_do_update(
                index_elements=[leader_table.c.name],
                set_={"term": term, "holder": holder, "expires_at": sa.func.now()},
            )
        )


def test_a_stale_term_acts_on_nothing_and_its_holder_leads_again_only_with_a_new_term(
    own_engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = own_engine
    a, b = candidate(engine, f"{name}-a"), candidate(engine, f"{name}-b")
    try:
        # A led under term 7 and froze; its lease lapsed and B took term 8.
        set_lease(engine, a.worker_id, 7)
        a.term = 7
        assert b.once()
        assert lease(engine) == (b.worker_id, 8)
        # A wakes up with its stale term: its pass is refused before it touches a row.
        run = orphaned_run(engine, name)
        with caplog.at_level(logging.WARNING, logger="cyclone.worker"):
            assert not a.once()
        assert job_rows(engine, run.id)["only"].state == "running"
        assert a.term is None
        refused = [r for r in caplog.records if "refused" in r.getMessage()]
        assert [getattr(r, "term", None) for r in refused] == [7]
        # While B's term lasts, A does not lead; once it ends, A takes the next term.
        assert not a.once()
        assert lease(engine) == (b.worker_id, 8)
        b.release()
        assert a.once()
        assert lease(engine) == (a.worker_id, 9)
        assert job_rows(engine, run.id)["only"].state == "available"
    finally:
        a.release()
        b.release()


def test_a_leader_whose_server_process_ends_is_replaced_at_the_next_try_not_at_expiry(
    own_engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A worker killed outright: the server ends its backend, and the lease (30 s to go)
    # is free at once. Its term is over even if it was only its connection that ended.
    engine = own_engine
    a, b = candidate(engine, f"{name}-a"), candidate(engine, f"{name}-b")
    try:
        assert a.once()
        term = a.term
        assert term is not None
        assert not b.once()
        assert a._conn is not None
        pid = a._conn.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        with engine.connect() as admin:
            admin.execute(sa.select(sa.func.pg_terminate_backend(pid)))
        wait_until(lambda: not backend_alive(engine, pid), timeout=10)
        assert b.once()
        assert lease(engine) == (b.worker_id, term + 1)
        with caplog.at_level(logging.WARNING, logger="cyclone.worker"):
            with pytest.raises(sa.exc.DBAPIError):
                a.once()  # its connection is gone: the pass fails, as any would
            with a._lock:
                a._close()  # as the leader thread does after a failed pass
            assert not a.once()
        assert [
            getattr(r, "term", None) for r in caplog.records if "refused" in r.getMessage()
        ] == [term]
    finally:
        a.release()
        b.release()


def test_a_takeover_skips_a_locked_lease_instead_of_waiting_for_its_transaction(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    b = candidate(engine, f"{name}-b")
    set_lease(engine, f"{name}-a", 3)
    try:
        with engine.connect() as frozen:
            # The lapsed leader's transaction still holds the row (as if frozen in it).
            frozen.execute(sa.select(leader_table).with_for_update())
            trying = Background(b.once)
            assert trying.join(5) is False  # not free yet; B did not wait
            frozen.rollback()
        assert b.once()
        assert lease(engine) == (b.worker_id, 4)
    finally:
        b.release()


def test_the_server_ends_a_leaders_session_frozen_in_its_transaction_and_another_takes_over(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    a, b = candidate(engine, f"{name}-a", 2), candidate(engine, f"{name}-b", 2)
    frozen = _leadership.dedicated(engine, autocommit=False)
    try:
        assert a.once()
        term = a.term
        assert term is not None
        # A's next maintenance transaction renews and locks the lease, then A freezes in it.
        frozen_tx = frozen.begin()
        a._fence(frozen)
        pid = frozen.connection.dbapi_connection.info.backend_pid  # type: ignore[union-attr]
        # Idle in its transaction for half the TTL (1 s), the session is ended by the
        # server; once A's lease lapses (2 s after its renewal), B takes the next term.
        wait_until(lambda: not backend_alive(engine, pid), timeout=30)
        wait_until(b.once, timeout=30)
        assert lease(engine) == (b.worker_id, term + 1)
        with pytest.raises(sa.exc.DBAPIError):
            frozen_tx.commit()
    finally:
        frozen.invalidate()
        frozen.close()
        a.release()
        b.release()


def jit_compiled(conn: sa.Connection, statement: str) -> bool:
    """Whether the server compiled ``statement`` with JIT when it ran it (EXPLAIN ANALYZE)."""
    (plan,) = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}").scalar_one()
    return "JIT" in plan


def test_a_maintenance_transaction_compiles_none_of_its_statements_with_jit(
    own_engine: sa.Engine, name: str
) -> None:
    """The fence turns JIT off for the transaction it starts: a rescue's plan, costed
    past ``jit_above_cost`` while many jobs run, was compiled at every pass."""
    a = candidate(own_engine, f"{name}-a")
    conn = _leadership.dedicated(own_engine, autocommit=False)
    try:
        assert a.once()
        with conn.begin():
            conn.exec_driver_sql("SET LOCAL jit_above_cost = 0")
            assert jit_compiled(conn, "SELECT count(*) FROM cyclone_jobs")
            a._fence(conn)
            assert not jit_compiled(conn, "SELECT count(*) FROM cyclone_jobs")
        with conn.begin():
            assert conn.exec_driver_sql("SHOW jit").scalar_one() == "on"
    finally:
        conn.close()
        a.release()


def backend_alive(engine: sa.Engine, pid: int) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"), {"p": pid}
            ).scalar_one()
        )


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
        wait_until(lambda: (lease(engine) or ("",))[0] == rescuer.id, timeout=10)
        run = wf.submit(engine, None)
        serving = Background(worker.run)
        assert started.wait(30)
        held = [small.connect() for _ in range(2)]
        for conn in held:
            conn.execute(sa.text("SELECT 1"))
        # Passes of the rescuer that began once a heartbeat held up by the pool would have
        # been older than rescue_after (and half a second more).
        wait_for_passes(rescuer, 2, after=time.monotonic() + 1.5)
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
