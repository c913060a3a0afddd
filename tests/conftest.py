"""Shared fixtures: a throwaway database per test session, engines, connections, counters."""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL, make_url

import cyclone
from tests.support import at_rest, leaks, processes
from tests.support.counting import CountingCursor, Recorder
from tests.support.workers import Background

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"

pytest_plugins = ("pytester",)

# A psycopg connection garbage-collected open fails the test that is running (pyproject's
# filterwarnings): its message says where and during which test it was opened.
leaks.install()


def admin_url() -> URL:
    return make_url(os.environ.get("CYCLONE_DATABASE_URL", DEFAULT_URL))


def create_database(prefix: str, template: str | None = None) -> URL:
    """Create a database on the test server and return its URL: empty, or a copy of the
    database named ``template`` (which nobody may be connected to)."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    copy = f' TEMPLATE "{template}"' if template is not None else ""
    admin = sa.create_engine(admin_url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"{copy}'))
    admin.dispose()
    return admin_url().set(database=name)


def sessions_on(database: str) -> int:
    """How many sessions are connected to ``database``."""
    admin = sa.create_engine(admin_url(), poolclass=sa.NullPool)
    with admin.connect() as conn:
        count = conn.execute(
            sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :name"),
            {"name": database},
        ).scalar_one()
    admin.dispose()
    return int(count)


def drop_database(url: URL) -> None:
    admin = sa.create_engine(admin_url(), isolation_level="AUTOCOMMIT", poolclass=sa.NullPool)
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{url.database}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def database_url() -> Iterator[URL]:
    """A database migrated with cyclone.upgrade, dropped at the end of the session.

    Each pytest-xdist worker is a process with a session of its own, hence a database of
    its own; CYCLONE_TEST_DATABASE_URL (read by the subprocesses tests start) is set in
    that process's environment only.
    """
    url = create_database("cyclone_test")
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    engine.dispose()
    os.environ["CYCLONE_TEST_DATABASE_URL"] = url.render_as_string(hide_password=False)
    yield url
    del os.environ["CYCLONE_TEST_DATABASE_URL"]
    drop_database(url)


@pytest.fixture(autouse=True)
def invariants_at_rest(request: pytest.FixtureRequest) -> Iterator[None]:
    """After the test and its fixtures: stop the subprocesses it left running, and fail it
    if cyclone's invariants do not hold at rest on a database it touched (the session
    database if it used it, and every database :mod:`tests.support.at_rest` was told of)."""
    processes.begin_test()
    yield
    if "database_url" in request.fixturenames:
        at_rest.touch(request.getfixturevalue("database_url"), at_head=True)
    _left_running, found = at_rest.after_test()
    if found:
        pytest.fail(at_rest.describe(found), pytrace=False)


@pytest.fixture(scope="session")
def cyclone_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cyclone's wheel, built once per test process (the tests using it share an
    ``xdist_group``, hence a process)."""
    out = tmp_path_factory.mktemp("dist")
    processes.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("cyclone-*.whl")
    return built


@pytest.fixture(scope="session")
def engine(database_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(
        database_url,
        pool_size=20,
        max_overflow=40,
        connect_args={"cursor_factory": CountingCursor},
    )
    # The first connection runs SQLAlchemy's dialect set-up queries: run them now, so that
    # a test counting statements never counts them, whichever test a process runs first.
    with engine.connect():
        pass
    yield engine
    engine.dispose()


@pytest.fixture
def conn(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A connection inside a transaction that is rolled back after the test."""
    with engine.connect() as connection:
        tx = connection.begin()
        yield connection
        if tx.is_active:
            tx.rollback()


@pytest.fixture
def name() -> str:
    """A name unique to this test, for workflow names, step kinds, queues and keys."""
    return f"t{uuid.uuid4().hex[:12]}"


class StatementCounter(Recorder):
    """Counts the statements that reach the driver, through SQLAlchemy or cyclone's fast path."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def record(self, thread: str, statement: str) -> None:
        self.statements.append(statement)

    @property
    def count(self) -> int:
        return len(self.statements)

    def reset(self) -> None:
        self.statements.clear()


@pytest.fixture
def statements(engine: sa.Engine) -> Iterator[StatementCounter]:
    with StatementCounter() as counter:
        yield counter


@pytest.fixture
def clean_tables(engine: sa.Engine) -> Iterator[None]:
    """Empty cyclone's tables before and after a test that asserts over global counts."""
    with engine.begin() as c:
        c.execute(sa.text("TRUNCATE cyclone_signals, cyclone_jobs, cyclone_runs, cyclone_queues"))
    yield
    with engine.begin() as c:
        c.execute(sa.text("TRUNCATE cyclone_signals, cyclone_jobs, cyclone_runs, cyclone_queues"))


@pytest.fixture
def fresh_database() -> URL:
    """An empty database (no cyclone schema), checked at rest and dropped after the test."""
    return own_database("cyclone_fresh")


def own_database(prefix: str, template: str | None = None) -> URL:
    """A new database for the current test (empty, or a copy of ``template``), checked at
    rest and dropped after it."""
    url = create_database(prefix, template)
    at_rest.touch(url)
    at_rest.drop_after_test(lambda: drop_database(url))
    return url


TOGETHER = {
    "tests/reliability/": "reliability",
    "tests/test_alembic_wheel.py": "wheel",
    "tests/test_dashboard_packaging.py": "wheel",
    "tests/test_packaging.py": "wheel",
}
"""Tests pytest-xdist sends to one process, by the start of their node id: the
reliability scenarios (one private cluster, and their load is part of what they measure)
and the tests of the built wheel (built once, with its venv). Every other test is sent on
its own to the next free process. (pytest-xdist's ``xdist_group`` marks do nothing with
pytest 9.2: they rename node ids through an attribute pytest no longer reads.)"""


FIRST = (
    "wheel",
    "reliability",
    "tests/test_cli_docs.py::test_a_terminal_session_prints_what_the_docs_show[cli.md]",
    "tests/test_django.py::test_django_test_runner_passes_and_drops_its_test_databases",
    "tests/test_model.py::test_random_interleavings_end_as_the_model_says",
    "tests/test_public_api.py::test_the_readmes_definitions_type_check_under_mypy_strict",
    "tests/test_signals.py::test_a_signal_racing_a_worker_that_reaches_the_node_is_never_lost",
    "tests/test_readme.py::test_the_quickstart_demo_runs_the_checkout_example_to_its_result",
    "tests/test_test_support.py::test_a_test_that_breaks_an_invariant_fails",
    "tests/test_worker_operations.py::test_a_worker_rides_out_a_database_restart",
    "tests/test_dashboard_mounts.py::test_django_include_serves_staff_and_lets_them_act",
    "tests/test_schedules.py::test_a_worker_killed_while_firing_a_tick",
    "tests/test_schedules.py::test_four_worker_processes_make_one_run_per_tick",
    "tests/test_map.py::test_items_completing_while_their_retried_map_nodes_are_decided",
    "tests/test_wake_ups.py::test_no_wake_up_is_lost_while_workers_fall_asleep_and_wake",
    "tests/test_flask.py::test_the_flask_doc_commands_run_as_written",
    "tests/test_bench_docs.py",
    "tests/test_django.py",
    "tests/test_cli_bulk.py",
    "tests/test_fork.py::test_the_cli_forks",
    "tests/test_cli_parked.py",
    "tests/test_migrations.py::test_alembic_cli",
    "tests/test_migrations.py::test_concurrent_upgrade_from_processes",
    "tests/test_model.py",
    "tests/test_cli_docs.py",
    "tests/test_worker_processes.py",
    "tests/test_missing_extras.py",
)
"""The longest tests (and TOGETHER's groups, by name), which pytest-xdist sends out first,
in this order, before every other test in collection order: a long test started last would
run on alone while the other processes have finished. Only an order: a test missing here
runs later, an entry that matches nothing is ignored. (Measured with ``--durations``.)"""


def _rank(scope: str) -> int:
    return next((i for i, start in enumerate(FIRST) if scope.startswith(start)), len(FIRST))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    class Together(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            for start, group in TOGETHER.items():
                if nodeid.startswith(start):
                    return group
            return nodeid

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:  # the queue is complete before the first unit is sent
                self.ordered = True
                queue = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))
                self.workqueue.clear()
                self.workqueue.update(queue)
            super()._assign_work_unit(node)

    return Together(config, log)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport() -> Iterator[None]:
    """Captured output in reports as UTF-8: pytest-xdist's workers cannot send a report
    holding a lone surrogate (a test stores one in jsonb on purpose, and it is logged)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    report.sections = [
        (title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
        for title, text in report.sections
    ]


_figure_lines: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Gather the figures tests recorded (tests/reliability/conftest.py's ``figures``)."""
    for name, value in report.user_properties:
        if name == "figures" and value not in _figure_lines:
            _figure_lines.append(value)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _figure_lines:
        terminalreporter.section("reliability figures")
        for line in _figure_lines:
            terminalreporter.write_line(line)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition not met",
) -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail the test after ``timeout``.

    The one poll of the suite: database state and other processes have no event to wait
    on. ``message`` (or what it returns, called once the time is up) says what was awaited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            said = message if isinstance(message, str) else message()
            pytest.fail(f"{said} within {timeout} s")
        time.sleep(interval)


# A migrated database of a test's own, for tests that elect a maintenance leader: the
# leader's advisory lock is per database, and a worker another test left running on the
# session database could lead, or take over, in the test's place.


@pytest.fixture(scope="session")
def migrated_template() -> Iterator[str]:
    """The name of a database migrated with cyclone.upgrade once per test process, that
    ``own_url`` copies (``CREATE DATABASE ... TEMPLATE``: a file copy, where migrating each
    test's database anew runs every revision's DDL again). Nothing connects to it after
    its migration: PostgreSQL copies only a database nobody is connected to."""
    url = create_database("cyclone_template")
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    engine.dispose()
    # Its backend leaves a moment after the connection closed (later on a loaded machine),
    # and CREATE DATABASE gives up on a template still in use after 5 s.
    wait_until(
        lambda: sessions_on(str(url.database)) == 0,
        timeout=60,
        message=f"the sessions on {url.database} to end",
    )
    yield str(url.database)
    drop_database(url)


@pytest.fixture
def own_url(migrated_template: str) -> URL:
    """A database migrated with cyclone.upgrade for this test alone (a copy of
    ``migrated_template``), checked at rest and dropped after the test."""
    return own_database("cyclone_own", template=migrated_template)


@pytest.fixture
def own_engine(own_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(own_url, pool_size=20, max_overflow=40)
    yield engine
    engine.dispose()


@pytest.fixture
def serving() -> Iterator[Callable[[cyclone.Worker], Background]]:
    """Start ``worker.run()`` in a thread named ``serving-N``; stop them all at the end."""
    started: list[tuple[cyclone.Worker, Background]] = []

    def start(worker: cyclone.Worker) -> Background:
        background = Background(worker.run, name=f"serving-{len(started)}")
        started.append((worker, background))
        return background

    yield start
    for worker, background in started:
        worker.stop()
        background.join(30)
