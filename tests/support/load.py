"""Load for the reliability suite: submitter threads, supervised worker processes, checks.

:class:`Submitters` submit one key each through ``submit_once`` or ``submit_once_tx``,
rolling some transactions back on purpose. A call that fails on a lost connection
leaves its outcome unknown, so it is called again with the same key (the README's
advice): the key then counts as committed, and ``created`` may be true at most once
per key. :class:`Workers` keeps worker processes running (a dead one is replaced, as a
process manager would) and can ``kill -9`` them. :func:`check_contract` asserts the
contract over the database and returns the figures.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

import cyclone
from cyclone.schema import jobs, runs
from tests.support import processes
from tests.support.reliability_proc import NAME, WORKFLOW, Order, expected_outputs
from tests.support.workers import REPO


def lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection error, after which the README says: call again."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    return isinstance(exc, (OperationalError, InterfaceError, psycopg.OperationalError))


def key_of(n: int) -> str:
    return f"order-{n}"


def n_of(key: str) -> int:
    return int(key.removeprefix("order-"))


class Submitters:
    """``threads`` threads submitting keys ``order-0 .. order-{count-1}``."""

    def __init__(
        self,
        engine: sa.Engine,
        count: int,
        *,
        threads: int = 4,
        rollback_share: float = 0.25,
        pause: float = 0.0,
        seed: int = 0,
        spacing: float = 0.0,
    ) -> None:
        self.engine = engine
        self.pause = pause
        self.spacing = spacing
        rng = random.Random(seed)
        self._todo = [(n, rng.random()) for n in range(count)]
        self._rollback_share = rollback_share
        self._lock = threading.Lock()
        self.committed: set[str] = set()
        self.rolled_back: set[str] = set()
        self.created: Counter[str] = Counter()
        self.handles: dict[str, Any] = {}
        self.calls = 0
        self.connection_errors = 0
        self.failures: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._loop, name=f"submitter-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _next(self) -> tuple[int, float] | None:
        with self._lock:
            return self._todo.pop() if self._todo else None

    def _loop(self) -> None:
        try:
            while (item := self._next()) is not None:
                n, draw = item
                if draw < self._rollback_share:
                    self._rolled_back(n)
                else:
                    self._committed(n, in_transaction=draw < (1 + self._rollback_share) / 2)
                if self.spacing:
                    time.sleep(self.spacing)  # the load's shape: spaced submits
        except BaseException as exc:
            self.failures.append(exc)

    def _count(self, calls: int = 1, errors: int = 0) -> None:
        with self._lock:
            self.calls += calls
            self.connection_errors += errors

    def _rolled_back(self, n: int) -> None:
        key = key_of(n)
        try:
            with self.engine.connect() as conn:
                conn.begin()
                WORKFLOW.submit_once_tx(conn, key, Order(n=n, pause=self.pause))
                conn.rollback()
            self._count()
        except (DBAPIError, psycopg.OperationalError) as exc:
            if not lost_connection(exc):
                raise
            self._count(errors=1)
        with self._lock:
            self.rolled_back.add(key)

    def _committed(self, n: int, *, in_transaction: bool) -> None:
        key = key_of(n)
        order = Order(n=n, pause=self.pause)
        deadline = time.monotonic() + 90
        while True:
            try:
                if in_transaction:
                    with self.engine.begin() as conn:
                        run, created = WORKFLOW.submit_once_tx(conn, key, order)
                else:
                    run, created = WORKFLOW.submit_once(self.engine, key, order)
            except (DBAPIError, psycopg.OperationalError) as exc:
                if not lost_connection(exc) or time.monotonic() > deadline:
                    raise
                self._count(errors=1)
                time.sleep(0.05)  # a pause before retrying a lost connection
                continue
            self._count()
            with self._lock:
                self.committed.add(key)
                self.created[key] += created
                self.handles[key] = run
            return

    def join(self, timeout: float = 120) -> None:
        for thread in self._threads:
            thread.join(timeout)
            assert not thread.is_alive(), f"{thread.name} still submitting after {timeout} s"
        if self.failures:
            raise self.failures[0]

    @property
    def done(self) -> bool:
        return not any(thread.is_alive() for thread in self._threads)


class Waiters:
    """Threads calling ``result()`` on runs just submitted, while the faults happen.

    Their engine has no ``pool_pre_ping``: after a restart its pooled connections are
    dead, and the waits must read again on new ones.

    A wait must come back with the run's result: neither a lost connection nor a
    restart may surface as an error while the timeout has time left.
    """

    def __init__(
        self,
        submitters: Submitters,
        engine: sa.Engine,
        *,
        threads: int = 2,
        timeout: float = 90,
    ) -> None:
        self._submitters = submitters
        self._engine = engine
        self._timeout = timeout
        self._lock = threading.Lock()
        self._taken: set[str] = set()
        self.results_read = 0
        self.failures: list[BaseException] = []
        self._threads = [
            threading.Thread(target=self._loop, name=f"waiter-{i}", daemon=True)
            for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _next(self) -> tuple[str, Any] | None:
        while True:
            with self._submitters._lock:
                fresh = [k for k in self._submitters.handles if k not in self._taken]
                if fresh:
                    key = fresh[-1]
                    self._taken.add(key)
                    return key, self._submitters.handles[key]
            if self._submitters.done:
                return None
            time.sleep(0.01)  # a poll for a submitted run to wait on

    def _loop(self) -> None:
        try:
            while (item := self._next()) is not None:
                key, submitted = item
                run = cyclone.ResultRun(self._engine, submitted.id, NAME, key, output_type=int)
                assert run.result(timeout=self._timeout) == expected_outputs(n_of(key))["join"]
                with self._lock:
                    self.results_read += 1
        except BaseException as exc:
            self.failures.append(exc)

    def join(self, timeout: float = 120) -> int:
        for thread in self._threads:
            thread.join(timeout)
            assert not thread.is_alive(), f"{thread.name} still waiting after {timeout} s"
        if self.failures:
            raise self.failures[0]
        return self.results_read


class Workers:
    """``count`` worker processes on ``url``, each replaced when it dies."""

    def __init__(self, url: URL, count: int) -> None:
        self.url = url
        self.logs = Path(tempfile.mkdtemp(prefix="cyclone-workers-"))
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.killed = 0
        self.died = 0
        for _ in range(count):
            self.procs.append(self._spawn())

    def _spawn(self) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env["CYCLONE_RELIABILITY_DSN"] = self.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        self.started += 1
        with (self.logs / f"worker-{self.started}.log").open("wb") as log:
            return processes.popen(
                [
                    sys.executable,
                    "-m",
                    "tests.support.reliability_proc",
                    self.url.render_as_string(hide_password=False),
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def supervise(self) -> None:
        """Replace every worker that has exited."""
        for i, proc in enumerate(self.procs):
            if proc.poll() is not None:
                self.died += 1
                self.procs[i] = self._spawn()

    def kill_busy(self, engine: sa.Engine, rng: random.Random, timeout: float = 10) -> bool:
        """``kill -9`` a worker that has just started a step, at a random point after."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.supervise()
            live = {proc.pid: i for i, proc in enumerate(self.procs) if proc.poll() is None}
            with engine.connect() as conn:
                busy = [
                    pid
                    for (pid,) in conn.execute(
                        sa.text(
                            "SELECT DISTINCT pid FROM executions "
                            "WHERE at > clock_timestamp() - interval '150 ms'"
                        )
                    )
                    if pid in live
                ]
            if busy:
                time.sleep(rng.uniform(0, 0.15))  # the fault: a kill at a random point of the step
                i = live[rng.choice(busy)]
                self.procs[i].send_signal(signal.SIGKILL)
                self.procs[i].wait(10)
                self.killed += 1
                self.procs[i] = self._spawn()
                return True
            time.sleep(0.02)  # a poll for a busy worker
        return False

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def remove_logs(self) -> None:
        """Delete the workers' logs (kept when a scenario fails, for its message)."""
        shutil.rmtree(self.logs, ignore_errors=True)

    def tail(self) -> str:
        """The end of each worker's log, for a failure message."""
        parts = []
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text(errors="replace").strip()
            if text:
                parts.append(f"--- {path.name}\n{text[-1500:]}")
        return "\n".join(parts)


def deadlocks(engine: sa.Engine) -> int:
    """PostgreSQL's count of deadlocks detected in this database."""
    with engine.connect() as conn:
        value = conn.execute(
            sa.text("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
        ).scalar_one()
    return int(value)


def unfinished(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        count = conn.execute(
            sa.select(sa.func.count()).where(runs.c.workflow == NAME, runs.c.state != "completed")
        ).scalar_one()
    return int(count)


def stuck(engine: sa.Engine) -> str:
    """The unfinished runs of the workflow with their steps, for a failure message."""
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                runs.c.id,
                runs.c.state,
                runs.c.start_at,
                runs.c.steps_remaining,
                sa.select(
                    sa.func.string_agg(
                        jobs.c.kind
                        + sa.literal(":")
                        + jobs.c.state
                        + sa.literal("@")
                        + sa.func.coalesce(jobs.c.worker_id, sa.literal("-")),
                        sa.literal(" "),
                    )
                )
                .where(jobs.c.run_id == runs.c.id)
                .scalar_subquery(),
            )
            .where(runs.c.workflow == NAME, runs.c.state != "completed")
            .limit(10)
        ).all()
    return "\n".join(" ".join(str(v) for v in row) for row in rows)


def wait_for_runs(engine: sa.Engine, workers: Workers | None, timeout: float = 90) -> None:
    """Wait until every run of the workflow has completed, keeping the workers alive."""
    deadline = time.monotonic() + timeout
    while True:
        if workers is not None:
            workers.supervise()
        try:
            if unfinished(engine) == 0:
                return
        except (DBAPIError, psycopg.OperationalError) as exc:
            if not lost_connection(exc):
                raise
        if time.monotonic() > deadline:
            tail = workers.tail() if workers is not None else ""
            raise AssertionError(
                f"runs still unfinished after {timeout} s\n{stuck(engine)}\n{tail}"
            )
        time.sleep(0.1)  # a poll of the runs left


def check_contract(engine: sa.Engine, submitters: Submitters) -> dict[str, Any]:
    """Assert one run per committed key, none for a rolled-back one, every output right.

    Returns the figures: submit calls, runs checked, step executions, re-executions.
    """
    committed, rolled_back = submitters.committed, submitters.rolled_back - submitters.committed
    assert all(count <= 1 for count in submitters.created.values()), "a key created twice"
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(runs.c.id, runs.c.submit_key, runs.c.state).where(runs.c.workflow == NAME)
        ).all()
        keys = [row.submit_key for row in rows]
        assert len(keys) == len(set(keys)), "two runs for one key"
        assert set(keys) - committed <= set(), (
            f"runs for keys never committed: {sorted(set(keys) - committed)[:5]}"
        )
        assert committed - set(keys) == set(), f"lost runs: {sorted(committed - set(keys))[:5]}"
        assert not (set(keys) & rolled_back), "a run for a rolled-back key"
        assert all(row.state == "completed" for row in rows)
        key_by_run = {row.id: row.submit_key for row in rows}
        outputs: dict[Any, dict[str, Any]] = {}
        for run_id, kind, state, output in conn.execute(
            sa.select(jobs.c.run_id, jobs.c.kind, jobs.c.state, jobs.c.output).where(
                jobs.c.workflow == NAME
            )
        ):
            assert state == "completed"
            assert kind not in outputs.setdefault(run_id, {}), "a step recorded twice"
            outputs[run_id][kind] = output
        for run_id, key in key_by_run.items():
            assert outputs.get(run_id) == expected_outputs(n_of(key)), f"outputs of {key}"
        executions = Counter(
            (row[0], row[1]) for row in conn.execute(sa.text("SELECT run_id, step FROM executions"))
        )
    for run_id in key_by_run:
        for step in expected_outputs(0):
            assert executions[(run_id, step)] >= 1, f"{step} of {run_id} completed, never ran"
    total = sum(executions[(r, s)] for r in key_by_run for s in expected_outputs(0))
    return {
        "submit_calls": submitters.calls,
        "connection_errors_on_submit": submitters.connection_errors,
        "keys_committed": len(committed),
        "keys_rolled_back": len(rolled_back),
        "runs_checked": len(key_by_run),
        "step_executions": total,
        "re_executions": total - 4 * len(key_by_run),
    }


def check_results(engine: sa.Engine, submitters: Submitters, timeout: float = 30) -> int:
    """Submit every committed key again: the same run, not created, with the right result."""
    for key in sorted(submitters.committed):
        run, created = WORKFLOW.submit_once(engine, key, Order(n=n_of(key), pause=submitters.pause))
        assert not created
        assert run.result(timeout=timeout) == expected_outputs(n_of(key))["join"]
    return len(submitters.committed)
