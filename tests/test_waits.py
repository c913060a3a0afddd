"""Waits end by their timeout whatever their reads are doing; cyclone's own connections
keep TCP keepalives. (Frozen networks and restarts: tests/reliability/test_network.py.)"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import deadline as _deadline
from cyclone._store import executor as _executor
from cyclone.runs import lost_connection
from tests.conftest import wait_until
from tests.support.conninfo import keepalive_settings
from tests.support.factories import result_workflow


@pytest.fixture
def one_connection(database_url: sa.URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=60)
    yield engine
    engine.dispose()


def test_a_wait_whose_read_waits_for_a_pool_connection_ends_by_its_timeout(
    one_connection: sa.Engine, name: str
) -> None:
    wf = result_workflow(name)
    run = wf.submit(one_connection, 1)
    with pytest.raises(TimeoutError):
        run.wait(timeout=0.5)  # the listener is up from here on
    checkins: list[object] = []

    def on_checkin(*args: object) -> None:
        checkins.append(args)

    with one_connection.connect() as held:  # the pool's only connection
        held.exec_driver_sql("SELECT 1")
        for call in (lambda: run.result(timeout=1), lambda: run.wait(timeout=1)):
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                call()
            assert time.monotonic() - started < 1 + 2
        sa.event.listen(one_connection.pool, "checkin", on_checkin)
    # The two reads left behind get the connection now, and put it back.
    wait_until(lambda: len(checkins) >= 1 + 2, timeout=30)
    sa.event.remove(one_connection.pool, "checkin", on_checkin)


def test_a_read_that_fails_for_another_reason_raises_at_once(engine: sa.Engine) -> None:
    handle = cyclone.Run(engine, uuid.uuid4(), "nothing")
    started = time.monotonic()
    with pytest.raises(cyclone.NotFoundError):
        handle.wait(timeout=30)
    assert time.monotonic() - started < 10


def test_connections_cyclone_opens_for_itself_have_keepalives(engine: sa.Engine) -> None:
    driver = _executor.detached(engine)
    try:
        assert keepalive_settings(driver) == dict(_deadline.KEEPALIVES)
    finally:
        driver.close()


def test_keepalive_settings_in_the_url_are_left_as_given(database_url: sa.URL) -> None:
    engine = sa.create_engine(database_url.update_query_dict({"keepalives": "0"}))
    driver = _executor.detached(engine)
    try:
        settings = keepalive_settings(driver)
        assert settings.pop("keepalives") == "0"
        assert set(settings.values()) == {None}
    finally:
        driver.close()
        engine.dispose()


def error_of(engine: sa.Engine, sql: str) -> BaseException:
    with engine.connect() as conn, pytest.raises(sa.exc.DBAPIError) as caught:
        conn.exec_driver_sql(sql)
    return caught.value


def test_a_terminated_backend_is_a_lost_connection_a_cancelled_statement_is_not(
    database_url: sa.URL,
) -> None:
    engine = sa.create_engine(
        database_url, poolclass=sa.NullPool, connect_args={"options": "-c statement_timeout=50"}
    )
    try:
        assert lost_connection(error_of(engine, "SELECT pg_terminate_backend(pg_backend_pid())"))
        assert not lost_connection(error_of(engine, "SELECT pg_sleep(5)"))
        assert not lost_connection(error_of(engine, "SELECT 1/0"))
    finally:
        engine.dispose()
