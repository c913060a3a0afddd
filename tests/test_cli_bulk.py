"""``cyclone runs cancel|retry --all``, ``cyclone jobs retry`` and ``cyclone queues``, run as
a user runs them: the console script in a subprocess, on a database of the test's own."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from tests.support import processes

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.processes


def cli(url: URL, *args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    return processes.run(
        [
            sys.executable,
            "-m",
            "cyclone",
            *args,
            "--url",
            url.render_as_string(hide_password=False),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        stdin=stdin,
        env={**os.environ, "COLUMNS": "200"},
        timeout=60,
    )


@pytest.fixture
def engine(fresh_database: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(fresh_database, poolclass=sa.NullPool)
    cyclone.upgrade(engine)
    yield engine
    engine.dispose()


def shop(engine: sa.Engine) -> tuple[cyclone.Workflow[Any], list[cyclone.Run]]:
    """Runs of ``checkout``: orders 1 and 3 fail, order 2 completes, orders 4 and 5 run."""
    wf = cyclone.Workflow("checkout")

    @wf.step(max_attempts=1)
    def charge(ctx: cyclone.StepContext, order: int) -> int:
        if order % 2:
            raise RuntimeError(f"card declined for order {order}")
        return order

    runs = [wf.submit_once(engine, f"order-{i}", i)[0] for i in (1, 2, 3)]
    cyclone.Worker(engine, workflows=[wf]).drain()
    runs += [wf.submit_once(engine, f"order-{i}", i)[0] for i in (4, 5)]
    return wf, runs


def states(runs: list[cyclone.Run]) -> list[str]:
    return [r.status().state.value for r in runs]


def test_runs_retry_all_filtered_retries_every_failed_run_with_yes(engine: sa.Engine) -> None:
    _wf, runs = shop(engine)
    url = engine.url

    dry = cli(url, "runs", "retry", "--all", "--workflow", "checkout", "--dry-run")
    assert (dry.returncode, dry.stdout) == (0, "would retry 2 runs (workflow checkout)\n")

    done = cli(url, "runs", "retry", "--all", "--workflow", "checkout", "--state", "failed", "-y")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "retried 2 runs\n"
    assert states(runs) == ["running", "completed", "running", "running", "running"]

    again = cli(url, "runs", "retry", "--all", "--workflow", "checkout", "--yes")
    assert (again.returncode, again.stdout) == (
        0,
        "no failed or cancelled runs match (workflow checkout): nothing to retry\n",
    )
    cyclone.Client(engine).cancel_runs()


def test_runs_cancel_all_without_yes_refuses_when_stdin_is_not_a_terminal(
    engine: sa.Engine,
) -> None:
    _wf, runs = shop(engine)
    refused = cli(engine.url, "runs", "cancel", "--all", "--since", "1h")
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.startswith("cyclone: Cancel 2 runs (running) (since ")
    assert refused.stderr.endswith("? Pass --yes to confirm (stdin is not a terminal)\n")
    assert states(runs)[3:] == ["running", "running"]

    done = cli(engine.url, "runs", "cancel", "--all", "--since", "1h", "--yes")
    assert (done.returncode, done.stdout) == (0, "cancelled 2 runs\n")
    assert states(runs)[3:] == ["cancelled", "cancelled"]


def answer(url: URL, reply: str, *args: str) -> tuple[int, str]:
    """Run the command with a terminal as stdin, answer its question with ``reply``."""
    controller, terminal = pty.openpty()
    argv = [
        sys.executable,
        "-m",
        "cyclone",
        *args,
        "--url",
        url.render_as_string(hide_password=False),
    ]
    with processes.popen(
        argv, stdin=terminal, stdout=terminal, stderr=terminal, cwd=ROOT, env=dict(os.environ)
    ) as proc:
        os.close(terminal)
        seen = b""
        while b"[y/N]" not in seen:
            chunk = os.read(controller, 4096)
            assert chunk, seen
            seen += chunk
        os.write(controller, reply.encode() + b"\n")
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        status = proc.wait(timeout=60)
    os.close(controller)
    return status, seen.decode().replace("\r\n", "\n")


def test_runs_cancel_all_on_a_terminal_asks_how_many_and_acts_only_on_yes(
    engine: sa.Engine,
) -> None:
    _wf, runs = shop(engine)
    status, shown = answer(engine.url, "n", "runs", "cancel", "--all", "--workflow", "checkout")
    assert "Cancel 2 runs (running) (workflow checkout)? [y/N]: n\n" in shown
    assert "cyclone: nothing changed" in shown
    assert status == 1
    assert states(runs)[3:] == ["running", "running"]

    status, shown = answer(engine.url, "y", "runs", "cancel", "--all", "--workflow", "checkout")
    assert status == 0, shown
    assert shown.endswith("cancelled 2 runs\n")
    assert states(runs)[3:] == ["cancelled", "cancelled"]


def test_single_run_commands_still_take_a_run_id_and_refuse_mixed_forms(
    engine: sa.Engine,
) -> None:
    _wf, runs = shop(engine)
    done = cli(engine.url, "runs", "cancel", str(runs[3].id))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"cancelled run {runs[3].id} of workflow checkout\n"
    done = cli(engine.url, "runs", "retry", str(runs[0].id))
    assert done.stdout == f"retrying run {runs[0].id} of workflow checkout\n"

    for args, message in [
        (("runs", "cancel"), "give RUN_ID, or --all to act on every run the filters list"),
        (("runs", "cancel", "--workflow", "checkout"), "give RUN_ID, or --all"),
        (("runs", "cancel", str(runs[4].id), "--all"), "give RUN_ID or --all with filters"),
        (("runs", "retry", str(runs[2].id), "--state", "failed"), "--state goes with --all"),
        (("runs", "retry", "--all", "--state", "completed"), "'completed' is not one of"),
        (
            ("runs", "cancel", "--all", "--since", "1h", "--until", "2h", "--yes"),
            "is not before --until",
        ),
    ]:
        refused = cli(engine.url, *args)
        assert refused.returncode == 2, (args, refused.stderr)
        assert message in refused.stderr, (args, refused.stderr)
        assert refused.stderr.count("\n") == 1
    assert states(runs) == ["running", "completed", "failed", "cancelled", "running"]
    cyclone.Client(engine).cancel_runs()


def test_jobs_retry_runs_a_failed_job_again_and_refuses_one_not_failed(engine: sa.Engine) -> None:
    @cyclone.step("send_email", max_attempts=1)
    def send_email(ctx: cyclone.StepContext, to: str) -> None:
        raise RuntimeError("smtp down")

    job = send_email.enqueue(engine, "ada@example.com")
    cyclone.Worker(engine, steps=[send_email]).drain()
    done = cli(engine.url, "jobs", "retry", str(job.id))
    assert (done.returncode, done.stdout) == (0, f"retrying job {job.id}\n")
    assert job.status().state == cyclone.JobState.AVAILABLE
    refused = cli(engine.url, "jobs", "retry", str(job.id))
    assert refused.returncode == 1
    assert refused.stderr == f"cyclone: cannot retry job {job.id}: it is available\n"
    job.cancel()


def test_queues_list_pause_and_resume(engine: sa.Engine) -> None:
    @cyclone.step("resize", queue="images")
    def resize(ctx: cyclone.StepContext, name: str) -> None: ...

    for i in range(3):
        resize.enqueue(engine, f"{i}.png")
    paused = cli(engine.url, "queues", "pause", "images")
    assert (paused.returncode, paused.stdout) == (0, "paused queue images\n")
    again = cli(engine.url, "queues", "pause", "images")
    assert again.stdout == "queue images was paused already\n"
    assert cyclone.Worker(engine, steps=[resize]).drain() == 0

    listed = cli(engine.url, "queues", "list")
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "PAUSED", "AVAILABLE", "SCHEDULED", "RUNNING"]
    assert lines[1].split()[:3] == ["images", "since", lines[1].split()[2]]
    assert lines[1].split()[-3:] == ["3", "0", "0"]
    as_json = cli(engine.url, "queues", "list", "--json")
    assert '"name":"images","paused":true' in as_json.stdout

    resumed = cli(engine.url, "queues", "resume", "images")
    assert (resumed.returncode, resumed.stdout) == (0, "resumed queue images\n")
    assert cyclone.Worker(engine, steps=[resize]).drain() == 3
    listed = cli(engine.url, "queues", "list")
    assert listed.stdout.splitlines()[1].split() == ["images", "no", "0", "0", "0"]


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_an_empty_queue_name_is_bad_usage_in_one_line(engine: sa.Engine, verb: str) -> None:
    """It was "cyclone: ValueError: queue must be a non-empty str" with status 1, as if
    an operation had failed; a bad argument is status 2."""
    refused = cli(engine.url, "queues", verb, "")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        "cyclone: Invalid value for 'NAME': a queue name is a non-empty string "
        f"(see 'cyclone queues {verb} --help')\n"
    )
