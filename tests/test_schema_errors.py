"""First contact with a database lacking cyclone's schema (or at an older revision): SchemaError."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import cyclone
from cyclone import migrations
from tests.support.factories import workflow


@pytest.fixture
def bare_engine(fresh_database: URL) -> Iterator[sa.Engine]:
    """An engine on a database without cyclone's schema."""
    engine = sa.create_engine(fresh_database)
    yield engine
    cyclone.close(engine)
    engine.dispose()


def assert_names_the_fix(error: cyclone.SchemaError, database: str | None) -> None:
    message = str(error)
    assert repr(database) in message
    assert "no cyclone revision found" in message
    assert "cyclone migrate" in message
    assert "cyclone.upgrade(engine)" in message
    for sql in ("SELECT", "INSERT", "cyclone_runs", "cyclone_jobs"):
        assert sql not in message
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_submit_forms_on_a_database_without_the_schema_raise_schema_error(
    bare_engine: sa.Engine, fresh_database: URL, name: str
) -> None:
    wf = workflow(name)
    calls = [
        lambda: wf.submit(bare_engine, 1),
        lambda: wf.submit_once(bare_engine, "k", 1),
        lambda: wf.submit_once_many(bare_engine, [("k", 1)]),
    ]
    for call in calls:
        with pytest.raises(cyclone.SchemaError) as err:
            call()
        assert_names_the_fix(err.value, fresh_database.database)


def test_tx_forms_on_a_database_without_the_schema_raise_schema_error(
    bare_engine: sa.Engine, fresh_database: URL, name: str
) -> None:
    wf = workflow(name)
    with Session(bare_engine) as session:
        with pytest.raises(cyclone.SchemaError) as err:
            wf.submit_once_tx(session, "k", 1)
        assert_names_the_fix(err.value, fresh_database.database)
    conninfo = fresh_database.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo) as driver:
        with pytest.raises(cyclone.SchemaError) as err:
            wf.submit_tx(driver, 1)
        assert_names_the_fix(err.value, fresh_database.database)


def test_enqueue_forms_on_a_database_without_the_schema_raise_schema_error(
    bare_engine: sa.Engine, fresh_database: URL, name: str
) -> None:
    @cyclone.step(name)
    def kind(ctx: cyclone.StepContext, args: int) -> None:
        return None

    with pytest.raises(cyclone.SchemaError) as err:
        kind.enqueue(bare_engine, 1)
    assert_names_the_fix(err.value, fresh_database.database)
    with bare_engine.connect() as conn, pytest.raises(cyclone.SchemaError):
        kind.enqueue_tx(conn, 1)


def test_a_worker_does_not_start_on_a_database_without_the_schema(
    bare_engine: sa.Engine, fresh_database: URL, name: str
) -> None:
    worker = cyclone.Worker(bare_engine, workflows=[workflow(name)])
    with pytest.raises(cyclone.SchemaError) as err:
        worker.drain()
    assert_names_the_fix(err.value, fresh_database.database)
    with pytest.raises(cyclone.SchemaError):
        worker.run()


def test_a_worker_does_not_start_on_an_older_revision(
    bare_engine: sa.Engine, fresh_database: URL, name: str
) -> None:
    cyclone.upgrade(bare_engine, "cyclone_0001")
    worker = cyclone.Worker(bare_engine, workflows=[workflow(name)])
    with pytest.raises(cyclone.SchemaError) as err:
        worker.drain()
    message = str(err.value)
    assert repr(fresh_database.database) in message
    assert "cyclone_0001" in message
    assert migrations.head_revision() in message
    assert "cyclone migrate" in message


def test_handles_and_listings_raise_schema_error_once_the_schema_is_gone(
    bare_engine: sa.Engine, fresh_database: URL, name: str
) -> None:
    cyclone.upgrade(bare_engine)

    @cyclone.step(name)
    def kind(ctx: cyclone.StepContext, args: int) -> None:
        return None

    run, _ = workflow(name).submit_once(bare_engine, "k", 1)
    job = kind.enqueue(bare_engine, 1)
    cyclone.downgrade(bare_engine)
    client = cyclone.Client(bare_engine)
    for call in (run.status, job.status, client.list_runs, client.list_jobs):
        with pytest.raises(cyclone.SchemaError) as err:
            call()
        assert_names_the_fix(err.value, fresh_database.database)


def test_check_schema_in_shared_history_mode_names_alembic_upgrade_heads(
    bare_engine: sa.Engine,
) -> None:
    """cyclone's revision kept in the application's alembic_version, next to its own head."""
    with bare_engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)"))
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('app_0001'), ('cyclone_0002')"))
    found = migrations.find(bare_engine)
    assert (found.mode, found.revision) == ("shared", "cyclone_0002")
    with pytest.raises(
        cyclone.SchemaError, match=r"cyclone_0002 \(alembic_version, shared-history mode\)"
    ) as err:
        cyclone.check_schema(bare_engine)
    assert "alembic upgrade heads" in str(err.value)
    assert "cyclone migrate" not in str(err.value)


def test_a_revision_this_version_does_not_know_asks_to_upgrade_cyclone(
    bare_engine: sa.Engine,
) -> None:
    cyclone.upgrade(bare_engine)
    with bare_engine.begin() as conn:
        conn.execute(sa.text("UPDATE cyclone_alembic_version SET version_num = 'cyclone_9999'"))
    with pytest.raises(cyclone.SchemaError, match=r"does not know.*upgrade cyclone"):
        cyclone.check_schema(bare_engine)


def test_upgrade_and_downgrade_of_a_revision_this_version_does_not_know_change_nothing(
    bare_engine: sa.Engine,
) -> None:
    """A newer cyclone migrated the database: this version's upgrade and downgrade raise
    SchemaError asking to upgrade cyclone, before alembic runs (it failed on a revision it
    cannot locate), and leave the revision as it was."""
    cyclone.upgrade(bare_engine)
    with bare_engine.begin() as conn:
        conn.execute(sa.text("UPDATE cyclone_alembic_version SET version_num = 'cyclone_9999'"))
    for call in (cyclone.upgrade, cyclone.downgrade):
        with pytest.raises(
            cyclone.SchemaError, match=r"cyclone_9999 .*does not know.*upgrade cyclone"
        ):
            call(bare_engine)
    with bare_engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM cyclone_alembic_version")).all() == [
            ("cyclone_9999",)
        ]


def test_a_worker_starts_on_a_newer_revision_it_does_not_know_with_a_warning(
    bare_engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A rolling deploy that migrates first: older workers keep serving the newer schema."""
    cyclone.upgrade(bare_engine)
    with bare_engine.begin() as conn:
        conn.execute(sa.text("UPDATE cyclone_alembic_version SET version_num = 'cyclone_9999'"))
    wf = workflow(name)
    wf.submit_once(bare_engine, "k", 1)
    with cyclone.Worker(bare_engine, workflows=[wf]) as worker:
        assert worker.drain() == 1
    assert any("cyclone_9999" in record.getMessage() for record in caplog.records)


def test_schema_error_on_a_pool_of_one_does_not_wait_for_a_second_connection(
    fresh_database: URL, name: str
) -> None:
    """The revision lookup runs once the failed statement's connection is back in the pool."""
    engine = sa.create_engine(fresh_database, pool_size=1, max_overflow=0, pool_timeout=60)
    try:
        wf = workflow(name)
        for call in (
            lambda: wf.submit_once(engine, "k", 1),
            lambda: wf.submit(engine, 1),
            lambda: cyclone.Client(engine).list_runs(),
        ):
            with pytest.raises(cyclone.SchemaError, match="no cyclone revision found"):
                call()
    finally:
        engine.dispose()
