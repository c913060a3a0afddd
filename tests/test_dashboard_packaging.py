"""The wheel ships the dashboard's templates, stylesheet and script, and pages render from it."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest
from sqlalchemy.engine import URL

from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "cyclone" / "dashboard"


@pytest.fixture
def wheel(cyclone_wheel: Path) -> Path:
    return cyclone_wheel


def test_wheel_ships_every_template_and_static_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = {
        f"cyclone/dashboard/{p.relative_to(PACKAGE).as_posix()}"
        for folder in ("templates", "static")
        for p in (PACKAGE / folder).iterdir()
    }
    assert {
        "cyclone/dashboard/templates/run.html",
        "cyclone/dashboard/static/style.css",
        "cyclone/dashboard/static/live.js",
    } <= assets
    assert assets <= names
    assert "cyclone/contrib/django/dashboard.py" in names
    for page in ("run_change_form", "job_change_form"):
        assert f"cyclone/contrib/django/templates/cyclone/admin/{page}.html" in names


def test_the_dashboard_extra_brings_the_production_server(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    (metadata,) = (n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    requires = archive.read(metadata).decode().splitlines()
    assert "Requires-Dist: waitress>=3; extra == 'dashboard'" in requires


@pytest.mark.processes
def test_pages_render_from_the_installed_wheel(
    wheel: Path, database_url: URL, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sys, sqlalchemy as sa, cyclone.dashboard as d;"
        "from werkzeug.test import Client;"
        "assert d.__file__.startswith(sys.argv[2]), d.__file__;"
        "c = Client(d.create_app(sa.create_engine(sys.argv[1])));"
        "page, css, js = c.get('/runs'), c.get('/static/style.css'), c.get('/static/live.js');"
        "print(page.status_code, css.status_code, js.status_code,"
        " '<h1>Runs</h1>' in page.get_data(as_text=True))"
    )
    done = processes.run(
        [sys.executable, "-c", code, database_url.render_as_string(hide_password=False), str(site)],
        env={**os.environ, "PYTHONPATH": str(site)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["200", "200", "200", "True"]
