"""Durable sleep: ``@wf.sleep(duration)`` nodes start no earlier than ``duration`` after their
upstreams completed (after the submit, for a root), holding no worker, across restarts."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from tests.conftest import wait_until
from tests.support.workers import Background, step_columns


def times(
    engine: sa.Engine, run_id: Any
) -> dict[str, tuple[str, datetime | None, datetime | None]]:
    """Per step: state, when it was last started and when it finished."""
    rows = step_columns(engine, run_id, "kind", "state", "attempted_at", "finalized_at")
    return {kind: (state, started, finished) for kind, state, started, finished in rows}


def remind(name: str, pause: timedelta) -> cyclone.Workflow[int]:
    """signup -> (sleep pause) remind."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def signup(ctx: cyclone.StepContext, user: int) -> int:
        return user

    @wf.sleep(pause, after=[signup])
    def reminder(ctx: cyclone.StepContext, user: int) -> str:
        return f"reminded {ctx.output(signup)}"

    return wf


def test_a_sleep_node_starts_no_earlier_than_its_duration_after_its_upstreams(
    engine: sa.Engine, name: str
) -> None:
    wf = remind(name, timedelta(milliseconds=700))
    run = wf.submit(engine, 7)
    worker = cyclone.Worker(engine, workflows=[wf])
    worker.drain()
    state, _, _ = times(engine, run.id)["reminder"]
    assert state == "available"  # parked, no worker holds it
    wait_until(lambda: run.status().done or worker.drain() < 0, timeout=20, interval=0.05)
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
    rows = times(engine, run.id)
    _, _, signup_done = rows["signup"]
    _, reminder_started, _ = rows["reminder"]
    assert signup_done is not None
    assert reminder_started is not None
    assert reminder_started - signup_done >= timedelta(milliseconds=700)


def test_a_root_sleep_counts_from_the_submit(engine: sa.Engine, name: str) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.sleep(timedelta(milliseconds=500))
    def later(ctx: cyclone.StepContext, n: int) -> int:
        return n

    run = wf.submit(engine, 1)
    worker = cyclone.Worker(engine, workflows=[wf])
    wait_until(lambda: worker.drain() >= 0 and run.status().done, timeout=20, interval=0.05)
    created = run.status().created_at
    _, started, _ = times(engine, run.id)["later"]
    assert started is not None
    assert started - created >= timedelta(milliseconds=500)


def test_a_zero_sleep_runs_at_once(engine: sa.Engine, name: str) -> None:
    wf = remind(name, timedelta(0))
    run = wf.submit(engine, 3)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED


@pytest.fixture
def stop_after() -> Iterator[list[tuple[cyclone.Worker, Background]]]:
    started: list[tuple[cyclone.Worker, Background]] = []
    yield started
    for worker, background in started:
        worker.stop()
        background.join(30)


def test_a_sleep_survives_a_worker_restart_and_wakes_without_polling(
    engine: sa.Engine, name: str, stop_after: list[tuple[cyclone.Worker, Background]]
) -> None:
    wf = remind(name, timedelta(seconds=2))
    run = wf.submit(engine, 9)
    first = cyclone.Worker(engine, workflows=[wf], poll_interval=120, sweep=False)
    serving = Background(first.run)
    wait_until(lambda: times(engine, run.id)["reminder"][1] is not None)  # reached and parked
    first.stop()
    serving.join(30)
    assert times(engine, run.id)["reminder"][0] == "available"
    second = cyclone.Worker(engine, workflows=[wf], poll_interval=120, sweep=False)
    stop_after.append((second, Background(second.run)))
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    rows = times(engine, run.id)
    assert rows["reminder"][1] - rows["signup"][2] >= timedelta(seconds=2)  # type: ignore[operator]


def test_a_bad_duration_is_a_definition_error() -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow("sleepy")
    with pytest.raises(cyclone.DefinitionError, match="non-negative timedelta"):
        wf.sleep(timedelta(seconds=-1))
    with pytest.raises(cyclone.DefinitionError, match="non-negative timedelta"):
        wf.sleep(5)  # type: ignore[arg-type]


@pytest.mark.parametrize("duration", [timedelta.max, timedelta(days=3_000_000)])
def test_a_duration_past_a_thousand_years_is_a_definition_error(duration: timedelta) -> None:
    """A worker reaching such a node computed a time PostgreSQL or Python cannot hold,
    and handed the node back forever: drain() never returned."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow("sleepy")
    with pytest.raises(cyclone.DefinitionError, match="1,000 years"):
        wf.sleep(duration)
    assert wf.steps == {}


def test_a_sleep_node_whose_due_time_cannot_be_read_fails_its_attempts_instead_of_looping(
    engine: sa.Engine, name: str, stop_after: list[tuple[cyclone.Worker, Background]]
) -> None:
    """A decision the database refuses is the same at every try (here the due time falls
    after year 9999, its upstream's end put in year 9999): the node's attempt fails, and
    the run fails when its attempts are spent. It was handed back and claimed again at
    once, for ever, and the run never ended."""
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step()
    def signup(ctx: cyclone.StepContext, user: int) -> int:
        return user

    @wf.sleep(timedelta(hours=2), after=[signup], max_attempts=2)
    def reminder(ctx: cyclone.StepContext, user: int) -> str:
        return "reminded"

    run = wf.submit(engine, 1)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert times(engine, run.id)["reminder"][0] == "available"  # parked for two hours
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "UPDATE cyclone_jobs SET finalized_at = '9999-12-31 23:00+00' "
                "WHERE run_id = :r AND kind = 'signup'"
            ),
            {"r": run.id},
        )
        conn.execute(
            sa.text("UPDATE cyclone_jobs SET scheduled_at = now() WHERE run_id = :r"),
            {"r": run.id},
        )
    worker = cyclone.Worker(engine, workflows=[wf], backoff=lambda attempt: 0.0, sweep=False)
    stop_after.append((worker, Background(worker.run)))
    status = run.wait(timeout=30)
    assert status.state == cyclone.RunState.FAILED
    assert status.failed_step == "reminder"
    assert status.error is not None
    assert status.error["type"] == "DataError"
    assert status.error["message"].startswith("cyclone could not decide about this sleep node: ")
    assert status.error["attempt"] == 2
