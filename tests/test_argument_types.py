"""An argument of the wrong type is a TypeError, raised before anything is written; a value
of the right type that is out of bounds stays a ValueError. ``run.signal(5, ...)`` and
``set_retention(5)`` were ValueErrors, and a purge's ``batch_size="x"`` Python's own
comparison error."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import runs, signals

DAY = timedelta(days=1)


def waiting(name: str) -> cyclone.Workflow[Any]:
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.wait("paid")
    def paid(ctx: cyclone.StepContext, payment: Any) -> Any:
        return payment

    return wf


def stored(engine: sa.Engine, run_id: Any) -> tuple[Any, int]:
    """The run's retention and how many signals it has."""
    with engine.connect() as conn:
        retention = conn.execute(
            sa.select(runs.c.retention).where(runs.c.id == run_id)
        ).scalar_one()
        sent = conn.execute(
            sa.select(sa.func.count()).select_from(signals).where(signals.c.run_id == run_id)
        ).scalar_one()
    return retention, sent


def test_a_signal_name_or_retention_of_the_wrong_type_is_a_type_error_and_writes_nothing(
    engine: sa.Engine, name: str
) -> None:
    wf = waiting(name)
    run, _ = wf.submit_once(engine, "k", 1)
    wrong: list[Callable[[], object]] = [
        lambda: run.signal(5, {"ref": "p"}),  # type: ignore[arg-type]
        lambda: run.signal(b"paid", {"ref": "p"}),  # type: ignore[arg-type]
        lambda: wf.signal(engine, "k", 5, {"ref": "p"}),  # type: ignore[arg-type]
        lambda: run.set_retention(5),  # type: ignore[arg-type]
        lambda: run.set_retention("7d"),  # type: ignore[arg-type]
    ]
    for call in wrong:
        with pytest.raises(TypeError):
            call()
    with engine.begin() as conn, pytest.raises(TypeError, match="a signal name is a str, not int"):
        wf.signal_tx(conn, "k", 5, {"ref": "p"})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retention= takes a timedelta, not int"):
        wf.submit_once(engine, "other", 1, retention=5)  # type: ignore[arg-type]
    assert stored(engine, run.id) == (None, 0)
    assert wf.get_run(engine, "other") is None

    # Right type, bad value: still a ValueError.
    with pytest.raises(ValueError, match="non-empty"):
        run.signal("", {"ref": "p"})
    with pytest.raises(ValueError, match="non-negative"):
        run.set_retention(timedelta(seconds=-1))
    with pytest.raises(ValueError, match="non-negative"):
        wf.submit(engine, 1, retention=timedelta(seconds=-1))
    assert stored(engine, run.id) == (None, 0)

    assert run.signal("paid", {"ref": "p"}) is True
    run.set_retention(DAY)
    assert stored(engine, run.id) == (DAY, 1)


def wrong_client_calls(client: cyclone.Client) -> list[Callable[[], object]]:
    now = datetime.now(UTC)
    return [
        lambda: client.list_runs(state=5),  # type: ignore[arg-type]
        lambda: client.list_runs(parked=1),  # type: ignore[arg-type]
        lambda: client.list_jobs(state=5),  # type: ignore[arg-type]
        lambda: client.page_runs(state=5),  # type: ignore[arg-type]
        lambda: client.list_runs(limit="10"),  # type: ignore[arg-type]
        lambda: client.list_jobs(limit=1.5),  # type: ignore[arg-type]
        lambda: client.page_runs(limit="10"),  # type: ignore[arg-type]
        lambda: client.list_runs(since="2026-01-01"),  # type: ignore[arg-type]
        lambda: client.page_runs(until=now.timestamp()),  # type: ignore[arg-type]
        lambda: client.get_run_detail(cyclone_id(), children_limit="2"),  # type: ignore[arg-type]
        lambda: client.count_runs_per_workflow(up_to="1000"),  # type: ignore[arg-type]
        lambda: client.count_finished_per_minute(minutes=1.5),  # type: ignore[arg-type]
        lambda: client.count_purgeable(older_than=7),  # type: ignore[arg-type]
        lambda: client.purge_terminal_runs(older_than="7d"),  # type: ignore[arg-type]
        lambda: client.purge_finished_jobs(older_than=DAY, batch_size="x"),  # type: ignore[arg-type]
        lambda: client.purge_terminal_runs(older_than=DAY, batch_size=1.0),  # type: ignore[arg-type]
        lambda: client.retry_runs(state=5, dry_run=True),  # type: ignore[arg-type]
        lambda: client.cancel_runs(parked=5, dry_run=True),  # type: ignore[arg-type]
        lambda: client.retry_runs(since="1h", dry_run=True),  # type: ignore[arg-type]
        lambda: client.cancel_runs(batch_size="500"),  # type: ignore[arg-type]
        lambda: client.pause_queue(5),  # type: ignore[arg-type]
        lambda: client.resume_queue(None),  # type: ignore[arg-type]
        lambda: client.set_limit("some-limit", "3"),  # type: ignore[arg-type]
    ]


def cyclone_id() -> str:
    return "00000000-0000-0000-0000-000000000000"


def test_client_arguments_of_the_wrong_type_are_type_errors(engine: sa.Engine) -> None:
    client = cyclone.Client(engine)
    for number, call in enumerate(wrong_client_calls(client)):
        with pytest.raises(TypeError) as raised:
            call()
        # Raised by cyclone, naming what it got: not an accident of a comparison.
        assert " not " in str(raised.value), (number, raised.value)
        assert "supported between" not in str(raised.value), (number, raised.value)


def test_client_values_of_the_right_type_out_of_bounds_stay_value_errors(
    engine: sa.Engine,
) -> None:
    client = cyclone.Client(engine)
    bad: list[tuple[Callable[[], object], str]] = [
        (lambda: client.list_runs(state="paused"), "not a valid RunState"),
        (lambda: client.list_jobs(state="done"), "not a valid JobState"),
        (lambda: client.list_runs(parked="napping"), "not a valid Parked"),
        (lambda: client.list_runs(limit=0), "limit must be a positive int"),
        (lambda: client.list_runs(since=datetime(2026, 1, 1)), "aware datetime"),
        (lambda: client.get_run_detail(cyclone_id(), children_limit=-1), "children_limit"),
        (lambda: client.count_purgeable(older_than=-DAY), "non-negative"),
        (lambda: client.purge_finished_jobs(older_than=DAY, batch_size=0), "batch_size"),
        (lambda: client.retry_runs(batch_size=0), "batch_size"),
        (lambda: client.pause_queue(""), "non-empty"),
        (lambda: client.set_limit("some-limit", -1), "from 0 to"),
    ]
    for call, said in bad:
        with pytest.raises(ValueError, match=said) as raised:
            call()
        assert not isinstance(raised.value, TypeError)


def test_worker_options_of_the_wrong_type_are_type_errors(engine: sa.Engine, name: str) -> None:
    wf = waiting(name)
    for options in (
        {"poll_interval": "5"},
        {"heartbeat_interval": 5},
        {"rescue_after": 60.0},
        {"sweep_interval": "1h"},
        {"retention": 7},
    ):
        with pytest.raises(TypeError, match="takes"):
            cyclone.Worker(engine, workflows=[wf], **options)
    for options in (
        {"poll_interval": 0},
        {"heartbeat_interval": timedelta()},
        {"retention": -DAY},
    ):
        with pytest.raises(ValueError, match="takes"):
            cyclone.Worker(engine, workflows=[wf], **options)


def test_a_wait_timeout_of_the_wrong_type_or_sign_is_refused_before_any_read(
    engine: sa.Engine, name: str
) -> None:
    # "5" failed in the arithmetic with Python's own message; NaN waited for ever.
    wf = waiting(name)
    run, _ = wf.submit_once(engine, "k", 1)
    step: cyclone.Step[Any] = cyclone.step(f"{name}.kind")(lambda ctx, value: None)
    job = step.enqueue(engine, 1)
    priced: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        f"{name}.result", input=int, output=int
    )
    priced.result()(lambda ctx, value: value)
    result_run, _ = priced.submit_once(engine, "k", 1)
    for wait in (run.wait, result_run.result, job.wait, job.result):
        with pytest.raises(TypeError, match=r"timeout= takes seconds \(a number\), not str"):
            wait("5")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not timedelta"):
            wait(timedelta(seconds=5))  # type: ignore[arg-type]
        for bad in (float("nan"), -1):
            with pytest.raises(ValueError, match="timeout= takes a number of seconds >= 0"):
                wait(bad)
    with pytest.raises(TimeoutError):
        run.wait(0)


def test_a_wait_timeout_of_infinity_or_centuries_waits_without_a_deadline(
    engine: sa.Engine, name: str
) -> None:
    # float("inf") passed the checks, then a thread's wait of that long overflowed:
    # OverflowError("timeout value is too large"), even for a run that had finished.
    step: cyclone.Step[int] = cyclone.step(f"{name}.kind")(lambda ctx, value: value)
    job = step.enqueue(engine, 3)
    priced: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(
        f"{name}.result", input=int, output=int
    )
    priced.result()(lambda ctx, value: value)
    run, _ = priced.submit_once(engine, "k", 4)
    assert cyclone.Worker(engine, workflows=[priced], steps=[step]).drain() == 2
    for timeout in (float("inf"), 1e12):
        assert run.wait(timeout).state == cyclone.RunState.COMPLETED
        assert run.result(timeout) == 4
        assert job.wait(timeout).state == cyclone.JobState.COMPLETED
        assert job.result(timeout) == 3
