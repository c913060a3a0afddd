"""``cyclone runs list`` and ``runs show`` as a subprocess: parked runs are told from running
ones ("waiting for 'paid'", "sleeping until ...", "starts at ..."), and ``--parked`` filters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone.client import Client
from tests.support import processes
from tests.test_parked import parking

ROOT = Path(__file__).resolve().parent.parent


def cli(url: URL, *args: str) -> subprocess.CompletedProcess[str]:
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
        env={**os.environ, "COLUMNS": "250"},
        timeout=60,
    )


def field(shown: subprocess.CompletedProcess[str], name: str) -> str:
    """The value of a ``name  value`` line of ``runs show``."""
    found = re.search(rf"^{name} +(.+)$", shown.stdout, re.M)
    assert found is not None, shown.stdout
    return found.group(1)


def test_runs_show_says_waiting_for_the_signal_sleeping_until_and_starts_at(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    flows = parking(name)
    waiting = flows.waits.submit(engine, 1)
    sleeping = flows.sleeps.submit(engine, 2)
    at = datetime(2100, 1, 2, 3, 4, 5, tzinfo=UTC)
    delayed = flows.waits.submit(engine, 3, run_at=at)
    cyclone.Worker(engine, workflows=[flows.waits, flows.sleeps]).drain()

    shown = cli(database_url, "runs", "show", str(waiting.id))
    assert shown.returncode == 0, shown.stderr
    assert field(shown, "state") == "running"
    assert field(shown, "parked") == "waiting for 'paid'"
    row = next(line for line in shown.stdout.splitlines() if line.startswith("paid "))
    assert "waiting for 'paid'" in row
    assert row.split()[1] == "blocked"

    shown = cli(database_url, "runs", "show", str(sleeping.id))
    detail = Client(engine).get_run_detail(sleeping.id)
    assert detail is not None
    wakes = next(s.wakes_at for s in detail.steps if s.name == "remind")
    assert wakes is not None
    until = wakes.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    assert field(shown, "parked") == f"sleeping until {until}"
    row = next(line for line in shown.stdout.splitlines() if line.startswith("remind "))
    assert f"sleeping until {until}" in row
    assert "so far" not in shown.stdout

    shown = cli(database_url, "runs", "show", str(delayed.id))
    assert field(shown, "parked") == "starts at 2100-01-02 03:04:05"
    row = next(line for line in shown.stdout.splitlines() if line.startswith("reserve "))
    assert "starts at 2100-01-02 03:04:05" in row

    record = json.loads(cli(database_url, "runs", "show", str(waiting.id), "--json").stdout)
    assert record["parked"] == "waiting"
    paid = next(s for s in record["steps"] if s["name"] == "paid")
    assert (paid["waiting_for"], paid["parked"], paid["wakes_at"]) == ("paid", "waiting", None)
    for run in (waiting, sleeping, delayed):
        run.cancel()


def test_runs_list_shows_a_parked_column_and_filters_by_it(
    engine: sa.Engine, database_url: URL, name: str
) -> None:
    flows = parking(name)
    waiting = flows.waits.submit(engine, 1)
    sleeping = flows.sleeps.submit(engine, 2)
    delayed = flows.waits.submit(engine, 3, delay=timedelta(days=1))
    cyclone.Worker(engine, workflows=[flows.waits, flows.sleeps]).drain()
    running = flows.waits.submit(engine, 4)

    listed = cli(database_url, "runs", "list", "--workflow", flows.waits.name)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:5] == ["ID", "WORKFLOW", "KEY", "STATE", "PARKED"]
    parked = {row.split()[0]: row.split()[4] for row in rows}
    assert parked == {
        str(waiting.id): "waiting",
        str(delayed.id): "delayed",
        str(running.id): "-",
    }
    for kind, run in (("waiting", waiting), ("sleeping", sleeping), ("delayed", delayed)):
        found = cli(database_url, "runs", "list", "--parked", kind, "--json", "--limit", "1000")
        assert found.returncode == 0, found.stderr
        records = [json.loads(line) for line in found.stdout.splitlines()]
        mine = [r for r in records if r["workflow"].startswith(name)]
        assert [r["id"] for r in mine] == [str(run.id)]
        assert {r["parked"] for r in records} == {kind}
        assert {r["state"] for r in records} == {"running"}

    bad = cli(database_url, "runs", "list", "--parked", "resting")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1
    assert "'resting'" in bad.stderr
    for run in (waiting, sleeping, delayed, running):
        run.cancel()
