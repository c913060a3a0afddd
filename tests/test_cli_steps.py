"""The jobs of steps as an operator meets them, ``cyclone`` run as a subprocess: ``jobs show``
of a step's job id (from a worker's log or ``runs show``) shows it and names its run."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
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
