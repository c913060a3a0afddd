"""The ``cyclone`` console script, run as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone import migrations

ROOT = Path(__file__).resolve().parent.parent


def cli(
    url: URL, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "cyclone",
            "--url",
            url.render_as_string(hide_password=False),
            *args,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=60,
    )


def test_migrate_installs_the_schema_on_a_fresh_database(fresh_database: URL) -> None:
    done = cli(fresh_database, "migrate")
    assert done.returncode == 0, done.stderr
    assert migrations.head_revision() in done.stdout
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    cyclone.check_schema(engine)
    engine.dispose()


def test_migrate_sql_prints_the_ddl_without_a_database() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cyclone", "migrate", "--sql"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "CREATE TABLE cyclone_runs" in done.stdout
    assert "idx_runs_submit_key" in done.stdout


def test_worker_drain_runs_the_workflows_of_a_module(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    hello = cyclone.ResultWorkflow(name, output=str)

    @hello.result()
    def greet(ctx: cyclone.StepContext, who: str) -> str:
        raise AssertionError("the CLI worker runs it, not this process")

    run, _ = hello.submit_once(engine, "k", "ada")
    done = cli(
        database_url,
        "worker",
        "tests.support.cli_app",
        "--drain",
        env={"CYCLONE_CLI_WORKFLOW": name},
    )
    assert done.returncode == 0, done.stderr
    assert "ran 1 job\n" in done.stdout
    assert run.result(timeout=10) == "hello ada"

    listed = cli(database_url, "runs", "list", "--workflow", name)
    assert listed.returncode == 0, listed.stderr
    assert str(run.id) in listed.stdout
    assert "completed" in listed.stdout
