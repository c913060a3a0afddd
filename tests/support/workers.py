"""Helpers for the worker tests: background threads that re-raise, job rows, subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import cyclone
from cyclone._store import unstarted as _unstarted
from cyclone._store.leadership import LEADERSHIP
from cyclone.schema import jobs, leader
from tests.support import processes

REPO = Path(__file__).resolve().parents[2]


class Background:
    """Runs ``fn`` in a daemon thread; :meth:`join` re-raises its error or returns its value."""

    def __init__(self, fn: Callable[[], Any], name: str = "test-background") -> None:
        self._fn = fn
        self._value: Any = None
        self._error: BaseException | None = None
        self.finished_at: float | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self.finished_at = time.monotonic()

    def alive(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = 10.0) -> Any:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise AssertionError(f"{self.thread.name} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        return self._value


class IdleWatch:
    """Whether ``worker``'s claim loop is waiting for a wake-up (a NOTIFY, a finished step,
    a poll due): attach it before the worker serves, then wait for :attr:`waiting`."""

    def __init__(self, worker: cyclone.Worker) -> None:
        self.waiting = False
        doorbell = worker._wake
        wait = doorbell.wait

        def watched(timeout: float | None = None) -> bool:
            self.waiting = True
            try:
                return wait(timeout)
            finally:
                self.waiting = False

        doorbell.wait = watched  # type: ignore[method-assign]


@dataclass(frozen=True)
class JobRow:
    kind: str
    state: str
    attempt: int
    errors: list[dict[str, Any]]
    worker_id: str | None
    scheduled_at: Any
    output: Any


def step_columns(engine: sa.Engine, run_id: Any, *names: str) -> list[sa.Row[Any]]:
    """These columns of a run's jobs; a run not started yet shows the steps it will create
    (``cyclone._store.unstarted``), as its detail does."""
    unstarted = _unstarted.steps_of(run_id).subquery("unstarted")
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.union_all(
                    sa.select(*(jobs.c[n] for n in names)).where(jobs.c.run_id == run_id),
                    sa.select(*(unstarted.c[n] for n in names)),
                )
            )
        )


@cyclone.step("tests.support.workers.never-enqueued")
def _NEVER_ENQUEUED(ctx: cyclone.StepContext, value: Any) -> None:
    raise AssertionError("never enqueued")


def rescue_lost_jobs(engine: sa.Engine) -> None:
    """Run a maintenance pass that rescues every running job whose worker is gone.

    A test that faked a running job, or killed the worker running one, ends with this so
    that its database is at rest (the check after every test): the job goes back to
    ``available``, or is cancelled when its run has ended. The pass leads maintenance (no
    other worker serves the database then) and claims nothing (its one kind is never
    enqueued). The registry's rows go first: a killed worker's row records its own
    ``rescue_after``, by which the leader would judge its jobs; without the row they are
    judged by the pass's 2 ms.
    """
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM cyclone_workers"))
    with cyclone.Worker(
        engine,
        steps=[_NEVER_ENQUEUED],
        rescue_after=timedelta(milliseconds=2),
        heartbeat_interval=timedelta(milliseconds=1),
        sweep=False,
    ) as worker:
        assert worker.drain() == 0


def start_runs(engine: sa.Engine, wf: cyclone.Workflow[Any]) -> None:
    """Start the due runs of ``wf`` (create their steps) without running a step of them.

    A worker serving only a queue no step uses starts runs as it claims, and claims none.
    """
    with cyclone.Worker(engine, workflows=[wf], queues={"~unserved": 64}, sweep=False) as worker:
        assert worker.drain() == 0


def job_rows(engine: sa.Engine, run_id: uuid.UUID) -> dict[str, JobRow]:
    """The jobs of a run, by step name; a run not started yet shows the steps it will create."""
    names = ("kind", "state", "attempt", "errors", "worker_id", "scheduled_at", "output")
    rows = step_columns(engine, run_id, *names)
    return {row[0]: JobRow(*row) for row in rows}


def lease(engine: sa.Engine) -> tuple[str, int] | None:
    """The maintenance leader's lease, ``(holder, term)``, while it has not expired."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(leader.c.holder, leader.c.term).where(
                leader.c.name == LEADERSHIP, leader.c.expires_at > sa.func.now()
            )
        ).one_or_none()
    return None if row is None else (row.holder, row.term)


def wait_for_passes(
    worker: cyclone.Worker, count: int, *, after: float | None = None, timeout: float = 30.0
) -> None:
    """Until ``worker``'s maintenance thread has ended ``count`` passes (taking the lease
    if free, then maintaining if it leads) that began after ``after`` (monotonic; default
    now). A pass is known to have ended when the next one begins."""
    from tests.conftest import wait_until  # conftest imports this module

    since = time.monotonic() if after is None else after
    began: set[float] = set()

    def ended() -> bool:
        candidacy = worker._leader
        passed = None if candidacy is None else candidacy._passed_at
        if passed is not None and passed > since:
            began.add(passed)
        return len(began) > count

    wait_until(ended, timeout, message=f"worker {worker.id} did not end {count} passes")


def spawn_worker(
    mode: str, name: str, arg: str, database_url: str | None = None
) -> subprocess.Popen[str]:
    """Start ``python -m tests.support.worker_proc MODE NAME ARG`` on the test database
    (or on ``database_url``)."""
    env = dict(os.environ)
    if database_url is not None:
        env["CYCLONE_TEST_DATABASE_URL"] = database_url
    assert "CYCLONE_TEST_DATABASE_URL" in env, "the database_url fixture sets it"
    return processes.popen(
        [sys.executable, "-m", "tests.support.worker_proc", mode, name, arg],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def waiting_advisory_locks(engine: sa.Engine, key: int) -> int:
    """How many backends are waiting for the advisory lock ``key`` (a bigint key)."""
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND ((classid::bigint << 32) | objid::bigint) = :key"
            ),
            {"key": key},
        ).scalar_one()
    return int(count)


def stop_all(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Kill the children that are still running (test teardown)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def waiting_on_locks(engine: sa.Engine) -> int:
    """How many backends of this database wait for a lock."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def blocked_by(engine: sa.Engine, holder_pid: int) -> int | None:
    """The pid of a backend waiting on a lock that ``holder_pid`` holds, if any."""
    with engine.connect() as conn:  # a new transaction: pg_stat_activity is re-read
        return conn.execute(
            sa.text(
                "SELECT pid FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND :holder = ANY(pg_blocking_pids(pid))"
            ),
            {"holder": holder_pid},
        ).scalar()
