"""One lock order (the run, then its jobs in id order) and outcomes that are never dropped.

Every statement that locks runs and jobs takes them in that order, so user calls (cancel,
retry, purge), completions, rescue and expiry never deadlock: a workload of all of them at
once adds nothing to ``pg_stat_database.deadlocks``. An outcome whose recording fails is
kept and recorded once the database takes it again, however many cycles that takes.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import worker as worker_module
from tests.conftest import wait_until
from tests.support.workers import Background, job_rows
from tests.test_worker_fence import QUICK


def deadlocks(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return int(
            conn.execute(
                sa.text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            ).scalar_one()
        )


def diamond(name: str) -> cyclone.Workflow[int]:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(max_attempts=3)
    def start(ctx: cyclone.StepContext, n: int) -> int:
        if random.random() < 0.1:
            raise RuntimeError("flaky")
        return n

    @wf.step(after=[start])
    def left(ctx: cyclone.StepContext, n: int) -> int:
        time.sleep(random.random() * 0.005)
        return n

    @wf.step(after=[start])
    def right(ctx: cyclone.StepContext, n: int) -> int:
        return n

    @wf.step(after=[left, right])
    def join(ctx: cyclone.StepContext, n: int) -> int:
        return ctx.output(left) + ctx.output(right)

    return wf


def test_cancel_retry_purge_completions_and_rescue_at_once_never_deadlock(
    own_engine: sa.Engine, name: str
) -> None:
    engine = own_engine
    wf = diamond(name)
    client = cyclone.Client(engine)
    workers = [
        cyclone.Worker(
            engine,
            workflows=[wf],
            concurrency=4,
            rescue_after=timedelta(milliseconds=500),
            heartbeat_interval=timedelta(milliseconds=100),
            backoff=lambda attempt: 0.0,
            poll_interval=0.05,
            sweep=True,
            retention=timedelta(0),
            sweep_interval=timedelta(milliseconds=100),
        )
        for _ in range(2)
    ]
    stop = threading.Event()
    made: list[cyclone.Run] = []
    errors: list[BaseException] = []

    def forever(action: Any) -> Any:
        def loop() -> None:
            while not stop.is_set():
                try:
                    action()
                except (cyclone.InvalidStateError, cyclone.NotFoundError):
                    pass
                except BaseException as exc:
                    errors.append(exc)
                    return

        return loop

    def submit() -> None:
        made.extend(wf.submit(engine, i) for i in range(5))

    def cancel() -> None:
        if made:
            random.choice(made).cancel()

    def retry() -> None:
        if made:
            run = random.choice(made)
            run.retry() if random.random() < 0.5 else run.retry_all()

    def purge() -> None:
        client.purge_terminal_runs(older_than=timedelta(0), batch_size=3)

    def stale() -> None:
        # Jobs whose worker "stopped": their heartbeat goes back an hour (skip locked rows).
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE cyclone_jobs SET heartbeat_at = now() - interval '1 hour' WHERE id IN"
                    " (SELECT id FROM cyclone_jobs WHERE state = 'running' AND workflow = :w"
                    " ORDER BY random() LIMIT 2 FOR UPDATE SKIP LOCKED)"
                ),
                {"w": name},
            )
        time.sleep(0.05)

    before = deadlocks(engine)
    serving = [Background(w.run) for w in workers]
    actors = [
        Background(forever(action), name=f"actor-{action.__name__}")
        for action in (submit, cancel, cancel, retry, retry, purge, stale)
    ]
    time.sleep(5)  # the workload under test runs meanwhile
    stop.set()
    for actor in actors:
        actor.join(60)
    for w in workers:
        w.stop()
    for s in serving:
        s.join(60)
    assert errors == []
    assert len(made) > 20
    assert sum(w.stats.completed for w in workers) > 20
    time.sleep(1)  # statistics reach pg_stat_database within a second of a transaction's end
    assert deadlocks(engine) - before == 0


def test_an_outcome_whose_recording_fails_for_many_cycles_is_recorded_once_it_can_be(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "RETRY_FIRST", 0.05)
    wf = cyclone.Workflow(name)
    executions = 0

    @wf.step()
    def once(ctx: cyclone.StepContext, value: Any) -> int:
        nonlocal executions
        executions += 1
        return 42

    seq, fn, trigger = f"{name}_tries", f"{name}_refuse", f"{name}_refuse"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SEQUENCE {seq}"))
        conn.execute(
            sa.text(
                f"CREATE FUNCTION {fn}() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                f"PERFORM nextval('{seq}'); RAISE EXCEPTION 'recording refused by the test'; "
                "END $$"
            )
        )
        conn.execute(
            sa.text(
                f"CREATE TRIGGER {trigger} BEFORE UPDATE ON cyclone_jobs FOR EACH ROW "
                f"WHEN (NEW.state = 'completed' AND NEW.workflow = '{name}') "
                f"EXECUTE FUNCTION {fn}()"
            )
        )

    def tries() -> int:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {seq}")
                ).scalar_one()
            )

    worker = cyclone.Worker(engine, workflows=[wf], sweep=False, **QUICK)
    run = wf.submit(engine, None)
    try:
        with caplog.at_level(logging.INFO, logger="cyclone.worker"):
            serving = Background(worker.run)
            wait_until(lambda: tries() >= 6, timeout=30)  # twice the old limit of 3 cycles
            with engine.begin() as conn:
                conn.execute(sa.text(f"DROP TRIGGER {trigger} ON cyclone_jobs"))
            assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
            worker.stop()
            serving.join(30)
        refusals = tries()
    finally:
        worker.stop()
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TRIGGER IF EXISTS {trigger} ON cyclone_jobs"))
            conn.execute(sa.text(f"DROP FUNCTION IF EXISTS {fn}()"))
            conn.execute(sa.text(f"DROP SEQUENCE IF EXISTS {seq}"))
    assert executions == 1
    row = job_rows(engine, run.id)["once"]
    assert (row.state, row.output, row.errors) == ("completed", 42, [])
    assert worker.stats.completed == 1
    kept = [r for r in caplog.records if "outcomes kept" in r.getMessage()]
    # One line per failed try, no more: the backoff caps how many there are.
    assert 6 <= len(kept) <= refusals
