"""The jobs of steps as an operator meets them, ``cyclone`` run as a subprocess: ``jobs show``
of a step's job id (from a worker's log or ``runs show``) shows it and names its run, and
``runs show`` of a running run says which worker holds each running step, and for how long."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone.schema import jobs
from tests.conftest import wait_until
from tests.support.workers import Background
from tests.test_cli_parked import cli, field


def test_jobs_show_of_a_step_shows_the_job_and_names_its_run(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    """It said "standalone job N does not exist" for a job that does."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step(max_attempts=2)
    def charge(ctx: cyclone.StepContext, order: Any) -> None:
        raise RuntimeError(f"card declined for {order['id']}")

    run = wf.submit(engine, {"id": 7})
    cyclone.Worker(engine, workflows=[wf], backoff=lambda n: 0.0).drain()
    assert run.wait(timeout=10).state == cyclone.RunState.FAILED
    shown_run = json.loads(cli(database_url, "runs", "show", str(run.id), "--json").stdout)
    job_id = shown_run["steps"][0]["job_id"]

    shown = cli(database_url, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    assert field(shown, "job") == str(job_id)
    assert field(shown, "run") == str(run.id)
    assert field(shown, "workflow") == name
    assert field(shown, "step") == "charge"
    assert field(shown, "state") == "failed"
    assert field(shown, "attempts") == "2/2"
    assert 'input\n    {\n      "id": 7\n    }' in shown.stdout
    assert shown.stdout.count(f"job {job_id}, attempt ") == 2
    assert "    RuntimeError: card declined for 7" in shown.stdout

    as_json = cli(database_url, "jobs", "show", str(job_id), "--json")
    assert as_json.returncode == 0, as_json.stderr
    record = json.loads(as_json.stdout)
    assert (record["id"], record["kind"], record["state"]) == (job_id, "charge", "failed")
    assert (record["run_id"], record["workflow"], record["item"]) == (str(run.id), name, None)
    assert record["args"] == {"id": 7}
    assert [e["message"] for e in record["errors"]] == ["card declined for 7"] * 2
    assert record["worker_id"] == shown_run["steps"][0]["worker_id"]

    missing = cli(database_url, "jobs", "show", "999999999999")
    assert (missing.returncode, missing.stderr) == (1, "cyclone: job 999999999999 does not exist\n")


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    opened = threading.Event()
    yield opened
    opened.set()  # a failed test lets its step end, so its worker stops


def attempt_age(engine: sa.Engine, job_id: int) -> timedelta:
    """How long the job's attempt has run, by the database's clock."""
    with engine.connect() as conn:
        age: timedelta = conn.execute(
            sa.select(sa.func.now() - jobs.c.attempted_at).where(jobs.c.id == job_id)
        ).scalar_one()
    return age


def test_runs_show_of_a_running_step_names_its_worker_and_how_long_it_has_run(
    engine: sa.Engine,
    database_url: URL,
    name: str,
    serving: Callable[[cyclone.Worker], Background],
    gate: threading.Event,  # after serving: opened before the worker is stopped
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    @wf.step(after=[first])
    def hold(ctx: cyclone.StepContext, value: Any) -> int:
        gate.wait(30)
        return 2

    @wf.step(after=[hold])
    def last(ctx: cyclone.StepContext, value: Any) -> int:
        return 3

    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf], concurrency=1)
    serving(worker)
    client = cyclone.Client(engine)

    def running() -> int | None:
        detail = client.get_run_detail(run.id)
        assert detail is not None
        held = [s.job_id for s in detail.steps if s.state == cyclone.JobState.RUNNING]
        return held[0] if held else None

    job_id = wait_until(running, message="the step hold running")
    before = attempt_age(engine, job_id)
    shown = cli(database_url, "runs", "show", str(run.id))
    as_json = cli(database_url, "runs", "show", str(run.id), "--json")
    after = attempt_age(engine, job_id)
    assert shown.returncode == 0, shown.stderr
    assert as_json.returncode == 0, as_json.stderr

    steps = shown.stdout.split("\nsteps\n")[1].splitlines()
    assert steps[0].split()[6] == "DURATION"
    assert steps[2].split()[:3] == ["hold", "running", "1/3"]
    assert steps[2].split()[7:9] == ["so", "far"]  # its DURATION: how long it has run
    assert "so far" not in steps[1]
    assert "so far" not in steps[3]
    held_by = r"^step hold, attempt 1, running for (\S+) on worker (\S+)$"
    line = re.search(held_by, shown.stdout, re.M)
    assert line is not None, shown.stdout
    assert line.group(2) == worker.id

    by_name = {step["name"]: step for step in json.loads(as_json.stdout)["steps"]}
    held = by_name["hold"]
    assert (held["state"], held["worker_id"]) == ("running", worker.id)
    assert before.total_seconds() <= held["running_for"] <= after.total_seconds()
    assert held["duration"] is None
    assert by_name["first"]["running_for"] is None
    assert by_name["last"]["running_for"] is None

    gate.set()
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    done = json.loads(cli(database_url, "runs", "show", str(run.id), "--json").stdout)
    assert [s["running_for"] for s in done["steps"]] == [None, None, None]
