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
