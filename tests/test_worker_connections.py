"""A worker's own connections: claims and records on one held connection, kept across losses."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import deadline as _deadline
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from tests.conftest import wait_until
from tests.support.conninfo import keepalive_settings
from tests.support.counting import CountingCursor, Recorder
from tests.support.workers import Background


def noop_kind(kind: str) -> cyclone.StandaloneStep[int, int]:
    @cyclone.step(kind)
    def noop(ctx: cyclone.StepContext, n: int) -> int:
        return n

    return noop


@pytest.fixture
def own_engine(database_url: sa.URL, name: str) -> Iterator[sa.Engine]:
    """An engine of one pooled connection whose backends are named for the test."""
    engine = sa.create_engine(
        database_url,
        pool_size=1,
        max_overflow=0,
        pool_timeout=5,
        connect_args={"application_name": name},
    )
    yield engine
    engine.dispose()


def checkouts_to_drain(engine: sa.Engine, step: cyclone.StandaloneStep[int, int], n: int) -> int:
    for i in range(n):
        step.enqueue(engine, i)
    seen: list[object] = []

    def on_checkout(dbapi_conn: object, record: object, proxy: object) -> None:
        seen.append(record)

    sa.event.listen(engine.pool, "checkout", on_checkout)
    try:
        assert cyclone.Worker(engine, steps=[step], concurrency=4).drain() == n
    finally:
        sa.event.remove(engine.pool, "checkout", on_checkout)
    return len(seen)


def test_a_worker_checks_out_no_connection_per_claim_or_record(
    own_engine: sa.Engine, name: str
) -> None:
    # With 4 at a time, 100 jobs take at least 25 claims and as many records: none of
    # them checks a connection out of the pool.
    step = noop_kind(name)
    checkouts_to_drain(own_engine, step, 0)  # the engine's listener connects once, here
    assert checkouts_to_drain(own_engine, step, 100) == checkouts_to_drain(own_engine, step, 1)


def test_a_running_worker_leaves_the_pool_to_the_application(
    own_engine: sa.Engine, name: str
) -> None:
    step = noop_kind(name)
    worker = cyclone.Worker(own_engine, steps=[step])
    running = Background(worker.run)
    try:
        for i in range(20):
            assert step.enqueue(own_engine, i).result(timeout=10) == i
    finally:
        worker.stop()
        running.join(10)


def test_a_worker_whose_connections_are_terminated_reconnects_and_runs_the_next_job(
    engine: sa.Engine, own_engine: sa.Engine, name: str
) -> None:
    step = noop_kind(name)
    worker = cyclone.Worker(own_engine, steps=[step])
    running = Background(worker.run)
    try:
        assert step.enqueue(own_engine, 1).result(timeout=10) == 1
        with engine.connect() as conn:
            killed = conn.execute(
                sa.text(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) "
                    "FROM pg_stat_activity WHERE application_name = :name"
                ),
                {"name": name},
            ).scalar_one()
        assert killed >= 2  # the listener's and the claim loop's, and the pool's
        own_engine.dispose()
        assert step.enqueue(own_engine, 2).result(timeout=20) == 2
        assert step.enqueue(own_engine, 3).result(timeout=10) == 3
    finally:
        worker.stop()
        running.join(10)


def test_an_idle_worker_is_woken_by_a_notify_on_its_own_connection_without_a_listener(
    engine: sa.Engine, own_engine: sa.Engine, name: str
) -> None:
    step = noop_kind(name)
    worker = cyclone.Worker(own_engine, steps=[step], poll_interval=120, sweep=False)
    running = Background(worker.run)
    try:
        wait_until(lambda: worker._held is not None and worker._held.fileno() is not None)
        # Its poll interval is far longer than the test: only a NOTIFY can wake it.
        for i in range(3):
            assert step.enqueue(engine, i).result(timeout=10) == i
        assert own_engine not in _notify._listeners
    finally:
        worker.stop()
        running.join(10)


def open_connections(database: str | None) -> dict[int, psycopg.Connection[Any]]:
    """The psycopg connections to ``database`` open in this process, by backend pid."""
    # type(), not isinstance(): a lazy proxy (Django's settings) would resolve itself.
    drivers = [o for o in gc.get_objects() if issubclass(type(o), psycopg.Connection)]
    return {
        conn.info.backend_pid: conn
        for conn in drivers
        if not conn.closed and conn.info.dbname == database
    }


def backends(engine: sa.Engine) -> set[int]:
    """The backends of ``engine``'s database but the caller's."""
    with engine.connect() as conn:
        return set(
            conn.execute(
                sa.text(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalars()
        )


def test_every_connection_a_running_worker_opens_for_itself_has_keepalives(
    engine: sa.Engine, own_url: sa.URL, name: str
) -> None:
    # No pool: the application keeps no connection open, so every backend of the database
    # is one of cyclone's (held, heartbeat, maintenance leader, the waits' listener).
    app = sa.create_engine(own_url, poolclass=sa.NullPool)
    admin = sa.create_engine(own_url, poolclass=sa.NullPool)
    step = noop_kind(name)
    worker = cyclone.Worker(app, steps=[step], sweep=False)
    running = Background(worker.run)
    try:
        assert step.enqueue(app, 1).result(timeout=10) == 1
        wait_until(lambda: worker._leader is not None and worker._leader.leading)
        seen = wait_until(lambda: len(backends(admin)) >= 4 and backends(admin), timeout=10)
        opened = open_connections(own_url.database)
        assert seen <= set(opened), "a backend of the database is no connection of this process"
        settings = {pid: keepalive_settings(opened[pid]) for pid in seen}
        assert settings == {pid: dict(_deadline.KEEPALIVES) for pid in seen}
    finally:
        worker.stop()
        running.join(10)
        cyclone.close(app)
        app.dispose()
        admin.dispose()


def test_a_workers_own_connection_compiles_none_of_its_statements_with_jit(
    own_url: sa.URL,
) -> None:
    """A worker's held connection runs without JIT, whatever the database sets: its look
    for earlier limits (a recursive union) is always costed past ``jit_above_cost``, and
    its prepared statements were compiled again at every execution."""
    explain = sa.text("EXPLAIN (ANALYZE, FORMAT JSON) SELECT count(*) FROM cyclone_jobs")
    admin = sa.create_engine(own_url, poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'ALTER DATABASE "{own_url.database}" SET jit_above_cost = 0'))
        conn.commit()
    engine = sa.create_engine(own_url)
    held = _executor.Held(engine)
    try:
        with engine.connect() as conn:
            assert "JIT" in conn.execute(explain).scalar_one()[0]
        (plan,) = held.rows(explain)[0]
        assert "JIT" not in plan[0]
    finally:
        held.close()
        engine.dispose()
        admin.dispose()


class LoopStatements(Recorder):
    """The statements sent by one thread."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.statements: list[str] = []
        self.lock = threading.Lock()

    def record(self, thread: str, statement: str) -> None:
        if thread == self.thread:
            with self.lock:
                self.statements.append(statement)


@contextmanager
def asleep_counted(
    engine: sa.Engine, worker: cyclone.Worker, name: str
) -> Iterator[tuple[LoopStatements, int]]:
    """``worker`` serving in a thread of its own, yielded once asleep with the statements
    its loop sends and how many it sent until then; stopped, and ``engine`` disposed, at
    the end. On an empty queue the loop's startup ends with a claim that finds nothing
    and a read of when the next job is due; then it sleeps."""
    with LoopStatements(f"loop-{name}") as sent:
        running = Background(worker.run, name=f"loop-{name}")
        try:
            wait_until(lambda: any("min(cyclone_jobs.scheduled_at)" in s for s in sent.statements))
            threading.Event().wait(0.1)
            yield sent, len(sent.statements)
        finally:
            worker.stop()
            running.join(10)
            engine.dispose()


def test_an_idle_worker_claims_and_records_a_job_in_two_statements_and_no_more(
    own_url: sa.URL, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database of its own: another test's NOTIFY would wake the worker for a claim more.
    # Its looks at the tables' size (tests/test_replanning.py) are not counted here.
    monkeypatch.setattr(_executor, "REPLAN_FIRST", 3600.0)
    monkeypatch.setattr(_executor, "REPLAN_STATEMENTS_FIRST", 10**9)
    engine = sa.create_engine(own_url, connect_args={"cursor_factory": CountingCursor})
    step = noop_kind(name)
    worker = cyclone.Worker(engine, steps=[step], poll_interval=120, sweep=False)
    with asleep_counted(engine, worker, name) as (sent, start):
        assert "min(cyclone_jobs.scheduled_at)" in sent.statements[-1], sent.statements
        for i in range(1, 6):
            assert step.enqueue(engine, i).result(timeout=10) == i
            # The step's end wakes the loop once: to record, not again to claim.
            wait_until(lambda: len(sent.statements) >= start + 2 * i)  # noqa: B023
            threading.Event().wait(0.1)
            assert len(sent.statements) == start + 2 * i, sent.statements


def test_an_idle_worker_records_a_last_step_alone_and_a_step_with_a_dependent_in_its_claim(
    own_url: sa.URL, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A step with a dependent is recorded by a claim, which continues the dependent; the
    # last step, with nothing to continue, by a statement that claims nothing: a worker
    # recorded as waiting hears of new work by its NOTIFY.
    monkeypatch.setattr(_executor, "REPLAN_FIRST", 3600.0)
    monkeypatch.setattr(_executor, "REPLAN_STATEMENTS_FIRST", 10**9)
    engine = sa.create_engine(own_url, connect_args={"cursor_factory": CountingCursor})
    wf = cyclone.ResultWorkflow(f"{name}.wf", input=int, output=int)

    @wf.step()
    def first(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.result(after=[first])
    def last(ctx: cyclone.StepContext, n: int) -> int:
        return ctx.output(first) + 1

    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=120, sweep=False)
    with asleep_counted(engine, worker, name) as (sent, start):
        for i in range(1, 4):
            run, _created = wf.submit_once(engine, f"{name}-{i}", i)
            assert run.result(timeout=10) == i + 1
            wait_until(lambda: len(sent.statements) >= start + 3 * i)  # noqa: B023
            threading.Event().wait(0.1)
            claim, record_first, record_last = sent.statements[start + 3 * (i - 1) :]
            assert "SKIP LOCKED" in claim, claim
            assert "SKIP LOCKED" in record_first, record_first
            assert "SKIP LOCKED" not in record_last, record_last
            assert "UPDATE cyclone_runs SET" in record_last, record_last


def test_a_worker_draining_again_compiles_none_of_its_statements_again(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its maintenance passes and heartbeat run on an engine of its own, kept from one
    # drain to the next with SQLAlchemy's cache of compiled statements.
    step = noop_kind(name)
    worker = cyclone.Worker(engine, steps=[step], concurrency=2, sweep=False)
    step.enqueue(engine, 1)
    assert worker.drain() == 1
    compiled: list[str] = []
    original = sa.sql.compiler.SQLCompiler.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        compiled.append(str(self))

    monkeypatch.setattr(sa.sql.compiler.SQLCompiler, "__init__", counting)
    step.enqueue(engine, 2)
    assert worker.drain() == 1
    assert compiled == []


def test_pool_events_added_after_a_workers_drain_apply_to_its_own_connections_in_the_next(
    own_url: sa.URL, name: str
) -> None:
    app = sa.create_engine(own_url, poolclass=sa.NullPool)
    step = noop_kind(name)
    worker = cyclone.Worker(app, steps=[step], sweep=False)
    try:
        step.enqueue(app, 1)
        assert worker.drain() == 1
        threads: list[str] = []

        def on_connect(dbapi_conn: object, record: object) -> None:
            threads.append(threading.current_thread().name)

        sa.event.listen(app, "connect", on_connect)
        step.enqueue(app, 2)
        assert worker.drain() == 1
        assert "cyclone-heartbeat" in threads
    finally:
        cyclone.close(app)
        app.dispose()
