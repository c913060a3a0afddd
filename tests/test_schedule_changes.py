"""Schedules obey at once: pause, resume and a new registration reach running workers.

Each test runs a real Worker (a thread) on a database of its own, so no other test's
notification wakes its scheduler; pause and resume go through the ``cyclone`` command
line, a subprocess, as an operator's would. A 2-second schedule's first tick after a
resume fires at that tick (before, a worker that had seen the schedule paused slept a
minute: the first run came up to 60 s late).
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone import _ticks
from cyclone import schedules as sched
from cyclone.schema import runs, schedules
from tests.conftest import wait_until
from tests.support import processes
from tests.support.workers import REPO, Background

EVERY = timedelta(seconds=2)
PROMPT = timedelta(seconds=1)
"""How late after its tick a run may be created: the tick's wake-up plus one transaction."""

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]


class PausedLooks(logging.Handler):
    """Counts the scheduler's looks at a paused schedule (its DEBUG record), as events."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.name = name
        self.count = 0
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == f"schedule {self.name} is paused":
            with self.changed:
                self.count += 1
                self.changed.notify_all()

    def wait_beyond(self, count: int, timeout: float = 30.0) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.count > count, timeout), (
                "the scheduler did not look at the paused schedule"
            )


@pytest.fixture
def paused_looks(name: str) -> Iterator[PausedLooks]:
    logger = logging.getLogger("cyclone.schedules")
    handler = PausedLooks(name)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def workflow(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def noop(ctx: cyclone.StepContext, value: Any) -> None:
        return None

    return wf


def fired(engine: sa.Engine, name: str) -> dict[datetime, datetime]:
    """Each fired tick of schedule ``name`` and its run's created_at."""
    prefix = f"schedule:{name}:"
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(runs.c.submit_key, runs.c.created_at).where(runs.c.workflow == name)
        ).all()
    return {datetime.fromisoformat(key[len(prefix) :]): created for key, created in rows}


def changed_at(engine: sa.Engine, name: str) -> datetime:
    """When the schedule's row was last registered, paused or resumed (database time)."""
    with engine.connect() as conn:
        moment: datetime = conn.execute(
            sa.select(schedules.c.updated_at).where(schedules.c.name == name)
        ).scalar_one()
    return moment


def database_now(engine: sa.Engine) -> datetime:
    with engine.connect() as conn:
        moment: datetime = conn.execute(sa.select(sa.func.now())).scalar_one()
    return moment


def cli(url: URL, *args: str) -> None:
    done = processes.run(
        [sys.executable, "-m", "cyclone", *args, "--url", url.render_as_string(False)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def first_tick_after(moment: datetime) -> datetime:
    tick = _ticks.following(_ticks.Spec(cron=None, every=EVERY, timezone="UTC"), moment)
    assert tick is not None
    return tick


def fires_at_once(engine: sa.Engine, name: str, since: datetime) -> datetime:
    """Wait for the first tick after ``since`` to be fired; check it was fired at its time."""
    tick = first_tick_after(since)
    created = wait_until(lambda: fired(engine, name).get(tick), timeout=30, interval=0.05)
    assert tick - since <= EVERY
    assert timedelta(0) <= created - tick < PROMPT, (tick, created)
    return tick


@pytest.fixture
def worker_on(
    own_engine: sa.Engine,
) -> Iterator[Callable[[cyclone.Workflow[Any]], cyclone.Worker]]:
    started: list[tuple[cyclone.Worker, Background]] = []

    def start(wf: cyclone.Workflow[Any]) -> cyclone.Worker:
        worker = cyclone.Worker(own_engine, workflows=[wf], poll_interval=1, sweep=False)
        started.append((worker, Background(worker.run, name=f"serving-{len(started)}")))
        return worker

    yield start
    for worker, background in started:
        worker.stop()
        background.join(30)
    cyclone.close(own_engine)


def test_a_schedule_paused_from_the_cli_fires_nothing_and_resumed_fires_its_next_tick(
    own_engine: sa.Engine,
    own_url: URL,
    name: str,
    paused_looks: PausedLooks,
    worker_on: Callable[[cyclone.Workflow[Any]], cyclone.Worker],
) -> None:
    wf = workflow(name)
    wf.schedule(name, every=EVERY, input={"n": 1})
    worker_on(wf)
    wait_until(lambda: fired(own_engine, name), timeout=30)  # it fires

    cli(own_url, "schedules", "pause", name)
    paused_at = changed_at(own_engine, name)
    paused_looks.wait_beyond(0)  # the scheduler has seen it paused (now asleep)
    # Two ticks fall while paused; a look after them (another pause, which notifies)
    # fires neither.
    wait_until(lambda: database_now(own_engine) > first_tick_after(paused_at) + EVERY, 30)
    looks = paused_looks.count
    cli(own_url, "schedules", "pause", name)
    paused_looks.wait_beyond(looks)
    assert max(fired(own_engine, name)) <= paused_at + PROMPT  # a tick fired as it paused

    cli(own_url, "schedules", "resume", name)
    resumed_at = changed_at(own_engine, name)
    first = fires_at_once(own_engine, name, resumed_at)
    assert [tick for tick in fired(own_engine, name) if paused_at + PROMPT < tick < first] == []
    assert cyclone.Client(own_engine).list_schedules()[0].next_tick is not None


def test_a_schedule_registered_anew_is_fired_by_its_new_definition_by_a_running_worker(
    own_engine: sa.Engine,
    name: str,
    worker_on: Callable[[cyclone.Workflow[Any]], cyclone.Worker],
) -> None:
    """A new deploy registers the schedule every 2 s; a worker still running the old code
    (hourly) fires by the registered definition, from its next tick on."""
    old = workflow(name)
    old.schedule(name, every=timedelta(hours=1), input={"n": 1})
    worker_on(old)
    wait_until(lambda: cyclone.Client(own_engine).list_schedules(), timeout=30)

    new = workflow(name)
    sched.register(own_engine, [new.schedule(name, every=EVERY, input={"n": 1})])
    registered_at = changed_at(own_engine, name)
    fires_at_once(own_engine, name, registered_at)
    (listed,) = cyclone.Client(own_engine).list_schedules()
    assert listed.every == EVERY
