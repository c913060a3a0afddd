"""Retention: purge_terminal_runs, purge_finished_jobs and the worker's sweeper."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store.leadership import LEADERSHIP
from cyclone.schema import jobs, leader, runs
from tests.conftest import StatementCounter, wait_until
from tests.support.workers import start_runs, wait_for_passes
from tests.test_scheduling import pages, plan_nodes

pytestmark = pytest.mark.usefixtures("clean_tables")

DAY = timedelta(days=1)


@pytest.fixture
def client(engine: sa.Engine) -> cyclone.Client:
    return cyclone.Client(engine)


def workflow(name: str) -> cyclone.Workflow[int]:
    wf: cyclone.Workflow[int] = cyclone.Workflow(name, input=int)

    @wf.step(max_attempts=1)
    def first(ctx: cyclone.StepContext, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    @wf.step(after=[first])
    def second(ctx: cyclone.StepContext, n: int) -> int:
        return n

    return wf


def age(engine: sa.Engine, targets: Iterable[cyclone.Run], interval: str) -> None:
    """Pretend the runs ended ``interval`` ago."""
    with engine.begin() as c:
        c.execute(
            sa.text(
                "UPDATE cyclone_runs SET finalized_at = now() - CAST(:i AS interval) "
                "WHERE id = ANY(:ids)"
            ),
            {"i": interval, "ids": [r.id for r in targets]},
        )


def existing(engine: sa.Engine, targets: Iterable[cyclone.Run]) -> set[uuid.UUID]:
    with engine.connect() as c:
        return set(
            c.execute(sa.select(runs.c.id).where(runs.c.id.in_([r.id for r in targets]))).scalars()
        )


def jobs_of(engine: sa.Engine, targets: Iterable[cyclone.Run]) -> int:
    with engine.connect() as c:
        return int(
            c.execute(
                sa.select(sa.func.count()).where(jobs.c.run_id.in_([r.id for r in targets]))
            ).scalar_one()
        )


def cancelled(engine: sa.Engine, wf: cyclone.Workflow[int], count: int) -> list[cyclone.Run]:
    made = [wf.submit(engine, i) for i in range(count)]
    for run in made:
        run.cancel()
    return made


def test_purge_deletes_only_terminal_runs_older_than_the_cutoff(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = workflow(name)
    completed, failed, young = wf.submit(engine, 1), wf.submit(engine, -1), wf.submit(engine, 2)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert failed.status().state == cyclone.RunState.FAILED
    (old_cancelled,) = cancelled(engine, wf, 1)
    running = wf.submit(engine, 3)
    age(engine, [completed, failed, old_cancelled], "2 days")
    age(engine, [young], "1 hour")

    assert client.purge_terminal_runs(older_than=DAY) == 3
    assert existing(engine, [completed, failed, old_cancelled, young, running]) == {
        young.id,
        running.id,
    }
    with pytest.raises(cyclone.NotFoundError):
        completed.status()
    assert client.purge_terminal_runs(older_than=DAY) == 0


def test_purge_deletes_in_batches_and_returns_the_total(
    engine: sa.Engine, client: cyclone.Client, name: str, statements: StatementCounter
) -> None:
    doomed = cancelled(engine, workflow(name), 35)
    age(engine, doomed, "2 days")
    statements.reset()
    assert client.purge_terminal_runs(older_than=DAY, batch_size=10) == 35
    deletes = [s for s in statements.statements if "DELETE FROM cyclone_runs" in s]
    assert len(deletes) == 4  # 10 + 10 + 10 + 5
    assert existing(engine, doomed) == set()


def add_children(engine: sa.Engine, parent: cyclone.Run, count: int) -> None:
    """``count`` ended child runs of ``parent`` (made by hand: only their number matters)."""
    with engine.begin() as c:
        c.execute(
            sa.text(
                "INSERT INTO cyclone_runs (workflow, input, definition, state, steps_remaining, "
                "finalized_at, parent_id, parent_node, parent_item) "
                "SELECT workflow, input, definition, state, steps_remaining, finalized_at, id, "
                "'kid', g FROM cyclone_runs, generate_series(1, :n) g WHERE id = :parent"
            ),
            {"n": count, "parent": parent.id},
        )


def test_a_purge_batch_is_bounded_in_runs_with_their_trees_of_child_runs(
    engine: sa.Engine, client: cyclone.Client, name: str, statements: StatementCounter
) -> None:
    # batch_size counted parents alone: a batch of a thousand parents with 10,000 child
    # runs each deleted ten million runs in one statement.
    doomed = cancelled(engine, workflow(name), 4)
    for parent in doomed[:3]:
        add_children(engine, parent, 4)  # trees of 5 runs
    add_children(engine, doomed[3], 11)  # a tree of 12 runs: more than a batch, alone
    age(engine, doomed, "2 days")
    with engine.begin() as c:
        c.execute(
            sa.text(
                "UPDATE cyclone_runs SET finalized_at = now() - interval '2 days' "
                "WHERE parent_id = ANY(:ids)"
            ),
            {"ids": [r.id for r in doomed]},
        )
    deleted: list[int] = []
    statements.reset()
    assert client.purge_terminal_runs(older_than=DAY, batch_size=10, progress=deleted.append) == 4
    # In id order, parents whose trees add up to at most 10 runs share a batch, the tree
    # of 12 has one of its own: two trees of 5 together, the other two alone.
    assert sorted(deleted) == [1, 1, 2]
    assert len([s for s in statements.statements if "DELETE FROM cyclone_runs" in s]) == 3
    with engine.connect() as c:
        left = c.execute(
            sa.text("SELECT count(*) FROM cyclone_runs WHERE workflow = :wf"), {"wf": name}
        ).scalar_one()
    assert left == 0


def test_purge_deletes_the_jobs_of_the_runs_it_deletes(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = workflow(name)
    done = [wf.submit(engine, i) for i in range(3)]
    cyclone.Worker(engine, workflows=[wf]).drain()
    kept = wf.submit(engine, 9)
    start_runs(engine, wf)
    assert jobs_of(engine, done) == 6
    age(engine, done, "2 days")
    assert client.purge_terminal_runs(older_than=DAY) == 3
    assert jobs_of(engine, done) == 0
    assert jobs_of(engine, [kept]) == 2


def test_purge_never_deletes_running_runs(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = workflow(name)
    running = [wf.submit(engine, i) for i in range(3)]
    retried = wf.submit(engine, -1)
    retried.cancel()
    age(engine, [retried], "30 days")
    retried.retry()  # running again: its old finalized_at is gone with its terminal state
    with engine.begin() as c:  # and however old the runs are
        c.execute(sa.update(runs).values(created_at=sa.func.now() - sa.text("interval '1 year'")))
    assert client.purge_terminal_runs(older_than=timedelta(0)) == 0
    assert existing(engine, [*running, retried]) == {r.id for r in [*running, retried]}
    assert retried.status().state == cyclone.RunState.RUNNING


def test_purge_frees_the_keys_of_the_runs_it_deletes(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = workflow(name)
    first, created = wf.submit_once(engine, "order:1", 1)
    assert created
    cyclone.Worker(engine, workflows=[wf]).drain()
    again, created = wf.submit_once(engine, "order:1", 1)
    assert (again.id, created) == (first.id, False)  # a finished run keeps its key
    age(engine, [first], "2 days")
    assert client.purge_terminal_runs(older_than=DAY) == 1
    new, created = wf.submit_once(engine, "order:1", 1)
    assert created
    assert new.id != first.id
    assert new.status().state == cyclone.RunState.RUNNING


def test_a_runs_own_retention_overrides_older_than(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    wf = workflow(name)
    kept_longer = wf.submit(engine, 1, retention=timedelta(days=3))
    kept_shorter = wf.submit(engine, 2)
    kept_shorter.set_retention(timedelta(hours=1))
    plain = wf.submit(engine, 3)
    cyclone.Worker(engine, workflows=[wf]).drain()
    assert kept_longer.status().retention == timedelta(days=3)
    age(engine, [kept_longer, kept_shorter, plain], "2 days")

    # older_than=7 days keeps plain, but kept_shorter's own hour has passed
    assert client.purge_terminal_runs(older_than=timedelta(days=7)) == 1
    assert existing(engine, [kept_longer, kept_shorter, plain]) == {kept_longer.id, plain.id}
    # older_than=1 day would take kept_longer, but its own 3 days have not passed
    assert client.purge_terminal_runs(older_than=DAY) == 1
    assert existing(engine, [kept_longer, plain]) == {kept_longer.id}
    age(engine, [kept_longer], "4 days")
    assert client.purge_terminal_runs(older_than=timedelta(days=30)) == 1
    assert existing(engine, [kept_longer]) == set()


def test_set_retention_none_returns_a_run_to_the_default(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    run = workflow(name).submit(engine, 1, retention=timedelta(days=30))
    run.cancel()
    age(engine, [run], "2 days")
    assert client.purge_terminal_runs(older_than=DAY) == 0
    run.set_retention(None)
    assert client.purge_terminal_runs(older_than=DAY) == 1


def test_purge_rejects_a_negative_age_or_batch(client: cyclone.Client) -> None:
    with pytest.raises(ValueError, match="older_than"):
        client.purge_terminal_runs(older_than=timedelta(seconds=-1))
    with pytest.raises(ValueError, match="batch_size"):
        client.purge_finished_jobs(older_than=DAY, batch_size=0)


def test_a_retention_or_age_past_a_thousand_years_is_refused_and_purges_keep_working(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    """One run kept for ``timedelta.max`` made every purge, the sweeper's included, fail
    in the driver ("timestamp out of range") for every run."""
    wf = workflow(name)
    with pytest.raises(ValueError, match="1,000 years"):
        wf.submit(engine, 1, retention=timedelta.max)
    run = wf.submit(engine, 1)
    with pytest.raises(ValueError, match="1,000 years"):
        run.set_retention(timedelta(days=3_000_000))
    for purge in (client.purge_terminal_runs, client.purge_finished_jobs, client.count_purgeable):
        with pytest.raises(ValueError, match="1,000 years"):
            purge(older_than=timedelta.max)
    assert client.purge_terminal_runs(older_than=DAY) == 0
    with engine.connect() as conn:
        kept = conn.execute(sa.select(runs.c.retention).where(runs.c.id == run.id)).scalar()
    assert kept is None


def test_a_run_kept_past_the_timestamps_range_before_the_bound_does_not_stop_purges(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    """A retention stored before retentions were bounded (``timedelta.max``, written here
    as an older version wrote it) keeps its run, and every other run is purged as usual."""
    wf = workflow(name)
    kept_forever, old = cancelled(engine, wf, 2)
    with engine.begin() as conn:
        conn.execute(
            sa.update(runs).where(runs.c.id == kept_forever.id).values(retention=timedelta.max)
        )
    age(engine, [kept_forever, old], "2 days")
    assert client.count_purgeable(older_than=DAY)[0] == 1
    assert client.purge_terminal_runs(older_than=DAY) == 1
    assert existing(engine, [kept_forever, old]) == {kept_forever.id}


def test_purge_finished_jobs_deletes_old_finished_standalone_jobs_only(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    @cyclone.step(name, max_attempts=1)
    def check(ctx: cyclone.StepContext, n: int) -> int:
        if n < 0:
            raise ValueError("negative")
        return n

    old_ok, old_failed, young = (
        check.enqueue(engine, 1),
        check.enqueue(engine, -1),
        check.enqueue(engine, 2),
    )
    cyclone.Worker(engine, steps=[check]).drain()
    waiting = check.enqueue(engine, 3, unique="still-waiting")
    wf = workflow(name)
    run = wf.submit(engine, 1)
    cyclone.Worker(engine, workflows=[wf]).drain()
    with engine.begin() as c:
        c.execute(
            sa.update(jobs)
            .where(jobs.c.finalized_at.is_not(None), jobs.c.id.not_in([young.id]))
            .values(finalized_at=sa.func.now() - sa.text("interval '2 days'"))
        )

    assert client.purge_finished_jobs(older_than=DAY, batch_size=1) == 2
    assert client.get_job(old_ok.id) is None
    assert client.get_job(old_failed.id) is None
    assert client.get_job(young.id) is not None
    assert client.get_job(waiting.id) is not None
    assert jobs_of(engine, [run]) == 2  # a run's steps go with their run, not here


def clone(engine: sa.Engine, table: sa.Table, template: object, count: int) -> None:
    """``count`` copies of the row ``template`` of ``table``, ended two days ago (every
    column copied but the id, which the table makes)."""
    names = [c.name for c in table.columns if c.name not in ("id", "finalized_at")]
    copied = sa.select(
        *(table.c[n] for n in names),
        (sa.func.now() - sa.text("interval '2 days'")).label("finalized_at"),
    ).select_from(table.join(sa.func.generate_series(1, count).table_valued("g"), sa.true()))
    with engine.begin() as c:
        c.execute(
            sa.insert(table).from_select(
                [*names, "finalized_at"], copied.where(table.c.id == template)
            )
        )


def purge_batches(
    engine: sa.Engine, purge: Callable[[], int], deleting: str
) -> list[tuple[str, object]]:
    """The statements and parameters of a purge's batches (those with ``deleting``)."""
    sent: list[tuple[str, object]] = []

    def note(conn: object, cursor: object, statement: str, params: object, *_: object) -> None:
        if deleting in statement:
            sent.append((statement, params))

    sa.event.listen(engine, "before_cursor_execute", note)
    try:
        purge()
    finally:
        sa.event.remove(engine, "before_cursor_execute", note)
    return sent


@pytest.mark.parametrize("table", ["runs", "jobs"])
def test_each_purge_batch_starts_after_the_rows_the_batch_before_deleted(
    own_engine: sa.Engine, name: str, table: str
) -> None:
    """The index entries of the rows a purge deleted stay until a vacuum: a batch read from
    the first id stepped over all of them, so a purge's cost grew with the square of its
    size (10 million runs: each batch spent longer there as the purge went on). The last
    batch of a purge of 20,010 rows, in batches of 1,000, reads a few pages of the primary
    key from where the batch before it stopped, not the entries of the 20,000 rows the
    batches before it deleted (some 80 pages)."""
    engine, client = own_engine, cyclone.Client(own_engine)
    if table == "runs":
        (template,) = cancelled(engine, workflow(name), 1)
        age(engine, [template], "2 days")
        clone(engine, runs, template.id, 20_009)

        def purge() -> int:
            return client.purge_terminal_runs(older_than=DAY, batch_size=1_000)

        index, deleting = "pk_cyclone_runs", "DELETE FROM cyclone_runs"
    else:

        @cyclone.step(name)
        def noop(ctx: cyclone.StepContext, n: int) -> None:
            pass

        job = noop.enqueue(engine, 1)
        cyclone.Worker(engine, steps=[noop]).drain()
        clone(engine, jobs, job.id, 20_009)
        with engine.begin() as c:
            c.execute(
                sa.update(jobs).values(finalized_at=sa.func.now() - sa.text("interval '2 days'"))
            )

        def purge() -> int:
            return client.purge_finished_jobs(older_than=DAY, batch_size=1_000)

        index, deleting = "pk_cyclone_jobs", "DELETE FROM cyclone_jobs"
    with engine.connect() as c:
        # Analyzed as autovacuum would, the table having grown; then kept from autovacuum,
        # whose vacuum or analyze of the emptied table could change the plan replayed below.
        c.execute(sa.text(f"ANALYZE cyclone_{table}"))
        c.execute(sa.text(f"ALTER TABLE cyclone_{table} SET (autovacuum_enabled = off)"))
        c.commit()
    sent = purge_batches(engine, purge, deleting)
    assert len(sent) == 21
    last, params = sent[-1]
    with engine.connect() as c:
        assert c.execute(sa.text(f"SELECT count(*) FROM cyclone_{table}")).scalar_one() == 0
        (plan,) = c.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + last, params).one()
        c.rollback()
    (scan,) = [
        n
        for n in plan_nodes(plan[0]["Plan"])
        if n.get("Index Name") == index and "finalized_at" in str(n.get("Filter"))
    ]
    assert pages(scan) < 30, scan
    assert "id >" in str(scan.get("Index Cond")), scan


def test_a_purge_batch_is_planned_without_jit(own_engine: sa.Engine, name: str) -> None:
    """Past ``jit_above_cost`` (a table of millions of runs) PostgreSQL compiled each batch,
    over a second of a batch of 10,000 runs; a purge's transactions turn JIT off, on a
    server that has it on."""
    with own_engine.connect() as c:
        database = c.dialect.identifier_preparer.quote_identifier(c.engine.url.database or "")
        c.execute(sa.text(f"ALTER DATABASE {database} SET jit = on"))
        c.commit()
    own_engine.dispose()
    doomed = cancelled(own_engine, workflow(name), 5)
    age(own_engine, doomed, "2 days")
    seen: list[str] = []

    def look(conn: object, cursor: Any, statement: str, *_: object) -> None:
        if "DELETE FROM cyclone_" in statement:
            seen.append(cursor.connection.execute("SELECT current_setting('jit')").fetchone()[0])

    sa.event.listen(own_engine, "after_cursor_execute", look)
    try:
        client = cyclone.Client(own_engine)
        assert client.purge_terminal_runs(older_than=DAY, batch_size=2) == 5
        assert client.purge_finished_jobs(older_than=DAY) == 0
    finally:
        sa.event.remove(own_engine, "after_cursor_execute", look)
    assert seen == ["off"] * 4  # three batches of runs, one of jobs


@contextlib.contextmanager
def run_in_thread(worker: cyclone.Worker) -> Iterator[None]:
    thread = threading.Thread(target=worker.run, name="sweeping-worker")
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()


def sweeping_worker(
    engine: sa.Engine, wf: cyclone.Workflow[int], keep: timedelta
) -> cyclone.Worker:
    return cyclone.Worker(
        engine,
        workflows=[wf],
        sweep=True,
        retention=keep,
        sweep_interval=timedelta(milliseconds=50),
        poll_interval=0.05,
    )


def test_the_worker_sweeper_deletes_old_terminal_runs_and_honours_their_retention(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    old, young = wf.submit(engine, 1), wf.submit(engine, 2)
    retained = wf.submit(engine, 3, retention=timedelta(days=3))
    short = wf.submit(engine, 4, retention=timedelta(minutes=10))
    cyclone.Worker(engine, workflows=[wf]).drain()
    running = wf.submit(engine, 5)
    running.cancel()
    running.retry()
    age(engine, [old, retained], "2 days")
    age(engine, [short], "20 minutes")

    with run_in_thread(sweeping_worker(engine, wf, keep=DAY)):
        wait_until(lambda: not existing(engine, [old, short]))
        assert existing(engine, [young, retained]) == {young.id, retained.id}
        # the sweeper keeps sweeping: once the retained run's own 3 days pass, it goes
        age(engine, [retained], "4 days")
        wait_until(lambda: not existing(engine, [retained]))
        assert existing(engine, [young]) == {young.id}
    assert running.status().state in (cyclone.RunState.RUNNING, cyclone.RunState.COMPLETED)


def test_the_former_worker_keyword_sweep_keep_still_sets_the_retention_and_warns(
    engine: sa.Engine, name: str
) -> None:
    wf = workflow(name)
    old, young = cancelled(engine, wf, 2)
    age(engine, [old], "2 days")
    age(engine, [young], "12 hours")
    with pytest.warns(DeprecationWarning, match=r"sweep_keep=\) is deprecated: pass retention="):
        worker = cyclone.Worker(
            engine,
            workflows=[wf],
            sweep_keep=DAY,
            sweep_interval=timedelta(milliseconds=50),
            poll_interval=0.05,
        )
    assert worker.retention == DAY
    with pytest.warns(DeprecationWarning, match="read Worker.retention"):
        assert worker.sweep_keep == DAY
    with run_in_thread(worker):
        wait_until(lambda: not existing(engine, [old]))
        assert existing(engine, [young]) == {young.id}


def test_a_worker_given_retention_and_a_different_sweep_keep_is_refused(
    engine: sa.Engine, name: str
) -> None:
    with (
        pytest.warns(DeprecationWarning, match="sweep_keep"),
        pytest.raises(ValueError, match="give retention= or its former name sweep_keep="),
    ):
        cyclone.Worker(engine, workflows=[workflow(name)], retention=DAY, sweep_keep=2 * DAY)


def test_only_the_maintenance_leader_sweeps(own_engine: sa.Engine, name: str) -> None:
    engine = own_engine
    wf = workflow(name)
    (done,) = cancelled(engine, wf, 1)
    age(engine, [done], "2 days")
    with engine.connect() as other:
        # Another worker holds the lease for an hour, renewed from this live session: this
        # worker's sweeper stays idle.
        other.execute(
            sa.insert(leader).values(
                name=LEADERSHIP,
                term=1,
                holder="another-worker",
                expires_at=sa.func.now() + timedelta(hours=1),
                backend_pid=sa.func.pg_backend_pid(),
            )
        )
        other.commit()
        worker = sweeping_worker(engine, wf, keep=timedelta(0))
        with run_in_thread(worker):
            wait_for_passes(worker, 2)  # tries to lead, and finds the lease held
            assert existing(engine, [done]) == {done.id}
            other.execute(sa.update(leader).values(expires_at=sa.func.now()))  # it lapses
            other.commit()
            wait_until(lambda: not existing(engine, [done]))


def test_the_leader_sweeps_on_its_own_connection_while_the_app_holds_the_whole_pool(
    own_engine: sa.Engine, own_url: sa.URL, name: str
) -> None:
    engine = own_engine
    database_url = own_url
    # A sweep once held a pool connection for its lock and asked for another per batch.
    wf = workflow(name)
    made = cancelled(engine, wf, 3)
    one = sa.create_engine(database_url, pool_size=1, max_overflow=0, pool_timeout=2)
    worker = cyclone.Worker(
        one,
        workflows=[wf],
        sweep=True,
        retention=timedelta(days=1),
        sweep_interval=timedelta(milliseconds=50),
        poll_interval=0.05,
    )
    try:
        with run_in_thread(worker):
            wait_until(lambda: worker._leader is not None and worker._leader.leading)
            # The leader's connection is its own: the app holds the pool's only one.
            with one.connect() as app:
                app.execute(sa.text("SELECT 1"))
                age(engine, made, "2 days")
                wait_until(lambda: not existing(engine, made))
    finally:
        one.dispose()


def test_purge_and_sweeper_racing_submit_once_lose_no_run_and_never_share_a_key(
    engine: sa.Engine, client: cyclone.Client, name: str
) -> None:
    churn: cyclone.Workflow[dict[str, str]] = cyclone.Workflow(
        f"{name}-churn", input=dict[str, str]
    )

    @churn.step()
    def noop(ctx: cyclone.StepContext, value: dict[str, str]) -> None:
        return None

    steady = workflow(f"{name}-steady")  # no worker runs it: its runs stay running
    steady_runs = {f"s{i}": steady.submit_once(engine, f"s{i}", i)[0] for i in range(4)}
    keys = [f"c{i}" for i in range(6)]
    observed: list[tuple[str, uuid.UUID, bool]] = []
    problems: list[str] = []
    errors: list[BaseException] = []
    tracebacks: list[str] = []
    stop = threading.Event()
    purged = Counter[str]()

    def guard(fn: object) -> object:
        def wrapped(*args: object) -> None:
            try:
                fn(*args)  # type: ignore[operator]
            except BaseException as exc:
                errors.append(exc)
                tracebacks.append("".join(traceback.format_exception(exc)))
                stop.set()

        return wrapped

    @guard
    def submitter(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(75):
            if stop.is_set():
                return
            key = rng.choice(keys)
            run, created = churn.submit_once(engine, key, {"k": key})
            observed.append((key, run.id, created))
            if i % 3 == 0:
                with contextlib.suppress(cyclone.InvalidStateError, cyclone.NotFoundError):
                    run.cancel()
            if i % 5 == 0:
                skey = rng.choice(list(steady_runs))
                srun, screated = steady.submit_once(engine, skey, int(skey[1:]))
                if screated or srun.id != steady_runs[skey].id:
                    problems.append(f"steady key {skey} got run {srun.id} created={screated}")

    @guard
    def purger() -> None:
        while not stop.is_set():
            purged["purge"] += client.purge_terminal_runs(older_than=timedelta(0), batch_size=3)

    @guard
    def monitor() -> None:
        while not stop.is_set():
            with engine.connect() as c:
                shared = c.execute(
                    sa.select(runs.c.workflow, runs.c.submit_key)
                    .where(runs.c.workflow.in_([churn.name, steady.name]))
                    .group_by(runs.c.workflow, runs.c.submit_key)
                    .having(sa.func.count() > 1)
                ).all()
                alive = c.execute(
                    sa.select(runs.c.id).where(
                        runs.c.id.in_([r.id for r in steady_runs.values()]),
                        runs.c.state == cyclone.RunState.RUNNING.value,
                    )
                ).all()
            if shared:
                problems.append(f"keys held by two runs: {shared}")
            if len(alive) != len(steady_runs):
                problems.append("a running run was deleted")
            time.sleep(0.01)  # the monitor's pace between two looks

    worker = sweeping_worker(engine, churn, keep=timedelta(0))  # type: ignore[arg-type]
    background = [threading.Thread(target=purger), threading.Thread(target=monitor)]
    submitters = [threading.Thread(target=submitter, args=(seed,)) for seed in range(4)]
    with run_in_thread(worker):
        for t in background + submitters:
            t.start()
        for t in submitters:
            t.join(timeout=60)
        stop.set()
        for t in background:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in background + submitters)
    assert not errors, tracebacks[0]
    assert not problems, problems[:5]

    created_for: defaultdict[str, list[uuid.UUID]] = defaultdict(list)
    for key, run_id, created in observed:
        if created:
            created_for[key].append(run_id)
    all_created = [rid for ids in created_for.values() for rid in ids]
    assert len(all_created) == len(set(all_created))  # a run id is never handed out twice
    for key, run_id, _ in observed:  # every returned run exists or existed, under its key
        assert run_id in created_for[key]
    assert len(observed) == 300
    assert len(all_created) > len(keys)  # keys really were freed and used again
    for run in steady_runs.values():
        assert run.status().state == cyclone.RunState.RUNNING
    with engine.connect() as c:  # every run still there was handed out for its own key
        current = c.execute(
            sa.select(runs.c.submit_key, runs.c.id).where(runs.c.workflow == churn.name)
        ).all()
    assert all(run_id in created_for[key] for key, run_id in current)
