"""Every command and option of the ``cyclone`` group through click's CliRunner, real PostgreSQL."""

from __future__ import annotations

import json
import socket
import sys
import threading
import types
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import click
import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from click.testing import CliRunner, Result
from sqlalchemy.engine import URL

import cyclone
from cyclone import migrations
from cyclone.cli import _app as cli_app
from cyclone.cli import build_cli
from cyclone.schema import jobs, runs
from tests.support import cli_defs
from tests.support.factories import finish
from tests.support.workers import rescue_lost_jobs

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def url_text(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def invoke(
    url: URL | None, *args: str, cli: Any = None, env: dict[str, str] | None = None
) -> Result:
    """Run the group with ``--url`` after the subcommand (as most users type it)."""
    argv = [*args, "--url", url_text(url)] if url is not None else list(args)
    return CliRunner().invoke(cli or build_cli(), argv, env=env)


def json_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def failing_workflow(name: str) -> cyclone.ResultWorkflow[Any, Any]:
    wf: cyclone.ResultWorkflow[Any, Any] = cyclone.ResultWorkflow(name, output=Any)

    @wf.step()
    def prepare(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    @wf.result(after=[prepare], max_attempts=2)
    def explode(ctx: cyclone.StepContext, value: Any) -> Any:
        if value == "bad":
            raise ValueError(f"cannot handle {value}")
        return {"doubled": value * 2}

    return wf


def drain(engine: sa.Engine, *workflows: cyclone.Workflow[Any], **kwargs: Any) -> None:
    cyclone.Worker(engine, workflows=workflows, backoff=lambda n: 0.0, **kwargs).drain()


@pytest.fixture
def migrated(fresh_database: URL) -> URL:
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    engine.dispose()
    return fresh_database


@contextmanager
def scratch_engine(url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        yield engine
    finally:
        engine.dispose()


# -- the database: --url, the environment, drivers ---------------------------------------


def test_url_is_accepted_before_and_after_the_subcommand(database_url: URL, name: str) -> None:
    before = CliRunner().invoke(build_cli(), ["--url", url_text(database_url), "runs", "list"])
    after = invoke(database_url, "runs", "list", "--workflow", name)
    assert before.exit_code == 0, before.output
    assert after.exit_code == 0, after.output
    assert after.stdout.splitlines()[0].split()[:2] == ["ID", "WORKFLOW"]


def test_url_comes_from_the_environment_when_not_given(database_url: URL, name: str) -> None:
    done = invoke(None, "check", env={"CYCLONE_DATABASE_URL": url_text(database_url)})
    assert done.exit_code == 0, done.output


def test_no_url_anywhere_is_a_usage_error() -> None:
    done = invoke(None, "runs", "list", env={"CYCLONE_DATABASE_URL": ""})
    assert done.exit_code == 2
    assert done.stderr == "cyclone: no database given: pass --url URL or set CYCLONE_DATABASE_URL\n"


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_url_without_a_driver_uses_psycopg_3(database_url: URL, scheme: str) -> None:
    plain = url_text(database_url).replace("postgresql+psycopg://", f"{scheme}://")
    done = CliRunner().invoke(build_cli(), ["check", "--url", plain])
    assert done.exit_code == 0, done.output


def test_a_url_naming_another_driver_is_refused_in_one_line(database_url: URL) -> None:
    other = url_text(database_url).replace("+psycopg", "+psycopg2")
    done = CliRunner().invoke(build_cli(), ["check", "--url", other])
    assert done.exit_code == 2
    assert done.stderr.count("\n") == 1
    assert "names the driver 'psycopg2'" in done.stderr
    assert "postgresql+psycopg://" in done.stderr


def test_a_url_of_another_database_is_refused() -> None:
    done = CliRunner().invoke(build_cli(), ["check", "--url", "mysql://root@localhost/db"])
    assert done.exit_code == 2
    assert "is not PostgreSQL" in done.stderr


def test_the_host_engine_is_used_when_no_url_is_given(engine: sa.Engine, name: str) -> None:
    calls: list[str] = []

    def host_engine() -> sa.Engine:
        calls.append("engine")
        return engine

    done = CliRunner().invoke(
        build_cli(engine=host_engine), ["runs", "list"], env={"CYCLONE_DATABASE_URL": ""}
    )
    assert done.exit_code == 0, done.output
    assert calls == ["engine"]


def test_version_prints_the_package_version() -> None:
    done = CliRunner().invoke(build_cli(), ["--version"])
    assert done.exit_code == 0
    assert done.stdout == f"cyclone {cyclone.__version__}\n"


def test_help_shows_no_restructuredtext() -> None:
    for args in (["--help"], ["runs", "show", "--help"], ["worker", "--help"], ["purge", "-h"]):
        done = CliRunner().invoke(build_cli(), args)
        assert done.exit_code == 0, done.output
        assert "``" not in done.stdout
        assert ":class:" not in done.stdout


# -- migrate and check ---------------------------------------------------------------


def revisions() -> list[str]:
    """cyclone's revisions, oldest first."""
    script = ScriptDirectory.from_config(migrations.alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def test_check_exits_4_on_a_fresh_database_and_0_after_migrate(fresh_database: URL) -> None:
    before = invoke(fresh_database, "check")
    assert before.exit_code == 4
    assert before.stdout.split() == [
        "found",
        "nothing",
        "mode",
        "none",
        "expected",
        migrations.head_revision(),
    ]
    assert "has no cyclone schema: run `cyclone migrate`" in before.stderr

    done = invoke(fresh_database, "migrate")
    assert done.exit_code == 0, done.output
    assert done.stdout == f"cyclone schema upgraded from nothing to {migrations.head_revision()}\n"
    again = invoke(fresh_database, "migrate")
    assert again.stdout == f"cyclone schema already at {migrations.head_revision()}\n"

    after = invoke(fresh_database, "check")
    assert after.exit_code == 0, after.output
    head = migrations.head_revision()
    assert after.stdout.splitlines() == [
        f"found     {head}",
        "mode      own-table mode (cyclone_alembic_version)",
        f"expected  {head}",
    ]


def test_check_on_an_older_schema_names_both_revisions(fresh_database: URL) -> None:
    older = revisions()[-2]
    with scratch_engine(fresh_database) as engine:
        migrations.upgrade(engine, older)
    done = invoke(fresh_database, "check")
    assert done.exit_code == 4
    assert f"is at cyclone revision {older}, this version needs {migrations.head_revision()}" in (
        done.stderr
    )
    listing = invoke(fresh_database, "runs", "list")
    assert listing.exit_code == 4
    assert "run `cyclone migrate`" in listing.stderr


def test_migrate_sql_from_a_revision_prints_only_the_later_ones() -> None:
    *_, previous, head = revisions()
    done = CliRunner().invoke(build_cli(), ["migrate", "--sql", "--from", previous])
    assert done.exit_code == 0, done.output
    assert f"Running upgrade {previous} -> {head}" in done.stdout
    assert "CREATE TABLE cyclone_runs" not in done.stdout
    assert done.stdout.count("Running upgrade") == 1

    full = CliRunner().invoke(build_cli(), ["migrate", "--sql"])
    assert "CREATE TABLE cyclone_runs" in full.stdout
    assert full.stdout.count("Running upgrade") == len(revisions())


def test_migrate_from_without_sql_is_a_usage_error() -> None:
    done = CliRunner().invoke(build_cli(), ["migrate", "--from", revisions()[0]])
    assert done.exit_code == 2
    assert "--from goes with --sql" in done.output


def test_migrate_sql_from_an_unknown_revision_is_one_line() -> None:
    done = CliRunner().invoke(build_cli(), ["migrate", "--sql", "--from", "nope"])
    assert done.exit_code == 2
    assert done.stderr.startswith("cyclone: cannot print the SQL from 'nope': ")
    assert done.stderr.count("\n") == 1


# -- runs ------------------------------------------------------------------------------


def test_runs_list_filters_by_workflow_state_key_since_and_limit(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    good, _ = wf.submit_once(engine, "good", 21)
    bad, _ = wf.submit_once(engine, "bad", "bad")
    drain(engine, wf)
    pending, _ = wf.submit_once(engine, "pending", 1)

    listed = invoke(database_url, "runs", "list", "--workflow", name, "--json")
    assert [row["id"] for row in json_lines(listed)] == [str(pending.id), str(bad.id), str(good.id)]

    failed = json_lines(
        invoke(database_url, "runs", "list", "--workflow", name, "--state", "failed", "--json")
    )
    assert [row["id"] for row in failed] == [str(bad.id)]
    assert failed[0]["error"]["type"] == "ValueError"
    assert failed[0]["failed_step"] == "explode"

    keyed = json_lines(
        invoke(database_url, "runs", "list", "--key", "good", "--workflow", name, "--json")
    )
    assert [row["key"] for row in keyed] == ["good"]

    limited = json_lines(
        invoke(database_url, "runs", "list", "--workflow", name, "--limit", "1", "--json")
    )
    assert [row["id"] for row in limited] == [str(pending.id)]

    with engine.begin() as conn:
        conn.execute(
            runs.update()
            .where(runs.c.id == good.id)
            .values(created_at=sa.func.now() - timedelta(hours=3))
        )
    recent = json_lines(
        invoke(database_url, "runs", "list", "--workflow", name, "--since", "1h", "--json")
    )
    assert str(good.id) not in {row["id"] for row in recent}
    assert len(recent) == 2
    iso = (datetime.now(UTC) - timedelta(hours=4)).isoformat()
    older = json_lines(
        invoke(database_url, "runs", "list", "--workflow", name, "--since", iso, "--json")
    )
    assert len(older) == 3


def test_runs_list_prints_a_header_and_plain_columns_when_piped(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    run, _ = wf.submit_once(engine, "bad", "bad")
    drain(engine, wf)
    done = invoke(database_url, "runs", "list", "--workflow", name)
    header, row = done.stdout.splitlines()
    assert header.split() == [
        "ID",
        "WORKFLOW",
        "KEY",
        "STATE",
        "PARKED",
        "CREATED",
        "(UTC)",
        "FINISHED",
        "(UTC)",
        "ERROR",
    ]
    assert row.split()[:4] == [str(run.id), name, "bad", "failed"]
    assert row.endswith("ValueError: cannot handle bad")
    assert "\x1b[" not in done.stdout


def test_runs_list_pages_by_the_cursor_it_prints(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    made = [wf.submit_once(engine, f"k{i}", i)[0] for i in range(5)]
    newest_first = [str(r.id) for r in reversed(made)]

    seen: list[str] = []
    after: list[str] = []
    while True:
        page = invoke(database_url, "runs", "list", "--workflow", name, "--limit", "2", *after)
        assert page.exit_code == 0, page.output
        seen += [line.split()[0] for line in page.stdout.splitlines()[1:]]
        if not page.stderr:
            break
        hint, cursor = page.stderr.rstrip("\n").rsplit(" ", 1)
        assert hint == "more: --after"
        after = ["--after", cursor]
    assert seen == newest_first  # three pages: 2, 2, 1, none repeated or skipped

    lines = json_lines(
        invoke(database_url, "runs", "list", "--workflow", name, "--limit", "2", "--json")
    )
    assert [row["id"] for row in lines] == newest_first[:2]
    following = invoke(
        database_url, "runs", "list", "--workflow", name, "--json", "--after", lines[-1]["cursor"]
    )
    assert [row["id"] for row in json_lines(following)] == newest_first[2:]
    assert following.stderr == ""  # nothing more

    bad = invoke(database_url, "runs", "list", "--after", "yesterday")
    assert bad.exit_code == 2
    assert bad.stderr.startswith("cyclone: --after: after='yesterday' is not a cursor")
    assert bad.stderr.count("\n") == 1


def test_jobs_list_after_a_cursor_past_bigint_is_bad_usage(database_url: URL) -> None:
    # It was "cyclone: database error: bigint out of range", status 1.
    bad = invoke(database_url, "jobs", "list", "--after", f"2026-01-01T00:00:00+00:00~{2**63}")
    assert bad.exit_code == 2
    assert bad.stderr.startswith("cyclone: --after: after='2026-01-01T00:00:00+00:00~")
    assert "is not a cursor" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_jobs_list_pages_by_the_cursor_it_prints(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    kind = standalone(name)
    made = [kind.enqueue(engine, {"to": f"u{i}"}) for i in range(3)]
    first = invoke(database_url, "jobs", "list", "--kind", name, "--limit", "2", "--json")
    rows = json_lines(first)
    assert [row["id"] for row in rows] == [made[2].id, made[1].id]
    assert first.stderr == f"more: --after {rows[-1]['cursor']}\n"
    rest = invoke(database_url, "jobs", "list", "--kind", name, "--after", rows[-1]["cursor"])
    assert [int(line.split()[0]) for line in rest.stdout.splitlines()[1:]] == [made[0].id]
    assert rest.stderr == ""


def test_runs_list_rejects_a_bad_since_and_state(database_url: URL) -> None:
    bad_since = invoke(database_url, "runs", "list", "--since", "yesterday")
    assert bad_since.exit_code == 2
    assert "neither a duration" in bad_since.output
    bad_state = invoke(database_url, "runs", "list", "--state", "lost")
    assert bad_state.exit_code == 2


def test_a_duration_past_a_thousand_years_or_a_limit_past_integer_is_bad_usage_in_one_line(
    database_url: URL,
) -> None:
    """``--since 99999999d`` ended in an OverflowError traceback; ``--limit`` past
    PostgreSQL's integer was blamed on ``--after``."""
    for args in (("runs", "list", "--since", "99999999d"), ("purge", "--older-than", "99999999d")):
        result = invoke(database_url, *args)
        assert result.exit_code == 2, result.output
        assert "longer than 1,000 years" in result.output
        assert "Traceback" not in result.output
    too_many = invoke(database_url, "runs", "list", "--limit", str(2**70))
    assert too_many.exit_code == 2
    assert too_many.output.strip().splitlines() == [
        "cyclone: limit must be a positive int, at most 2147483647"
    ]


def test_runs_show_gives_input_result_and_each_step(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    run, _ = wf.submit_once(engine, "k", 21)
    drain(engine, wf)
    done = invoke(database_url, "runs", "show", str(run.id))
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert f"run        {run.id}" in out
    assert "state      completed" in out
    assert "input\n    21\n" in out
    assert 'result (step explode)\n    {\n      "doubled": 42\n    }' in out
    steps = out.split("\nsteps\n")[1].splitlines()
    assert steps[0].split()[:4] == ["STEP", "STATE", "ATTEMPTS", "QUEUE"]
    assert steps[1].split()[:4] == ["prepare", "completed", "1/3", "default"]
    assert steps[2].split()[:4] == ["explode", "completed", "1/2", "default"]


def test_runs_show_of_a_failed_run_prints_each_error_with_its_traceback(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    run, _ = wf.submit_once(engine, "bad", "bad")
    drain(engine, wf)
    done = invoke(database_url, "runs", "show", "--workflow", name, "--key", "bad")
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert "error      step explode: ValueError: cannot handle bad" in out
    assert "result (step" not in out
    assert out.count("step explode, attempt ") == 2
    assert "step explode, attempt 1 at " in out
    assert "step explode, attempt 2 at " in out
    assert out.count("    Traceback (most recent call last):") == 2
    assert "    ValueError: cannot handle bad" in out

    record = json_lines(invoke(database_url, "runs", "show", str(run.id), "--json"))
    assert len(record) == 1
    detail = record[0]
    assert detail["state"] == "failed"
    assert detail["input"] == "bad"
    assert detail["result"] is None
    explode = detail["steps"][1]
    assert explode["name"] == "explode"
    assert explode["state"] == "failed"
    assert explode["attempt"] == 2
    assert explode["max_attempts"] == 2
    assert isinstance(explode["duration"], float)
    assert explode["duration"] >= 0
    assert [e["attempt"] for e in explode["errors"]] == [1, 2]
    assert "Traceback" in explode["errors"][0]["traceback"]


def test_runs_show_of_a_missing_or_malformed_run_is_one_line(database_url: URL, name: str) -> None:
    missing = uuid.uuid4()
    done = invoke(database_url, "runs", "show", str(missing))
    assert done.exit_code == 1
    assert done.stderr == f"cyclone: run {missing} does not exist\n"
    by_key = invoke(database_url, "runs", "show", "--workflow", name, "--key", "nope")
    assert by_key.exit_code == 1
    assert by_key.stderr == f"cyclone: workflow {name!r} has no run with key 'nope'\n"
    malformed = invoke(database_url, "runs", "show", "123")
    assert malformed.exit_code == 2
    assert malformed.stderr == "cyclone: '123' is not a run id (a UUID)\n"
    neither = invoke(database_url, "runs", "show")
    assert neither.exit_code == 2


def run_state(engine: sa.Engine, run_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        state: str = conn.execute(sa.select(runs.c.state).where(runs.c.id == run_id)).scalar_one()
    return state


def test_runs_cancel_cancels_a_running_run_and_refuses_a_finished_one(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    done = invoke(database_url, "runs", "cancel", str(run.id))
    assert done.exit_code == 0, done.output
    assert done.stdout == f"cancelled run {run.id} of workflow {name}\n"
    assert run_state(engine, run.id) == "cancelled"
    again = invoke(database_url, "runs", "cancel", str(run.id))
    assert again.exit_code == 1
    assert again.stderr == f"cyclone: cannot cancel run {run.id}: it is cancelled\n"


def test_runs_retry_and_retry_all_restart_finished_runs(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = failing_workflow(name)
    bad, _ = wf.submit_once(engine, "bad", "bad")
    good, _ = wf.submit_once(engine, "good", 2)
    drain(engine, wf)

    refused = invoke(database_url, "runs", "retry", str(good.id))
    assert refused.exit_code == 1
    assert refused.stderr == f"cyclone: cannot retry run {good.id}: it is completed\n"

    retried = invoke(database_url, "runs", "retry", str(bad.id))
    assert retried.exit_code == 0, retried.output
    assert run_state(engine, bad.id) == "running"
    again = invoke(database_url, "runs", "retry-all", str(good.id))
    assert again.exit_code == 0, again.output
    assert run_state(engine, good.id) == "running"
    drain(engine, wf)
    assert good.result(timeout=5) == {"doubled": 4}


# -- jobs ------------------------------------------------------------------------------


def standalone(name: str, *, fail: bool = False) -> cyclone.StandaloneStep[Any, Any]:
    @cyclone.step(name, queue=f"{name}.q", max_attempts=1)
    def work(ctx: cyclone.StepContext, args: dict[str, Any]) -> dict[str, Any]:
        if fail:
            raise RuntimeError("mail server said no")
        return {"sent": args["to"]}

    return work


def test_jobs_list_filters_by_queue_kind_and_state(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    kind = standalone(name)
    done_job = kind.enqueue(engine, {"to": "ada"})
    cyclone.Worker(engine, steps=[kind]).drain()
    waiting = kind.enqueue(engine, {"to": "bob"}, delay=timedelta(days=1), unique="bob")

    by_kind = json_lines(invoke(database_url, "jobs", "list", "--kind", name, "--json"))
    assert [row["id"] for row in by_kind] == [waiting.id, done_job.id]
    assert by_kind[0]["key"] == "bob"
    assert by_kind[0]["queue"] == f"{name}.q"

    by_queue = json_lines(
        invoke(
            database_url, "jobs", "list", "--queue", f"{name}.q", "--state", "completed", "--json"
        )
    )
    assert [row["id"] for row in by_queue] == [done_job.id]

    newest = json_lines(
        invoke(database_url, "jobs", "list", "--kind", name, "--limit", "1", "--json")
    )
    assert [row["id"] for row in newest] == [waiting.id]

    table = invoke(database_url, "jobs", "list", "--kind", name)
    header, *rows = table.stdout.splitlines()
    assert header.split()[:6] == ["ID", "KIND", "QUEUE", "KEY", "STATE", "ATTEMPTS"]
    assert [r.split()[4] for r in rows] == ["available", "completed"]


def test_jobs_show_gives_args_output_and_errors(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    kind = standalone(name, fail=True)
    job = kind.enqueue(engine, {"to": "ada"})
    cyclone.Worker(engine, steps=[kind]).drain()
    done = invoke(database_url, "jobs", "show", str(job.id))
    assert done.exit_code == 0, done.output
    assert "state      failed" in done.stdout
    assert 'args\n    {\n      "to": "ada"\n    }' in done.stdout
    assert f"job {job.id}, attempt 1 at " in done.stdout
    assert "    RuntimeError: mail server said no" in done.stdout

    record = json_lines(invoke(database_url, "jobs", "show", str(job.id), "--json"))[0]
    assert record["args"] == {"to": "ada"}
    assert record["state"] == "failed"
    assert record["errors"][0]["message"] == "mail server said no"

    ok_kind = standalone(f"{name}.ok")
    ok = ok_kind.enqueue(engine, {"to": "bob"})
    cyclone.Worker(engine, steps=[ok_kind]).drain()
    shown = json_lines(invoke(database_url, "jobs", "show", str(ok.id), "--json"))[0]
    assert shown["output"] == {"sent": "bob"}

    missing = invoke(database_url, "jobs", "show", "999999999")
    assert missing.exit_code == 1
    assert missing.stderr == "cyclone: job 999999999 does not exist\n"


def test_jobs_cancel_cancels_a_waiting_job_only(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    kind = standalone(name)
    waiting = kind.enqueue(engine, {"to": "ada"}, delay=timedelta(hours=1))
    done = invoke(database_url, "jobs", "cancel", str(waiting.id))
    assert done.exit_code == 0, done.output
    assert done.stdout == f"cancelled job {waiting.id}\n"
    assert waiting.status().state == cyclone.JobState.CANCELLED
    assert waiting.status().finished_at is not None

    again = invoke(database_url, "jobs", "cancel", str(waiting.id))
    assert again.exit_code == 1
    assert again.stderr == f"cyclone: cannot cancel job {waiting.id}: it is cancelled\n"
    missing = invoke(database_url, "jobs", "cancel", "999999999")
    assert missing.stderr == "cyclone: standalone job 999999999 does not exist\n"
    # An id past bigint (cyclone_jobs.id) names no job either: it was "database error:
    # bigint out of range".
    huge = str(2**63)
    beyond = invoke(database_url, "jobs", "cancel", huge)
    assert beyond.exit_code == 1, beyond.output
    assert beyond.stderr == f"cyclone: standalone job {huge} does not exist\n"
    for command in ("show", "retry"):
        beyond = invoke(database_url, "jobs", command, huge)
        assert (beyond.exit_code, beyond.stderr) == (1, f"cyclone: job {huge} does not exist\n")


def test_jobs_cancel_of_a_step_names_its_run(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    """Worker logs name the job ids of steps (a hand-back, a rescue); cancelling one by
    id said it did not exist, where `jobs retry` names the run it belongs to."""
    wf = failing_workflow(name)
    run = wf.submit(engine, "bad")
    cyclone.Worker(engine, workflows=[wf]).drain()
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    step = detail.steps[0]
    done = invoke(database_url, "jobs", "cancel", str(step.job_id))
    assert done.exit_code == 1
    assert done.stderr == (
        f"cyclone: job {step.job_id} is step {step.name} of run {run.id}, "
        "not a standalone job (see the run)\n"
    )


def test_jobs_cancel_does_not_touch_a_running_job(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    kind = standalone(name)
    job = kind.enqueue(engine, {"to": "ada"})
    with engine.begin() as conn:
        conn.execute(
            jobs.update()
            .where(jobs.c.id == job.id)
            .values(
                state="running",
                attempt=1,
                worker_id="elsewhere",
                attempted_at=sa.func.now(),
                heartbeat_at=sa.func.now(),
            )
        )
    done = invoke(database_url, "jobs", "cancel", str(job.id))
    assert done.exit_code == 1
    assert done.stderr == f"cyclone: cannot cancel job {job.id}: it is running\n"
    assert job.status().state == cyclone.JobState.RUNNING
    rescue_lost_jobs(engine)  # "elsewhere" never was: its job goes back to available


# -- purge -----------------------------------------------------------------------------


def test_purge_dry_run_counts_and_purge_deletes_in_batches(migrated: URL) -> None:
    with scratch_engine(migrated) as engine:
        wf = failing_workflow("purged")
        old = [wf.submit_once(engine, f"old{i}", i)[0] for i in range(3)]
        recent, _ = wf.submit_once(engine, "recent", 9)
        for run in old:
            finish(engine, run.id, cyclone.RunState.COMPLETED, ago=timedelta(days=10))
        finish(engine, recent.id, cyclone.RunState.COMPLETED)
        kind = standalone("purged.mail")
        job = kind.enqueue(engine, {"to": "ada"})
        cyclone.Worker(engine, steps=[kind]).drain()
        with engine.begin() as conn:
            conn.execute(
                jobs.update()
                .where(jobs.c.id == job.id)
                .values(finalized_at=sa.func.now() - timedelta(days=9))
            )

        dry = invoke(migrated, "purge", "--older-than", "7d", "--dry-run")
        assert dry.exit_code == 0, dry.output
        assert dry.stdout == "would delete 3 runs and 1 standalone job\n"
        assert cyclone.Client(engine).count_runs()[cyclone.RunState.COMPLETED] == 4

        done = invoke(migrated, "purge", "--older-than", "7d")
        assert done.exit_code == 0, done.output
        assert done.stdout == "deleted 3 runs and 1 standalone job\n"
        assert cyclone.Client(engine).get_run(recent.id) is not None
        assert all(cyclone.Client(engine).get_run(run.id) is None for run in old)


def test_purge_reports_each_batch_to_its_progress_callback(migrated: URL) -> None:
    with scratch_engine(migrated) as engine:
        wf = failing_workflow("batched")
        for i in range(5):
            run, _ = wf.submit_once(engine, f"k{i}", i)
            finish(engine, run.id, cyclone.RunState.FAILED, ago=timedelta(days=1))
        batches: list[int] = []
        deleted = cyclone.Client(engine).purge_terminal_runs(
            older_than=timedelta(hours=1), batch_size=2, progress=batches.append
        )
        assert deleted == 5
        assert batches == [2, 2, 1]


def test_purge_rejects_a_bad_duration(database_url: URL) -> None:
    done = invoke(database_url, "purge", "--older-than", "a week")
    assert done.exit_code == 2
    assert "not a duration such as 30s, 15m, 1h, 7d or 2w" in done.output


# -- worker ----------------------------------------------------------------------------


def submit_defs(
    engine: sa.Engine, key: str
) -> tuple[cyclone.ResultRun[str], cyclone.ResultRun[str]]:
    one, _ = cli_defs.first.submit_once(engine, key, "a")
    two, _ = cli_defs.second.submit_once(engine, key, "b")
    return one, two


def test_worker_module_attr_runs_only_that_workflow(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    one, two = submit_defs(engine, name)
    done = invoke(database_url, "worker", "tests.support.cli_defs:first", "--drain")
    assert done.exit_code == 0, done.output
    assert one.result(timeout=5) == "first a"
    assert two.status().state == cyclone.RunState.RUNNING

    listed = invoke(database_url, "worker", "tests.support.cli_defs:both", "--drain", "-c", "2")
    assert listed.exit_code == 0, listed.output
    assert two.result(timeout=5) == "second b"


def test_worker_module_runs_everything_it_defines(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    one, two = submit_defs(engine, name)
    job = cli_defs.mail.enqueue(engine, name)
    done = invoke(database_url, "worker", "tests.support.cli_defs", "--drain")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith("ran ")
    assert (one.result(timeout=5), two.result(timeout=5)) == ("first a", "second b")
    assert job.result(timeout=5) == f"sent to {name}"


def test_worker_queue_option_limits_the_queues(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    job = cli_defs.mail.enqueue(engine, name)
    other = invoke(
        database_url, "worker", "tests.support.cli_defs:mail", "--drain", "--queue", "elsewhere=2"
    )
    assert other.exit_code == 0, other.output
    assert job.status().state == cyclone.JobState.AVAILABLE
    served = invoke(
        database_url, "worker", "tests.support.cli_defs:mail", "--drain", "-q", "cli.defs.mail"
    )
    assert served.exit_code == 0, served.output
    assert job.result(timeout=5) == f"sent to {name}"


@pytest.mark.parametrize("spec", ["=2", "mail=0", "mail=x"])
def test_worker_rejects_a_bad_queue_spec(database_url: URL, spec: str) -> None:
    done = invoke(database_url, "worker", "tests.support.cli_defs", "--drain", "--queue", spec)
    assert done.exit_code == 2
    assert "write NAME or NAME=LIMIT" in done.output


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "tests.support.nope",
            "cyclone: no module named 'tests.support.nope' "
            "(searched the current directory and sys.path)\n",
        ),
        (
            "tests.support.counting",
            "cyclone: module 'tests.support.counting' defines no workflow or step kind "
            "(it has no module-level Workflow or StandaloneStep)\n",
        ),
        (
            "tests.support.cli_defs:missing",
            "cyclone: module 'tests.support.cli_defs' has no attribute 'missing'\n",
        ),
        (
            "tests.support.cli_defs:not_a_definition",
            "cyclone: tests.support.cli_defs:not_a_definition holds an object of type int, "
            "not a workflow, a step kind or a list of them\n",
        ),
    ],
)
def test_worker_names_a_module_or_attribute_that_gives_nothing(
    database_url: URL, target: str, message: str
) -> None:
    done = invoke(database_url, "worker", target, "--drain")
    assert done.exit_code == 2
    assert done.stderr == message


def test_worker_without_a_module_or_host_definitions_is_a_usage_error(database_url: URL) -> None:
    done = invoke(database_url, "worker", "--drain")
    assert done.exit_code == 2
    assert "name at least one MODULE[:ATTR]" in done.output


def test_worker_uses_the_host_definitions_and_worker_options(engine: sa.Engine, name: str) -> None:
    wf = failing_workflow(name)
    run, _ = wf.submit_once(engine, "k", 5)
    entered: list[str] = []

    @contextmanager
    def app_context() -> Iterator[None]:
        entered.append(threading.current_thread().name)
        yield

    group = build_cli(
        engine=lambda: engine,
        definitions=lambda: ([wf], []),
        worker_options=lambda: {"step_context": app_context, "backoff": lambda n: 0.0},
    )
    done = CliRunner().invoke(group, ["worker", "--drain"], env={"CYCLONE_DATABASE_URL": ""})
    assert done.exit_code == 0, done.output
    assert run.result(timeout=5) == {"doubled": 10}
    assert len(entered) == 2


def test_worker_heartbeat_and_rescue_after_options_reach_the_worker(
    monkeypatch: pytest.MonkeyPatch, engine: sa.Engine, database_url: URL, name: str
) -> None:
    made: list[cyclone.Worker] = []

    class Recorded(cyclone.Worker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(cli_app, "Worker", Recorded)
    job = cli_defs.mail.enqueue(engine, name)
    done = invoke(
        database_url,
        "worker",
        "tests.support.cli_defs:mail",
        "--drain",
        "--heartbeat",
        "0.5",
        "--rescue-after",
        "3",
    )
    assert done.exit_code == 0, done.output
    assert job.result(timeout=5) == f"sent to {name}"
    (worker,) = made
    assert (worker.heartbeat_interval, worker.rescue_after) == (0.5, timedelta(seconds=3))


@pytest.mark.parametrize(
    "args", [("--heartbeat", "60"), ("--rescue-after", "4", "--heartbeat", "4.5")]
)
def test_worker_refuses_a_heartbeat_not_shorter_than_its_rescue_after(
    database_url: URL, args: tuple[str, ...]
) -> None:
    done = invoke(database_url, "worker", "tests.support.cli_defs", "--drain", *args)
    assert done.exit_code == 2
    assert "must be less than --rescue-after" in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_worker_refuses_an_unmigrated_database(fresh_database: URL) -> None:
    done = invoke(fresh_database, "worker", "tests.support.cli_defs", "--drain")
    assert done.exit_code == 4
    assert done.stderr.endswith("has no cyclone schema: run `cyclone migrate`\n")


# -- dashboard -------------------------------------------------------------------------


def test_dashboard_serves_the_engine_on_the_host_port_and_threads(
    monkeypatch: pytest.MonkeyPatch, database_url: URL
) -> None:
    served: list[tuple[sa.Engine, str, int, int]] = []
    module = types.ModuleType("cyclone.dashboard")

    def serve(
        engine: sa.Engine, *, host: str, port: int, threads: int, ready: Callable[[str], None]
    ) -> None:
        served.append((engine, host, port, threads))
        ready(f"http://{host}:{port}/")

    module.serve = serve  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "cyclone.dashboard", module)
    done = invoke(
        database_url, "dashboard", "--host", "0.0.0.0", "--port", "9000", "--threads", "8"
    )
    assert done.exit_code == 0, done.output
    defaults = invoke(database_url, "dashboard")
    assert defaults.exit_code == 0, defaults.output
    assert defaults.stderr == (
        "cyclone dashboard on http://127.0.0.1:8421/\ncyclone dashboard stopped\n"
    )
    assert [(e.url.database, h, p, t) for e, h, p, t in served] == [
        (database_url.database, "0.0.0.0", 9000, 8),
        (database_url.database, "127.0.0.1", 8421, 4),
    ]


def test_dashboard_on_an_address_it_cannot_listen_on_is_one_line_before_any_announce(
    database_url: URL,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = invoke(database_url, "dashboard", "--port", str(port))
    assert done.exit_code == 1
    assert done.stderr == f"cyclone: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    empty = invoke(database_url, "dashboard", "--host", "")
    assert empty.exit_code == 2
    assert "--host" in empty.stderr
    assert "is empty" in empty.stderr
    assert "dashboard on" not in empty.stderr


@pytest.mark.parametrize("missing", ["cyclone.dashboard", "waitress"])
def test_dashboard_without_its_extra_is_one_line(
    monkeypatch: pytest.MonkeyPatch, database_url: URL, missing: str
) -> None:
    monkeypatch.setitem(sys.modules, missing, None)
    done = invoke(database_url, "dashboard")
    assert done.exit_code == 1
    assert done.stderr == (
        f"cyclone: the dashboard needs the dashboard extra (no module {missing}): "
        "pip install 'cyclone[dashboard]'\n"
    )


# -- mounted under a host's command line; -v -----------------------------------------------


def test_a_mounted_group_names_its_own_command_path_and_keeps_the_host_obj(
    fresh_database: URL,
) -> None:
    seen: list[object] = []
    marker = object()

    @click.group("host")
    @click.pass_context
    def host(ctx: click.Context) -> None:
        ctx.obj = marker

    @host.result_callback()
    @click.pass_context
    def after(ctx: click.Context, *_: object, **__: object) -> None:
        seen.append(ctx.obj)

    host.add_command(build_cli(), "cyclone")
    done = CliRunner().invoke(host, ["cyclone", "runs", "list", "--url", url_text(fresh_database)])
    assert done.exit_code == 4
    assert done.stderr.endswith("has no cyclone schema: run `host cyclone migrate`\n")

    listed = CliRunner().invoke(host, ["cyclone", "--version"])
    assert listed.exit_code == 0
    ok = CliRunner().invoke(host, ["cyclone", "migrate", "--sql", "--from", revisions()[-2]])
    assert ok.exit_code == 0, ok.output
    assert seen == [marker]


def test_verbose_after_the_subcommand_shows_the_traceback() -> None:
    done = CliRunner().invoke(build_cli(), ["check", "--url", "postgresql://u@127.0.0.1:1/d", "-v"])
    assert done.exit_code == 3
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1].startswith("cyclone: cannot connect to PostgreSQL at 127.0.0.1:1")
    quiet = CliRunner().invoke(build_cli(), ["check", "--url", "postgresql://u@127.0.0.1:1/d"])
    assert quiet.stderr.count("\n") == 1


def test_a_newer_schema_lets_a_worker_start_with_one_warning_but_says_upgrade_cyclone_elsewhere(
    migrated: URL, caplog: pytest.LogCaptureFixture
) -> None:
    with scratch_engine(migrated) as engine, engine.begin() as conn:
        conn.execute(sa.text("UPDATE cyclone_alembic_version SET version_num = 'cyclone_9999'"))
    listing = invoke(migrated, "runs", "list")
    assert listing.exit_code == 4
    assert listing.stderr.endswith(
        "is at cyclone revision cyclone_9999, which this version of cyclone does not know "
        f"(it needs {migrations.head_revision()}): upgrade cyclone\n"
    )
    worker = invoke(migrated, "worker", "tests.support.cli_defs", "--drain")
    assert worker.exit_code == 0, worker.output
    warned = "is at cyclone revision cyclone_9999 (cyclone_alembic_version, own-table mode), "
    assert caplog.text.count(warned + "which this version of cyclone does not know") == 1
