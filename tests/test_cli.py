"""The ``cyclone`` console script, run as a user would run it."""

from __future__ import annotations

import os
import pty
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone import migrations
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support import processes
from tests.support.factories import finish

ROOT = Path(__file__).resolve().parent.parent


def cli(
    url: URL, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return processes.run(
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
    done = processes.run(
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
    assert "ran 1 job: 1 completed, 0 retried, 0 failed\n" in done.stdout
    assert re.search(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO cyclone\.cli: worker \S+: "
        rf"workflows {name}, step kinds none, queues all$",
        done.stderr,
        flags=re.M,
    ), done.stderr
    assert run.result(timeout=10) == "hello ada"

    listed = cli(database_url, "runs", "list", "--workflow", name)
    assert listed.returncode == 0, listed.stderr
    assert str(run.id) in listed.stdout
    assert "completed" in listed.stdout


# -- as a program: exact one-line errors and exit codes --------------------------------

CYCLONE = str(Path(sys.executable).with_name("cyclone"))
PROGRAMS = {"console-script": [CYCLONE], "python-m": [sys.executable, "-m", "cyclone"]}


def program(
    how: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return processes.run(
        [*PROGRAMS[how], *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "CYCLONE_DATABASE_URL": "", **(env or {})},
        timeout=60,
    )


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("how", PROGRAMS)
def test_a_refused_connection_names_host_and_port_in_one_line(how: str) -> None:
    port = closed_port()
    done = program(how, "runs", "list", "--url", f"postgresql://postgres@127.0.0.1:{port}/shop")
    assert done.returncode == 3
    assert done.stderr == (
        f"cyclone: cannot connect to PostgreSQL at 127.0.0.1:{port} (database shop): "
        "Connection refused\n"
    )
    assert done.stdout == ""


def test_a_refused_role_or_database_is_one_line_with_the_servers_reason(
    database_url: URL,
) -> None:
    host, port = database_url.host, database_url.port or 5432
    for url, reason in (
        (database_url.set(username="no_such_role"), 'role "no_such_role" does not exist'),
        (database_url.set(database="no_such_db"), 'database "no_such_db" does not exist'),
    ):
        done = program("python-m", "check", "--url", url.render_as_string(hide_password=False))
        assert done.returncode == 3
        assert done.stderr.startswith(f"cyclone: cannot connect to PostgreSQL at {host}:{port} ")
        assert done.stderr.endswith(f"{reason}\n")
        assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("how", PROGRAMS)
def test_a_bad_url_is_one_line_with_exit_2(how: str) -> None:
    done = program(how, "check", "--url", "postgres//nohost")
    assert done.returncode == 2
    assert done.stderr == (
        "cyclone: invalid database URL 'postgres//nohost': "
        "expected postgresql://USER@HOST:PORT/DBNAME\n"
    )


def test_an_empty_url_is_bad_usage_not_the_environments_database(database_url: URL) -> None:
    # `--url "$DB"` with DB unset ran against $CYCLONE_DATABASE_URL's database.
    env_url = database_url.render_as_string(hide_password=False)
    done = program("python-m", "check", "--url", "", env={"CYCLONE_DATABASE_URL": env_url})
    assert done.returncode == 2
    assert done.stderr == (
        "cyclone: Invalid value for '--url': is empty: give a database URL "
        "(see 'cyclone check --help')\n"
    )
    assert done.stdout == ""


@pytest.mark.parametrize(
    "args",
    [
        ["--concurrency", str(10**20)],  # started a thread per slot: it hung
        ["--concurrency", "10001"],
        ["--queue", "emails=10001"],
        ["--queue", "emails=\u00b2"],  # isdigit(), not int(): "ValueError", status 1
        ["--queue", "emails=" + "1" * 5000],  # past int()'s 4,300 digits: status 1
    ],
)
def test_a_worker_past_ten_thousand_jobs_at_once_is_bad_usage(args: list[str]) -> None:
    done = program("python-m", "worker", "tests.support.cli_app", "--drain", *args)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "10000" in done.stderr or "10,000" in done.stderr


def test_a_bad_url_never_prints_its_password() -> None:
    done = program("python-m", "check", "--url", "postgresql://ada:s3cret@host:port/db")
    assert done.returncode == 2
    assert "s3cret" not in done.stderr
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("how", PROGRAMS)
def test_an_unknown_module_is_one_line_with_exit_2(how: str, database_url: URL) -> None:
    url = database_url.render_as_string(hide_password=False)
    done = program(how, "worker", "no_such_module", "--drain", "--url", url)
    assert done.returncode == 2
    assert done.stderr == (
        "cyclone: no module named 'no_such_module' (searched the current directory and sys.path)\n"
    )


@pytest.mark.parametrize("how", PROGRAMS)
def test_an_unmigrated_database_names_cyclone_migrate(how: str, fresh_database: URL) -> None:
    url = fresh_database.render_as_string(hide_password=False)
    for args in (["runs", "list"], ["worker", "tests.support.cli_app", "--drain"], ["check"]):
        done = program(how, *args, "--url", url)
        assert done.returncode == 4, done.stderr
        assert done.stderr == (
            f"cyclone: the database at 127.0.0.1:{fresh_database.port or 5432} "
            f"(database {fresh_database.database}) has no cyclone schema: run `cyclone migrate`\n"
        )


def test_verbose_shows_the_traceback_before_the_line() -> None:
    port = closed_port()
    done = program("python-m", "-v", "runs", "list", "--url", f"postgresql://u@127.0.0.1:{port}/d")
    assert done.returncode == 3
    lines = done.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert any("psycopg.OperationalError" in line for line in lines)
    assert lines[-1].startswith(f"cyclone: cannot connect to PostgreSQL at 127.0.0.1:{port}")


def test_a_usage_error_is_one_line_with_exit_2() -> None:
    done = program("console-script", "runs", "list", "--state", "lost")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith("cyclone: Invalid value for '--state': 'lost' is not one of")
    assert done.stderr.endswith("(see 'cyclone runs list --help')\n")


def test_without_click_the_command_names_the_cli_extra() -> None:
    code = (
        "import sys; sys.modules['click'] = None\n"
        "from cyclone.cli import main\n"
        "raise SystemExit(main(['--help']))\n"
    )
    done = processes.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr == (
        "cyclone: the command line needs the cli extra: pip install 'cyclone[cli]'\n"
    )


def in_terminal(args: list[str]) -> str:
    """Run a command with a pseudo-terminal as stdout and stderr; return what it showed."""
    controller, terminal = pty.openpty()
    with processes.popen(
        args, stdout=terminal, stderr=terminal, cwd=ROOT, env={**os.environ, "COLUMNS": "200"}
    ) as proc:
        os.close(terminal)
        seen = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        assert proc.wait(timeout=60) == 0, seen.decode()
    os.close(controller)
    return seen.decode()


def test_purge_shows_a_progress_bar_on_a_terminal(fresh_database: URL) -> None:
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    wf = cyclone.Workflow("purged")
    wf.step("only")(lambda ctx, value: None)
    for i in range(3):
        run, _ = wf.submit_once(engine, f"k{i}", i)
        finish(engine, run.id, cyclone.RunState.COMPLETED, ago=timedelta(days=30))
    engine.dispose()
    url = fresh_database.render_as_string(hide_password=False)
    shown = in_terminal([CYCLONE, "purge", "--older-than", "7d", "--url", url])
    assert "deleting runs" in shown
    assert "3/3" in shown
    assert "deleted 3 runs and 0 standalone jobs" in shown


def test_a_terminal_gets_a_coloured_table_and_a_pipe_plain_columns(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf = cyclone.Workflow(name)
    wf.step("only")(lambda ctx, value: None)
    wf.submit_once(engine, "k", 1)
    url = database_url.render_as_string(hide_password=False)
    args = [CYCLONE, "runs", "list", "--workflow", name, "--url", url]
    shown = in_terminal(args)
    assert "\x1b[" in shown
    assert "WORKFLOW" in shown
    assert "running" in shown

    piped = processes.run(args, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "\x1b[" not in piped.stdout
    assert piped.stdout.splitlines()[0].split()[:4] == ["ID", "WORKFLOW", "KEY", "STATE"]


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_worker_grace_lets_the_running_step_finish_on_sigterm_or_sigint_then_exits_0(
    engine: sa.Engine, database_url: URL, name: str, stop: signal.Signals
) -> None:
    slow = cyclone.ResultWorkflow(name, output=str)

    @slow.result()
    def greet(ctx: cyclone.StepContext, who: str) -> str:
        raise AssertionError("the CLI worker runs it, not this process")

    run, _ = slow.submit_once(engine, "k", "slow")
    url = database_url.render_as_string(hide_password=False)
    with processes.popen(
        [CYCLONE, "worker", "tests.support.cli_app", "--grace", "30", "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "CYCLONE_CLI_WORKFLOW": name, "CYCLONE_CLI_STEP_SECONDS": "1"},
    ) as worker:

        def step_started() -> bool:
            if worker.poll() is not None:
                pytest.fail(f"the worker exited early: {worker.communicate()[1]}")
            return run_step_state(engine, run.id) == "running"

        wait_until(step_started, timeout=30)
        worker.send_signal(stop)
        _, stderr = worker.communicate(timeout=60)
    assert worker.returncode == 0, stderr
    assert run.result(timeout=5) == "hello slow"


def run_step_state(engine: sa.Engine, run_id: object) -> str | None:
    with engine.connect() as conn:
        state: str | None = conn.execute(
            sa.select(jobs.c.state).where(jobs.c.run_id == run_id)
        ).scalar()
    return state


def ignore_sigint() -> None:
    """Run in the child before exec: what `trap "" INT` or a shell's background job does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def test_the_ignoring_parent_of_the_dashboard_tests_leaves_sigint_ignored() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT).name)"],
        capture_output=True,
        text=True,
        preexec_fn=ignore_sigint,
        timeout=60,
    )
    assert done.stdout == "SIG_IGN\n"


@pytest.mark.processes
@pytest.mark.parametrize("parent_ignores_sigint", [False, True], ids=["", "parent-ignores-SIGINT"])
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_dashboard_serves_the_overview_until_sigint_or_sigterm_then_exits_0_and_frees_its_port(
    database_url: URL, stop: signal.Signals, parent_ignores_sigint: bool
) -> None:
    port = closed_port()
    url = database_url.render_as_string(hide_password=False)
    server = subprocess.Popen(
        [CYCLONE, "dashboard", "--port", str(port), "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
        preexec_fn=ignore_sigint if parent_ignores_sigint else None,
    )
    try:

        def overview() -> str | None:
            if server.poll() is not None:
                pytest.fail(f"the dashboard exited: {server.communicate()[1]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
                    assert page.status == 200
                    body: str = page.read().decode()
                    return body
            except OSError:
                return None

        assert "<h1>Overview</h1>" in wait_until(overview, timeout=30)
        server.send_signal(stop)
        _, stderr = server.communicate(timeout=15)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.communicate()
    # Besides cyclone's two lines, waitress may log its own (e.g. "Task queue depth is 1"
    # when the page's requests come faster than a loaded machine serves them).
    ours = [line for line in stderr.splitlines() if line.startswith("cyclone")]
    assert server.returncode == 0, stderr
    assert ours == [f"cyclone dashboard on http://127.0.0.1:{port}/", "cyclone dashboard stopped"]
    assert "Traceback" not in stderr
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen()


@pytest.mark.parametrize("output", [["--json"], []], ids=["json", "columns"])
@pytest.mark.parametrize("how", PROGRAMS)
def test_a_reader_that_goes_away_ends_the_command_quietly_with_exit_141(
    how: str, output: list[str], engine: sa.Engine, database_url: URL, name: str
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def only(ctx: cyclone.StepContext, n: int) -> int:
        return n

    # 2,000 lines: far more than a pipe holds, so the writer meets the closed pipe.
    wf.submit_once_many(engine, [(f"k{i}", i) for i in range(2000)])
    url = database_url.render_as_string(hide_password=False)
    with subprocess.Popen(
        [*PROGRAMS[how], "runs", "list", "--workflow", name, "--limit", "2000", *output],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "CYCLONE_DATABASE_URL": url},
    ) as reader:
        assert reader.stdout is not None
        assert reader.stdout.readline().startswith(b"{" if output else b"ID ")
        reader.stdout.close()  # as `| head -1` does once it has its line
        assert reader.stderr is not None
        stderr = reader.stderr.read().decode()
        returncode = reader.wait(timeout=60)
    assert (returncode, stderr) == (141, "")


@pytest.mark.parametrize(
    ("query", "expected"),
    [("", "cyclone worker"), ("?application_name=billing-worker", "billing-worker")],
    ids=["named-for-the-command", "the-urls-name-kept"],
)
def test_a_cli_workers_connections_name_the_command_in_pg_stat_activity(
    database_url: URL, name: str, query: str, expected: str
) -> None:
    monitor = sa.create_engine(database_url, poolclass=sa.NullPool)

    def backends() -> dict[int, str]:
        with monitor.connect() as conn:  # a transaction of its own: a fresh stats snapshot
            rows = conn.execute(
                sa.text(
                    "SELECT pid, application_name FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            return {pid: app for pid, app in rows}

    before = backends()
    url = database_url.render_as_string(hide_password=False) + query
    env = {k: v for k, v in os.environ.items() if k != "PGAPPNAME"}
    with processes.popen(
        [CYCLONE, "worker", "tests.support.cli_app", "--url", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**env, "CYCLONE_CLI_WORKFLOW": name},
    ) as worker:

        def the_workers_backends() -> dict[int, str]:
            if worker.poll() is not None:
                pytest.fail(f"the worker exited early: {worker.communicate()[1]}")
            new = {pid: app for pid, app in backends().items() if pid not in before}
            return new if len(new) >= 3 else {}  # its registry, its listener, its claims

        opened = wait_until(the_workers_backends, timeout=30)
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=60)
    monitor.dispose()
    assert worker.returncode == 0, stderr
    assert set(opened.values()) == {expected}
