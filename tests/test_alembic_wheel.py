"""docs/migrations.md, run as written: alembic's own commands against the built wheel.

One clean virtualenv for the module gets the wheel (and its dependencies); an application
directory is made with ``alembic init`` and the snippets of docs/migrations.md, and
alembic's commands run in it as an application's pipeline would.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from cyclone import migrations
from tests.conftest import admin_url, own_database
from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "migrations.md"
SNIPPET = re.compile(r"<!-- snippet: (\S+) -->\n```(\w+)\n(.*?)```", re.DOTALL)
USED = {
    "own-shell",
    "own-python",
    "own-from-app-revision",
    "own-offline",
    "own-app-offline",
    "shared-ini",
    "shared-env",
    "shared-shell",
    "shared-offline",
    "shared-remove",
}

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]


def snippets() -> dict[str, str]:
    return {name: body for name, _lang, body in SNIPPET.findall(DOC.read_text())}


def test_every_block_of_the_doc_is_a_snippet_these_tests_run() -> None:
    text = DOC.read_text()
    assert text.count("```") == 2 * len(USED)
    assert set(snippets()) == USED


@dataclass
class Venv:
    bin: Path

    def run(
        self,
        *args: str,
        cwd: Path,
        env: dict[str, str] | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "PATH": f"{self.bin}:{os.environ['PATH']}", **(env or {})}
        full_env.pop("PYTHONPATH", None)
        full_env.pop("VIRTUAL_ENV", None)
        done = processes.run(
            args,
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done

    def python(self, code: str, *, cwd: Path, env: dict[str, str] | None = None) -> str:
        return self.run(str(self.bin / "python"), "-c", code, cwd=cwd, env=env).stdout


@pytest.fixture(scope="session")  # TOGETHER's "wheel" modules may interleave in a process
def venv(tmp_path_factory: pytest.TempPathFactory, cyclone_wheel: Path) -> Venv:
    wheel = cyclone_wheel
    home = tmp_path_factory.mktemp("venv")
    processes.run([sys.executable, "-m", "venv", str(home)], check=True, capture_output=True)
    processes.run(
        [str(home / "bin" / "pip"), "install", "-q", f"{wheel}[cli]"],
        check=True,
        capture_output=True,
    )
    return Venv(home / "bin")


def fresh() -> str:
    """A fresh database's URL (psycopg 3), checked at rest and dropped after the test."""
    return own_database("cyclone_wheel").render_as_string(hide_password=False)


database = pytest.fixture(fresh, name="database")
other_database = pytest.fixture(fresh, name="other_database")


MODELS = """
import os

import sqlalchemy as sa

metadata = sa.MetaData()
columns = [sa.Column("id", sa.Integer, primary_key=True)]
if os.environ.get("APP_WITH_NOTE"):
    columns.append(sa.Column("note", sa.Text))
orders = sa.Table("orders", metadata, *columns)
"""

APP_ROOT_REVISION = '''
"""Orders.

Revision ID: app_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade() -> None:
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True))


def downgrade() -> None:
    op.drop_table("orders")
'''


def make_app(venv: Venv, where: Path, *, shared: bool) -> Path:
    """An application directory: ``alembic init``, then the docs' files (or own-mode ones)."""
    where.mkdir()
    venv.run("alembic", "init", "--template", "generic", "migrations", cwd=where)
    docs = snippets()
    if shared:
        (where / "alembic.ini").write_text(docs["shared-ini"])
    else:
        (where / "alembic.ini").write_text(
            "[alembic]\nscript_location = %(here)s/migrations\nprepend_sys_path = %(here)s\n"
        )
        versions = where / "migrations" / "versions"
        (versions / "app_0002_cyclone.py").write_text(docs["own-from-app-revision"])
    (where / "migrations" / "env.py").write_text(docs["shared-env"])
    (where / "models.py").write_text(MODELS)
    (where / "migrations" / "versions" / "app_0001_orders.py").write_text(APP_ROOT_REVISION)
    return where


def shell(venv: Venv, snippet: str, *, cwd: Path, env: dict[str, str]) -> None:
    """Run each line of a bash snippet of the doc, as written, in the application's directory."""
    for line in snippets()[snippet].splitlines():
        venv.run("bash", "-c", line, cwd=cwd, env=env)


def apply_sql(url: str, path: Path) -> None:
    """Run an offline script as a DBA would (psql's job, through psycopg)."""
    conninfo = sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(path.read_bytes())


def found(url: str) -> tuple[str, str | None]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        result = migrations.find(engine)
    finally:
        engine.dispose()
    return result.mode, result.revision


def version_rows(url: str, table: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return set(conn.execute(sa.text(f"SELECT version_num FROM {table}")).scalars())
    finally:
        engine.dispose()


def tables(url: str) -> set[str]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def test_shared_history_upgrade_heads_and_autogenerate_with_head(
    venv: Venv, database: str, tmp_path: Path
) -> None:
    app = make_app(venv, tmp_path / "app", shared=True)
    env = {"APP_DATABASE_URL": database}
    refused = venv.run("alembic", "upgrade", "head", cwd=app, env=env, check=False)
    assert refused.returncode != 0
    assert "Multiple head revisions" in refused.stdout + refused.stderr
    shell = [shlex.split(line) for line in snippets()["shared-shell"].splitlines()]
    venv.run(*shell[0], cwd=app, env=env)
    head = migrations.head_revision()
    assert found(database) == ("shared", head)
    assert version_rows(database, "alembic_version") == {"app_0001", head}
    assert "cyclone_alembic_version" not in tables(database)

    env_note = {**env, "APP_WITH_NOTE": "1"}
    venv.run(*shell[1], cwd=app, env=env_note)
    (made,) = [
        path
        for path in (app / "migrations" / "versions").glob("*.py")
        if path.name != "app_0001_orders.py"
    ]
    text = made.read_text()
    assert "op.add_column('orders'" in text
    assert re.search(r"^down_revision.*'app_0001'", text, re.MULTILINE)
    assert "drop_table" not in text
    assert "cyclone" not in text
    venv.run(*shell[2], cwd=app, env=env_note)
    engine = sa.create_engine(database, poolclass=sa.NullPool)
    with engine.connect() as conn:
        assert "note" in {c["name"] for c in sa.inspect(conn).get_columns("orders")}
    engine.dispose()
    check = "import sqlalchemy as sa, cyclone; cyclone.check_schema(sa.create_engine(%r))"
    venv.python(check % database, cwd=app)


def test_own_table_from_an_application_revision_and_from_the_console_script(
    venv: Venv, database: str, other_database: str, tmp_path: Path
) -> None:
    app = make_app(venv, tmp_path / "app", shared=False)
    env = {"APP_DATABASE_URL": database}
    venv.run("alembic", "upgrade", "head", cwd=app, env=env)
    head = migrations.head_revision()
    assert version_rows(database, "alembic_version") == {"app_0002"}
    assert version_rows(database, "cyclone_alembic_version") == {head}
    assert {"orders", "shipments", "cyclone_runs"} <= tables(database)
    assert found(database) == ("own", head)
    venv.run("alembic", "downgrade", "app_0001", cwd=app, env=env)
    assert not {"shipments", "cyclone_runs", "cyclone_jobs"} & tables(database)

    # The console script and the Python calls of the doc, on another fresh database.
    env = {"CYCLONE_DATABASE_URL": other_database}
    venv.run(*snippets()["own-shell"].split(), cwd=app, env=env)
    assert version_rows(other_database, "cyclone_alembic_version") == {head}
    code = f"import sqlalchemy as sa\nengine = sa.create_engine({other_database!r})\n"
    venv.python(code + snippets()["own-python"], cwd=app)
    offline = venv.python(snippets()["own-offline"], cwd=app)
    assert offline == migrations.upgrade_sql("cyclone_0003") + "\n"


IN_FLIGHT = """
import sys, uuid
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
import cyclone
from cyclone import migrations

admin, app_ini, revisions = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
wf = cyclone.Workflow("inflight")


@wf.step()
def s0(ctx, value):
    return value


admin_engine = sa.create_engine(admin, isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
for mode in ("own", "shared"):
    for revision in revisions:
        name = f"cyclone_inflight_{uuid.uuid4().hex[:8]}"
        with admin_engine.connect() as c:
            c.execute(sa.text(f'CREATE DATABASE "{name}"'))
        url = sa.make_url(admin).set(database=name)
        engine = sa.create_engine(url)
        config = Config(app_ini)
        if mode == "own":
            cyclone.upgrade(engine, revision)
        else:
            import os
            os.environ["APP_DATABASE_URL"] = url.render_as_string(hide_password=False)
            command.upgrade(config, "app@head")
            command.upgrade(config, revision)
        assert migrations.find(engine).revision == revision
        run_id = uuid.uuid4()
        with engine.begin() as c:  # a run and its job in flight, in the revision's columns
            graph_column = c.execute(sa.text(
                "SELECT count(*) FROM information_schema.columns "
                "WHERE table_name = 'cyclone_runs' AND column_name = 'graph'")).scalar_one()
            if graph_column:  # before cyclone_0020_definitions: the run keeps its graph
                c.execute(sa.text(
                    "INSERT INTO cyclone_runs (id, workflow, submit_key, input, graph, state, "
                    "steps_remaining) VALUES (:id, 'inflight', 'k', '7', CAST(:g AS jsonb), "
                    "'running', 1)"), {"id": run_id, "g": wf.plan().graph})
            else:  # since: the run names its stored definition
                c.execute(sa.text(
                    "WITH d AS (INSERT INTO cyclone_definitions (id, workflow, graph) "
                    "VALUES (gen_random_uuid(), 'inflight', CAST(:g AS jsonb)) RETURNING id) "
                    "INSERT INTO cyclone_runs (id, workflow, submit_key, input, definition, "
                    "state, steps_remaining) SELECT :id, 'inflight', 'k', '7', d.id, "
                    "'running', 1 FROM d"), {"id": run_id, "g": wf.plan().graph})
            c.execute(sa.text(
                "INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, state, max_attempts) "
                "VALUES (:id, 'inflight', 's0', 'default', 'available', 3)"), {"id": run_id})
        try:
            cyclone.check_schema(engine)
            raise AssertionError("an old revision passed check_schema")
        except cyclone.SchemaError as exc:
            fix = "cyclone migrate" if mode == "own" else "alembic upgrade heads"
            assert fix in str(exc), str(exc)
        if mode == "own":
            cyclone.upgrade(engine)
        else:
            command.upgrade(config, "heads")
        cyclone.check_schema(engine)
        with cyclone.Worker(engine, workflows=[wf]) as worker:
            assert worker.drain() == 1
        run, created = wf.submit_once(engine, "k", 7)
        assert (run.id, created) == (run_id, False)
        assert run.status().state == cyclone.RunState.COMPLETED
        cyclone.close(engine)
        engine.dispose()
        with admin_engine.connect() as c:
            c.execute(sa.text(f'DROP DATABASE "{name}"'))
        print(mode, revision, "ok")
"""


def test_an_upgrade_from_every_earlier_revision_with_runs_in_flight_in_both_modes(
    venv: Venv, tmp_path: Path
) -> None:
    app = make_app(venv, tmp_path / "app", shared=True)
    script = ScriptDirectory.from_config(migrations.alembic_config())
    earlier = [rev.revision for rev in script.walk_revisions()][::-1][:-1]
    assert earlier
    (tmp_path / "inflight.py").write_text(textwrap.dedent(IN_FLIGHT))
    admin = admin_url().render_as_string(hide_password=False)
    done = venv.run(
        str(venv.bin / "python"),
        str(tmp_path / "inflight.py"),
        admin,
        str(app / "alembic.ini"),
        ",".join(earlier),
        cwd=app,
        # Two upgrades per earlier revision: about a minute here, two on a loaded machine.
        timeout=270,
    )
    assert done.stdout.split("\n")[:-1] == [
        f"{mode} {rev} ok" for mode in ("own", "shared") for rev in earlier
    ]


CHECK_EITHER = (
    "run `cyclone migrate` (own-table mode, the default), or `alembic upgrade heads` in your "
    "application if its alembic history holds cyclone's revisions (shared-history mode)\n"
)


def test_shared_history_mode_migrate_refuses_and_check_names_the_mode_and_its_command(
    venv: Venv, database: str, tmp_path: Path
) -> None:
    app = make_app(venv, tmp_path / "app", shared=True)
    env = {"APP_DATABASE_URL": database, "CYCLONE_DATABASE_URL": database}
    venv.run("alembic", "upgrade", "heads", cwd=app, env=env)
    head = migrations.head_revision()

    refused = venv.run("cyclone", "migrate", cwd=app, env=env, check=False)
    assert refused.returncode == 1
    assert refused.stdout == ""
    assert refused.stderr.count("\n") == 1
    assert "is in the shared-history mode" in refused.stderr
    assert refused.stderr.endswith("run `alembic upgrade heads` in your application\n")
    assert "cyclone_alembic_version" not in tables(database)  # nothing written
    library = venv.run(
        "python",
        "-c",
        f"import sqlalchemy as sa, cyclone; cyclone.upgrade(sa.create_engine({database!r}))",
        cwd=app,
        env=env,
        check=False,
    )
    assert library.returncode == 1
    assert "cyclone.errors.SchemaError" in library.stderr
    assert "shared-history mode" in library.stderr

    checked = venv.run("cyclone", "check", cwd=app, env=env)
    assert checked.stdout.splitlines() == [
        f"found     {head}",
        "mode      shared-history mode (alembic_version)",
        f"expected  {head}",
    ]

    venv.run("alembic", "downgrade", "cyclone@-1", cwd=app, env=env)
    behind = venv.run("cyclone", "check", cwd=app, env=env, check=False)
    assert behind.returncode == 4
    assert behind.stderr.endswith(
        f"in your application's alembic history (shared-history mode), this version needs "
        f"{head}: run `alembic upgrade heads` in your application\n"
    )
    assert "cyclone migrate" not in behind.stderr

    # The doc's removal, line by line: downgrade cyclone@base, check, upgrade heads again.
    lines = snippets()["shared-remove"].splitlines()
    venv.run("bash", "-c", lines[0], cwd=app, env=env)
    assert found(database) == ("none", None)
    assert version_rows(database, "alembic_version") == {"app_0001"}
    assert not {"cyclone_runs", "cyclone_jobs", "cyclone_alembic_version"} & tables(database)
    removed = venv.run("bash", "-c", lines[1], cwd=app, env=env, check=False)
    assert removed.returncode == 4
    assert removed.stdout.splitlines()[1] == "mode      unknown"
    assert removed.stderr.count("\n") == 1
    assert removed.stderr.endswith("has no cyclone schema: " + CHECK_EITHER)
    venv.run("bash", "-c", lines[2], cwd=app, env=env)
    assert found(database) == ("shared", head)


def test_shared_history_mode_offline_scripts_install_and_remove_cyclone(
    venv: Venv, database: str, tmp_path: Path
) -> None:
    app = make_app(venv, tmp_path / "app", shared=True)
    shell(venv, "shared-offline", cwd=app, env={})  # no database: --sql never connects
    upgrade = (app / "upgrade.sql").read_text()
    assert "CREATE TABLE cyclone_runs" in upgrade
    assert upgrade.count("BEGIN;") == upgrade.count("COMMIT;") == 1
    assert tables(database) == set()

    apply_sql(database, app / "upgrade.sql")
    head = migrations.head_revision()
    assert found(database) == ("shared", head)
    assert version_rows(database, "alembic_version") == {"app_0001", head}
    assert "cyclone_alembic_version" not in tables(database)
    checked = venv.run("cyclone", "check", "--url", database, cwd=app)
    assert "mode      shared-history mode (alembic_version)" in checked.stdout

    apply_sql(database, app / "remove-cyclone.sql")
    assert found(database) == ("none", None)
    assert version_rows(database, "alembic_version") == {"app_0001"}
    assert tables(database) == {"alembic_version", "orders"}


def test_own_table_mode_app_revision_under_alembic_sql_writes_cyclone_ddl_into_the_script(
    venv: Venv, database: str, tmp_path: Path
) -> None:
    app = make_app(venv, tmp_path / "app", shared=False)
    shell(venv, "own-app-offline", cwd=app, env={})  # no database: --sql never connects
    upgrade = (app / "upgrade.sql").read_text()
    assert upgrade.count("BEGIN;") == upgrade.count("COMMIT;") == 1  # one transaction
    assert upgrade.index("CREATE TABLE cyclone_runs") < upgrade.index("CREATE TABLE shipments")

    apply_sql(database, app / "upgrade.sql")
    head = migrations.head_revision()
    assert version_rows(database, "alembic_version") == {"app_0002"}
    assert version_rows(database, "cyclone_alembic_version") == {head}
    assert {"orders", "shipments", "cyclone_runs", "cyclone_jobs"} <= tables(database)
    checked = venv.run("cyclone", "check", "--url", database, cwd=app)
    assert "mode      own-table mode (cyclone_alembic_version)" in checked.stdout

    apply_sql(database, app / "downgrade.sql")
    assert version_rows(database, "alembic_version") == {"app_0001"}
    assert found(database) == ("none", None)
    assert tables(database) == {"alembic_version", "cyclone_alembic_version", "orders"}
    # cyclone's own (empty) table is left: the mode is known, and check names migrate alone.
    after = venv.run("cyclone", "check", "--url", database, cwd=app, check=False)
    assert after.returncode == 4
    assert after.stderr.endswith("has no cyclone schema: run `cyclone migrate`\n")
