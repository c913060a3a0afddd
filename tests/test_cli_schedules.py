"""``cyclone schedules list|pause|resume`` through click's CliRunner, real PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import CliRunner, Result
from sqlalchemy.engine import URL

import cyclone
from cyclone import schedules as sched
from cyclone.cli import build_cli
from cyclone.schema import schedules


def invoke(url: URL, *args: str) -> Result:
    return CliRunner().invoke(build_cli(), [*args, "--url", url.render_as_string(False)])


def json_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture
def registered(engine: sa.Engine, name: str) -> Iterator[str]:
    """A schedule ``name`` firing every 6 hours, registered as a worker registers it."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def noop(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    sched.register(engine, [wf.schedule(name, every=timedelta(hours=6), input={"n": 1})])
    yield name
    with engine.begin() as conn:
        conn.execute(schedules.delete().where(schedules.c.name == name))


def test_schedules_list_shows_each_registered_schedule_with_its_ticks(
    database_url: URL, registered: str
) -> None:
    done = invoke(database_url, "schedules", "list")
    assert done.exit_code == 0, done.output
    header, *rows = done.stdout.splitlines()
    assert header.split("  ")[0] == "NAME"
    assert "NEXT TICK (UTC)" in header
    (row,) = [line for line in rows if line.startswith(registered + " ")]
    assert row.split()[1:6] == [registered, "every", "6h00m", "UTC", "latest"]
    assert row.split()[6] == "no"

    listed = json_lines(invoke(database_url, "schedules", "list", "--json"))
    (record,) = [r for r in listed if r["name"] == registered]
    assert record["workflow"] == registered
    assert (record["cron"], record["every"]) == (None, 6 * 3600.0)
    assert (record["paused"], record["missed"], record["timezone"]) == (False, "latest", "UTC")
    last = datetime.fromisoformat(record["last_tick"])
    following = datetime.fromisoformat(record["next_tick"])
    # Interval ticks fall on multiples of the interval since the epoch.
    assert last < following <= last + timedelta(hours=6)
    assert following.timestamp() % (6 * 3600) == 0
    assert row.split()[-2:] == following.strftime("%Y-%m-%d %H:%M:%S").split()
    assert abs(last - datetime.now(UTC)) < timedelta(minutes=1)


def test_schedules_pause_and_resume_change_the_stored_schedule(
    engine: sa.Engine, database_url: URL, registered: str
) -> None:
    def stored() -> cyclone.ScheduleStatus:
        (found,) = [s for s in cyclone.Client(engine).list_schedules() if s.name == registered]
        return found

    paused = invoke(database_url, "schedules", "pause", registered)
    assert paused.exit_code == 0, paused.output
    assert paused.stdout == f"paused schedule {registered}\n"
    assert stored().paused
    (record,) = [
        r
        for r in json_lines(invoke(database_url, "schedules", "list", "--json"))
        if r["name"] == registered
    ]
    assert (record["paused"], record["next_tick"]) == (True, None)

    resumed = invoke(database_url, "schedules", "resume", registered)
    assert resumed.exit_code == 0, resumed.output
    assert resumed.stdout == f"resumed schedule {registered}\n"
    assert not stored().paused
    assert stored().next_tick is not None


def test_schedules_pause_or_resume_that_changes_nothing_says_so(
    engine: sa.Engine, database_url: URL, registered: str
) -> None:
    """A second pause, or a resume of a running schedule, says it changed nothing (as
    `queues pause|resume` do), and the resume leaves the schedule's last tick alone."""
    before = [s for s in cyclone.Client(engine).list_schedules() if s.name == registered]
    resumed = invoke(database_url, "schedules", "resume", registered)
    assert (resumed.exit_code, resumed.stdout) == (0, f"schedule {registered} was not paused\n")
    after = [s for s in cyclone.Client(engine).list_schedules() if s.name == registered]
    assert after[0].last_tick == before[0].last_tick
    assert invoke(database_url, "schedules", "pause", registered).exit_code == 0
    again = invoke(database_url, "schedules", "pause", registered)
    assert (again.exit_code, again.stdout) == (0, f"schedule {registered} was paused already\n")


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_schedules_pause_or_resume_of_an_unknown_name_is_one_line_and_status_1(
    database_url: URL, name: str, verb: str
) -> None:
    done = invoke(database_url, "schedules", verb, name)
    assert done.exit_code == 1
    assert done.stdout == ""
    assert done.stderr == f"cyclone: no schedule named {name!r} is registered\n"


def test_schedules_pause_without_a_name_is_bad_usage(database_url: URL) -> None:
    done = invoke(database_url, "schedules", "pause")
    assert done.exit_code == 2
    assert "NAME" in done.stderr


@pytest.mark.parametrize("verb", ["pause", "resume"])
def test_schedules_pause_or_resume_of_a_name_that_is_no_utf8_is_bad_usage(
    database_url: URL, verb: str
) -> None:
    # Bytes of argv that are no UTF-8 reach the command as lone surrogates: the command
    # printed "cyclone: UnicodeEncodeError: ..." with status 1, a failed operation's.
    done = invoke(database_url, "schedules", verb, "night\udcff")
    assert done.exit_code == 2
    assert done.stdout == ""
    assert done.stderr == (
        "cyclone: NAME: name='night\\udcff' is not valid UTF-8 (it holds a lone surrogate)\n"
    )
