"""Work rings only while a worker waits for it, and a worker asleep is never left asleep
with work available (revision cyclone_0019_waiters; see cyclone/_store/notify.py)."""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import cyclone
from cyclone import worker as worker_module
from tests.conftest import wait_until
from tests.support import worker_proc
from tests.support.counting import ThreadStatements
from tests.support.worker_proc import NEVER_POLL, Item, doorbell_kinds
from tests.support.workers import Background, spawn_worker, stop_all

WAKE_TIMEOUT = 30.0
"""Far beyond a wake-up, far short of NEVER_POLL: a job still waiting then was missed."""


def recorded_waiters(engine: sa.Engine) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT worker_id FROM cyclone_waiters WHERE waits_until > now()")
        )
        return {row[0] for row in rows}


@pytest.fixture
def listening(database_url: sa.URL) -> Iterator[psycopg.Connection[Any]]:
    """A connection that LISTENs on cyclone_jobs_available, in a database where no worker
    is recorded as waiting: a record left by an earlier test's worker killed in its
    process (it lapses only after a minute) would make every new job ring."""
    conninfo = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("DELETE FROM cyclone_waiters")
        conn.execute('LISTEN "cyclone_jobs_available"')
        yield conn


def notifications(conn: psycopg.Connection[Any], timeout: float) -> int:
    return sum(1 for _ in conn.notifies(timeout=timeout))


def test_an_idle_worker_records_that_it_waits_and_removes_the_record_when_it_stops(
    engine: sa.Engine, name: str
) -> None:
    wf, ping = doorbell_kinds(name)
    worker = cyclone.Worker(engine, workflows=[wf], steps=[ping], poll_interval=NEVER_POLL)
    serving = Background(worker.run)
    try:
        wait_until(lambda: worker.id in recorded_waiters(engine), timeout=30)
        job = ping.enqueue(engine, Item(n=1))
        assert job.wait(timeout=WAKE_TIMEOUT).state.value == "completed"
    finally:
        worker.stop()
        serving.join(30)
        worker.close()
    assert worker.id not in recorded_waiters(engine)


def test_a_busy_worker_is_not_rung_for_new_work(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any]
) -> None:
    release = threading.Event()

    @cyclone.step(f"{name}.hold")
    def hold(ctx: cyclone.StepContext, n: int) -> int:
        release.wait(60)
        return n

    worker = cyclone.Worker(engine, steps=[hold], concurrency=1, poll_interval=NEVER_POLL)
    serving = Background(worker.run)
    try:
        wait_until(lambda: worker.id in recorded_waiters(engine), timeout=30)
        first = hold.enqueue(engine, 1)
        # Claimed with no room left: the worker no longer waits for work.
        wait_until(lambda: first.status().state.value == "running", timeout=WAKE_TIMEOUT)
        wait_until(lambda: not recorded_waiters(engine), timeout=WAKE_TIMEOUT)
        notifications(listening, 0.05)
        later = [hold.enqueue(engine, n) for n in range(2, 6)]
        assert notifications(listening, 0.5) == 0
        release.set()
        for job in [first, *later]:
            assert job.wait(timeout=WAKE_TIMEOUT).state.value == "completed"
    finally:
        release.set()
        worker.stop()
        serving.join(30)
        worker.close()


ROUNDS = 40
"""Rounds per submitter thread."""
BURST = 5
"""Jobs of a burst: one per thread of the workers, so that every worker stops waiting
and falls asleep again at about the same moment."""


def _submitter(
    engine: sa.Engine, name: str, seed: int, solo: threading.Lock, done: list[int]
) -> None:
    """Rounds of a burst that takes every worker, then one job submitted at a random moment
    around the burst's end, when the workers fall asleep; mostly while no other submitter's
    work is in flight, so that no later ring can cover a lost one. Each job is waited for."""
    wf, ping = doorbell_kinds(name)
    rng = random.Random(seed)
    for i in range(ROUNDS):
        alone = rng.random() < 0.75
        if alone:
            solo.acquire()
        try:
            burst = [ping.enqueue(engine, Item(n=20)) for _ in range(BURST)]
            time.sleep(0.002 + rng.random() * 0.004)  # the burst's jobs claimed, not ended
            form = rng.randrange(4)
            if form == 0:
                probe: Any = ping.enqueue(engine, Item(n=20))
            elif form == 1:
                probe = wf.submit(engine, Item(n=20))
            else:
                # Committed a while after its ring was decided: a worker falling asleep
                # meanwhile must wait for this transaction before its last claim.
                with engine.begin() as conn:
                    probe = ping.enqueue_tx(conn, Item(n=20))
                    time.sleep(rng.random() * 0.04)  # open across the burst's end
            for handle in [probe, *burst]:
                status = handle.wait(timeout=WAKE_TIMEOUT)
                assert status.state.value == "completed", status
            done.append(i)
        finally:
            if alone:
                solo.release()


@pytest.mark.processes
def test_no_wake_up_is_lost_while_workers_fall_asleep_and_wake_at_random(
    engine: sa.Engine, name: str
) -> None:
    wf, ping = doorbell_kinds(name)
    procs = [spawn_worker("asleep", name, "1") for _ in range(2)]
    workers = [
        cyclone.Worker(
            engine,
            workflows=[wf],
            steps=[ping],
            concurrency=1,  # each claim fills it: it stops waiting, then waits anew
            poll_interval=NEVER_POLL,
            sweep=False,
        )
        for _ in range(3)
    ]
    serving = [Background(worker.run, name=f"worker-{i}") for i, worker in enumerate(workers)]
    try:
        wait_until(lambda: len(recorded_waiters(engine)) == 5, timeout=60)
        solo = threading.Lock()
        done: list[int] = []
        seed = random.randrange(2**32)
        submitters = [
            Background(functools.partial(_submitter, engine, name, seed + k, solo, done))
            for k in range(3)
        ]
        for submitter in submitters:
            submitter.join(timeout=600)
        assert len(done) == 3 * ROUNDS, f"seed {seed}"
        with engine.connect() as conn:
            left = conn.execute(
                sa.text(
                    "SELECT count(*) FROM cyclone_jobs WHERE state <> 'completed' "
                    "AND (workflow = :name OR kind = :name || '.ping')"
                ),
                {"name": name},
            ).scalar_one()
        assert left == 0
    finally:
        for worker in workers:
            worker.stop()
        for background in serving:
            background.join(60)
        for worker in workers:
            worker.close()
        for proc in procs:
            proc.terminate()
        stop_all(procs)
    assert worker_proc.NEVER_POLL > WAKE_TIMEOUT


def test_a_worker_whose_wait_record_failed_listens_again_within_a_second(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A record cut short (here: cancelled while it waited for a lock) closes the worker's
    connection, so no NOTIFY reaches it until a new record: that comes after half a second,
    not after half a minute of a deaf worker that never polls."""
    wf, ping = doorbell_kinds(name)
    worker = cyclone.Worker(engine, workflows=[wf], steps=[ping], poll_interval=NEVER_POLL)
    with engine.connect() as locker, caplog.at_level("WARNING", logger="cyclone.worker"):
        locker.execute(sa.text("LOCK TABLE cyclone_waiters IN ACCESS EXCLUSIVE MODE"))
        serving = Background(worker.run)
        try:
            cancel_blocked_until(
                engine, "cyclone_waiters", caplog, "could not record that it waits"
            )
            locker.rollback()
            job = ping.enqueue(engine, Item(n=20))
            # Deaf for half a minute before: the job waited until then.
            assert job.wait(timeout=10).state.value == "completed"
        finally:
            worker.stop()
            serving.join(30)
            worker.close()
    assert worker.id not in recorded_waiters(engine)


def test_a_worker_falling_asleep_looks_at_a_slot_held_open_less_and_less_often(
    engine: sa.Engine, name: str, serving: Any
) -> None:
    """A transaction that rang and stays open (a web request's) holds its ring slot: the
    worker falling asleep looked at it every 10 ms for as long as it stayed open. It now
    waits twice as long each time, up to half a second, and new work still wakes it at
    once (it is recorded as waiting, so the work rings)."""
    wf, ping = doorbell_kinds(name)
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cyclone_waiters"))
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT cyclone_ring()"))  # its slot, held until it ends
        worker = cyclone.Worker(engine, workflows=[wf], steps=[ping], poll_interval=NEVER_POLL)
        loop = serving(worker)
        with ThreadStatements(loop.thread.name) as sent:

            def looks() -> list[float]:
                return [t for t, s in sent.timed if "pg_try_advisory_lock" in s]

            wait_until(lambda: len(looks()) >= 8, timeout=30)
            first, eighth = looks()[0], looks()[7]
            # 10 + 20 + 40 + 80 + 160 + 320 + 500 ms at least between them (70 ms before).
            assert eighth - first >= 1.0, looks()
            job = ping.enqueue(engine, Item(n=20))
            assert job.wait(timeout=WAKE_TIMEOUT).state.value == "completed"
        holder.rollback()


def started_on_time(engine: sa.Engine, run: cyclone.Run) -> bool:
    """Whether the run completed and each of its steps started no earlier than it was due."""
    assert run.wait(timeout=WAKE_TIMEOUT).state == cyclone.RunState.COMPLETED
    with engine.connect() as conn:
        started = conn.execute(
            sa.text(
                "SELECT scheduled_at, attempted_at FROM cyclone_jobs "
                "WHERE run_id = :run AND attempted_at IS NOT NULL"
            ),
            {"run": run.id},
        ).all()
    return bool(started) and all(at >= due for due, at in started)


@contextmanager
def asleep(engine: sa.Engine, *steps: Any, **options: Any) -> Iterator[cyclone.Worker]:
    """A worker serving ``steps`` (workflows and step kinds) in a thread, that never polls,
    yielded once it is recorded as waiting for work; stopped at the end."""
    workflows = [s for s in steps if isinstance(s, cyclone.Workflow)]
    kinds = [s for s in steps if not isinstance(s, cyclone.Workflow)]
    worker = cyclone.Worker(
        engine, workflows=workflows, steps=kinds, poll_interval=NEVER_POLL, **options
    )
    serving = Background(worker.run)
    try:
        wait_until(lambda: worker.id in recorded_waiters(engine), timeout=30)
        yield worker
    finally:
        worker.stop()
        serving.join(30)
        worker.close()


def cancel_blocked_until(
    engine: sa.Engine, table: str, caplog: pytest.LogCaptureFixture, logged: str
) -> None:
    """Cancel the statements of this database that wait for a lock on ``table`` until the
    worker logs ``logged`` (one of its statements failed)."""

    def cancelled() -> bool:
        with engine.connect() as conn:
            conn.execute(
                sa.text(
                    "SELECT pg_cancel_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND query LIKE :table"
                ),
                {"table": f"%{table}%"},
            )
        return logged in caplog.text

    wait_until(cancelled, timeout=30)


def test_a_woken_claim_that_failed_is_tried_again_as_a_woken_one(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A claim woken by a NOTIFY and cut short (here: cancelled while it waits for a lock)
    read nothing, so the claim after the backoff reads when the next job falls due. It was
    tried as a plain claim: the delayed run whose NOTIFY woke the worker waited for its poll."""
    wf, ping = doorbell_kinds(name)
    with asleep(engine, wf, ping), engine.connect() as locker:
        with caplog.at_level("WARNING", logger="cyclone.worker"):
            # The claim takes a row lock on cyclone_jobs; a delayed submit writes no job.
            locker.execute(sa.text("LOCK TABLE cyclone_jobs IN EXCLUSIVE MODE"))
            run = wf.submit(engine, Item(n=20), delay=timedelta(seconds=6))
            cancel_blocked_until(engine, "cyclone_jobs", caplog, "could not record or claim")
            locker.rollback()
        assert started_on_time(engine, run)


def test_a_notify_sent_while_the_worker_had_no_connection_is_not_lost(
    engine: sa.Engine, database_url: sa.URL, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A NOTIFY sent after the worker's connection was lost and before a new one LISTENed
    reaches no one: the first claim on the new connection reads what it would have told
    (here: when a delayed run falls due), as a woken claim does. It was a plain claim, and
    the run waited for the poll."""
    wf, ping = doorbell_kinds(name)
    database = database_url.database
    admin = sa.create_engine(database_url.set(database="postgres"), poolclass=sa.NullPool)

    def allow(allowed: bool) -> None:
        with admin.connect() as conn:
            conn.execute(
                sa.text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allowed).lower()}')
            )
            conn.commit()

    try:
        with asleep(engine, wf, ping) as worker, engine.connect() as submitter:
            held = worker._held
            assert held is not None
            assert held._direct is not None
            pid = held._direct._driver.info.backend_pid
            with caplog.at_level("WARNING", logger="cyclone.worker"):
                allow(False)
                try:
                    submitter.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
                    # The worker woke at once and failed to connect: it hears nothing now.
                    wait_until(lambda: "could not record or claim" in caplog.text, timeout=30)
                    run = wf.submit_tx(submitter, Item(n=20), delay=timedelta(seconds=6))
                    submitter.commit()
                finally:
                    allow(True)
            assert started_on_time(engine, run)
    finally:
        admin.dispose()


def test_a_delayed_run_notified_beside_work_claimed_at_once_starts_on_time(
    engine: sa.Engine, name: str
) -> None:
    """One NOTIFY told of a delayed run and of a job due now: the woken claim took the job,
    so it did not read when the delayed run falls due, and the claim that found nothing
    after the job ended was not a woken one: the run waited for the poll. A woken claim now
    reads that time in its own statement."""
    wf, ping = doorbell_kinds(name)
    with asleep(engine, wf, ping, concurrency=4):
        with engine.begin() as conn:
            run = wf.submit_tx(conn, Item(n=20), delay=timedelta(seconds=4))
            job = ping.enqueue_tx(conn, Item(n=20))
        assert job.wait(timeout=WAKE_TIMEOUT).state.value == "completed"
        assert started_on_time(engine, run)


def test_a_worker_with_queue_limits_woken_for_work_and_a_delayed_run_starts_the_run_on_time(
    engine: sa.Engine, name: str
) -> None:
    """A worker with per-queue limits reads when its next job falls due in a statement of
    its own: after a woken claim that left room, not only after one that found nothing.
    The job that one NOTIFY told of took the woken claim, and the delayed run told of with
    it waited until that job ended."""
    release = threading.Event()

    @cyclone.step(f"{name}.hold")
    def hold(ctx: cyclone.StepContext, n: int) -> int:
        release.wait(60)
        return n

    wf, _ping = doorbell_kinds(name)
    try:
        with asleep(engine, wf, hold, queues={"default": 4}):
            with engine.begin() as conn:
                run = wf.submit_tx(conn, Item(n=20), delay=timedelta(seconds=4))
                job = hold.enqueue_tx(conn, 1)
            assert started_on_time(engine, run)
            assert job.status().state.value == "running"
            release.set()
            assert job.result(timeout=WAKE_TIMEOUT) == 1
    finally:
        release.set()


def test_a_worker_whose_connection_was_lost_outside_a_claim_listens_again_before_it_sleeps(
    engine: sa.Engine, name: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal of the wait record cut short closes the worker's connection, and the next
    record comes only after a backoff (here an hour). Its record is still in force (the
    test renews it), so new work rings: the worker LISTENs again on a new connection before
    it sleeps. It slept on no connection until the backoff ended, and the ring was lost."""
    monkeypatch.setattr(worker_module, "WAIT_RECORD", 4.0)  # renewed after 2 s
    monkeypatch.setattr(worker_module, "backoff_delay", lambda failures: 3600.0)
    wf, ping = doorbell_kinds(name)
    with asleep(engine, wf, ping) as worker, engine.connect() as locker:
        with caplog.at_level("WARNING", logger="cyclone.worker"):
            locker.execute(sa.text("LOCK TABLE cyclone_waiters IN ACCESS EXCLUSIVE MODE"))
            cancel_blocked_until(
                engine, "cyclone_waiters", caplog, "could not record that it waits"
            )
            locker.rollback()
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO cyclone_waiters (worker_id, waits_until) "
                    "VALUES (:me, now() + interval '1 minute') ON CONFLICT (worker_id) "
                    "DO UPDATE SET waits_until = excluded.waits_until"
                ),
                {"me": worker.id},
            )
        job = ping.enqueue(engine, Item(n=20))
        assert job.wait(timeout=WAKE_TIMEOUT).state.value == "completed"


@contextmanager
def holding(engine: sa.Engine, name: str, busy: bool, *steps: Any) -> Iterator[None]:
    """A worker asleep serving ``steps``; with ``busy``, running a job of its own (recorded
    as waiting, with room) until the block ends, when that job's end is recorded."""
    release = threading.Event()

    @cyclone.step(f"{name}.hold")
    def hold(ctx: cyclone.StepContext, n: int) -> int:
        release.wait(60)
        return n

    try:
        with asleep(engine, *steps, hold, concurrency=2):
            job = hold.enqueue(engine, 1) if busy else None
            if job is not None:
                wait_until(lambda: job.status().state.value == "running", timeout=WAKE_TIMEOUT)
            yield
            release.set()
            if job is not None:
                assert job.result(timeout=WAKE_TIMEOUT) == 1
    finally:
        release.set()


def start_due(engine: sa.Engine, run: cyclone.Run) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                sa.text("SELECT start_at <= now() FROM cyclone_runs WHERE id = :r"), {"r": run.id}
            ).scalar()
        )


@pytest.mark.parametrize("busy", [False, True], ids=["asleep", "running a job"])
def test_a_retried_run_that_never_started_rings_for_its_start(
    engine: sa.Engine, name: str, busy: bool
) -> None:
    wf, ping = doorbell_kinds(name)
    run = wf.submit(engine, Item(n=20), delay=timedelta(seconds=0.5))
    run.cancel()
    wait_until(lambda: start_due(engine, run), timeout=10)
    with holding(engine, name, busy, wf, ping):
        run.retry()
        assert run.wait(timeout=WAKE_TIMEOUT).state == cyclone.RunState.COMPLETED


@pytest.mark.parametrize("busy", [False, True], ids=["asleep", "running a job"])
def test_a_map_node_its_last_item_makes_available_rings_for_its_collect(
    engine: sa.Engine, name: str, busy: bool
) -> None:
    # The worker running the item stops: it records the item with no room to claim the
    # node, which another worker must be rung for.
    gate = threading.Event()
    wf: cyclone.Workflow[int] = cyclone.Workflow(f"{name}-map", input=int)

    @wf.step()
    def numbers(ctx: cyclone.StepContext, n: int) -> list[int]:
        return list(range(n))

    @wf.map(over=numbers)
    def each(ctx: cyclone.StepContext, i: int) -> int:
        gate.wait(60)
        return i

    def item_running() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    sa.text(
                        "SELECT count(*) FROM cyclone_jobs WHERE workflow = :w "
                        "AND item IS NOT NULL AND state = 'running'"
                    ),
                    {"w": wf.name},
                ).scalar()
            )

    first = cyclone.Worker(engine, workflows=[wf], concurrency=1, poll_interval=NEVER_POLL)
    serving = Background(first.run)
    try:
        run = wf.submit(engine, 1)
        wait_until(item_running, timeout=WAKE_TIMEOUT)
        with holding(engine, name, busy, wf):
            first.stop()
            gate.set()
            serving.join(30)
            assert run.wait(timeout=WAKE_TIMEOUT).state == cyclone.RunState.COMPLETED
    finally:
        gate.set()
        first.stop()
        serving.join(30)
        first.close()


def test_a_success_recorded_alone_does_not_put_the_poll_off(engine: sa.Engine, name: str) -> None:
    # A job its worker's claims skipped as locked (here by a test's FOR UPDATE) rings
    # nothing once unlocked: the poll finds it. Steps ending one after the other are
    # recorded alone; were each to put the poll off, it would never come.
    poll = 2.0
    held = 8
    release = {n: threading.Event() for n in range(1, held + 1)}

    @cyclone.step(f"{name}.hold")
    def hold(ctx: cyclone.StepContext, n: int) -> int:
        if n in release:
            release[n].wait(60)
        return n

    worker = cyclone.Worker(engine, steps=[hold], concurrency=held, poll_interval=poll)
    claims: list[int] = []
    inner = worker._record_and_claim

    def counted(outcomes: Any, free: Any, **kw: Any) -> Any:
        if free:
            claims.append(1)
        return inner(outcomes, free, **kw)

    worker._record_and_claim = counted  # type: ignore[method-assign]
    serving = Background(worker.run)
    try:
        wait_until(lambda: worker.id in recorded_waiters(engine), timeout=30)
        holding = [hold.enqueue(engine, n) for n in range(1, held + 1)]
        for job in holding:
            wait_until(lambda j=job: j.status().state.value == "running", timeout=WAKE_TIMEOUT)
        skipped = hold.enqueue(engine, 0)  # the worker is full: nothing rings
        with engine.connect() as locker:
            locker.execute(
                sa.text("SELECT id FROM cyclone_jobs WHERE id = :id FOR UPDATE"),
                {"id": skipped.id},
            )
            before = len(claims)
            release[held].set()
            assert holding[-1].result(timeout=WAKE_TIMEOUT) == held
            # The claim that records it, then the last claim before the worker sleeps.
            wait_until(lambda: len(claims) >= before + 2, timeout=WAKE_TIMEOUT)
            wait_until(lambda: worker.id in recorded_waiters(engine), timeout=WAKE_TIMEOUT)
            locker.rollback()
        for n in range(held - 1, 1, -1):  # an end every 0.8 s, for longer than the poll
            release[n].set()
            assert holding[n - 1].result(timeout=WAKE_TIMEOUT) == n
            threading.Event().wait(0.8)
        assert skipped.status().state.value == "completed"
    finally:
        for event in release.values():
            event.set()
        worker.stop()
        serving.join(30)
        worker.close()
