"""Schedules in the database: registration, firing once per tick, missed-tick policies,
pause and resume, crashes, and four worker processes firing one schedule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import schedules as sched
from cyclone.schema import runs, schedules
from tests.conftest import wait_until
from tests.support import processes
from tests.support.pgcluster import free_port
from tests.support.workers import REPO, Background, stop_all


def workflow(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def noop(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    return wf


def runs_of(engine: sa.Engine, name: str) -> dict[str, Any]:
    """The key and input of each run of workflow ``name``."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(runs.c.submit_key, runs.c.input).where(runs.c.workflow == name)
        ).all()
    return {key: value for key, value in rows}


def ticks_of(engine: sa.Engine, name: str) -> list[datetime]:
    prefix = f"schedule:{name}:"
    keys = [key for key in runs_of(engine, name) if key and key.startswith(prefix)]
    return sorted(datetime.fromisoformat(key[len(prefix) :]) for key in keys)


def set_last_tick(engine: sa.Engine, name: str, ago: timedelta) -> None:
    """Move the schedule's last fired tick back, as if no worker had run for ``ago``."""
    with engine.begin() as conn:
        conn.execute(
            schedules.update().where(schedules.c.name == name).values(last_tick=sa.func.now() - ago)
        )


def fire(engine: sa.Engine, schedule: cyclone.Schedule) -> sched.Fired:
    with engine.begin() as conn:
        return sched.fire(conn, schedule)


def status(engine: sa.Engine, name: str) -> cyclone.ScheduleStatus:
    (found,) = [s for s in cyclone.Client(engine).list_schedules() if s.name == name]
    return found


@pytest.fixture
def cleanup(engine: sa.Engine) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    with engine.begin() as conn:
        conn.execute(schedules.delete().where(schedules.c.name.in_(names)))


def hourly(engine: sa.Engine, name: str, cleanup: list[str], **options: Any) -> cyclone.Schedule:
    wf = workflow(name)
    schedule = wf.schedule(name, every=timedelta(hours=1), input={"n": 1}, **options)
    sched.register(engine, [schedule])
    cleanup.append(name)
    return schedule


def test_registering_keeps_the_definition_and_starts_at_now(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    wf = workflow(name)
    wf.schedule(name, cron="0 3 * * *", timezone="Europe/Berlin", input={}, missed="catch_up")
    cleanup.append(name)
    sched.register(engine, list(wf.schedules.values()))
    found = status(engine, name)
    assert (found.workflow, found.cron, found.every, found.timezone) == (
        name,
        "0 3 * * *",
        None,
        "Europe/Berlin",
    )
    assert (found.missed, found.max_catch_up, found.paused) == ("catch_up", 10, False)
    assert abs(found.last_tick - datetime.now(UTC)) < timedelta(minutes=1)
    assert found.next_tick is not None
    assert found.next_tick.astimezone(UTC).hour in (1, 2)
    # A new registration (a redeploy) updates the definition and keeps the last tick...
    wf1 = workflow(name)
    wf1.schedule(name, cron="0 3 * * *", timezone="Europe/Berlin", input={"new": 1})
    sched.register(engine, list(wf1.schedules.values()))
    kept = status(engine, name)
    assert (kept.missed, kept.last_tick) == ("latest", found.last_tick)
    # ...unless its timing changed: it starts at its registration, as a new schedule.
    wf2 = workflow(name)
    wf2.schedule(name, every=timedelta(minutes=5), input={})
    sched.register(engine, list(wf2.schedules.values()))
    again = status(engine, name)
    assert (again.cron, again.every) == (None, timedelta(minutes=5))
    assert again.last_tick >= found.last_tick


def test_a_new_schedule_fires_no_tick_from_before_it_was_registered(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    assert fire(engine, schedule).ticks == ()
    assert runs_of(engine, name) == {}


def test_catch_up_fires_the_most_recent_missed_ticks_up_to_the_limit(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    schedule = hourly(engine, name, cleanup, missed="catch_up", max_catch_up=3)
    set_last_tick(engine, name, timedelta(hours=10))
    fired = fire(engine, schedule)
    assert len(fired.ticks) == 3
    assert ticks_of(engine, name) == list(fired.ticks)
    assert [b - a for a, b in zip(fired.ticks, fired.ticks[1:], strict=False)] == [
        timedelta(hours=1)
    ] * 2
    assert datetime.now(UTC) - fired.ticks[-1] < timedelta(hours=1)
    assert status(engine, name).last_tick == fired.ticks[-1]
    assert runs_of(engine, name)[schedule.key(fired.ticks[0])] == {"n": 1}


def test_latest_fires_only_the_most_recent_missed_tick(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    schedule = hourly(engine, name, cleanup)
    set_last_tick(engine, name, timedelta(hours=10))
    (tick,) = fire(engine, schedule).ticks
    assert ticks_of(engine, name) == [tick]
    assert datetime.now(UTC) - tick < timedelta(hours=1)


def test_a_schedule_whose_input_fails_is_looked_at_again_later_not_every_second(
    engine: sa.Engine, name: str, cleanup: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # An input callable that raises, or returns what is not the workflow's input, failed
    # the schedule's look every second for as long as the worker ran, each one a
    # transaction and a traceback in the log. Now it waits 1 s, 2 s, 4 s... up to a
    # minute, and the tick still fires once the input can be made.
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)
    wf.step()(lambda ctx, value: None)
    calls: list[datetime] = []
    answer: list[Any] = ["not an int"]

    def make_input(tick: datetime) -> Any:
        calls.append(tick)
        return answer[0]

    schedule = wf.schedule(name, every=timedelta(hours=1), input=make_input)
    sched.register(engine, [schedule])
    cleanup.append(name)
    set_last_tick(engine, name, timedelta(hours=2))
    clock = [1000.0]
    monkeypatch.setattr(sched.time, "monotonic", lambda: clock[0])
    failing: dict[str, sched.Failing] = {}

    assert sched.fire_all(engine, [schedule], failing) == 1.0
    assert len(calls) == 1
    clock[0] += 0.5
    assert sched.fire_all(engine, [schedule], failing) == 0.5  # not looked at again yet
    assert len(calls) == 1
    clock[0] += 0.5
    assert sched.fire_all(engine, [schedule], failing) == 2.0  # failed again: 2 s now
    assert len(calls) == 2
    failing[name].failures = 10
    clock[0] += 2.0
    assert sched.fire_all(engine, [schedule], failing) == 60.0  # at most a minute
    assert ticks_of(engine, name) == []

    answer[0] = 7
    clock[0] += 60.0
    sched.fire_all(engine, [schedule], failing)
    assert failing == {}
    (tick,) = ticks_of(engine, name)
    assert tick == calls[-1]
    assert list(runs_of(engine, name).values()) == [7]


def test_a_schedule_failing_for_a_day_blocks_no_other_schedule(
    engine: sa.Engine, name: str, cleanup: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backoff was 2.0 ** (failures - 1) capped afterwards: at 1,024 failures in a row
    # (17 hours of a failing input callable, 85 minutes of an outage at 5 s) the power
    # overflowed, the OverflowError left fire_all, and every schedule after the failing
    # one (by name) was never looked at again while it failed.
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)
    wf.step()(lambda ctx, value: None)
    failing_schedule = wf.schedule(f"{name}-a", every=timedelta(hours=1), input=lambda t: "x")
    later = hourly(engine, f"{name}-b", cleanup, missed="catch_up")
    sched.register(engine, [failing_schedule])
    cleanup.append(f"{name}-a")
    set_last_tick(engine, f"{name}-a", timedelta(hours=2))
    set_last_tick(engine, f"{name}-b", timedelta(hours=2))
    clock = [1000.0]
    monkeypatch.setattr(sched.time, "monotonic", lambda: clock[0])
    failing = {failing_schedule.name: sched.Failing(1024, clock[0])}
    with engine.connect() as conn:  # the hourly ticks fall on the hours of the server's clock
        to_next_hour = float(
            conn.execute(
                sa.text("SELECT 3600 - mod(extract(epoch FROM clock_timestamp()), 3600)")
            ).scalar_one()
        )
    waited = sched.fire_all(engine, [later, failing_schedule], failing)
    # The failing schedule tries again in a minute, the other at its next tick: the top of
    # the hour, sooner than that in an hour's last minute.
    if to_next_hour > sched.MAX_SLEEP:
        assert waited == sched.MAX_SLEEP
    else:
        assert 0.0 <= waited <= to_next_hour + 1.0
    assert failing[failing_schedule.name].failures == 1025
    assert len(ticks_of(engine, f"{name}-b")) == 2


def test_a_schedule_that_could_not_reach_the_database_is_looked_at_again_within_seconds(
    engine: sa.Engine, name: str, cleanup: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The backoff for a failing input callable also grew to a minute while the database
    # was down, so the ticks of an outage fired up to a minute after it ended.
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    set_last_tick(engine, name, timedelta(hours=2))
    down = sa.create_engine(engine.url.set(host="127.0.0.1", port=free_port()))
    clock = [1000.0]
    monkeypatch.setattr(sched.time, "monotonic", lambda: clock[0])
    failing: dict[str, sched.Failing] = {}
    try:
        waits = []
        for _ in range(8):
            waits.append(sched.fire_all(down, [schedule], failing))
            clock[0] += waits[-1]
    finally:
        down.dispose()
    assert waits == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0, 5.0]
    assert failing[name].failures == 8
    sched.fire_all(engine, [schedule], failing)  # the database is back
    assert failing == {}
    assert len(ticks_of(engine, name)) == 2


def test_a_fired_tick_is_not_fired_again(engine: sa.Engine, name: str, cleanup: list[str]) -> None:
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    set_last_tick(engine, name, timedelta(hours=3))
    assert len(fire(engine, schedule).ticks) == 3
    again = fire(engine, schedule)
    assert again.ticks == ()
    assert 0 < again.wait <= sched.MAX_SLEEP
    assert len(ticks_of(engine, name)) == 3


def test_a_crash_before_the_commit_leaves_the_ticks_to_fire_again(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    set_last_tick(engine, name, timedelta(hours=2))
    before = status(engine, name).last_tick
    with engine.connect() as conn:
        tx = conn.begin()
        assert len(sched.fire(conn, schedule).ticks) == 2
        tx.rollback()  # the worker died before committing
    assert runs_of(engine, name) == {}
    assert status(engine, name).last_tick == before
    assert len(fire(engine, schedule).ticks) == 2
    assert len(ticks_of(engine, name)) == 2


def test_a_schedule_being_fired_elsewhere_is_skipped_not_waited_for(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    set_last_tick(engine, name, timedelta(hours=1))
    with engine.connect() as first:
        tx = first.begin()
        (tick,) = sched.fire(first, schedule).ticks
        other = fire(engine, schedule)
        assert other.ticks == ()
        assert other.wait == sched.LOCKED_RETRY
        tx.commit()
    assert fire(engine, schedule).ticks == ()
    assert ticks_of(engine, name) == [tick]


def test_a_tick_whose_key_has_a_run_already_keeps_that_run(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    schedule = hourly(engine, name, cleanup)
    set_last_tick(engine, name, timedelta(hours=1))
    tick = sched._ticks.latest(
        schedule.spec, datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC), 1
    )[0]
    manual, _ = schedule.workflow.submit_once(engine, schedule.key(tick), {"n": 2})
    assert fire(engine, schedule).ticks == (tick,)
    assert schedule.workflow.get_run(engine, schedule.key(tick)) == manual
    assert status(engine, name).last_tick == tick


def test_pause_stops_firing_and_resume_skips_the_paused_ticks(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    client = cyclone.Client(engine)
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    client.pause_schedule(name)
    assert status(engine, name).paused
    assert status(engine, name).next_tick is None
    set_last_tick(engine, name, timedelta(hours=5))
    assert fire(engine, schedule).ticks == ()
    client.resume_schedule(name)
    resumed = status(engine, name)
    assert not resumed.paused
    assert abs(resumed.last_tick - datetime.now(UTC)) < timedelta(minutes=1)
    assert fire(engine, schedule).ticks == ()  # the five paused hours are not caught up
    assert runs_of(engine, name) == {}
    set_last_tick(engine, name, timedelta(hours=1))
    assert len(fire(engine, schedule).ticks) == 1


def test_resuming_a_schedule_that_is_not_paused_keeps_the_ticks_it_missed(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    """An operator's `schedules resume` after an outage must not drop the missed ticks.

    Resuming moved ``last_tick`` to now whether or not the schedule was paused, so a
    catch-up schedule whose workers had been down lost every tick it was owed.
    """
    client = cyclone.Client(engine)
    schedule = hourly(engine, name, cleanup, missed="catch_up")
    # Exactly five hours: (now - 5 h, now] holds five hourly ticks whatever the minute
    # (five hours and a minute held six during the first minute of each hour).
    set_last_tick(engine, name, timedelta(hours=5))
    before = status(engine, name)
    assert client.resume_schedule(name) is False
    after = status(engine, name)
    assert (after.paused, after.last_tick) == (False, before.last_tick)
    assert len(fire(engine, schedule).ticks) == 5
    assert client.pause_schedule(name) is True
    assert client.pause_schedule(name) is False
    assert client.resume_schedule(name) is True


def test_pausing_an_unknown_schedule_raises_not_found(engine: sa.Engine, name: str) -> None:
    client = cyclone.Client(engine)
    with pytest.raises(cyclone.NotFoundError):
        client.pause_schedule(name)
    with pytest.raises(cyclone.NotFoundError):
        client.resume_schedule(name)


@pytest.mark.parametrize(
    ("bad", "error"),
    [("a\x00b", ValueError), ("\udcff", ValueError), (5, TypeError), (None, TypeError)],
)
def test_a_schedule_name_text_cannot_hold_is_refused_before_a_statement(
    engine: sa.Engine, bad: Any, error: type[Exception]
) -> None:
    # A NUL failed in the driver ("cannot contain NUL (0x00) bytes"), a lone surrogate in
    # its encoder (UnicodeEncodeError); an int or None said no schedule is named 5.
    client = cyclone.Client(engine)
    with pytest.raises(error, match="name"):
        client.pause_schedule(bad)
    with pytest.raises(error, match="name"):
        client.resume_schedule(bad)


def test_a_running_worker_registers_and_fires_its_schedules(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    wf = workflow(name)
    wf.schedule(name, every=timedelta(seconds=1), input=lambda tick: {"at": tick.isoformat()})
    cleanup.append(name)
    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=1, sweep=False)
    assert worker.drain() == 0  # a drain neither registers nor fires
    assert [s for s in cyclone.Client(engine).list_schedules() if s.name == name] == []
    serving = Background(worker.run)
    try:
        wait_until(lambda: len(ticks_of(engine, name)) >= 3, timeout=30)
        first = wf.get_run(
            engine, f"schedule:{name}:{ticks_of(engine, name)[0]:%Y-%m-%dT%H:%M:%SZ}"
        )
        assert first is not None
        assert first.wait(timeout=30).state == cyclone.RunState.COMPLETED
    finally:
        worker.stop()
        serving.join(30)
    ticks = ticks_of(engine, name)
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))]
    inputs = runs_of(engine, name)
    assert all(
        inputs[f"schedule:{name}:{t:%Y-%m-%dT%H:%M:%SZ}"] == {"at": t.isoformat()} for t in ticks
    )


# -- many processes ------------------------------------------------------------------


def spawn(mode: str, name: str, directory: Path) -> subprocess.Popen[str]:
    return processes.popen(
        [sys.executable, "-m", "tests.support.schedule_proc", mode, name, str(directory)],
        cwd=REPO,
        env=dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_one_run_per_tick(engine: sa.Engine, name: str, at_least: int) -> None:
    ticks = ticks_of(engine, name)
    assert len(ticks) >= at_least
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))], ticks
    inputs = runs_of(engine, name)
    assert len(inputs) == len(ticks)
    for tick in ticks:
        assert datetime.fromisoformat(inputs[sched._ticks.key(name, tick)]["tick"]) == tick


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_four_worker_processes_make_one_run_per_tick(
    engine: sa.Engine, name: str, cleanup: list[str], tmp_path: Path
) -> None:
    cleanup.append(name)
    procs = [spawn("serve", name, tmp_path) for _ in range(4)]
    try:
        wait_until(lambda: len(ticks_of(engine, name)) >= 20, timeout=90, interval=0.2)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.communicate(timeout=30)
            assert proc.returncode == 0
    finally:
        stop_all(procs)
    assert_one_run_per_tick(engine, name, 20)


@pytest.mark.processes
@pytest.mark.timeout(180)
def test_a_worker_killed_while_firing_a_tick_loses_and_repeats_no_tick(
    engine: sa.Engine, name: str, cleanup: list[str], tmp_path: Path
) -> None:
    cleanup.append(name)
    procs = [spawn("serve", name, tmp_path) for _ in range(3)]
    try:
        wait_until(lambda: len(ticks_of(engine, name)) >= 5, timeout=90, interval=0.2)
        victim = spawn("victim", name, tmp_path)
        procs.append(victim)
        # The victim blocks inside its firing transaction, holding the schedule row.
        wait_until(lambda: (tmp_path / "victim").exists(), timeout=90, interval=0.05)
        victim.send_signal(signal.SIGKILL)
        victim.communicate(timeout=30)
        fired = len(ticks_of(engine, name))
        wait_until(
            lambda: len(ticks_of(engine, name)) >= max(20, fired + 8), timeout=90, interval=0.2
        )
        for proc in procs[:3]:
            proc.send_signal(signal.SIGTERM)
        for proc in procs[:3]:
            proc.communicate(timeout=30)
            assert proc.returncode == 0
    finally:
        stop_all(procs)
    assert_one_run_per_tick(engine, name, 20)


# -- through a night the clocks go back, by the clock the scheduler reads --------------


def through(
    engine: sa.Engine,
    schedule: cyclone.Schedule,
    start: datetime,
    end: datetime,
    monkeypatch: pytest.MonkeyPatch,
    first_look: datetime | None = None,
) -> tuple[dict[datetime, datetime], int]:
    """Look at ``schedule`` as a worker does, from ``start`` (its last tick; or from
    ``first_look``, as if no worker had run until then) to ``end``:
    the database's now() a look reads is the simulated clock (cast by PostgreSQL, so in
    the session's time zone), which moves on by the wait each look returns (at least
    10 ms, a look's own time). Each tick fired and when, and the number of looks."""
    with engine.begin() as conn:
        conn.execute(
            schedules.update().where(schedules.c.name == schedule.name).values(last_tick=start)
        )
    clock = [first_look or start]
    locked = sched._schedules.lock

    def lock(conn: sa.Connection, name: str) -> Any:
        row = locked(conn, name)
        moment = sa.cast(sa.literal(clock[0], sa.DateTime(timezone=True)), sa.DateTime(True))
        return None if row is None else row._replace(now=conn.scalar(sa.select(moment)))

    monkeypatch.setattr(sched._schedules, "lock", lock)
    fired: dict[datetime, datetime] = {}
    looks = 0
    while clock[0] < end and looks < 1000:
        looks += 1
        done = fire(engine, schedule)
        fired.update((tick, clock[0]) for tick in done.ticks)
        clock[0] += timedelta(seconds=max(done.wait, 0.01))
    return fired, looks


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


BERLIN_NIGHT = [
    utc(2026, 10, 24, 23),
    utc(2026, 10, 25, 0),
    utc(2026, 10, 25, 1),
    utc(2026, 10, 25, 2),
]
NEW_YORK_NIGHT = [utc(2026, 11, 1, 5) + timedelta(minutes=20 * i) for i in range(7)]


@pytest.mark.parametrize(
    ("timezone", "cron", "night", "expected"),
    [
        # 01:30 happens twice (05:30 and 06:30 UTC): it fired at the first, then the
        # worker looked again without sleeping, through the second copy of the hour.
        (
            "America/New_York",
            "30 1 * * *",
            (utc(2026, 11, 1, 5), utc(2026, 11, 1, 7, 10), None),
            [utc(2026, 11, 1, 5, 30)],
        ),
        (
            "America/New_York",
            "*/20 * * * *",
            (utc(2026, 11, 1, 4, 55), utc(2026, 11, 1, 7, 5), None),
            NEW_YORK_NIGHT,
        ),
        (
            "Europe/Berlin",
            "0 * * * *",
            (utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2, 30), None),
            BERLIN_NIGHT,
        ),
        # No worker ran until inside the second copy of the hour: that copy's ticks
        # (01:00 UTC, the second 02:00 in Berlin; 06:00 and 06:20 UTC in New York) were
        # never fired.
        (
            "America/New_York",
            "*/20 * * * *",
            (utc(2026, 11, 1, 4, 55), utc(2026, 11, 1, 7, 5), utc(2026, 11, 1, 6, 30)),
            NEW_YORK_NIGHT,
        ),
        (
            "Europe/Berlin",
            "0 * * * *",
            (utc(2026, 10, 24, 22, 30), utc(2026, 10, 25, 2, 30), utc(2026, 10, 25, 1, 0, 30)),
            BERLIN_NIGHT,
        ),
    ],
)
def test_a_worker_through_the_night_the_clocks_go_back_fires_each_tick_once_and_sleeps(
    engine: sa.Engine,
    name: str,
    cleanup: list[str],
    monkeypatch: pytest.MonkeyPatch,
    timezone: str,
    cron: str,
    night: tuple[datetime, datetime, datetime | None],
    expected: list[datetime],
) -> None:
    seen: list[str] = []

    def stamp(tick: datetime) -> dict[str, str]:
        seen.append(tick.isoformat())
        return {"at": tick.isoformat()}

    wf = workflow(name)
    schedule = wf.schedule(name, cron=cron, timezone=timezone, input=stamp, missed="catch_up")
    sched.register(engine, [schedule])
    cleanup.append(name)
    start, end, first_look = night
    fired, looks = through(engine, schedule, start, end, monkeypatch, first_look)
    assert list(fired) == expected
    for tick, at in fired.items():  # each at its tick, or at the first look after downtime
        assert at - max(tick, first_look or tick) < timedelta(seconds=1), (tick, at)
    assert ticks_of(engine, name) == expected
    # A look a minute at most, and one at each tick: none in a loop.
    assert looks <= (end - start) / timedelta(seconds=sched.MAX_SLEEP) + 2 * len(expected)
    # The input callable's tick: aware, in the schedule's zone, the right copy of the hour.
    assert [datetime.fromisoformat(s) for s in seen] == expected
    assert {datetime.fromisoformat(s).utcoffset() for s in seen} <= {
        t.astimezone(schedule.spec.zone).utcoffset() for t in expected
    }


@pytest.mark.parametrize("server_zone", ["America/New_York", "UTC"])
def test_the_sessions_time_zone_does_not_change_which_ticks_fire(
    engine: sa.Engine,
    name: str,
    cleanup: list[str],
    monkeypatch: pytest.MonkeyPatch,
    server_zone: str,
) -> None:
    """psycopg gives a timestamptz in the session's zone; two of them in one zone compare
    by wall-clock time in Python, so on a server set to New York the second 01:10 came
    before the first 01:50: the schedule fired nothing and looked again at once for an
    hour, then caught up late."""
    local = sa.create_engine(engine.url, connect_args={"options": f"-c TimeZone={server_zone}"})
    try:
        with local.connect() as conn:
            assert conn.scalar(sa.text("SHOW TimeZone")) == server_zone
        wf = workflow(name)
        schedule = wf.schedule(name, every=timedelta(minutes=10), input={}, missed="catch_up")
        sched.register(local, [schedule])
        cleanup.append(name)
        start, end = utc(2026, 11, 1, 5, 45), utc(2026, 11, 1, 6, 35)
        fired, looks = through(local, schedule, start, end, monkeypatch)
        expected = [utc(2026, 11, 1, 5, 50) + timedelta(minutes=10 * i) for i in range(5)]
        assert list(fired) == expected
        for tick, at in fired.items():
            assert at - tick < timedelta(seconds=1), (tick, at)
        assert looks <= (end - start) / timedelta(seconds=sched.MAX_SLEEP) + 2 * len(expected)
        listed = status(local, name)
        assert listed.last_tick == expected[-1]
        assert listed.last_tick.utcoffset() == timedelta(0)  # in UTC, as next_tick is
    finally:
        local.dispose()


def test_a_changed_cron_every_or_timezone_starts_at_its_registration_not_in_a_burst(
    engine: sa.Engine, name: str, cleanup: list[str]
) -> None:
    """A deploy that made a daily catch-up schedule every 5 minutes fired at once the ten
    5-minute ticks before it (the new definition's ticks since the old one's last
    tick, 12 hours back); a new definition starts at its registration, as a new
    schedule does."""
    daily = workflow(name).schedule(name, every=timedelta(days=1), input={}, missed="catch_up")
    sched.register(engine, [daily])
    cleanup.append(name)
    set_last_tick(engine, name, timedelta(hours=12))
    before = status(engine, name).last_tick

    # Only the missed-tick policy changes: the ticks owed are kept.
    policy = workflow(name).schedule(
        name, every=timedelta(days=1), input={}, missed="catch_up", max_catch_up=3
    )
    sched.register(engine, [policy])
    assert status(engine, name).last_tick == before

    for changed in (
        {"every": timedelta(minutes=5)},
        {"cron": "*/5 * * * *"},
        {"cron": "*/5 * * * *", "timezone": "Asia/Kolkata"},  # :30 off UTC, other ticks
    ):
        set_last_tick(engine, name, timedelta(hours=12))
        new = workflow(name).schedule(name, input={}, missed="catch_up", **changed)
        sched.register(engine, [new])
        assert abs(status(engine, name).last_tick - datetime.now(UTC)) < timedelta(minutes=1)
        assert fire(engine, new).ticks == (), changed
    assert ticks_of(engine, name) == []
