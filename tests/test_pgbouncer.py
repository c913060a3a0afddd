"""cyclone behind PgBouncer in transaction pooling mode: submit, ``_tx`` calls, handles, workers.

Each test starts from an engine on a PgBouncer the module starts itself (Debian's
``pgbouncer``, pool_mode = transaction, 1.18: no prepared-statement support), with
``prepare_threshold=None`` as docs/deployment.md says, and a small server pool so that
consecutive statements of one client land on different server connections.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import msgspec
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session

import cyclone
from cyclone._store.leadership import LEADERSHIP
from cyclone.schema import leader
from tests.conftest import wait_until
from tests.support import docs
from tests.support import pgbouncer as pgb
from tests.support.workers import Background, IdleWatch


class Cart(msgspec.Struct):
    items: list[int]


class Quote(msgspec.Struct):
    total: int
    count: int


def pricing(name: str) -> cyclone.ResultWorkflow[Cart, Quote]:
    wf: cyclone.ResultWorkflow[Cart, Quote] = cyclone.ResultWorkflow(name, input=Cart, output=Quote)

    @wf.step()
    def subtotal(ctx: cyclone.StepContext, cart: Cart) -> int:
        return sum(cart.items)

    @wf.result(after=[subtotal])
    def quote(ctx: cyclone.StepContext, cart: Cart) -> Quote:
        return Quote(total=ctx.output(subtotal), count=len(cart.items))

    return wf


@pytest.fixture(scope="module")
def bouncer(database_url: URL) -> Iterator[pgb.PgBouncer]:
    bouncer = pgb.PgBouncer(database_url, pool_size=3)
    bouncer.start()
    yield bouncer
    bouncer.stop()


@pytest.fixture
def bounced(bouncer: pgb.PgBouncer, database_url: URL) -> Iterator[sa.Engine]:
    """An engine through PgBouncer, its session connections configured per test."""
    engine = pgb.engine(bouncer.url_for(database_url), pool_size=10)
    yield engine
    cyclone.close(engine)
    engine.dispose()


def lease_row(engine: sa.Engine) -> tuple[str, int, bool] | None:
    """The maintenance lease: its holder, its term, and whether it is still in force."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(leader.c.holder, leader.c.term, leader.c.expires_at > sa.func.now()).where(
                leader.c.name == LEADERSHIP
            )
        ).one_or_none()
    return None if row is None else (row[0], row[1], row[2])


def server_backends(engine: sa.Engine, database: str | None) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :db"),
                {"db": database},
            ).scalar_one()
        )


def test_the_engine_really_goes_through_a_transaction_pooling_pgbouncer(
    bounced: sa.Engine, engine: sa.Engine
) -> None:
    # Two consecutive transactions of one client connection reach different server
    # backends when another client holds the first one: that is transaction pooling.
    with bounced.connect() as first, bounced.connect() as other:
        a = first.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        first.commit()
        held = other.begin()
        b = other.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        c = first.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        held.rollback()
        first.commit()
    assert b == a
    assert c != a


def test_submit_once_through_pgbouncer_gives_one_run_per_key_past_the_prepare_threshold(
    bounced: sa.Engine, name: str
) -> None:
    wf = pricing(name)
    keys = [f"k{i}" for i in range(8)]
    seen: dict[str, set[uuid.UUID]] = {key: set() for key in keys}
    lock = threading.Lock()

    def submitter() -> None:
        for _ in range(4):
            for key in keys:
                run, _ = wf.submit_once(bounced, key, Cart(items=[1]))
                with lock:
                    seen[key].add(run.id)

    threads = [Background(submitter, name=f"submitter-{i}") for i in range(4)]
    for thread in threads:
        thread.join(30)
    plain = [wf.submit(bounced, Cart(items=[i])) for i in range(12)]
    assert all(len(ids) == 1 for ids in seen.values())
    assert len({run.id for run in plain}) == 12
    listed = cyclone.Client(bounced).list_runs(workflow=name, limit=100)
    assert len(listed) == 8 + 12


def test_submit_once_tx_on_a_connection_commits_and_rolls_back_with_it(
    bounced: sa.Engine, name: str
) -> None:
    wf = pricing(name)
    with bounced.connect() as conn:
        with conn.begin() as tx:
            kept, created = wf.submit_once_tx(conn, "kept", Cart(items=[1]))
            conn.execute(sa.text("SELECT 1"))
        with conn.begin() as tx:
            wf.submit_once_tx(conn, "dropped", Cart(items=[2]))
            tx.rollback()
    assert created
    keys = [status.key for status in cyclone.Client(bounced).list_runs(workflow=name)]
    assert keys == ["kept"]
    assert kept.status().key == "kept"


def test_submit_once_tx_in_an_orm_session_commits_with_it(bounced: sa.Engine, name: str) -> None:
    wf = pricing(name)
    with Session(bounced) as session:
        first, created = wf.submit_once_tx(session, "s", Cart(items=[3]))
        again, created_again = wf.submit_once_tx(session, "s", Cart(items=[3]))
        session.commit()
    assert (again, created, created_again) == (first, True, False)
    assert [status.id for status in cyclone.Client(bounced).list_runs(workflow=name)] == [first.id]


def test_without_a_direct_url_handles_and_a_worker_poll_through_pgbouncer(
    bounced: sa.Engine, engine: sa.Engine, name: str, database_url: URL
) -> None:
    cyclone.configure(bounced, listen_url=None)
    wf = pricing(name)
    runs = [wf.submit_once(bounced, f"r{i}", Cart(items=[i, 1]))[0] for i in range(40)]
    assert runs[0].status().state == cyclone.RunState.RUNNING
    before = server_backends(engine, database_url.database)
    workers = [cyclone.Worker(bounced, workflows=[wf], concurrency=4) for _ in range(2)]
    drains = [Background(worker.drain) for worker in workers]
    assert sum(drain.join(60) for drain in drains) == 80
    assert runs[5].wait(timeout=30).state == cyclone.RunState.COMPLETED
    assert [run.result(timeout=30) for run in runs] == [
        Quote(total=i + 1, count=2) for i in range(40)
    ]
    # The worker's held and heartbeat connections, and the waits, ran through the bouncer's
    # pool of 3 server connections: no connection of cyclone's went to the server directly.
    assert server_backends(engine, database_url.database) <= before + 3
    # One of them took the maintenance lease through the bouncer, and gave it up at the end.
    row = lease_row(engine)
    assert row is not None
    assert row[0] in {worker.id for worker in workers}
    assert row[2] is False


def test_with_a_direct_url_an_idle_worker_and_a_waiter_are_woken_by_notify(
    bounced: sa.Engine, name: str, database_url: URL
) -> None:
    # A poll interval of an hour: only a NOTIFY, received on the direct connection, makes
    # the idle worker claim the run submitted through PgBouncer.
    cyclone.configure(bounced, listen_url=database_url)
    wf = pricing(name)
    warm, _ = wf.submit_once(bounced, "warm", Cart(items=[1]))
    worker = cyclone.Worker(
        bounced,
        workflows=[wf],
        poll_interval=3600,
        heartbeat_interval=timedelta(seconds=30),
        sweep=False,
    )
    idle = IdleWatch(worker)
    serving = Background(worker.run, name=f"worker-{name}")
    try:
        assert warm.result(timeout=30) == Quote(total=1, count=1)
        wait_until(lambda: idle.waiting)  # the worker went idle after its last claim
        started = time.monotonic()
        run, _ = wf.submit_once(bounced, "woken", Cart(items=[20, 22]))
        assert run.result(timeout=30) == Quote(total=42, count=2)
        assert time.monotonic() - started < 5.0
    finally:
        worker.stop()
    serving.join(30)


def test_without_a_direct_url_a_worker_keeps_the_maintenance_lease_through_pgbouncer(
    bounced: sa.Engine, name: str
) -> None:
    # The lease needs no session: the leader renews it, term after term unchanged, in
    # transactions that land on whichever server connection the bouncer gives.
    cyclone.configure(bounced, listen_url=None)
    wf = pricing(name)
    worker = cyclone.Worker(
        bounced,
        workflows=[wf],
        heartbeat_interval=timedelta(seconds=1),
        rescue_after=timedelta(seconds=3),
        sweep=False,
    )
    serving = Background(worker.run, name=f"worker-{name}")
    try:
        term, renewed = wait_until(lambda: held_by(bounced, worker.id), timeout=30)
        # Renewed past its first TTL: the same worker still leads, under the same term.
        wait_until(
            lambda: (
                (held_by(bounced, worker.id) or (0, renewed))[1] > renewed + timedelta(seconds=3)
            ),
            timeout=30,
        )
        assert held_by(bounced, worker.id)[0] == term  # type: ignore[index]
    finally:
        worker.stop()
    serving.join(30)


def held_by(engine: sa.Engine, worker_id: str) -> tuple[int, Any] | None:
    """The term and expiry of the maintenance lease, if in force and held by ``worker_id``."""
    with engine.connect() as conn:
        row = conn.execute(
            sa.select(leader.c.term, leader.c.expires_at).where(
                leader.c.name == LEADERSHIP,
                leader.c.holder == worker_id,
                leader.c.expires_at > sa.func.now(),
            )
        ).one_or_none()
    return None if row is None else (row[0], row[1])


def test_configure_refuses_a_listen_url_of_another_driver(bounced: sa.Engine) -> None:
    with pytest.raises(TypeError, match="postgresql\\+psycopg"):
        cyclone.configure(bounced, listen_url="postgresql+psycopg2://postgres@127.0.0.1/x")


def test_the_deployment_guide_snippet_runs_behind_pgbouncer(
    bouncer: pgb.PgBouncer, database_url: URL, name: str
) -> None:
    namespace: dict[str, object] = {
        "BOUNCER_URL": bouncer.url_for(database_url),
        "DIRECT_URL": database_url,
    }
    code = docs.snippet("docs/deployment.md", "pgbouncer")
    exec(compile(code, "docs/deployment.md", "exec"), namespace)
    engine = namespace["engine"]
    assert isinstance(engine, sa.Engine)
    try:
        wf = pricing(name)
        run, _ = wf.submit_once(engine, "doc", Cart(items=[2, 3]))
        worker = cyclone.Worker(engine, workflows=[wf], poll_interval=3600, sweep=False)
        serving = Background(worker.run, name=f"worker-{name}")
        try:
            assert run.result(timeout=30) == Quote(total=5, count=2)
        finally:
            worker.stop()
        serving.join(30)
    finally:
        cyclone.close(engine)
        engine.dispose()
