"""How a submit wakes the workers: its own NOTIFY when it comes alone, else the Ringer's.

PostgreSQL lets one notifying commit through at a time, so submits that come together
commit without NOTIFY and the engine's Ringer sends one NOTIFY after their commits.
Every run still wakes an idle worker at once; these workers poll far less often than
the tests last, so only a NOTIFY can wake them.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

import cyclone
from cyclone import _notify
from tests.conftest import wait_until
from tests.support.counting import Recorder
from tests.support.factories import workflow
from tests.support.workers import REPO, Background


class Sent(Recorder):
    """Every statement, with the thread that sent it."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def record(self, thread: str, statement: str) -> None:
        with self.lock:
            self.statements.append((thread, statement))

    def of(self, thread: str) -> list[str]:
        with self.lock:
            return [s for t, s in self.statements if t == thread]

    def rings(self) -> list[str]:
        """The threads that sent a NOTIFY of their own (not with a write)."""
        with self.lock:
            return [t for t, s in self.statements if s.lstrip().startswith("SELECT pg_notify")]


@pytest.fixture
def idle_worker(engine: sa.Engine, name: str) -> Iterator[cyclone.Worker]:
    """A worker of ``workflow(name)`` that polls every two minutes, already sleeping."""
    worker = cyclone.Worker(engine, workflows=[workflow(name)], poll_interval=120, sweep=False)
    running = Background(worker.run)
    try:
        wait_until(lambda: worker._held is not None and worker._held.fileno() is not None)
        time.sleep(0.2)  # past its first claim: asleep
        yield worker
    finally:
        worker.stop()
        running.join(10)


def test_a_submit_that_comes_alone_rings_in_its_own_statement(engine: sa.Engine, name: str) -> None:
    wf = workflow(name)
    wf.submit_once(engine, "warm", 1)  # the engine's first connection has its own statements
    time.sleep(0.2)
    with Sent() as sent:
        wf.submit_once(engine, "k", 1)
        time.sleep(0.2)
    (submitted,) = sent.of(threading.current_thread().name)
    assert "pg_notify" in submitted
    assert sent.rings() == []


def test_a_submit_while_another_is_in_flight_commits_without_notify_and_still_wakes_a_worker(
    engine: sa.Engine, name: str, idle_worker: cyclone.Worker
) -> None:
    wf = workflow(name)
    ringer = _notify.ringer(engine)
    assert ringer.begin()  # another submit of this process, in flight
    try:
        with Sent() as sent:
            run, created = wf.submit_once(engine, "k", 1)
            assert created
            assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
        submitted, *_reads = sent.of(threading.current_thread().name)
        assert "INSERT INTO cyclone_runs" in submitted
        assert "pg_notify" not in submitted
        # The one NOTIFY came from the Ringer's thread, after the submit's commit.
        assert sent.rings() == ["cyclone-ringer"]
    finally:
        ringer.end(False)


def test_submits_in_quick_succession_share_their_notifies_and_every_run_starts(
    engine: sa.Engine, name: str, idle_worker: cyclone.Worker
) -> None:
    wf = workflow(name)
    per_thread, threads = 25, 8

    def submit_many(t: int) -> None:
        for i in range(per_thread):
            wf.submit_once(engine, f"k{t}-{i}", i)

    with Sent() as sent:
        submitters = [threading.Thread(target=submit_many, args=(t,)) for t in range(threads)]
        for thread in submitters:
            thread.start()
        for thread in submitters:
            thread.join(60)
        runs = [wf.get_run(engine, f"k{t}-{i}") for t in range(threads) for i in range(per_thread)]
        for run in runs:
            assert run is not None
            assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    inserts = [s for _, s in sent.statements if "INSERT INTO cyclone_runs" in s]
    assert len(inserts) == per_thread * threads
    rang_alone = [s for s in inserts if "pg_notify" in s]
    assert 1 <= len(rang_alone) + len(sent.rings()) < len(inserts) // 2


def test_a_process_that_exits_right_after_a_quiet_submit_rings_on_its_way_out(
    engine: sa.Engine, name: str, idle_worker: cyclone.Worker
) -> None:
    script = f"""
import os
import sqlalchemy as sa
from cyclone import _notify
from tests.support.factories import workflow

_notify.Ringer._loop = lambda self: None  # as if the process ended before its thread rang
engine = sa.create_engine(os.environ["CYCLONE_TEST_DATABASE_URL"])
_notify.ringer(engine).begin()
workflow({name!r}).submit_once(engine, "k", 1)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    run = workflow(name).get_run(engine, "k")
    assert run is not None
    assert run.wait(timeout=10).state == cyclone.RunState.COMPLETED
