"""Connections cyclone opens outside the pool are closed: cyclone.close, Worker.close, weak refs."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone._store import executor as _executor
from cyclone._store import notify as _notify
from tests.conftest import admin_url, wait_until
from tests.support.factories import workflow


def sessions(database: str | None) -> list[str]:
    """The sessions open on ``database``: each one's state and last statement."""
    admin = sa.create_engine(admin_url(), poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT state, query FROM pg_stat_activity WHERE datname = :d"),
                {"d": database},
            )
            return [f"{state}: {query}" for state, query in rows]
    finally:
        admin.dispose()


def backends(database: str | None) -> int:
    return len(sessions(database))


def all_closed(database: str | None) -> None:
    """Every session on ``database`` ends. A backend leaves ``pg_stat_activity`` a moment
    after its client closed the connection (later on a loaded machine); one still
    connected never does."""
    wait_until(
        lambda: not sessions(database),
        timeout=10,
        message=lambda: f"sessions still open: {sessions(database)}",
    )


def drop_database_without_force(database: str | None) -> None:
    admin = sa.create_engine(admin_url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE "{database}"'))
    finally:
        admin.dispose()


@pytest.fixture
def migrated(fresh_database: URL) -> Iterator[URL]:
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    engine.dispose()
    return fresh_database


def test_after_close_and_dispose_drop_database_succeeds_at_once(migrated: URL, name: str) -> None:
    engine = sa.create_engine(migrated)
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    with cyclone.Worker(engine, workflows=[wf]) as worker:
        worker.drain()
    run.wait(timeout=10)  # the listener is up and LISTENing
    assert _notify.listener(engine).wait_ready(10)
    conninfo = migrated.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as driver:
        joined, _ = wf.submit_once_tx(driver, "k2", 1)
        driver.commit()
        joined.status()  # reads through the Engine cyclone made for this connection
        cyclone.close(joined._engine)
    assert backends(migrated.database) > 0
    cyclone.close(engine)
    engine.dispose()
    drop_database_without_force(migrated.database)


def test_a_worker_running_in_another_thread_is_stopped_and_closed_by_close(
    migrated: URL, name: str
) -> None:
    engine = sa.create_engine(migrated)
    worker = cyclone.Worker(engine, workflows=[workflow(name)], poll_interval=0.05)
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_until(lambda: worker._held is not None)
    worker.close()
    thread.join(10)
    assert not thread.is_alive()
    cyclone.close(engine)
    engine.dispose()
    all_closed(migrated.database)


def test_the_listener_registry_does_not_keep_an_engine_alive(migrated: URL) -> None:
    engine = sa.create_engine(migrated)
    listener = _notify.listener(engine)
    assert listener.wait_ready(10)
    assert backends(migrated.database) >= 1
    ref = weakref.ref(engine)
    engine.dispose()
    del engine
    gc.collect()
    assert ref() is None
    wait_until(lambda: not listener._thread.is_alive(), timeout=10)
    wait_until(lambda: backends(migrated.database) == 0, timeout=10)


def test_close_of_an_unused_engine_does_nothing(migrated: URL) -> None:
    engine = sa.create_engine(migrated)
    cyclone.close(engine)
    cyclone.close(engine)
    engine.dispose()


def test_engine_dispose_alone_also_closes_the_listener_and_held_connections(
    migrated: URL, name: str
) -> None:
    engine = sa.create_engine(migrated)
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    worker = cyclone.Worker(engine, workflows=[wf])
    worker.drain()
    run.wait(timeout=10)
    assert _notify.listener(engine).wait_ready(10)
    held = _executor.Held(engine)  # a held connection left open, as a running loop's would be
    held.rows(_executor.Compiled(sa.select(sa.literal(1))), {})
    engine.dispose()
    drop_database_without_force(migrated.database)


def test_a_connection_of_its_own_that_cannot_be_set_up_is_closed(migrated: URL) -> None:
    # A connect event that leaves a transaction open (a SET without autocommit, say): the
    # switch to autocommit is refused, and the new connection was dropped open, one more
    # each second as the listener retried.
    engine = sa.create_engine(migrated)
    opened: list[psycopg.Connection[object]] = []

    @sa.event.listens_for(engine, "connect")
    def leave_a_transaction_open(driver: psycopg.Connection[object], record: object) -> None:
        opened.append(driver)
        driver.execute("SET application_name = 'set_in_a_transaction'")

    try:
        with pytest.raises(psycopg.ProgrammingError, match="autocommit"):
            _executor.detached(engine)
        assert [driver.closed for driver in opened] == [True]
    finally:
        engine.dispose()
