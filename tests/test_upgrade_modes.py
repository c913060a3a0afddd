"""cyclone.upgrade on a Connection (an application's migration transaction) and upgrade_sql."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

import cyclone
from cyclone import migrations


@pytest.fixture
def fresh_engine(fresh_database: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    yield engine
    engine.dispose()


def earlier_revisions() -> list[str]:
    """Every cyclone revision but the head, oldest first."""
    script = ScriptDirectory.from_config(migrations.alembic_config())
    ordered = [rev.revision for rev in script.walk_revisions()][::-1]
    return ordered[:-1]


def test_upgrade_takes_a_connection_outside_a_transaction(fresh_engine: sa.Engine) -> None:
    with fresh_engine.connect() as conn:
        cyclone.upgrade(conn)
        assert not conn.in_transaction()
    cyclone.check_schema(fresh_engine)


def test_upgrade_on_a_connection_joins_its_transaction(fresh_engine: sa.Engine) -> None:
    with fresh_engine.connect() as conn:
        conn.begin()
        cyclone.upgrade(conn)
        cyclone.check_schema(conn)
        conn.rollback()
    assert migrations.current_revision(fresh_engine) is None
    with fresh_engine.connect() as conn:
        conn.begin()
        cyclone.upgrade(conn)
        assert conn.in_transaction()
        conn.commit()
    cyclone.check_schema(fresh_engine)


@pytest.mark.parametrize("start", earlier_revisions())
def test_upgrade_sql_from_a_revision_holds_only_what_follows_it_and_applies(
    start: str, fresh_engine: sa.Engine, fresh_database: URL
) -> None:
    script = migrations.upgrade_sql(start)
    earlier = earlier_revisions()
    for rev in earlier[: earlier.index(start)]:
        assert f"Running upgrade {rev} ->" not in script
    assert f"Running upgrade {start} ->" in script
    assert "CREATE TABLE cyclone_runs" not in script
    cyclone.upgrade(fresh_engine, start)
    conninfo = fresh_database.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as driver:
        driver.execute(script.encode())
    cyclone.check_schema(fresh_engine)


def test_upgrade_sql_from_nothing_creates_the_schema(
    fresh_engine: sa.Engine, fresh_database: URL
) -> None:
    script = migrations.upgrade_sql(None)
    assert "CREATE TABLE cyclone_runs" in script
    conninfo = fresh_database.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as driver:
        driver.execute(script.encode())
    cyclone.check_schema(fresh_engine)


def test_upgrade_sql_from_an_unknown_revision_is_a_schema_error() -> None:
    with pytest.raises(cyclone.SchemaError, match="not a cyclone revision"):
        migrations.upgrade_sql("nope")


def shared_history(engine: sa.Engine, *revisions: str) -> None:
    """An application's ``alembic_version`` holding its head and these cyclone revisions."""
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)"))
        for revision in ("app_0001", *revisions):
            conn.execute(sa.text("INSERT INTO alembic_version VALUES (:r)"), {"r": revision})


def test_upgrade_refuses_the_shared_history_mode_before_writing_anything(
    fresh_engine: sa.Engine,
) -> None:
    shared_history(fresh_engine, "cyclone_0001")
    for call in (cyclone.upgrade, cyclone.downgrade):
        with pytest.raises(cyclone.SchemaError, match="is in the shared-history mode") as err:
            call(fresh_engine)
        assert "alembic upgrade heads" in str(err.value)
    with fresh_engine.connect() as conn:
        assert sa.inspect(conn).get_table_names() == ["alembic_version"]


def test_with_no_cyclone_revision_beside_an_application_history_check_names_both_modes(
    fresh_engine: sa.Engine,
) -> None:
    """What ``alembic downgrade cyclone@base`` leaves looks like an own-table application
    that never migrated cyclone: the error cannot pick one command."""
    shared_history(fresh_engine)
    found = migrations.find(fresh_engine)
    assert (found.mode, found.maybe_shared) == ("none", True)
    with pytest.raises(cyclone.SchemaError) as err:
        cyclone.check_schema(fresh_engine)
    assert "run `cyclone migrate` or cyclone.upgrade(engine) (own-table mode" in str(err.value)
    assert "or `alembic upgrade heads` in your application" in str(err.value)


def test_after_cyclone_downgrade_in_its_own_table_check_names_migrate_alone(
    fresh_engine: sa.Engine,
) -> None:
    shared_history(fresh_engine)  # the application's own alembic, as in the own-table mode
    cyclone.upgrade(fresh_engine)
    cyclone.downgrade(fresh_engine)
    found = migrations.find(fresh_engine)
    assert (found.mode, found.maybe_shared) == ("none", False)
    with pytest.raises(cyclone.SchemaError) as err:
        cyclone.check_schema(fresh_engine)
    assert "alembic upgrade heads" not in str(err.value)
    assert "cyclone migrate" in str(err.value)
