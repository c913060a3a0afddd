"""Delayed runs: ``run_at=`` and ``delay=`` on every submit form.

The run exists and holds its key at once; its root steps start no earlier than the time
given; an idle worker wakes for that time without polling in a busy loop.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import notify as _notify
from cyclone.schema import jobs
from tests.conftest import StatementCounter, wait_until
from tests.support.counting import ThreadStatements
from tests.support.factories import count_runs, workflow
from tests.support.workers import Background


def scheduled_at(engine: sa.Engine, run_id: Any) -> dict[str, datetime]:
    """When each step of the run is due, as its detail shows it (created or not yet)."""
    detail = cyclone.Client(engine).get_run_detail(run_id)
    assert detail is not None
    return {step.name: step.scheduled_at for step in detail.steps}


def attempted(engine: sa.Engine, run_id: Any) -> list[tuple[datetime, datetime]]:
    """``(scheduled_at, attempted_at)`` of each started step of the run."""
    with engine.connect() as conn:
        return [
            (row[0], row[1])
            for row in conn.execute(
                sa.select(jobs.c.scheduled_at, jobs.c.attempted_at).where(
                    jobs.c.run_id == run_id, jobs.c.attempted_at.is_not(None)
                )
            )
        ]


def later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


SUBMITS: dict[str, Callable[[cyclone.Workflow[Any], sa.Engine, dict[str, Any]], cyclone.Run]] = {
    "submit": lambda wf, engine, opts: wf.submit(engine, 1, **opts),
    "submit_tx": lambda wf, engine, opts: _in_tx(engine, lambda c: wf.submit_tx(c, 1, **opts)),
    "submit_once": lambda wf, engine, opts: wf.submit_once(engine, "k", 1, **opts)[0],
    "submit_once_tx": lambda wf, engine, opts: _in_tx(
        engine, lambda c: wf.submit_once_tx(c, "k", 1, **opts)[0]
    ),
    "submit_once_many": lambda wf, engine, opts: wf.submit_once_many(
        engine, [("k", 1), ("k2", 2)], **opts
    )[0][0],
}


def _in_tx(engine: sa.Engine, fn: Callable[[sa.Connection], cyclone.Run]) -> cyclone.Run:
    with engine.begin() as conn:
        return fn(conn)


@pytest.mark.parametrize("form", SUBMITS)
def test_every_submit_form_schedules_the_runs_steps_at_run_at(
    engine: sa.Engine, name: str, form: str
) -> None:
    wf = workflow(name, steps=2)
    at = later().replace(microsecond=123456)
    run = SUBMITS[form](wf, engine, {"run_at": at})
    assert scheduled_at(engine, run.id) == {"s0": at, "s1": at}
    assert run.status().state == cyclone.RunState.RUNNING
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 0


@pytest.mark.parametrize("form", SUBMITS)
def test_every_submit_form_takes_a_delay_from_the_database_clock(
    engine: sa.Engine, name: str, form: str
) -> None:
    wf = workflow(name)
    run = SUBMITS[form](wf, engine, {"delay": timedelta(minutes=30)})
    detail = cyclone.Client(engine).get_run_detail(run.id)
    assert detail is not None
    assert detail.steps[0].scheduled_at - detail.status.created_at == timedelta(minutes=30)


def test_a_delayed_run_exists_and_holds_its_key_at_once(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run, created = wf.submit_once(engine, "order-1", 1, delay=timedelta(hours=1))
    assert created
    assert wf.get_run(engine, "order-1") == run
    again, created_again = wf.submit_once(engine, "order-1", 1)
    assert (again, created_again) == (run, False)
    with pytest.raises(cyclone.SubmitConflictError):
        wf.submit_once(engine, "order-1", 2, delay=timedelta(hours=1))


def test_start_options_take_no_part_in_the_input_comparison(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    at = later()
    run, _ = wf.submit_once(engine, "k", {"a": 1, "b": 2}, run_at=at)
    same, created = wf.submit_once(engine, "k", {"b": 2, "a": 1}, delay=timedelta(seconds=1))
    assert (same, created) == (run, False)
    assert scheduled_at(engine, run.id) == {"s0": at}  # the first submit's options stay


def test_a_run_at_in_the_past_runs_now(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    run = wf.submit(engine, 1, run_at=datetime.now(UTC) - timedelta(minutes=5))
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 1
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED


def test_a_delayed_run_is_not_started_before_its_time(engine: sa.Engine, name: str) -> None:
    wf = workflow(name, steps=2)
    run = wf.submit(engine, 1, delay=timedelta(seconds=1))
    worker = cyclone.Worker(engine, workflows=[wf])
    # A drain before the run's time starts nothing; on a machine so loaded that the first
    # drain comes after it, the run starts then, and its steps' starts below prove the rule.
    ran = [worker.drain()]

    def both_ran() -> bool:
        ran.append(worker.drain())
        return sum(ran) == 2

    if ran[0] < 2:
        wait_until(both_ran, timeout=20, interval=0.05)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    started = attempted(engine, run.id)
    assert len(started) == 2
    assert all(at >= due for due, at in started)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"run_at": datetime.now(UTC), "delay": timedelta(1)}, "not both"),
        ({"delay": 5}, "timedelta"),
        ({"run_at": "2030-01-01T00:00:00Z"}, "datetime"),
        # Times PostgreSQL cannot compute, or a read cannot decode (after year 9999): they
        # failed in the driver, or were stored and made every listing of runs fail.
        ({"delay": timedelta.max}, "1,000 years"),
        ({"delay": timedelta(days=3_000_000)}, "1,000 years"),
        ({"deadline": timedelta(days=3_000_000)}, "1,000 years"),
        ({"deadline": timedelta.min}, "1,000 years"),
        ({"retention": timedelta.max}, "1,000 years"),
        ({"run_at": datetime.max.replace(tzinfo=timezone(timedelta(hours=-14)))}, "9999"),
        ({"deadline": datetime.min.replace(tzinfo=timezone(timedelta(hours=14)))}, "9999"),
        # Late on 9999-12-31 in UTC: read in a session at UTC+14 it falls in year 10000.
        ({"deadline": datetime(9999, 12, 31, 20, tzinfo=UTC)}, "9999-12-30"),
        ({"run_at": datetime(1, 1, 1, 3, tzinfo=UTC)}, "0001-01-02"),
    ],
)
@pytest.mark.parametrize("form", SUBMITS)
def test_bad_start_options_raise_before_anything_is_written(
    engine: sa.Engine,
    name: str,
    form: str,
    options: dict[str, Any],
    message: str,
    statements: StatementCounter,
) -> None:
    wf = workflow(name)
    wf.plan()
    statements.reset()
    with pytest.raises((ValueError, TypeError), match=message):
        SUBMITS[form](wf, engine, options)
    assert statements.statements == []
    assert count_runs(engine, name) == 0


def test_an_idle_worker_wakes_for_a_delayed_run_without_polling(
    engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    wf = workflow(name)
    worker = cyclone.Worker(engine, workflows=[wf], poll_interval=120, sweep=False)
    loop = serving(worker)
    with ThreadStatements(loop.thread.name) as sent:
        wait_until(lambda: sent.count() >= 1 or worker._held is not None)
        # Its poll interval is far longer than the test: only the NOTIFY of the submit can
        # wake it, so the worker's LISTEN must be in force before the submit.
        assert _notify.listener(engine).wait_ready(10)
        run = wf.submit(engine, 1, delay=timedelta(seconds=2))
        # The NOTIFY of the new (not yet due) step wakes the worker once: a claim finds
        # nothing, it reads when the step is due and sleeps until then.
        wait_until(lambda: any("min(" in s for s in sent.statements))
        before = sent.count()
        threading.Event().wait(1.0)
        assert sent.count() - before <= 6, sent.statements[before:]
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    ((due, at),) = attempted(engine, run.id)
    assert at >= due


def test_a_delayed_run_starts_on_time_after_a_worker_restart(
    engine: sa.Engine, name: str, serving: Callable[[cyclone.Worker], Background]
) -> None:
    wf = workflow(name)
    run = wf.submit(engine, 1, delay=timedelta(seconds=3))
    first = cyclone.Worker(engine, workflows=[wf], poll_interval=120, sweep=False)
    running = serving(first)
    wait_until(lambda: first._held is not None)
    first.stop()
    running.join(30)
    assert attempted(engine, run.id) == []
    # Its poll interval is far longer than the wait: only the due time can wake it.
    second = cyclone.Worker(engine, workflows=[wf], poll_interval=120, sweep=False)
    serving(second)
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    ((due, at),) = attempted(engine, run.id)
    assert at >= due
