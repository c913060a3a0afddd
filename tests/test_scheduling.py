"""Scheduling of standalone jobs: run_at/delay, priorities, queues and per-queue limits."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import claim as _claim
from cyclone.schema import jobs, runs
from tests.conftest import wait_until


def recorder(kind: str, **options: object) -> tuple[cyclone.StandaloneStep[int, int], list[int]]:
    seen: list[int] = []

    @cyclone.step(kind, **options)  # type: ignore[arg-type]
    def record(ctx: cyclone.StepContext, n: int) -> int:
        seen.append(n)
        return n

    return record, seen


def test_a_job_scheduled_in_the_future_is_not_run_by_drain_now(
    engine: sa.Engine, name: str
) -> None:
    step, seen = recorder(name)
    later = step.enqueue(engine, 1, run_at=datetime.now(UTC) + timedelta(hours=1))
    delayed = step.enqueue(engine, 2, delay=timedelta(hours=1))
    assert cyclone.Worker(engine, steps=[step]).drain() == 0
    assert seen == []
    assert later.status().state == cyclone.JobState.AVAILABLE
    assert delayed.status().state == cyclone.JobState.AVAILABLE


def test_a_delayed_job_runs_once_its_time_has_passed(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name)
    job = step.enqueue(engine, 7, delay=timedelta(seconds=1))
    worker = cyclone.Worker(engine, steps=[step])
    # A drain before the job's time runs nothing; on a machine so loaded that the first
    # drain comes after it, the job runs then, and its start below still proves the rule.
    if worker.drain() == 0:
        wait_until(lambda: worker.drain() == 1, timeout=10, interval=0.05)
    assert seen == [7]
    status = job.wait(timeout=10)
    assert status.state == cyclone.JobState.COMPLETED
    assert status.scheduled_at - status.created_at >= timedelta(seconds=1)
    with engine.connect() as conn:
        started = conn.execute(
            sa.select(jobs.c.attempted_at).where(jobs.c.id == job.id)
        ).scalar_one()
    assert started >= status.scheduled_at


def test_a_job_with_run_at_in_the_past_runs_now(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name)
    step.enqueue(engine, 3, run_at=datetime.now(UTC) - timedelta(minutes=5))
    assert cyclone.Worker(engine, steps=[step]).drain() == 1
    assert seen == [3]


WEST = timezone(-timedelta(hours=14))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        # enqueue checked none of these: a naive time was read in the server's time zone,
        # a string was parsed by PostgreSQL, an int failed in the driver.
        ({"run_at": datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
        ({"run_at": "2030-01-01T00:00:00Z"}, TypeError, "datetime"),
        ({"delay": 5}, TypeError, "timedelta"),
        ({"run_at": datetime.now(UTC), "delay": timedelta(1)}, ValueError, "not both"),
        # A time after year 9999 was stored, and every listing of jobs then failed.
        ({"delay": timedelta(days=3_000_000)}, ValueError, "1,000 years"),
        ({"delay": timedelta.max}, ValueError, "1,000 years"),
        ({"run_at": datetime.max.replace(tzinfo=WEST)}, ValueError, "9999"),
        # A call's arguments of the wrong type or range raised DefinitionError, the
        # error of a bad definition, where every other call raises TypeError/ValueError.
        ({"priority": "x"}, TypeError, "priority= takes an int, not str"),
        ({"priority": 40_000}, ValueError, "priority= must be from -32768 to 32767"),
        ({"max_attempts": 0}, ValueError, "max_attempts= must be from 1"),
        ({"max_attempts": 2.0}, TypeError, "max_attempts= takes an int, not float"),
        ({"queue": 5}, TypeError, "queue= takes a str, not int"),
        ({"queue": ""}, ValueError, "queue must be a non-empty str"),
        ({"queue": "a\x00b"}, ValueError, "NUL"),
    ],
)
def test_bad_options_of_an_enqueue_raise_before_anything_is_written(
    engine: sa.Engine, name: str, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    step, _seen = recorder(name)
    with pytest.raises(error, match=message):
        step.enqueue(engine, 1, **options)
    with engine.begin() as conn, pytest.raises(error, match=message):
        step.enqueue_tx(conn, 1, **options)
    assert cyclone.Client(engine).list_jobs(kind=name) == []


def test_a_bool_priority_is_refused_before_anything_is_written(
    engine: sa.Engine, name: str
) -> None:
    """PostgreSQL cannot cast a bool to smallint: it failed in the driver."""
    step, _seen = recorder(name)
    with pytest.raises(TypeError, match="priority"):
        step.enqueue(engine, 1, priority=True)
    with pytest.raises(cyclone.DefinitionError, match="priority"):
        recorder(f"{name}-b", priority=True)
    assert cyclone.Client(engine).list_jobs(kind=name) == []


def test_a_lower_priority_number_runs_first(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name)
    priorities = [5, -3, 2, 0, 9, -10, 1]
    with engine.begin() as c:  # one transaction: every job is visible to the first claim
        for p in priorities:
            step.enqueue_tx(c, p, priority=p)
    assert cyclone.Worker(engine, steps=[step], concurrency=1).drain() == len(priorities)
    assert seen == sorted(priorities)


def test_priorities_order_jobs_across_every_kind_a_worker_serves(
    engine: sa.Engine, name: str
) -> None:
    seen: list[str] = []

    def kind(suffix: str) -> cyclone.StandaloneStep[int, None]:
        @cyclone.step(f"{name}.{suffix}")
        def record(ctx: cyclone.StepContext, n: int) -> None:
            seen.append(f"{suffix}{n}")

        return record

    a, b, c = kind("a"), kind("b"), kind("c")
    with engine.begin() as conn:
        for step, priorities in ((a, [4, 1]), (b, [3, 0]), (c, [5, 2])):
            for p in priorities:
                step.enqueue_tx(conn, p, priority=p)
    assert cyclone.Worker(engine, steps=[a, b, c], concurrency=1).drain() == 6
    assert seen == ["b0", "a1", "c2", "b3", "a4", "c5"]


def claim_plan(engine: sa.Engine, scope: _claim.Scope) -> dict[str, Any]:
    """EXPLAIN ANALYZE of the worker's claim statement for ``scope``, rolled back."""
    stmt = _claim._fast_claim(scope, False, 10)
    fairy = engine.raw_connection()
    try:
        driver = fairy.driver_connection
        assert driver is not None
        row = driver.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + stmt.sql,
            {**stmt.defaults, "me": "explain", "items": "[]"},
        ).fetchone()
        driver.rollback()
    finally:
        fairy.close()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


def picking(plan: dict[str, Any]) -> dict[str, Any]:
    """The node of the claim's ``picked`` CTE: finding and locking, not updating."""
    for node in plan.get("Plans", []):
        if node.get("Subplan Name") == "CTE picked":
            return node
    raise AssertionError("no CTE picked in the plan")


def pages(node: dict[str, Any]) -> int:
    return int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])


@pytest.fixture
def own_rows(engine: sa.Engine, name: str) -> Iterator[None]:
    """Delete the jobs and runs a test bulk-loaded under its name, then ANALYZE (as
    autovacuum would), so that later tests do not plan on this one's statistics."""
    yield
    with engine.begin() as conn:
        conn.execute(sa.delete(jobs).where(jobs.c.kind.startswith(f"{name}.")))
        conn.execute(sa.delete(runs).where(runs.c.workflow.startswith(f"{name}.")))
        conn.execute(sa.text("ANALYZE cyclone_jobs, cyclone_runs"))


def add_available_jobs(engine: sa.Engine, kind: str, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, args, max_attempts) "
                "SELECT :kind, 'default', 0, 'available', to_jsonb(g), 1 "
                "FROM generate_series(1, :n) g"
            ),
            {"kind": kind, "n": n},
        )


@pytest.mark.parametrize("served", ["one kind", "kinds and a workflow"])
def test_a_claim_reads_none_of_the_backlog_of_kinds_it_does_not_serve(
    engine: sa.Engine, name: str, own_rows: None, served: str
) -> None:
    add_available_jobs(engine, f"{name}.foreign", 20000)
    mine, _seen = recorder(f"{name}.mine")
    mine.enqueue(engine, 1, priority=0)  # behind all 20,000 in (priority, scheduled_at, id)
    with engine.begin() as conn:  # as autovacuum would after the load
        conn.execute(sa.text("ANALYZE cyclone_jobs"))
    if served == "one kind":
        scope = _claim.Scope(queues=None, workflows=(), kinds=(f"{name}.mine",))
    else:
        scope = _claim.Scope(
            queues=None, workflows=(f"{name}.wf",), kinds=(f"{name}.mine", f"{name}.other")
        )
    plan = claim_plan(engine, scope)
    assert plan["Actual Rows"] == 1
    # The 20,000 foreign jobs fill some 200 pages; reading past them touches every one.
    assert pages(picking(plan)) < 30


def test_a_claim_over_several_kinds_reads_a_few_jobs_of_each_not_its_whole_backlog(
    engine: sa.Engine, name: str, own_rows: None
) -> None:
    # Each served kind offers a few candidates in order; none is read and sorted whole.
    for suffix in ("a", "b"):
        add_available_jobs(engine, f"{name}.{suffix}", 20000)
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE cyclone_jobs"))
    scope = _claim.Scope(queues=None, workflows=(), kinds=(f"{name}.a", f"{name}.b"))
    plan = claim_plan(engine, scope)
    assert plan["Actual Rows"] == 10
    # Reading either kind's 20,000 jobs whole would touch hundreds of pages.
    assert pages(picking(plan)) < 100


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def outline(node: dict[str, Any]) -> list[str]:
    """The plan's nodes, with their index and pages, for a failing assertion's message."""
    return [
        f"{n['Node Type']} {n.get('Index Name', '')} pages={pages(n)} rows={n.get('Actual Rows')}"
        for n in plan_nodes(node)
    ]


def add_running_runs(engine: sa.Engine, workflow: str, runs_: int, available_steps: int) -> None:
    """``runs_`` running runs of ``workflow``; the first ``available_steps`` have a step to run."""
    with engine.begin() as conn:
        conn.execute(
            sa.text(
                "WITH d AS (INSERT INTO cyclone_definitions (id, workflow, graph)"
                " VALUES (gen_random_uuid(), :wf, '{}') RETURNING id) "
                "INSERT INTO cyclone_runs (workflow, input, definition, steps_remaining) "
                "SELECT :wf, to_jsonb(g), (SELECT id FROM d), 1 FROM generate_series(1, :n) g"
            ),
            {"wf": workflow, "n": runs_},
        )
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, priority, state, "
                "max_attempts) SELECT id, workflow, 'only', 'default', 0, 'available', 1 "
                "FROM cyclone_runs r WHERE workflow = :wf AND NOT EXISTS "
                "(SELECT FROM cyclone_jobs j WHERE j.run_id = r.id) LIMIT :n"
            ),
            {"wf": workflow, "n": available_steps},
        )


def test_a_claim_of_a_workflow_probes_its_runs_never_scans_every_running_run(
    own_engine: sa.Engine, name: str
) -> None:
    # An EXISTS on the run became a hashed subplan that read every running run per claim.
    # On a database of its own: the statistics are of this test's rows alone. On the
    # session's database, what earlier tests left in the tables has twice made the planner
    # read every available job of the workflow and sort them (about 9,100 pages).
    engine = own_engine
    add_running_runs(engine, f"{name}.other", 20000, 0)
    add_running_runs(engine, f"{name}.wf", 3000, 3000)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE cyclone_jobs, cyclone_runs"))
        scope = _claim.Scope(queues=None, workflows=(f"{name}.wf",), kinds=())
        plan = claim_plan(engine, scope)
        assert plan["Actual Rows"] == 10
        picked = picking(plan)
        assert not any("hashed" in n.get("Subplan Name", "") for n in plan_nodes(picked))
        assert pages(picked) < 100, outline(picked)
    finally:  # rows made by hand, which the invariants checked at rest would refuse
        with engine.begin() as conn:
            conn.execute(sa.delete(runs))


def scan_estimate(plan: dict[str, Any], index: str) -> int:
    """The planner's estimate of the rows the claim reads through ``index``."""
    (scan,) = (n for n in plan_nodes(picking(plan)) if n.get("Index Name") == index)
    return int(scan["Plan Rows"])


@pytest.mark.parametrize("served", ["workflow", "kind"])
def test_a_claim_is_planned_on_its_backlog_among_many_finished_jobs(
    own_engine: sa.Engine, name: str, served: str
) -> None:
    # The planner multiplied the shares of `state = 'available'` and `workflow = ...` (and
    # took one in two hundred for the run's state), estimating a handful of rows where
    # 3,000 wait: a plan free to read and sort all of them (and probe every run) on each
    # claim. The claim statistics (cyclone_0024) and the run's check as a boolean keep the
    # estimate near the backlog.
    engine = own_engine
    with engine.begin() as conn:  # history: finished jobs of other kinds
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, max_attempts, "
                "finalized_at) SELECT 'history.' || (g % 500), 'default', 0, 'completed', 1, "
                "now() FROM generate_series(1, 300000) g"
            )
        )
    if served == "workflow":
        add_running_runs(engine, f"{name}.wf", 3000, 3000)
        scope = _claim.Scope(queues=None, workflows=(f"{name}.wf",), kinds=())
        index = "ix_cyclone_jobs_claim_workflow"
    else:
        add_available_jobs(engine, f"{name}.kind", 3000)
        scope = _claim.Scope(queues=None, workflows=(), kinds=(f"{name}.kind",))
        index = "ix_cyclone_jobs_claim_kind"
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("ANALYZE cyclone_jobs, cyclone_runs"))
        plan = claim_plan(engine, scope)
        assert plan["Actual Rows"] == 10
        assert scan_estimate(plan, index) > 300, outline(picking(plan))
    finally:  # rows made by hand, which the invariants checked at rest would refuse
        with engine.begin() as conn:
            conn.execute(sa.delete(jobs))
            conn.execute(sa.delete(runs))


def test_a_claim_over_a_workflow_and_kinds_stays_small_after_a_burst_on_stale_statistics(
    engine: sa.Engine, name: str, own_rows: None
) -> None:
    # Statistics taken on a near-empty queue, then a burst: the merged claim must still
    # read a few candidates of each key, not a bitmap of every key's whole range.
    with engine.begin() as conn:  # history: finished jobs make the table large
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, priority, state, max_attempts, "
                "finalized_at) SELECT :kind, 'default', 0, 'completed', 1, now() "
                "FROM generate_series(1, 100000)"
            ),
            {"kind": f"{name}.history"},
        )
    add_running_runs(engine, f"{name}.wf", 20, 20)
    for suffix in ("a", "b"):
        add_available_jobs(engine, f"{name}.{suffix}", 20)
    with engine.begin() as conn:
        conn.execute(sa.text("ANALYZE cyclone_jobs, cyclone_runs"))
    add_running_runs(engine, f"{name}.wf", 5000, 5000)
    for suffix in ("a", "b"):
        add_available_jobs(engine, f"{name}.{suffix}", 20000)
    scope = _claim.Scope(queues=None, workflows=(f"{name}.wf",), kinds=(f"{name}.a", f"{name}.b"))
    plan = claim_plan(engine, scope)
    assert plan["Actual Rows"] == 10
    picked = picking(plan)
    kinds = {n["Node Type"] for n in plan_nodes(picked)}
    assert not kinds & {"BitmapOr", "Sort", "Hash Join"}, kinds
    assert not any(
        n["Node Type"] == "Bitmap Index Scan" and n["Index Name"].startswith("ix_cyclone_jobs")
        for n in plan_nodes(picked)
    )
    assert pages(picked) < 150, outline(picked)


def test_equal_priorities_run_in_enqueue_order(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name)
    for n in range(5):
        step.enqueue(engine, n, priority=1)
    step.enqueue(engine, 99, priority=0)
    assert cyclone.Worker(engine, steps=[step], concurrency=1).drain() == 6
    assert seen == [99, 0, 1, 2, 3, 4]


def test_the_step_definitions_priority_is_the_default(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name, priority=5)
    step.enqueue(engine, 5)
    step.enqueue(engine, 1, priority=1)
    assert cyclone.Worker(engine, steps=[step], concurrency=1).drain() == 2
    assert seen == [1, 5]


def test_a_worker_never_runs_jobs_of_a_queue_it_was_not_given(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name)
    in_a = step.enqueue(engine, 1, queue=f"{name}-a")
    in_b = step.enqueue(engine, 2, queue=f"{name}-b")
    assert cyclone.Worker(engine, steps=[step], queues={f"{name}-a": 1}).drain() == 1
    assert seen == [1]
    assert in_a.status().state == cyclone.JobState.COMPLETED
    assert in_b.status().state == cyclone.JobState.AVAILABLE
    assert in_b.status().attempt == 0

    assert cyclone.Worker(engine, steps=[step], queues={f"{name}-b": 1}).drain() == 1
    assert in_b.status().state == cyclone.JobState.COMPLETED


def test_a_queue_limit_of_one_never_runs_two_at_once_while_another_queue_runs_in_parallel(
    engine: sa.Engine, name: str
) -> None:
    slow_q, fast_q = f"{name}-slow", f"{name}-fast"
    lock = threading.Lock()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    fast_together = threading.Barrier(3)
    fast_all_running = threading.Event()

    def enter(queue: str) -> None:
        with lock:
            running[queue] += 1
            peak[queue] = max(peak[queue], running[queue])

    def leave(queue: str) -> None:
        with lock:
            running[queue] -= 1

    @cyclone.step(f"{name}.slow", queue=slow_q)
    def slow(ctx: cyclone.StepContext, n: int) -> None:
        enter(slow_q)
        try:
            # The first slow job stays running until all three fast jobs run at once:
            # the fast queue runs in parallel with a slow job in flight.
            assert fast_all_running.wait(timeout=10)
        finally:
            leave(slow_q)

    @cyclone.step(f"{name}.fast", queue=fast_q)
    def fast(ctx: cyclone.StepContext, n: int) -> None:
        enter(fast_q)
        try:
            fast_together.wait(timeout=10)  # breaks (and fails the job) unless 3 run at once
            fast_all_running.set()
        finally:
            leave(fast_q)

    with engine.begin() as c:
        slow_jobs = [slow.enqueue_tx(c, n) for n in range(3)]
        fast_jobs = [fast.enqueue_tx(c, n) for n in range(3)]
    worker = cyclone.Worker(
        engine, steps=[slow, fast], concurrency=4, queues={slow_q: 1, fast_q: 3}
    )
    assert worker.drain() == 6
    assert [j.status().state for j in slow_jobs + fast_jobs] == [cyclone.JobState.COMPLETED] * 6
    assert peak[slow_q] == 1
    assert peak[fast_q] == 3


def test_per_queue_limits_never_claim_more_than_the_workers_concurrency(
    engine: sa.Engine, name: str
) -> None:
    queues = {f"{name}-a": 2, f"{name}-b": 2}
    entered = threading.Semaphore(0)
    release = threading.Event()

    @cyclone.step(name)
    def block(ctx: cyclone.StepContext, n: int) -> None:
        entered.release()
        assert release.wait(timeout=10)

    with engine.begin() as c:
        for queue in queues:
            for n in range(2):
                block.enqueue_tx(c, n, queue=queue)
    worker = cyclone.Worker(engine, steps=[block], concurrency=2, queues=queues)
    drained: list[int] = []
    thread = threading.Thread(target=lambda: drained.append(worker.drain()))
    thread.start()
    try:
        assert entered.acquire(timeout=10)
        assert entered.acquire(timeout=10)
        with engine.connect() as c:
            running = c.execute(
                sa.select(sa.func.count()).where(jobs.c.kind == name, jobs.c.state == "running")
            ).scalar_one()
        assert running == 2  # claimed jobs are running jobs: no more than concurrency
    finally:
        release.set()
        thread.join(timeout=30)
    assert drained == [4]


def test_without_queues_a_worker_serves_every_queue(engine: sa.Engine, name: str) -> None:
    step, seen = recorder(name, queue=f"{name}-own")
    step.enqueue(engine, 1)
    elsewhere = step.enqueue(engine, 2, queue=f"{name}-elsewhere")
    assert cyclone.Worker(engine, steps=[step]).drain() == 2
    assert sorted(seen) == [1, 2]
    assert elsewhere.status().state == cyclone.JobState.COMPLETED


def test_a_worker_with_long_steps_holds_no_more_jobs_than_its_concurrency(
    engine: sa.Engine, name: str
) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    @cyclone.step(name)
    def slow(ctx: cyclone.StepContext, value: int) -> None:
        started.release()
        assert release.wait(30)

    for i in range(6):
        slow.enqueue(engine, i)
    worker = cyclone.Worker(engine, steps=[slow], concurrency=2)
    drained: list[int] = []
    thread = threading.Thread(target=lambda: drained.append(worker.drain()))
    thread.start()
    try:
        assert started.acquire(timeout=30)
        assert started.acquire(timeout=30)
        with engine.connect() as conn:
            running = conn.execute(
                sa.text("SELECT count(*) FROM cyclone_jobs WHERE kind = :k AND state = 'running'"),
                {"k": name},
            ).scalar_one()
        assert running == 2  # the other four stay available for other workers
    finally:
        release.set()
        thread.join(timeout=30)
    assert drained == [6]


@pytest.mark.parametrize("short_steps_first", [False, True])
def test_a_full_worker_waits_without_spinning(
    engine: sa.Engine, name: str, short_steps_first: bool
) -> None:
    release = threading.Event()
    started = threading.Event()

    @cyclone.step(name)
    def step(ctx: cyclone.StepContext, value: int) -> None:
        if value == 0:
            started.set()
            assert release.wait(30)

    worker = cyclone.Worker(engine, steps=[step], concurrency=1, poll_interval=0.01)
    if short_steps_first:
        for i in range(1, 40):
            step.enqueue(engine, i)
        worker.drain()  # the worker now believes its steps are short
    step.enqueue(engine, 0)
    for i in range(1, 6):
        step.enqueue(engine, i)
    iterations = 0
    take = worker._take_outcomes

    def counting() -> Any:
        nonlocal iterations
        iterations += 1
        return take()

    worker._take_outcomes = counting  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.drain)
    thread.start()
    try:
        assert started.wait(30)
        before = iterations
        time.sleep(1.5)  # the behaviour under test is what the loop does meanwhile
        assert iterations - before < 30
    finally:
        release.set()
        thread.join(timeout=30)


def test_jobs_claimed_before_a_failed_statement_still_run_at_once(
    engine: sa.Engine, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With per-queue limits a cycle claims queue by queue, one committed statement each.
    # When a later one fails, the jobs the earlier ones claimed must still be started, not
    # left running unowned until a rescue.
    from cyclone._store import claim as _claim

    real = _claim.record_and_claim
    calls = 0

    def second_fails(*args: object, **kwargs: object) -> list[_claim.Claimed]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise sa.exc.OperationalError("claim", {}, Exception("injected"))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_claim, "record_and_claim", second_fails)
    step, seen = recorder(name)
    queues = {f"{name}-a": 2, f"{name}-b": 2}
    with engine.begin() as c:
        handles = [step.enqueue_tx(c, n, queue=q) for n, q in enumerate(sorted(queues) * 2)]
    worker = cyclone.Worker(
        engine, steps=[step], concurrency=4, queues=queues, rescue_after=timedelta(hours=1)
    )
    assert worker.drain() == 4
    assert calls > 2
    assert sorted(seen) == [0, 1, 2, 3]
    assert [h.status().state for h in handles] == [cyclone.JobState.COMPLETED] * 4
