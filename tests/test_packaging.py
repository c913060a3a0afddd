"""The wheel carries the revisions and the type marker, and migrates a database from them."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def wheel(cyclone_wheel: Path) -> Path:
    return cyclone_wheel


def test_wheel_ships_the_revisions_and_py_typed(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "cyclone/py.typed" in names
    assert "cyclone/_alembic/env.py" in names
    assert "cyclone/_alembic/script.py.mako" in names
    revisions = {n for n in names if n.startswith("cyclone/_alembic/versions/")}
    shipped = {
        f"cyclone/_alembic/versions/{p.name}" for p in (ROOT / "alembic/versions").glob("*.py")
    }
    assert revisions == shipped
    assert not any(n.startswith("alembic/") for n in names), "would shadow the alembic library"


def test_installed_package_upgrades_a_fresh_database(
    wheel: Path, fresh_database: URL, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sqlalchemy as sa, cyclone, cyclone.migrations as m, sys;"
        "assert '_alembic' in m.script_location(), m.script_location();"
        "e = sa.create_engine(sys.argv[1]); cyclone.upgrade(e); cyclone.upgrade(e);"
        "cyclone.check_schema(e); print(m.current_revision(e))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    url = fresh_database.render_as_string(hide_password=False)
    done = processes.run(
        [sys.executable, "-c", code, url], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    with engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
    engine.dispose()
    assert {"cyclone_runs", "cyclone_jobs", "cyclone_alembic_version"} <= tables
