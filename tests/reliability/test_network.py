"""The network between client and server fails: frozen, cut after a commit, restarted.

A TCP proxy (tests/support/proxy.py) sits between the client's engine and the private
cluster; the workers connect to the cluster directly.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError

import cyclone
from cyclone._store import notify as _notify
from tests.conftest import wait_until
from tests.reliability.conftest import figures
from tests.support.pgcluster import Cluster
from tests.support.proxy import Proxy
from tests.support.workers import Background

TIMEOUT = 3.0
MARGIN = 3.0


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[Proxy]:
    proxy = Proxy("127.0.0.1", cluster.port)
    yield proxy
    proxy.close()


@pytest.fixture
def client(scenario_url: URL, proxy: Proxy) -> Iterator[sa.Engine]:
    """An engine whose connections go through the proxy; statements always carry their text."""
    engine = sa.create_engine(
        scenario_url.set(port=proxy.port), connect_args={"prepare_threshold": None}
    )
    yield engine
    engine.dispose()


@pytest.fixture
def direct(scenario_url: URL) -> Iterator[sa.Engine]:
    engine = sa.create_engine(scenario_url)
    yield engine
    engine.dispose()


def doubling(name: str) -> cyclone.ResultWorkflow[int, int]:
    wf: cyclone.ResultWorkflow[int, int] = cyclone.ResultWorkflow(name, input=int, output=int)

    @wf.result()
    def double(ctx: cyclone.StepContext, n: int) -> int:
        return 2 * n

    return wf


def name() -> str:
    return f"w{uuid.uuid4().hex[:10]}"


def test_waits_on_a_frozen_network_end_by_their_timeout(
    client: sa.Engine, direct: sa.Engine, proxy: Proxy
) -> None:
    wf = doubling(name())
    run = wf.submit(client, 21)
    echo = cyclone.step(name())(lambda ctx, n: n)
    job = echo.enqueue(client, 5)
    assert run.status().state == cyclone.RunState.RUNNING  # the pool holds a live connection

    proxy.freeze()
    calls = {
        "result": lambda: run.result(timeout=TIMEOUT),
        "wait": lambda: run.wait(timeout=TIMEOUT),
        "job_wait": lambda: job.wait(timeout=TIMEOUT),
        "job_result": lambda: job.result(timeout=TIMEOUT),
    }
    elapsed = {}
    for what, call in calls.items():
        started = time.monotonic()
        waiter = Background(call, name=f"frozen-{what}")
        with pytest.raises(TimeoutError):
            waiter.join(TIMEOUT + MARGIN)
        assert waiter.finished_at is not None
        elapsed[what] = round(waiter.finished_at - started, 2)
        assert elapsed[what] < TIMEOUT + MARGIN

    proxy.thaw()
    cyclone.Worker(direct, workflows=[wf], steps=[echo]).drain()
    assert run.result(timeout=30) == 42
    assert job.result(timeout=30) == 5
    figures(
        "frozen_network",
        timeout_s=TIMEOUT,
        **{f"{k}_returned_after_s": v for k, v in elapsed.items()},
    )


def test_the_listener_reconnects_when_its_connection_freezes(
    client: sa.Engine, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A LISTEN connection only reads: without its ping it would wait forever on a frozen
    # network, and waiters would keep trusting that it hears every notification.
    monkeypatch.setattr(_notify, "PING_INTERVAL", 0.5)
    monkeypatch.setattr(_notify, "PING_TIMEOUT", 0.5)
    listener = _notify.listener(client)
    unsubscribe = listener.subscribe(_notify.RUN_FINISHED, lambda payload: None)
    try:
        assert listener.wait_ready(10)
        since = time.monotonic()
        assert listener.listening_since(since)
        proxy.freeze()
        wait_until(lambda: not listener.listening_since(since), timeout=10)
        proxy.thaw()
        wait_until(lambda: listener.wait_ready(0.1), timeout=15)
    finally:
        unsubscribe()
        listener.stop()


def fill_pool(engine: sa.Engine, count: int = 5) -> None:
    """Leave ``count`` idle connections in the pool: after a restart, all of them dead."""
    conns = [engine.connect() for _ in range(count)]
    for conn in conns:
        conn.exec_driver_sql("SELECT 1")
    for conn in conns:
        conn.close()


def test_a_wait_survives_a_server_restart_within_its_timeout(
    direct: sa.Engine, cluster: Cluster
) -> None:
    wf = doubling(name())
    run = wf.submit(direct, 4)
    assert run.status().state == cyclone.RunState.RUNNING
    fill_pool(direct)
    waiter = Background(lambda: run.result(timeout=40), name="restart-waiter")
    cluster.restart("fast")
    assert waiter.alive()
    # The worker has an engine of its own: a Worker started on an engine whose pooled
    # connections are dead raises at start (its schema check), which is not under test.
    worker_engine = sa.create_engine(direct.url, pool_pre_ping=True)
    worker = Background(cyclone.Worker(worker_engine, workflows=[wf]).drain, name="restart-worker")
    assert waiter.join(40) == 8
    worker.join(30)
    worker_engine.dispose()
    # And a handle whose pooled connections all died reads again instead of raising.
    fill_pool(direct)
    cluster.restart("fast")
    assert run.wait(timeout=30).state == cyclone.RunState.COMPLETED
    assert run.result(timeout=30) == 8


@pytest.mark.parametrize(
    ("variant", "marker"),
    [("submit_once_tx", b"COMMIT"), ("submit_once", b"INSERT INTO cyclone_runs")],
)
def test_calling_submit_once_again_after_a_reply_lost_past_the_commit_returns_the_run(
    client: sa.Engine, direct: sa.Engine, proxy: Proxy, variant: str, marker: bytes
) -> None:
    wf = doubling(name())
    key = f"order-{uuid.uuid4()}"
    assert wf.submit(client, 0).status()  # the pool's connection is open and warm

    def first_call() -> None:
        if variant == "submit_once_tx":
            with client.begin() as conn:
                wf.submit_once_tx(conn, key, 7)
        else:
            wf.submit_once(client, key, 7)

    proxy.lose_reply_after(marker)
    with pytest.raises((OperationalError, psycopg.OperationalError)):
        first_call()
    assert proxy.replies_lost == 1

    again, created = wf.submit_once(client, key, 7)
    assert not created
    with direct.connect() as conn:
        ids = (
            conn.execute(
                sa.text("SELECT id FROM cyclone_runs WHERE workflow = :w AND submit_key = :k"),
                {"w": wf.name, "k": key},
            )
            .scalars()
            .all()
        )
    assert ids == [again.id]
    cyclone.Worker(direct, workflows=[wf]).drain()
    assert again.result(timeout=30) == 14
    figures(f"reply_lost_{variant}", replies_lost=proxy.replies_lost, runs_for_key=len(ids))


def cyclones_threads() -> list[str]:
    """The threads alive but the proxy's (two per connection through it)."""
    return [t.name for t in threading.enumerate() if not t.name.startswith(("Thread-", "proxy"))]


def test_waits_that_time_out_on_a_frozen_network_leave_no_thread_behind(
    client: sa.Engine, proxy: Proxy
) -> None:
    wf = doubling(name())
    run = wf.submit(client, 21)
    echo = cyclone.step(name())(lambda ctx, n: n)
    job = echo.enqueue(client, 5)
    with pytest.raises(TimeoutError):  # no worker: the listener is up, a reader is idle
        run.result(timeout=0.3)
    threads = cyclones_threads()

    proxy.freeze()
    calls = [
        lambda: run.result(timeout=0.5),
        lambda: run.wait(timeout=0.5),
        lambda: job.result(timeout=0.5),
        lambda: job.wait(timeout=0.5),
    ]
    for call in calls * 3:
        with pytest.raises(TimeoutError):
            call()
    # Each read left blocked on the frozen network is interrupted: its thread ends.
    wait_until(lambda: len(cyclones_threads()) <= len(threads), timeout=15)
    proxy.thaw()
    assert run.status().state == cyclone.RunState.RUNNING
