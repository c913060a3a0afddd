"""A maintenance leader that freezes (SIGSTOP, a frozen network) is replaced; its term is over.

The leader holds a lease renewed every pass for ``rescue_after``; once it stops renewing,
another worker takes the next term within ``rescue_after`` plus one interval and rescues
the frozen worker's jobs. A worker process frozen with SIGSTOP (its sessions stay open:
the kernel still answers TCP) and a worker whose network freezes (tests/support/proxy.py)
once held maintenance forever under a session advisory lock.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL

import cyclone
from cyclone._leader import LEADER_INTERVAL
from tests.conftest import wait_until
from tests.support import invariants
from tests.support.pgcluster import Cluster
from tests.support.proxy import Proxy
from tests.support.worker_proc import LEAD_RESCUE_AFTER, Item, crashy
from tests.support.workers import Background, job_rows, lease, spawn_worker

pytestmark = pytest.mark.processes

INTERVAL = min(LEADER_INTERVAL, LEAD_RESCUE_AFTER.total_seconds() / 3)
MARGIN = 3.0
"""Seconds allowed beyond ``rescue_after`` plus one interval: the test's own polling and a
busy machine's scheduling."""


@pytest.fixture
def engine(scenario_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(scenario_url)
    yield engine
    engine.dispose()


class Lines:
    """The lines a child writes on stderr, read by a thread as they come."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stderr is not None
        self._stream = proc.stderr
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self.lines.append(line)

    def having(self, *parts: str) -> list[str]:
        return [line for line in self.lines if all(part in line for part in parts)]


def backends(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        count = conn.execute(
            sa.text(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    return int(count)


def holder_pid(engine: sa.Engine) -> int | None:
    """The process id in the worker id holding the lease (``host:pid:random``)."""
    held = lease(engine)
    return None if held is None else int(held[0].split(":")[1])


def test_a_leader_frozen_by_sigstop_is_replaced_and_its_stale_term_acts_on_nothing(
    engine: sa.Engine, scenario_url: URL, tmp_path: Path
) -> None:
    name = "frozen_leader"
    flag = tmp_path / "flag"
    wf = crashy(name, flag)
    url = scenario_url.render_as_string(hide_password=False)
    procs: list[subprocess.Popen[str]] = []
    try:
        first = spawn_worker("lead", name, str(flag), database_url=url)
        procs.append(first)
        first_log = Lines(first)
        wait_until(lambda: holder_pid(engine) == first.pid, timeout=30)
        first_id, term = lease(engine) or ("", 0)
        run = wf.submit(engine, Item(n=7))
        wait_until(flag.exists, timeout=30)  # the leader runs the step, which blocks
        alone = backends(engine)
        second = spawn_worker("lead", name, str(flag), database_url=url)
        procs.append(second)
        wait_until(lambda: backends(engine) >= alone + 3, timeout=30)  # held, heartbeat, leader

        os.kill(first.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        wait_until(lambda: holder_pid(engine) == second.pid, timeout=30)
        took = time.monotonic() - frozen_at
        second_id, second_term = lease(engine) or ("", 0)
        assert second_term == term + 1
        assert took < LEAD_RESCUE_AFTER.total_seconds() + INTERVAL + MARGIN
        # The new leader rescued the frozen worker's job, and the job ran again on it.
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
        row = job_rows(engine, run.id)["stuck"]
        assert (row.state, row.output) == ("completed", 7)
        assert [e["type"] for e in row.errors] == ["WorkerLost"]

        os.kill(first.pid, signal.SIGCONT)
        # Awake, the old leader's term is refused before it acts, and said so.
        wait_until(lambda: first_log.having("maintenance refused", f"term {term} is over"))
        assert lease(engine) == (second_id, term + 1)
        # It leads again only through a new term: once the second worker gives it up.
        second.send_signal(signal.SIGTERM)
        second.communicate(timeout=30)
        wait_until(lambda: lease(engine) == (first_id, term + 2), timeout=30)
        # The worker logs its new term after the transaction that took it has committed.
        wait_until(lambda: first_log.having("leads maintenance", f"as term {term + 2}"))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.communicate(timeout=30)
    invariants.check(engine)


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[Proxy]:
    proxy = Proxy("127.0.0.1", cluster.port)
    yield proxy
    proxy.close()


def test_a_leader_whose_network_freezes_is_replaced_by_a_worker_that_reruns_its_job(
    engine: sa.Engine, scenario_url: URL, proxy: Proxy
) -> None:
    wf: cyclone.Workflow[int] = cyclone.Workflow("cut_off_leader", input=int)
    executions: list[str] = []
    released = threading.Event()

    @wf.step(max_attempts=1)
    def step(ctx: cyclone.StepContext, n: int) -> int:
        executions.append(threading.current_thread().name)
        if len(executions) == 1:
            assert released.wait(60)  # the cut-off worker's execution, until the end
        return n

    options: dict[str, Any] = {
        "workflows": [wf],
        "heartbeat_interval": timedelta(milliseconds=200),
        "rescue_after": LEAD_RESCUE_AFTER,
        "poll_interval": 0.05,
        "sweep": False,
    }
    cut_off = sa.create_engine(scenario_url.set(port=proxy.port))
    first = cyclone.Worker(cut_off, **options)
    second = cyclone.Worker(engine, **options)
    serving: list[Background] = []
    try:
        serving.append(Background(first.run, name="cut-off-worker"))
        wait_until(lambda: (lease(engine) or ("",))[0] == first.id, timeout=30)
        term = (lease(engine) or ("", 0))[1]
        run = wf.submit(engine, 5)
        wait_until(lambda: executions, timeout=30)
        serving.append(Background(second.run, name="direct-worker"))
        wait_until(lambda: second._leader is not None and second._leader._passed_at is not None)

        proxy.freeze()
        frozen_at = time.monotonic()
        wait_until(lambda: lease(engine) == (second.id, term + 1), timeout=30)
        assert time.monotonic() - frozen_at < LEAD_RESCUE_AFTER.total_seconds() + INTERVAL + MARGIN
        assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
        assert len(executions) == 2
        assert [e["type"] for e in job_rows(engine, run.id)["step"].errors] == ["WorkerLost"]
    finally:
        proxy.thaw()
        released.set()
        for worker in (first, second):
            worker.stop()
        for background in serving:
            background.join(60)
        cut_off.dispose()
    invariants.check(engine)
