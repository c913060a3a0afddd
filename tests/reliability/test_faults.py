"""Faults under load on a private cluster: the submit-once contract holds through each.

Every scenario submits keys from several threads (a share of them in transactions
rolled back on purpose) while worker processes run the diamond workflow of
tests/support/reliability_proc.py, injects its fault, then asserts: exactly one run per
committed key, none for a rolled-back key, no run lost, every run completed with every
step's output recorded once and right, every step executed at least once.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

from tests.conftest import wait_until
from tests.reliability.conftest import figures
from tests.support.load import (
    Submitters,
    Waiters,
    Workers,
    check_contract,
    check_results,
    deadlocks,
    lost_connection,
    wait_for_runs,
)
from tests.support.pgcluster import Cluster

pytestmark = pytest.mark.processes


@pytest.fixture
def engine(scenario_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(scenario_url, pool_size=8, max_overflow=8, pool_pre_ping=True)
    yield engine
    engine.dispose()


@pytest.fixture
def waiting(scenario_url: URL) -> Iterator[sa.Engine]:
    """The waiters' engine: no pre-ping, so a restart leaves its pooled connections dead."""
    engine = sa.create_engine(scenario_url, pool_size=8, max_overflow=8)
    yield engine
    engine.dispose()


def fill_pool(engine: sa.Engine, count: int = 8) -> None:
    """Leave ``count`` idle connections in the pool, as a busy application would."""
    conns = []
    while len(conns) < count:
        conn = engine.connect()
        try:
            conn.exec_driver_sql("SELECT 1")  # a dead one (an earlier fault) is replaced
        except sa.exc.DBAPIError:
            conn.close()
            continue
        conns.append(conn)
    for conn in conns:
        conn.close()


def run_scenario(
    name: str,
    engine: sa.Engine,
    waiting: sa.Engine,
    url: URL,
    *,
    keys: int,
    workers: int,
    pause: float,
    fault: Callable[[Submitters, Workers], dict[str, int]],
    spacing: float = 0.0,
) -> None:
    """Load, the ``fault`` (returning its own figures) meanwhile, then the checks."""
    before = deadlocks(engine)
    pool = Workers(url, workers)
    try:
        submitters = Submitters(
            engine, keys, pause=pause, seed=zlib.crc32(name.encode()), spacing=spacing
        )
        waiters = Waiters(submitters, waiting)
        injected = fault(submitters, pool)
        submitters.join()
        wait_for_runs(engine, pool)
        waited = waiters.join()
        figures_ = check_contract(engine, submitters)
        figures_["results_awaited_during_faults"] = waited
        figures_["results_read"] = check_results(engine, submitters)
    finally:
        pool.stop()
    pool.remove_logs()
    # An immediate stop resets the statistics: count the deadlocks before it, then after.
    reset_at = injected.pop("deadlocks_before_reset", None)
    seen = deadlocks(engine) - before if reset_at is None else reset_at - before + deadlocks(engine)
    figures(
        name,
        **figures_,
        **injected,
        worker_processes_started=pool.started,
        worker_deaths_replaced=pool.died,
        deadlocks=seen,
    )


def no_fault(submitters: Submitters, workers: Workers) -> dict[str, int]:
    while not submitters.done:
        workers.supervise()
        time.sleep(0.1)  # a poll: keep the workers alive until the submitters are done
    return {}


def executions(engine: sa.Engine) -> int | None:
    """How many step executions the workers have noted (None while the server is away)."""
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM executions")).scalar_one())
    except sa.exc.DBAPIError as exc:
        if not lost_connection(exc):
            raise
        return None


def mid_load(engine: sa.Engine, submitters: Submitters, steps: int = 40) -> None:
    """Wait until the workers have executed ``steps`` more steps (or the load is over), so
    that the fault that follows hits a load in progress."""
    first: list[int] = []

    def progressed() -> bool:
        now = executions(engine)
        if now is None:
            return False
        first[:] = first or [now]
        return now >= first[0] + steps or submitters.done

    wait_until(progressed, timeout=60)


def test_load_with_rolled_back_transactions_makes_one_run_per_committed_key(
    engine: sa.Engine, waiting: sa.Engine, scenario_url: URL
) -> None:
    run_scenario(
        "load_with_rollbacks",
        engine,
        waiting,
        scenario_url,
        keys=400,
        workers=2,
        pause=0.0,
        fault=no_fault,
    )


def test_kill_9_of_workers_at_random_points_loses_no_run(
    engine: sa.Engine, waiting: sa.Engine, scenario_url: URL
) -> None:
    rng = random.Random(9)

    def kill_workers(submitters: Submitters, workers: Workers) -> dict[str, int]:
        for _ in range(10):
            workers.kill_busy(engine, rng)
        return {"crashes_injected": workers.killed}

    run_scenario(
        "kill_9_workers",
        engine,
        waiting,
        scenario_url,
        keys=150,
        workers=3,
        pause=0.05,
        fault=kill_workers,
        spacing=0.02,
    )


def terminate_backends(engine: sa.Engine) -> int:
    """``pg_terminate_backend`` every other client backend of the cluster; how many."""
    with engine.connect() as conn:
        killed = conn.execute(
            sa.text(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            )
        ).scalar_one()
    return int(killed)


def test_every_backend_terminated_mid_load_loses_no_run(
    engine: sa.Engine, waiting: sa.Engine, scenario_url: URL
) -> None:
    def terminate(submitters: Submitters, workers: Workers) -> dict[str, int]:
        terminated = 0
        for _ in range(3):
            mid_load(engine, submitters)
            fill_pool(waiting)
            terminated += terminate_backends(engine)
        return {"terminations": 3, "backends_terminated": terminated}

    run_scenario(
        "backends_terminated",
        engine,
        waiting,
        scenario_url,
        keys=300,
        workers=2,
        pause=0.01,
        fault=terminate,
        spacing=0.005,
    )


def test_a_fast_restart_mid_load_loses_no_run(
    engine: sa.Engine, waiting: sa.Engine, scenario_url: URL, cluster: Cluster
) -> None:
    def restart(submitters: Submitters, workers: Workers) -> dict[str, int]:
        for _ in range(2):
            mid_load(engine, submitters)
            fill_pool(waiting)
            cluster.restart("fast")
        return {"restarts_survived": 2}

    run_scenario(
        "fast_restart",
        engine,
        waiting,
        scenario_url,
        keys=300,
        workers=2,
        pause=0.01,
        fault=restart,
        spacing=0.005,
    )


def test_an_immediate_stop_and_start_mid_load_loses_no_run(
    engine: sa.Engine, waiting: sa.Engine, scenario_url: URL, cluster: Cluster
) -> None:
    def crash(submitters: Submitters, workers: Workers) -> dict[str, int]:
        mid_load(engine, submitters)
        before = deadlocks(engine)
        fill_pool(waiting)
        cluster.stop("immediate")
        time.sleep(0.5)  # the outage itself: the clients meet a server that is away
        cluster.start()
        return {"restarts_survived": 1, "deadlocks_before_reset": before}

    run_scenario(
        "immediate_stop_start",
        engine,
        waiting,
        scenario_url,
        keys=300,
        workers=2,
        pause=0.01,
        fault=crash,
        spacing=0.005,
    )
