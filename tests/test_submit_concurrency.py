"""Concurrent submits of one key: waits, outcomes, threads and processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone.schema import runs
from tests.conftest import wait_until
from tests.support import processes
from tests.support.factories import count_runs, job_kinds, workflow
from tests.support.workers import blocked_by

REPO = Path(__file__).resolve().parent.parent


def backend_pid(conn: sa.Connection) -> int:
    return int(conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one())


def in_background(fn: Callable[[], Any]) -> tuple[ThreadPoolExecutor, Future[Any]]:
    pool = ThreadPoolExecutor(1)
    return pool, pool.submit(fn)


def submit_once_tx_in_own_transaction(
    engine: sa.Engine, wf: cyclone.Workflow[Any], key: str, value: Any
) -> Callable[[], tuple[cyclone.Run, bool]]:
    def call() -> tuple[cyclone.Run, bool]:
        with engine.begin() as conn:
            return wf.submit_once_tx(conn, key, value)

    return call


@pytest.mark.parametrize("form", ["submit_once", "submit_once_tx"])
def test_a_concurrent_submit_waits_and_returns_the_committed_run(
    engine: sa.Engine, name: str, form: str
) -> None:
    wf = workflow(name)
    if form == "submit_once":
        other = lambda: wf.submit_once(engine, "k", 1)  # noqa: E731
    else:
        other = submit_once_tx_in_own_transaction(engine, wf, "k", 1)
    with engine.connect() as a:
        a.begin()
        run_a, created_a = wf.submit_once_tx(a, "k", 1)
        assert created_a
        pool, b = in_background(other)
        try:
            wait_until(lambda: blocked_by(engine, backend_pid(a)), timeout=30)
            assert not b.done()
            a.commit()
            run_b, created_b = b.result(timeout=30)
        finally:
            pool.shutdown(wait=True)
    assert run_b.id == run_a.id
    assert created_b is False
    assert count_runs(engine, name, "k") == 1


@pytest.mark.parametrize("form", ["submit_once", "submit_once_tx"])
def test_a_concurrent_submit_waits_and_creates_the_run_after_a_rollback(
    engine: sa.Engine, name: str, form: str
) -> None:
    wf = workflow(name)
    if form == "submit_once":
        other = lambda: wf.submit_once(engine, "k", 1)  # noqa: E731
    else:
        other = submit_once_tx_in_own_transaction(engine, wf, "k", 1)
    with engine.connect() as a:
        a.begin()
        run_a, _ = wf.submit_once_tx(a, "k", 1)
        pool, b = in_background(other)
        try:
            wait_until(lambda: blocked_by(engine, backend_pid(a)), timeout=30)
            assert not b.done()
            a.rollback()
            run_b, created_b = b.result(timeout=30)
        finally:
            pool.shutdown(wait=True)
    assert created_b is True
    assert run_b.id != run_a.id
    with engine.connect() as conn:
        ids = list(conn.execute(sa.select(runs.c.id).where(runs.c.workflow == name)).scalars())
    assert ids == [run_b.id]


def test_a_concurrent_submit_with_a_different_input_conflicts_after_commit(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    with engine.connect() as a:
        a.begin()
        run_a, _ = wf.submit_once_tx(a, "k", 1)
        pool, b = in_background(lambda: wf.submit_once(engine, "k", 2))
        try:
            wait_until(lambda: blocked_by(engine, backend_pid(a)), timeout=30)
            a.commit()
            with pytest.raises(cyclone.SubmitConflictError) as info:
                b.result(timeout=30)
        finally:
            pool.shutdown(wait=True)
    assert info.value.run_id == run_a.id


@pytest.mark.parametrize("isolation", ["REPEATABLE READ", "SERIALIZABLE"])
def test_repeatable_read_raises_a_serialization_error(
    engine: sa.Engine, name: str, isolation: str
) -> None:
    wf = workflow(name)
    with engine.connect().execution_options(isolation_level=isolation) as a:
        a.begin()
        a.execute(sa.select(sa.literal(1)))  # takes the snapshot
        committed, created = wf.submit_once(engine, "k", 1)  # B commits the key
        assert created
        with pytest.raises(sa.exc.DBAPIError) as info:
            wf.submit_once_tx(a, "k", 1)
        assert getattr(info.value.orig, "sqlstate", None) == "40001"
        a.rollback()
    assert count_runs(engine, name, "k") == 1
    # A key committed before the snapshot is simply found.
    with engine.connect().execution_options(isolation_level=isolation) as a, a.begin():
        run, created = wf.submit_once_tx(a, "k", 1)
        assert (run.id, created) == (committed.id, False)


def test_sixteen_threads_submitting_one_key_make_one_run(engine: sa.Engine, name: str) -> None:
    wf = workflow(name, 3)
    wf.plan()
    barrier = threading.Barrier(16)
    # Every thread checks out its own connection before the barrier.
    connections = [engine.connect() for _ in range(16)]
    for c in connections:
        c.close()

    def submit() -> tuple[uuid.UUID, bool]:
        barrier.wait(timeout=30)
        run, created = wf.submit_once(engine, "k", {"key": "k"})
        return run.id, created

    with ThreadPoolExecutor(16) as pool:
        results = [f.result(timeout=30) for f in [pool.submit(submit) for _ in range(16)]]
    assert sum(created for _, created in results) == 1
    assert len({run_id for run_id, _ in results}) == 1
    assert count_runs(engine, name, "k") == 1


def test_sixteen_threads_in_their_own_transactions_make_one_run(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    barrier = threading.Barrier(16)

    def submit() -> tuple[uuid.UUID, bool]:
        with engine.begin() as conn:
            conn.execute(sa.select(sa.literal(1)))
            barrier.wait(timeout=30)
            run, created = wf.submit_once_tx(conn, "k", 1)
            return run.id, created

    with ThreadPoolExecutor(16) as pool:
        results = [f.result(timeout=30) for f in [pool.submit(submit) for _ in range(16)]]
    assert sum(created for _, created in results) == 1
    assert len({run_id for run_id, _ in results}) == 1
    assert count_runs(engine, name, "k") == 1


@pytest.mark.processes
@pytest.mark.timeout(240)
def test_eight_processes_submitting_one_key_at_the_same_instant_make_one_run(
    engine: sa.Engine, name: str
) -> None:
    gate = random.randrange(1, 2**62)
    env = {**os.environ}
    assert "CYCLONE_TEST_DATABASE_URL" in env
    with engine.connect() as holder:
        holder.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": gate})
        holder.commit()
        children = [
            processes.popen(
                [sys.executable, "-m", "tests.support.submit_proc", name, "order:1", str(gate)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(8)
        ]
        try:

            def all_at_the_gate() -> bool:
                for child in children:
                    if child.poll() is not None:  # died before the gate: fail now
                        pytest.fail(f"a child exited early: {child.communicate()[1]}")
                with engine.connect() as conn:
                    waiting = conn.execute(
                        sa.text(
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                            "AND NOT granted AND mode = 'ShareLock' "
                            "AND ((classid::bigint << 32) | objid::bigint) = :k"
                        ),
                        {"k": gate},
                    ).scalar_one()
                return bool(waiting == len(children))

            wait_until(all_at_the_gate, timeout=90)
        finally:
            holder.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": gate})
            holder.commit()
            outputs = [child.communicate(timeout=60) for child in children]
    results = []
    for child, (out, err) in zip(children, outputs, strict=True):
        assert child.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(result["created"] for result in results) == 1
    assert len({result["run_id"] for result in results}) == 1
    assert count_runs(engine, name, "order:1") == 1
    assert len(job_kinds(engine, uuid.UUID(results[0]["run_id"]))) == 3


@pytest.mark.parametrize("form", ["submit_once", "submit_once_many"])
def test_a_submit_waiting_on_a_purge_returns_the_new_run_not_the_purged_one(
    engine: sa.Engine, name: str, form: str
) -> None:
    wf = workflow(name)
    old, _ = wf.submit_once(engine, "k", 1)
    if form == "submit_once":
        other = lambda: wf.submit_once(engine, "k", 1)  # noqa: E731
    else:
        other = lambda: wf.submit_once_many(engine, [("k", 1)])[0]  # noqa: E731
    with engine.connect() as a:
        a.begin()
        a.execute(sa.delete(runs).where(runs.c.id == old.id))
        pool, b = in_background(other)
        try:
            wait_until(lambda: blocked_by(engine, backend_pid(a)), timeout=30)
            a.commit()
            run_b, created_b = b.result(timeout=30)
        finally:
            pool.shutdown(wait=True)
    assert created_b is True
    assert run_b.id != old.id
    assert run_b.status().key == "k"
    assert count_runs(engine, name, "k") == 1


@pytest.mark.parametrize("lock", ["FOR UPDATE", "FOR KEY SHARE"])
def test_a_duplicate_of_a_locked_run_returns_it_without_waiting(
    engine: sa.Engine, name: str, lock: str
) -> None:
    # A row lock (a cancel holding the run, a foreign-key check) is not a purge: the
    # duplicate takes the insert's path, whose conflict check does not wait for lockers.
    wf = workflow(name)
    run, _ = wf.submit_once(engine, "k", 1)
    with engine.connect() as a:
        a.begin()
        a.execute(sa.text(f"SELECT 1 FROM cyclone_runs WHERE id = :id {lock}"), {"id": run.id})
        pool, b = in_background(lambda: wf.submit_once(engine, "k", 1))
        try:
            again, created = b.result(timeout=10)
        finally:
            a.rollback()
            pool.shutdown(wait=True)
    assert again.id == run.id
    assert created is False


@pytest.mark.parametrize("form", ["submit_once", "submit_once_tx"])
def test_a_run_purged_between_the_insert_and_the_read_is_made_again(
    database_url: sa.URL, engine: sa.Engine, name: str, form: str
) -> None:
    # The race path of submit_once, driven step by step: its insert waits for another
    # transaction's run of the key and finds it committed after its snapshot (no row);
    # before its read, that run is purged; so it inserts again and makes the run.
    wf = workflow(name)
    observed = sa.create_engine(database_url)  # its statements pass the cursor events
    sent: list[str] = []
    purged: list[uuid.UUID] = []

    def before(conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        if threading.current_thread().name != "racer" or "cyclone_runs" not in statement:
            return  # (the _tx form first stores the definition, once, on a statement of its own)
        sent.append(statement)
        if len(sent) == 2:  # the read after the insert found nothing: purge the run now
            with engine.begin() as purge:
                purged.extend(
                    purge.execute(
                        sa.delete(runs)
                        .where(runs.c.workflow == name, runs.c.submit_key == "k")
                        .returning(runs.c.id)
                    ).scalars()
                )

    sa.event.listen(observed, "before_cursor_execute", before)

    def race() -> tuple[cyclone.Run, bool]:
        threading.current_thread().name = "racer"
        if form == "submit_once":
            return wf.submit_once(observed, "k", 1)
        with observed.begin() as conn:
            return wf.submit_once_tx(conn, "k", 1)

    try:
        with engine.connect() as a:
            a.begin()
            first, _ = wf.submit_once_tx(a, "k", 1)
            pool, racer = in_background(race)
            try:
                wait_until(lambda: blocked_by(engine, backend_pid(a)), timeout=30)
                a.commit()
                run, created = racer.result(timeout=30)
            finally:
                pool.shutdown(wait=True)
    finally:
        observed.dispose()
    assert purged == [first.id]
    assert len(sent) == 3  # insert (no row), read (purged meanwhile), insert again
    assert created is True
    assert run.id != first.id
    assert count_runs(engine, name, "k") == 1
