"""The Django app, driven the way a Django project drives it: manage.py in a subprocess.

``manage.py test`` runs the test project's own suite (tests/django_project/shop/tests.py:
TestCase and TransactionTestCase, the admin, the worker command) through Django's test
runner, which creates the test databases with ``migrate`` and drops them at the end.

To check another Django version, point CYCLONE_DJANGO_PYTHON at the interpreter of a
virtualenv holding it and cyclone[django], e.g. Django 4.2 LTS.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone import migrations
from tests.conftest import admin_url, wait_until
from tests.support import processes

pytest.importorskip("django", reason="the django extra is not installed")

PROJECT = Path(__file__).parent / "django_project"
PYTHON = os.environ.get("CYCLONE_DJANGO_PYTHON", sys.executable)
"""The interpreter running the project: set it to another virtualenv's to test another Django."""
DOCS = Path(__file__).parent.parent / "docs" / "django.md"


def environment(database: str) -> dict[str, str]:
    """The test project's settings take the server and the database names from here."""
    return {
        **os.environ,
        "CYCLONE_DATABASE_URL": admin_url().render_as_string(hide_password=False),
        "SHOP_DATABASE_NAME": database,
        "SHOP_ARCHIVE_NAME": f"{database}_archive",
    }


def manage(
    *args: str, database: str, timeout: float = 300, settings: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py *args``; ``settings``: a module file of settings to use instead (see
    :func:`settings_with`)."""
    env = environment(database)
    if settings is not None:
        env["DJANGO_SETTINGS_MODULE"] = settings.stem
        env["PYTHONPATH"] = os.pathsep.join(
            [str(settings.parent), *filter(None, [env.get("PYTHONPATH")])]
        )
    return processes.run(
        [PYTHON, "manage.py", *args],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def settings_with(tmp_path: Path, lines: str) -> Path:
    """A settings module: the test project's, then ``lines`` (a project's mistake)."""
    module = tmp_path / f"settings_{uuid.uuid4().hex[:8]}.py"
    module.write_text(f"from project.settings import *  # noqa: F403\n{lines}\n")
    return module


def databases_named(*names: str) -> list[str]:
    admin = sa.create_engine(admin_url(), poolclass=sa.NullPool)
    with admin.connect() as conn:
        found = conn.execute(
            sa.text("SELECT datname FROM pg_database WHERE datname = ANY(:names)"),
            {"names": list(names)},
        )
        rows = [row[0] for row in found]
    admin.dispose()
    return rows


def sessions_on(*names: str) -> int:
    admin = sa.create_engine(admin_url(), poolclass=sa.NullPool)
    with admin.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = ANY(:names)"),
            {"names": list(names)},
        ).scalar_one()
    admin.dispose()
    return int(count)


@pytest.mark.timeout(900)
def test_django_test_runner_passes_and_drops_its_test_databases() -> None:
    name = f"cyclone_dj_{uuid.uuid4().hex[:10]}"
    test_databases = (f"test_{name}", f"test_{name}_archive")
    try:
        done = manage("test", "--noinput", "-v", "2", database=name, timeout=840)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert re.search(r"^Ran \d+ tests? in", output, re.MULTILINE), output
        assert "OK" in output
        assert "being accessed by other users" not in output
        assert databases_named(*test_databases) == []
        assert sessions_on(*test_databases) == 0
    finally:
        admin = sa.create_engine(admin_url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
        with admin.connect() as conn:
            for database in test_databases:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


def test_manage_py_migrate_applies_cyclone_revisions_and_reverses_them(
    fresh_database: URL,
) -> None:
    database = fresh_database.database
    assert database is not None
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    try:
        done = manage("migrate", "--noinput", "--database", "default", database=database)
        assert done.returncode == 0, done.stderr
        assert migrations.current_revision(engine) == migrations.head_revision()

        done = manage("migrate", "cyclone", "zero", "--noinput", database=database)
        assert done.returncode == 0, done.stderr
        assert migrations.current_revision(engine) is None
        assert not sa.inspect(engine).has_table("cyclone_runs")

        done = manage("migrate", "--noinput", database=database)
        assert done.returncode == 0, done.stderr
        assert migrations.current_revision(engine) == migrations.head_revision()

        done = manage("cyclone", "migrate", database=database)
        assert done.returncode == 0, done.stderr
        done = manage("cyclone", "check", database=database)
        assert done.returncode == 0, done.stderr
    finally:
        engine.dispose()


def test_a_database_migrated_by_0001_only_gets_the_newer_revisions_from_0002(
    fresh_database: URL,
) -> None:
    """Reversing 0002 leaves the schema 0001 was written for (cyclone_0004); 0002 upgrades it."""
    database = fresh_database.database
    assert database is not None
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    try:
        assert manage("migrate", "--noinput", database=database).returncode == 0
        done = manage("migrate", "cyclone", "0001_initial", "--noinput", database=database)
        assert done.returncode == 0, done.stderr
        assert migrations.current_revision(engine) == "cyclone_0004"
        assert not sa.inspect(engine).has_table("cyclone_signals")

        done = manage("migrate", "cyclone", "--noinput", database=database)
        assert done.returncode == 0, done.stderr
        assert migrations.current_revision(engine) == migrations.head_revision()
        assert sa.inspect(engine).has_table("cyclone_signals")
        assert manage("cyclone", "check", database=database).returncode == 0
    finally:
        engine.dispose()


def test_manage_py_cyclone_worker_runs_runs_until_sigterm(fresh_database: URL) -> None:
    database = fresh_database.database
    assert database is not None
    assert manage("migrate", "--noinput", database=database).returncode == 0
    key = uuid.uuid4().hex
    submit = (
        "from cyclone.contrib.django import engine\n"
        "from shop.workflows import Probe, reconnect\n"
        f"reconnect.submit_once(engine(), {key!r}, Probe(alias='default'))\n"
    )
    assert manage("shell", "-c", submit, database=database).returncode == 0
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    client = cyclone.Client(engine)
    worker = processes.popen(
        [PYTHON, "manage.py", "cyclone", "worker", "--concurrency", "2"],
        cwd=PROJECT,
        env=environment(database),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (
                [run.state for run in client.list_runs(key=key)] == [cyclone.RunState.COMPLETED]
            ),
            timeout=60,
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=60)
        engine.dispose()
    assert worker.returncode == 0, err
    assert sessions_on(database) == 0


def test_manage_py_cyclone_on_an_unmigrated_database_says_to_migrate(
    fresh_database: URL,
) -> None:
    database = fresh_database.database
    assert database is not None
    done = manage("cyclone", "runs", "list", database=database)
    assert done.returncode == 4
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "migrate" in done.stderr


def test_manage_py_cyclone_help_says_the_database_is_the_projects() -> None:
    done = manage("cyclone", "--help", database="never_connected")
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stdout.split())
    assert done.stdout.startswith("Usage: manage.py cyclone"), done.stdout
    assert (
        "The database is the project's: the DATABASES alias that settings.CYCLONE_DATABASE "
        'names (default "default"); --url URL (before or after the command) overrides it.'
    ) in said
    assert "$CYCLONE_DATABASE_URL" not in said
    listing = manage("cyclone", "runs", "list", "--help", database="never_connected")
    assert listing.returncode == 0, listing.stderr
    assert "Use this database instead of the application's." in " ".join(listing.stdout.split())


SETTINGS_MISTAKES = [
    ('CYCLONE_DATABASE = "nope"', "settings.DATABASES has no alias 'nope'"),
    ("CYCLONE_DATABASE = 3", "settings.CYCLONE_DATABASE must be a DATABASES alias, got int"),
    (
        'DATABASES["lite"] = {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}\n'
        'CYCLONE_DATABASE = "lite"',
        "cyclone needs PostgreSQL: DATABASES['lite'] uses the sqlite backend",
    ),
    ('DATABASES["default"]["PORT"] = "fivefour"', "['PORT'] must be a port number"),
    ('CYCLONE_ENGINE_OPTIONS = "pool_size=3"', "settings.CYCLONE_ENGINE_OPTIONS must be a dict"),
    ("CYCLONE_ENGINE_OPTIONS = []", "settings.CYCLONE_ENGINE_OPTIONS must be a dict"),
    ('CYCLONE_ENGINE_OPTIONS = {"pool_sise": 3}', "'pool_sise'"),
    ('CYCLONE_ENGINE_OPTIONS = {"pool_size": "three"}', "settings.CYCLONE_ENGINE_OPTIONS:"),
    ("CYCLONE_WORKFLOW_MODULES = [3]", "must list absolute module paths, got 3"),
    ('CYCLONE_WORKFLOW_MODULES = [""]', "must list absolute module paths, got ''"),
]


@pytest.mark.parametrize(("lines", "said"), SETTINGS_MISTAKES)
def test_manage_py_cyclone_names_a_settings_mistake_in_one_line_with_exit_2(
    tmp_path: Path, lines: str, said: str
) -> None:
    """A settings mistake is bad usage (status 2), as a bad --url or MODULE is; it was
    status 1 with the exception's class name, or a TypeError from inside create_engine."""
    settings = settings_with(tmp_path, lines)
    done = manage("cyclone", "worker", "--drain", database="never_connected", settings=settings)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("cyclone: settings.") or done.stderr.startswith(
        "cyclone: cyclone needs PostgreSQL"
    ), done.stderr
    assert said in done.stderr
    assert "ImproperlyConfigured" not in done.stderr, done.stderr


@pytest.mark.parametrize(("lines", "said"), SETTINGS_MISTAKES)
def test_manage_py_check_reports_a_cyclone_settings_mistake(
    tmp_path: Path, lines: str, said: str
) -> None:
    settings = settings_with(tmp_path, lines)
    done = manage("check", database="never_connected", settings=settings)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"\(cyclone\.E00[123]\) .*" + re.escape(said), done.stderr), done.stderr


def test_manage_py_check_warns_of_a_misspelt_cyclone_setting(tmp_path: Path) -> None:
    settings = settings_with(tmp_path, 'CYCLONE_DATABSE = "archive"')
    done = manage("check", database="never_connected", settings=settings)
    assert done.returncode == 0, done.stderr
    assert "(cyclone.W001) settings.CYCLONE_DATABSE is not a cyclone setting" in done.stderr
    assert "did you mean CYCLONE_DATABASE?" in done.stderr
    assert manage("check", database="never_connected").stderr == ""


def test_a_submit_with_bad_engine_options_names_the_setting_and_writes_nothing(
    fresh_database: URL, tmp_path: Path
) -> None:
    database = fresh_database.database
    assert database is not None
    assert manage("migrate", "--noinput", database=database).returncode == 0
    settings = settings_with(tmp_path, 'CYCLONE_ENGINE_OPTIONS = {"pool_sise": 3}')
    submit = (
        "from django.core.exceptions import ImproperlyConfigured\n"
        "from django.db import connection, transaction\n"
        "from shop.workflows import restock\n"
        "try:\n"
        "    with transaction.atomic():\n"
        "        restock.submit_once_tx(connection, 'k', 'tea')\n"
        "except ImproperlyConfigured as exc:\n"
        "    print('refused:', exc)\n"
    )
    done = manage("shell", "-c", submit, database=database, settings=settings)
    assert done.returncode == 0, done.stderr
    assert "refused: settings.CYCLONE_ENGINE_OPTIONS: " in done.stdout, done.stdout
    assert "'pool_sise'" in done.stdout
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    try:
        assert cyclone.Client(engine).list_runs() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("option", ["--grace", "--heartbeat", "--rescue-after"])
def test_manage_py_cyclone_worker_refuses_nan_seconds_as_bad_usage(option: str) -> None:
    """nan passed click's FloatRange: --grace nan was taken, --heartbeat nan was status 1."""
    done = manage("cyclone", "worker", option, "nan", "--drain", database="never_connected")
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"cyclone: Invalid value for '{option}': 'nan' is not a number of seconds "
        "(see 'manage.py cyclone worker --help')\n"
    )


@pytest.mark.parametrize("args", [(), ("runs",)])
def test_manage_py_cyclone_without_a_command_prints_its_help_and_exits_2(
    args: tuple[str, ...],
) -> None:
    """As ``cyclone`` does; the help was printed as one "cyclone: Usage: ..." error."""
    done = manage("cyclone", *args, database="never_connected")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"Usage: manage.py cyclone {' '.join(args)}".rstrip()), (
        done.stderr
    )
    assert "Commands:" in done.stderr


def test_models_match_the_shipped_django_migrations(fresh_database: URL) -> None:
    database = fresh_database.database
    assert database is not None
    done = manage("makemigrations", "--check", "--dry-run", database=database)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No changes detected" in done.stdout


def test_newest_django_migration_is_written_for_cyclones_head_revision() -> None:
    """A cyclone release adding alembic revisions must add a Django migration too.

    Each Django migration upgrades to head, so a fresh database gets everything from
    0001; a database that applied the older ones gets the new revisions only through a
    new Django migration (or ``manage.py cyclone migrate``).
    """
    folder = Path(migrations.__file__).parent / "contrib" / "django" / "migrations"
    names = sorted(path.stem for path in folder.glob("[0-9][0-9][0-9][0-9]_*.py"))
    newest = importlib.import_module(f"cyclone.contrib.django.migrations.{names[-1]}")
    assert newest.Migration.revision == migrations.head_revision(), (
        f"add cyclone/contrib/django/migrations/{int(names[-1][:4]) + 1:04d}_....py "
        f"(revision = {migrations.head_revision()!r}, depending on {names[-1]!r})"
    )


COMMANDS_RUN_BY_TESTS = {
    "pip install 'cyclone[django]'": "test_the_django_extra_brings_django_and_click",
    "python manage.py migrate": (
        "test_manage_py_migrate_applies_cyclone_revisions_and_reverses_them"
    ),
    "python manage.py cyclone migrate": (
        "test_manage_py_migrate_applies_cyclone_revisions_and_reverses_them"
    ),
    "python manage.py cyclone worker": "test_manage_py_cyclone_worker_runs_runs_until_sigterm",
    "python manage.py cyclone worker --drain": (
        "shop.tests.WorkerTests.test_manage_py_cyclone_worker_drain_runs_the_run"
    ),
    "python manage.py test": "test_django_test_runner_passes_and_drops_its_test_databases",
}


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOCS.read_text(), flags=re.DOTALL)


def test_every_python_snippet_of_docs_django_md_is_taken_from_the_test_project() -> None:
    """The docs show code the Django test run executes: each snippet is a verbatim excerpt."""
    sources = [path.read_text() for path in PROJECT.rglob("*.py") if "migrations" not in path.parts]
    snippets = _blocks("python")
    assert snippets
    for snippet in snippets:
        assert any(snippet in text for text in sources), (
            f"this snippet of docs/django.md is in no file of the test project:\n{snippet}"
        )


def test_every_command_of_docs_django_md_is_run_by_a_test() -> None:
    commands = [line for block in _blocks("bash") for line in block.splitlines() if line]
    assert commands
    for command in commands:
        assert command in COMMANDS_RUN_BY_TESTS, f"no test runs `{command}` from docs/django.md"


def test_the_django_extra_brings_django_and_click() -> None:
    requires = importlib.metadata.requires("cyclone") or []
    extra = [
        req.split(";")[0].strip()
        for req in requires
        if re.search(r"extra\s*==\s*[\"']django[\"']", req)
    ]
    assert {re.split(r"[<>=!~ ]", req)[0].lower() for req in extra} >= {"django", "click"}
