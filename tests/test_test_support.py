"""The suite's own machinery: the invariant check after every test, and the subprocesses
tests start (default signal dispositions, stopped when the test ends)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from tests.conftest import wait_until
from tests.support import at_rest, invariants, processes
from tests.support.workers import start_runs

ROOT = Path(__file__).resolve().parent.parent
REPORT_SIGNALS = (  # Python installs its KeyboardInterrupt handler only over SIG_DFL
    "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler,"
    " signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,"
    " signal.pthread_sigmask(signal.SIG_BLOCK, ()) == set())"
)


@pytest.fixture
def caller_ignores_sigint_and_blocks_sigterm() -> Iterator[None]:
    """This process as a background job starts: SIGINT ignored (and SIGTERM blocked)."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        signal.signal(signal.SIGINT, before)


@pytest.mark.usefixtures("caller_ignores_sigint_and_blocks_sigterm")
def test_a_child_starts_with_default_signals_whatever_the_caller_ignores() -> None:
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    done = processes.run([sys.executable, "-c", REPORT_SIGNALS], capture_output=True, text=True)
    assert done.stdout.split() == ["True", "True", "True"], done.stderr


@pytest.mark.usefixtures("caller_ignores_sigint_and_blocks_sigterm")
def test_a_child_stops_on_sigint_whatever_the_caller_ignores() -> None:
    code = (
        "import signal, time;"
        " print('up', signal.getsignal(signal.SIGINT) is signal.default_int_handler, flush=True);"
        " time.sleep(60)"
    )
    with processes.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "up True\n"
        child.send_signal(signal.SIGINT)
        try:
            returncode = child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the child outlived its SIGINT: {signal_state(child.pid)}")
        assert returncode != 0


def signal_state(pid: int) -> str:
    """What the kernel says of process ``pid``'s state and signals, for a failure's message."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return str(exc)
    return "; ".join(line for line in status if line.startswith(("State", "Sig", "Shd")))


def test_a_failing_with_block_kills_the_child_and_its_process_group() -> None:
    code = (
        "import subprocess, sys, time;"
        " subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
        " print('up', flush=True); time.sleep(60)"
    )
    started = time.monotonic()
    with (  # noqa: PT012
        pytest.raises(RuntimeError, match="the test failed"),
        processes.popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as child,
    ):
        assert child.stdout is not None
        assert child.stdout.readline() == "up\n"
        raise RuntimeError("the test failed")
    assert child.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 30
    wait_until(lambda: living_in_group(child.pid) == [])


def living_in_group(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that are not zombies."""
    living = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            living.append(int(stat.parent.name))
    return living


def test_a_child_left_running_is_stopped_after_the_test() -> None:
    child = processes.popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert processes.stop_started() == [[sys.executable, "-c", "import time; time.sleep(60)"]]
    assert child.returncode == -signal.SIGKILL


def break_a_run(url: URL) -> None:
    """A run marked cancelled behind cyclone's back: a terminal run with a job to run."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    wf = cyclone.Workflow("broken")
    wf.step("only")(lambda ctx, value: None)
    run = wf.submit(engine, 1)
    start_runs(engine, wf)
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cyclone_runs SET state = 'cancelled', finalized_at = now() WHERE id = :id"
            ),
            {"id": run.id},
        )
    engine.dispose()


def test_the_check_after_a_test_reports_a_broken_invariant_of_its_database(own_url: URL) -> None:
    break_a_run(own_url)
    _left, found = at_rest.after_test()  # what the autouse fixture runs after the test
    assert list(found) == [own_url.database]
    (broken,) = found[str(own_url.database)]
    assert broken == "a terminal run has no job waiting to run (available or blocked)"
    assert "a terminal run has no job waiting to run" in at_rest.describe(found)


def test_a_test_that_breaks_an_invariant_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(
        textwrap.dedent(
            """
            from tests.test_test_support import break_a_run

            def test_breaks_a_run(own_url):
                break_a_run(own_url)

            def test_leaves_its_database_at_rest(own_url):
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_breaks_a_run*",
            "*a terminal run has no job waiting to run (available or blocked)*",
        ]
    )


def test_a_connection_dropped_open_fails_the_test_and_says_where_it_was_opened(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    pytester.makeconftest("from tests.conftest import *  # noqa: F403\n")
    pytester.makepyfile(
        textwrap.dedent(
            """
            import psycopg
            from tests.conftest import admin_url

            def open_and_forget():
                url = admin_url().set(drivername="postgresql")
                psycopg.connect(url.render_as_string(hide_password=False))

            def test_drops_a_connection_open():
                open_and_forget()

            def test_closes_its_connection():
                pass
            """
        )
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", "-W", "error"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*FAILED*test_drops_a_connection_open*",
        ]
    )
    result.stdout.fnmatch_lines(
        [
            "*garbage-collected while still open; it was opened during "
            "test_a_connection_dropped_open_fails_the_test_and_says_where_it_was_opened.py"
            "::test_drops_a_connection_open (call), at:*",
            "*in open_and_forget*",
        ]
    )


@cyclone.step("support.lane", concurrency=cyclone.Concurrency(1, key=lambda args: args["lane"]))
def lane_step(ctx: cyclone.StepContext, args: dict[str, str]) -> None: ...


def test_a_job_waiting_on_a_free_limit_slot_breaks_the_drained_invariant_only(
    own_engine: sa.Engine,
) -> None:
    """A limited job left available while its key has room is a lost wake-up once the
    workers have done all they could (the model-based test's end of an example): the
    ``drained`` check says so; at rest alone a job enqueued and not served yet is fine.
    A job whose key is full (its slot held by a running job) is waiting, not lost."""
    name = "no due job waits on a Concurrency whose key has room (a slot free, not taken)"
    lane_step.enqueue(own_engine, {"lane": "x"})
    lane_step.enqueue(own_engine, {"lane": "x"})
    with own_engine.connect() as conn:
        assert invariants.violations(conn, at_rest=True) == {}
        found = invariants.violations(conn, at_rest=True, drained=True)
    assert list(found) == [name]
    assert len(found[name]) == 2
    with own_engine.begin() as conn:  # one of them holds the slot (as a worker's claim)
        conn.execute(
            sa.text(
                "UPDATE cyclone_jobs SET state = 'running', worker_id = 'w:1', attempt = 1, "
                "heartbeat_at = now(), attempted_at = now() "
                "WHERE id = (SELECT min(id) FROM cyclone_jobs)"
            )
        )
    with own_engine.connect() as conn:
        assert name not in invariants.violations(conn, at_rest=False, drained=False)
        assert list(invariants.violations(conn, at_rest=True, drained=True)) == [
            "no job is running once every worker has stopped"
        ]
    with own_engine.begin() as conn:  # leave it at rest for the check after the test
        conn.execute(sa.text("DELETE FROM cyclone_jobs"))
