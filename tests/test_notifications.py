"""NOTIFY cyclone_jobs_available: an insert of an available job rings it, on commit only,
while a worker is recorded as waiting for work (``cyclone_waiters``), and not otherwise."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import cyclone
from cyclone._store import notify as _notify
from tests.support.factories import workflow


@pytest.fixture
def listening(database_url: sa.URL) -> Iterator[psycopg.Connection[Any]]:
    """A connection that LISTENs on cyclone_jobs_available, with nothing pending."""
    conninfo = database_url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # No worker serves now: forget the records of those an earlier test killed.
        conn.execute("DELETE FROM cyclone_waiters")
        conn.execute(f'LISTEN "{_notify.JOBS_AVAILABLE}"')
        received(conn, 0.05, quiet=0.05)
        yield conn


@contextlib.contextmanager
def a_worker_waits(listening: psycopg.Connection[Any]) -> Iterator[None]:
    """A waiter record for a worker that is not there: work rings while it lasts."""
    listening.execute(
        "INSERT INTO cyclone_waiters (worker_id, waits_until) "
        "VALUES ('test', now() + interval '50 seconds')"
    )
    try:
        yield
    finally:
        listening.execute("DELETE FROM cyclone_waiters WHERE worker_id = 'test'")


@pytest.fixture
def waiting(listening: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
    """``listening``, with a worker recorded in ``cyclone_waiters`` as waiting for work."""
    with a_worker_waits(listening):
        yield listening


def received(conn: psycopg.Connection[Any], timeout: float, quiet: float = 0.3) -> int:
    """How many notifications ``conn`` gets: the first within ``timeout`` seconds, then
    any more until none came for ``quiet`` seconds."""
    count = sum(1 for _ in conn.notifies(timeout=timeout, stop_after=1))
    while count and any(True for _ in conn.notifies(timeout=quiet, stop_after=1)):
        count += 1
    return count


def standalone(name: str) -> cyclone.StandaloneStep[Any, Any]:
    @cyclone.step(f"{name}.job")
    def job(ctx: cyclone.StepContext, args: Any) -> None:
        return None

    return job


BIND_FORMS: dict[str, Callable[[sa.Engine, str], Any]] = {
    "submit": lambda e, n: workflow(n, 3).submit(e, {"n": 1}),
    "submit_once": lambda e, n: workflow(n, 3).submit_once(e, "k", {"n": 1}),
    "submit_once_many": lambda e, n: workflow(n, 3).submit_once_many(
        e, [("a", {"n": 1}), ("b", {"n": 2})]
    ),
    "enqueue": lambda e, n: standalone(n).enqueue(e, {"n": 1}),
    "Client.submit_once": lambda e, n: workflow(n).submit_once(cyclone.Client(e), "k", 1),
}


@pytest.mark.parametrize("form", sorted(BIND_FORMS))
def test_a_new_available_job_notifies(
    engine: sa.Engine, name: str, waiting: psycopg.Connection[Any], form: str
) -> None:
    BIND_FORMS[form](engine, name)
    assert received(waiting, 2.0) == 1


TX_FORMS: dict[str, Callable[[sa.Connection, str], Any]] = {
    "submit_tx": lambda c, n: workflow(n, 2).submit_tx(c, {"n": 1}),
    "submit_once_tx": lambda c, n: workflow(n, 2).submit_once_tx(c, "k", {"n": 1}),
    "enqueue_tx": lambda c, n: standalone(n).enqueue_tx(c, {"n": 1}),
}


@pytest.mark.parametrize("form", sorted(TX_FORMS))
def test_a_job_inserted_in_the_callers_transaction_notifies_only_on_commit(
    engine: sa.Engine, name: str, waiting: psycopg.Connection[Any], form: str
) -> None:
    with engine.connect() as conn, conn.begin():
        TX_FORMS[form](conn, name)
        assert received(waiting, 0.3) == 0
    assert received(waiting, 2.0) == 1


def test_a_rolled_back_submit_does_not_notify(
    engine: sa.Engine, name: str, waiting: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        workflow(name).submit_once_tx(session, "k", {"n": 1})
        session.rollback()
    assert received(waiting, 0.5) == 0


def test_a_duplicate_submit_does_not_notify(
    engine: sa.Engine, name: str, waiting: psycopg.Connection[Any]
) -> None:
    wf = workflow(name)
    wf.submit_once(engine, "k", {"n": 1})
    assert received(waiting, 2.0) == 1
    _run, created = wf.submit_once(engine, "k", {"n": 1})
    assert not created
    assert received(waiting, 0.5) == 0


def test_one_notification_per_transaction_however_many_jobs(
    engine: sa.Engine, name: str, waiting: psycopg.Connection[Any]
) -> None:
    # PostgreSQL folds equal notifications of one transaction: a batch of 50 runs wakes
    # the workers once, not 50 times.
    workflow(name).submit_once_many(engine, [(f"k{i}", {"n": i}) for i in range(50)])
    assert received(waiting, 1.0) == 1


@pytest.mark.parametrize("form", sorted(BIND_FORMS))
def test_no_notification_while_no_worker_waits_for_work(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any], form: str
) -> None:
    BIND_FORMS[form](engine, name)
    assert received(listening, 0.5) == 0


def test_a_lapsed_wait_record_rings_no_more(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any]
) -> None:
    # A worker that died asleep leaves its record: it rings until ``waits_until``, then not.
    listening.execute(
        "INSERT INTO cyclone_waiters (worker_id, waits_until) "
        "VALUES ('gone', now() - interval '1 s')"
    )
    workflow(name).submit(engine, {"n": 1})
    assert received(listening, 0.5) == 0


def two_queues(name: str) -> cyclone.Workflow[Any]:
    """``first``, then ``second`` on a queue of its own."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)

    @wf.step()
    def first(ctx: cyclone.StepContext, value: Any) -> int:
        return 1

    @wf.step(after=[first], queue=f"{name}-second")
    def second(ctx: cyclone.StepContext, value: Any) -> int:
        return 2

    return wf


def test_an_unblocked_step_rings_only_while_a_worker_waits(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any]
) -> None:
    wf = two_queues(name)
    default_only = {"default": 1}
    second_only = {f"{name}-second": 1}
    run = wf.submit(engine, {"n": 1})
    with cyclone.Worker(engine, workflows=[wf], queues=default_only) as worker:
        worker.drain()
    with cyclone.Worker(engine, workflows=[wf], queues=second_only) as worker:
        worker.drain()
    assert run.status().state is cyclone.RunState.COMPLETED
    assert received(listening, 0.5) == 0
    with a_worker_waits(listening):
        run = wf.submit(engine, {"n": 2})
        assert received(listening, 2.0) == 1
        # The worker that ran the first step does not serve the second's queue: the
        # record makes it available, and rings.
        with cyclone.Worker(engine, workflows=[wf], queues=default_only) as worker:
            worker.drain()
        assert received(listening, 2.0) == 1
        with cyclone.Worker(engine, workflows=[wf], queues=second_only) as worker:
            worker.drain()
        assert run.status().state is cyclone.RunState.COMPLETED


def test_a_step_continued_by_the_worker_that_recorded_its_upstream_rings_nothing(
    engine: sa.Engine, name: str, waiting: psycopg.Connection[Any]
) -> None:
    wf = workflow(name, 3)
    run = wf.submit(engine, {"n": 1})
    assert received(waiting, 2.0) == 1
    with cyclone.Worker(engine, workflows=[wf], concurrency=1) as worker:
        worker.drain()
    assert run.status().state is cyclone.RunState.COMPLETED
    assert received(waiting, 0.5) == 0


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_a_submit_under_snapshot_isolation_rings_even_with_no_worker_waiting(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any], isolation: str
) -> None:
    # Its snapshot may predate a worker's wait record: it cannot tell, so it rings.
    with engine.connect().execution_options(isolation_level=isolation) as conn, conn.begin():
        workflow(name).submit_tx(conn, {"n": 1})
    assert received(listening, 2.0) == 1


def test_a_transaction_that_read_no_waiter_reads_again_at_its_next_submit(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any]
) -> None:
    # Only a ring is remembered for the rest of a transaction (cyclone_0030_ring_memo):
    # a worker recorded as waiting after the first submit is rung by the second.
    wf = workflow(name)
    memo = sa.text("SELECT current_setting('cyclone.rang', true)")
    with engine.connect() as conn:
        with conn.begin():
            wf.submit_tx(conn, {"n": 1})
            assert conn.execute(memo).scalar() in (None, "")
            with a_worker_waits(listening):
                wf.submit_tx(conn, {"n": 2})
            assert conn.execute(memo).scalar() == "y"
            assert received(listening, 0.2) == 0  # not before the commit
        assert received(listening, 2.0) == 1


def test_a_statement_making_many_jobs_available_reads_the_waiters_once(
    engine: sa.Engine, name: str, listening: psycopg.Connection[Any]
) -> None:
    # The row trigger remembers, while its statement_timestamp() lasts, that no worker
    # waited (cyclone_0031_trigger_ring_memo); the next statement sent reads again and
    # rings a worker recorded as waiting since.
    job = standalone(name)
    for i in range(20):
        job.enqueue(engine, {"n": i})
    jobs = cyclone.schema.jobs
    mine = jobs.c.kind == job.kind
    fail = sa.update(jobs).where(mine).values(state="failed", finalized_at=sa.func.now())
    again = sa.update(jobs).where(mine).values(state="available", finalized_at=None)
    scans = sa.select(sa.func.pg_stat_get_xact_numscans(sa.text("'cyclone_waiters'::regclass")))
    with engine.begin() as conn:
        conn.execute(fail)
    received(listening, 0.05, quiet=0.05)
    with engine.connect() as conn:
        with conn.begin():
            # Counted since the backend last reported its statistics, which it does only
            # between transactions: a difference within one transaction is exact.
            before = conn.execute(scans).scalar()
            assert conn.execute(again).rowcount == 20
            assert conn.execute(scans).scalar() == before + 1
            conn.execute(fail)
            with a_worker_waits(listening):
                conn.execute(again)
            assert conn.execute(scans).scalar() == before + 2
            assert received(listening, 0.2) == 0  # not before the commit
        assert received(listening, 2.0) == 1
