"""Listings and counts read their indexes (revisions cyclone_0013, cyclone_0020_definitions).

A state few runs are in (a handful failed among thousands completed) is listed, paged
and counted from the ``(state, created_at, id)`` and ``(workflow, state, created_at,
id)`` indexes; a listing of every state merges those indexes' ranges, one per state; the
key, the claim's start, the sweeper, the deadlines and a worker's look for the Rates of
earlier definitions (cyclone_0023_rated_jobs_index) read the index cyclone.schema names for
each. The plans below are PostgreSQL's own, for the statements cyclone sends.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import psycopg.sql
import pytest
import sqlalchemy as sa

import cyclone
from cyclone._store import children as _children
from cyclone._store import executor as _executor
from cyclone._store import limits as _limits
from cyclone._store import rescue as _rescue

BULK = sa.text(
    "WITH d AS (INSERT INTO cyclone_definitions (id, workflow, graph)"
    " VALUES (gen_random_uuid(), :wf, '{}') RETURNING id) "
    "INSERT INTO cyclone_runs (workflow, submit_key, input, definition, state, steps_remaining,"
    " created_at, finalized_at) "
    "SELECT :wf, 'k' || g, to_jsonb(g), (SELECT id FROM d), :state, 0,"
    " now() - interval '1 hour' + g * interval '1 ms', now() "
    "FROM generate_series(CAST(:first AS int), CAST(:last AS int)) g"
)


@pytest.fixture
def loaded(own_engine: sa.Engine) -> sa.Engine:
    """8,000 completed runs in two workflows, 6 failed and 3 cancelled; analyzed."""
    with own_engine.begin() as conn:
        for wf in ("big", "other"):
            conn.execute(BULK, {"wf": wf, "state": "completed", "first": 1, "last": 4000})
        conn.execute(BULK, {"wf": "big", "state": "failed", "first": 5000, "last": 5005})
        conn.execute(BULK, {"wf": "other", "state": "cancelled", "first": 6000, "last": 6002})
    with own_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE cyclone_runs"))
    return own_engine


@pytest.fixture
def plans(loaded: sa.Engine) -> Iterator[Callable[[Callable[[], Any]], str]]:
    """``plans(read)``: the plans of the statements on cyclone_runs that ``read`` sends."""
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "cyclone_runs" in statement and not statement.startswith("EXPLAIN"):
            sent.append((statement, parameters))

    def explain(read: Callable[[], Any]) -> str:
        sent.clear()
        read()
        found = []
        with loaded.connect() as conn:
            for statement, parameters in list(sent):
                lines = conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars()
                found.extend(lines)
        return "\n".join(found)

    sa.event.listen(loaded, "before_cursor_execute", capture)
    yield explain
    sa.event.remove(loaded, "before_cursor_execute", capture)


def test_a_state_filter_pages_through_its_index_not_a_window_of_runs(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    client = cyclone.Client(loaded)
    page = client.page_runs(state="failed", limit=4, scan=100)
    assert [r.key for r in page.runs] == ["k5005", "k5004", "k5003", "k5002"]
    assert page.searched_to is None  # answered by the index, not from 100 runs read
    assert page.next is not None
    rest = client.page_runs(state="failed", limit=4, scan=100, after=page.next.cursor)
    assert [r.key for r in rest.runs] == ["k5001", "k5000"]
    assert rest.next is None
    assert client.list_runs(state="failed", after=page.next.cursor) == rest.runs
    with pytest.raises(ValueError, match="is not a cursor"):
        client.list_runs(after="2026-01-01")

    plan = plans(lambda: client.page_runs(state="failed", limit=4, after=page.next))
    assert "ix_cyclone_runs_listing_state " in plan, plan
    assert "Seq Scan" not in plan, plan
    plan = plans(lambda: client.list_runs(state="cancelled"))
    assert "ix_cyclone_runs_listing_state " in plan, plan


def test_a_workflow_and_state_filter_reads_the_workflow_state_index(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    client = cyclone.Client(loaded)
    assert len(client.page_runs(workflow="big", state="failed").runs) == 6
    assert client.page_runs(workflow="other", state="failed").runs == []
    for read in (
        lambda: client.page_runs(workflow="big", state="failed", limit=3),
        lambda: client.list_runs(workflow="other", state="running"),
    ):
        plan = plans(read)
        assert "ix_cyclone_runs_listing_workflow_state" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_counts_with_a_cap_read_at_most_the_cap_per_workflow_and_state_from_the_index(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    client = cyclone.Client(loaded)
    exact = client.count_runs_per_workflow()
    assert exact["big"][cyclone.RunState.COMPLETED] == 4000
    capped = client.count_runs_per_workflow(up_to=1000)
    assert capped == {
        "big": {**exact["big"], cyclone.RunState.COMPLETED: 1000},
        "other": {**exact["other"], cyclone.RunState.COMPLETED: 1000},
    }
    assert capped["big"][cyclone.RunState.FAILED] == 6
    plan = plans(lambda: client.count_runs_per_workflow(up_to=1000))
    assert "Index Only Scan using ix_cyclone_runs_listing_workflow_state" in plan, plan
    assert "Seq Scan" not in plan, plan
    with pytest.raises(ValueError, match="up_to must be a positive int"):
        client.count_runs_per_workflow(up_to=0)


def test_the_backlog_and_the_per_minute_chart_read_indexes_not_rows(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    with loaded.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, queue, state, max_attempts, scheduled_at) "
                "SELECT 'mail', 'q' || g % 2, 'available', 1, now() + (g % 3 - 1) * interval '1 h'"
                " FROM generate_series(1, 3000) g"
            )
        )
    with loaded.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE cyclone_jobs"))
    client = cyclone.Client(loaded)
    backlog = client.count_active_jobs()
    assert [(a.queue, a.kind, a.ready, a.scheduled, a.running) for a in backlog] == [
        ("q0", "mail", 1000, 500, 0),
        ("q1", "mail", 1000, 500, 0),
    ]
    plan = plans(client.count_active_jobs)
    assert "Index Only Scan using ix_cyclone_jobs_available" in plan, plan
    chart = client.count_finished_per_minute()
    assert sum(m.completed for m in chart) == 8000
    assert sum(m.failed for m in chart) == 6
    plan = plans(client.count_finished_per_minute)
    assert "Index Only Scan using ix_cyclone_runs_finalized_at_state" in plan, plan


def newest_first(engine: sa.Engine, where: str = "true") -> list[str]:
    """The keys of the runs ``where`` holds, newest first, read by plain SQL."""
    with engine.connect() as conn:
        return list(
            conn.execute(
                sa.text(
                    f"SELECT submit_key FROM cyclone_runs WHERE {where} "
                    "ORDER BY created_at DESC, id DESC"
                )
            ).scalars()
        )


def test_every_run_and_a_workflows_runs_list_newest_first_merging_the_state_indexes(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    client = cyclone.Client(loaded)
    every = newest_first(loaded)
    big = newest_first(loaded, "workflow = 'big'")
    assert [r.key for r in client.list_runs(limit=10)] == every[:10]
    first = client.page_runs(limit=7)
    deeper = client.page_runs(limit=7, after=first.next)
    assert [r.key for r in first.runs + deeper.runs] == every[:14]
    assert [r.key for r in client.list_runs(workflow="big", limit=10)] == big[:10]
    failed_first = client.list_runs(workflow="big", limit=8, after=client.list_runs(limit=1)[0])
    assert [r.key for r in failed_first] == big[1:9] or [r.key for r in failed_first] == big[:8]
    for read in (
        lambda: client.list_runs(limit=10),
        lambda: client.page_runs(limit=7, after=first.next),
    ):
        plan = plans(read)
        assert "Merge Append" in plan, plan
        assert "ix_cyclone_runs_listing_state " in plan, plan
        assert "Seq Scan" not in plan, plan
    for read in (
        lambda: client.list_runs(workflow="big", limit=10),
        lambda: client.page_runs(workflow="other", limit=5, after=first.next),
    ):
        plan = plans(read)
        assert "Merge Append" in plan, plan
        assert "ix_cyclone_runs_listing_workflow_state" in plan, plan
        assert "Seq Scan" not in plan, plan


def test_a_key_is_looked_up_in_the_key_index(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    client = cyclone.Client(loaded)
    assert [r.key for r in client.page_runs(key="k42").runs] == ["k42", "k42"]
    plan = plans(lambda: client.page_runs(key="k42"))
    assert "idx_runs_submit_key" in plan, plan
    assert "Seq Scan" not in plan, plan


def test_the_claim_starts_runs_from_the_start_index_and_the_deadline_sweep_reads_its_own(
    loaded: sa.Engine, plans: Callable[[Callable[[], Any]], str]
) -> None:
    wf: cyclone.Workflow[Any] = cyclone.Workflow("big")
    wf.step("only")(lambda ctx, value: None)
    run = wf.submit(loaded, 1, deadline=timedelta(hours=1))
    worker = cyclone.Worker(loaded, workflows=[wf])
    plan = plans(worker.drain)
    assert run.status().state is cyclone.RunState.COMPLETED
    assert "ix_cyclone_runs_start" in plan, plan

    def expire() -> None:
        with loaded.begin() as conn:
            _rescue.expire_runs(conn)  # what the maintenance leader sends

    assert "ix_cyclone_runs_deadline" in plans(expire)


@pytest.mark.parametrize(
    ("table", "column"),
    [("cyclone_jobs", "run_id"), ("cyclone_signals", "run_id"), ("cyclone_runs", "parent_id")],
)
def test_a_purged_runs_rows_in_each_referencing_table_are_found_by_an_index(
    own_engine: sa.Engine, table: str, column: str
) -> None:
    """Deleting a run cascades to its jobs, signals and child runs through a query on the
    referencing column, planned once for any run (a generic plan, as the foreign key's
    trigger keeps it): an index must serve it, or a purge scans the table once per run."""
    with own_engine.connect() as conn:
        conn.execute(sa.text("SET plan_cache_mode = force_generic_plan"))
        conn.execute(sa.text("SET enable_seqscan = off"))
        conn.execute(
            sa.text(f"PREPARE cascade_of(uuid) AS DELETE FROM {table} WHERE {column} = $1")
        )
        plan = "\n".join(
            conn.execute(
                sa.text("EXPLAIN EXECUTE cascade_of('00000000-0000-0000-0000-000000000000')")
            ).scalars()
        )
        conn.rollback()
    assert "Seq Scan" not in plan, plan


def test_the_look_for_rates_of_earlier_definitions_steps_through_the_rated_jobs_index(
    own_engine: sa.Engine,
) -> None:
    """A worker's look for the Rates its definitions no longer give (after a deploy that
    kept a Concurrency and dropped the Rate given with it) reads one probe of
    ``ix_cyclone_jobs_rated`` per pair of a limit and a Rate that waiting jobs keep, not
    the jobs waiting under the limit, however many of them have no Rate."""
    with own_engine.begin() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_limits (name, max, per, counts) SELECT n, 10, NULL, "
                "'attempts' FROM unnest(ARRAY['kind:k0', 'kind:k1']) n UNION ALL SELECT n, 1, "
                "interval '1 day', 'starts' FROM unnest(ARRAY['kind:k0.r', 'kind:k1.r']) n"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_limit_keys (name, key) SELECT 'kind:k' || n, g::text "
                "FROM generate_series(0, 1) n, generate_series(0, 19) g UNION ALL "
                "SELECT 'kind:k' || n || '.r', '' FROM generate_series(0, 1) n"
            )
        )
        # The jobs of each kind enqueued after the deploy (without the Rate) sort first.
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, state, max_attempts, limit_name, limit_key,"
                " priority) SELECT 'k' || g % 2, 'available', 1, 'kind:k' || g % 2,"
                " (g % 20)::text, -1 FROM generate_series(1, 6000) g"
            )
        )
        conn.execute(
            sa.text(
                "INSERT INTO cyclone_jobs (kind, state, max_attempts, limit_name, limit_key,"
                " rate_name, rate_key) SELECT 'k' || g % 2, 'available', 1, 'kind:k' || g % 2,"
                " '0', 'kind:k' || g % 2 || '.r', '' FROM generate_series(1, 6) g"
            )
        )
    with own_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE cyclone_jobs"))
    served = _limits.Served(("k0",), ())
    gated = ("kind:k0", "kind:k1")
    with _executor.connect(own_engine) as conn:
        found = _limits.orphans(conn, served, gated, ())
        assert (found.gated, found.rates) == ((), ("kind:k0.r",))
        assert _limits.orphans(conn, served, gated, (), ("kind:k0.r",)).rates == ()
    waiting, _ = _limits.orphans_stmts(served, gated, (), ())
    compiled = _executor.Compiled(waiting)
    with own_engine.connect() as conn:
        plan = list(
            conn.exec_driver_sql(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + compiled.sql, compiled.defaults
            ).scalars()
        )
    shown = "\n".join(plan)
    # The pairs, stepped through by row comparison, and each pair's first served job.
    assert "Index Only Scan using ix_cyclone_jobs_rated" in shown, shown
    assert "Index Cond: ((limit_name = job_rates.n) AND (rate_name = job_rates.r))" in shown, shown
    # No sequential read of the jobs is made. The read of the first served job of a limit
    # name that the worker lacks (there is none here) may be planned as one that stops at
    # its first match: it is never executed here.
    read = [line for line in plan if "Seq Scan on cyclone_jobs" in line]
    assert all("never executed" in line for line in read), shown


def test_a_claim_reads_the_runs_of_its_jobs_by_id_not_by_a_scan_of_every_run(
    own_engine: sa.Engine,
) -> None:
    """On a table of some thousand runs, the planner hashed a record's few jobs against a
    scan of every run to lock their runs (here), and a claim's to join them (in the plan
    a worker kept through a drain of 1,667 three-step runs); each now reads the runs it
    needs by id, in the generic plan a worker's own connection keeps."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow("joined")
    wf.step("first")(lambda ctx, value: value)
    wf.step("second", after=["first"])(lambda ctx, value: None)
    wf.step("third", after=["second"])(lambda ctx, value: None)
    for start in range(0, 1667, 1000):
        wf.submit_once_many(
            own_engine, [(f"k{i}", i) for i in range(start, min(start + 1000, 1667))]
        )
    for plan in claim_plans(own_engine, wf, 3 * 1667):
        assert "Seq Scan on cyclone_runs" not in plan, plan


def _drained_once_then_submitted(engine: sa.Engine, name: str) -> cyclone.Workflow[Any]:
    """A two-step workflow whose 300 runs a worker drained, and 300 more waiting: the
    tables a worker's plans meet in the middle of its life, not on new tables."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(name)
    wf.step("first")(lambda ctx, value: value)
    wf.step("second", after=["first"])(lambda ctx, value: None)
    wf.submit_once_many(engine, [(f"a{i}", i) for i in range(300)])
    assert cyclone.Worker(engine, workflows=[wf]).drain() == 600
    wf.submit_once_many(engine, [(f"b{i}", i) for i in range(300)])
    return wf


def test_a_claim_updates_the_jobs_it_claims_by_id_not_by_a_scan_of_every_job(
    own_engine: sa.Engine,
) -> None:
    """A claim that serves workflows picked its jobs with ``id IN (...)``, which the
    planner hashed against a scan of every job on a table of some hundred jobs (the plan
    a worker made early in a drain on new tables, and kept until it planned again); it
    now finds them by id (:func:`cyclone._store.executor.among`) in the generic plan a
    worker's own connection keeps."""
    wf = _drained_once_then_submitted(own_engine, "picked")
    for plan in claim_plans(own_engine, wf, 600):
        claimed = cte_plan(plan, "claimed")
        assert "Update on cyclone_jobs" in claimed, plan
        assert "Seq Scan on cyclone_jobs" not in claimed, plan


def test_a_claimed_items_upstream_outputs_are_read_from_the_steps_index_not_its_runs_items(
    own_engine: sa.Engine,
) -> None:
    """A claimed step reads its upstream outputs by run, ``kind = ANY(deps)`` and ``item
    IS NULL``. Through ``ix_cyclone_jobs_run_id_kind`` (partial on ``item IS NULL``) that
    reads the run's steps alone; through ``ix_cyclone_jobs_run_id_kind_item`` it read
    every entry of the run's map items for each claimed item: without the first index,
    a map of 10,000 items ran in 5.3 s against 1.4 s (``bench.figures.map``)."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow("fanned")
    wf.step("first")(lambda ctx, value: value)
    wf.step("numbers", after=["first"])(lambda ctx, value: list(range(300)))
    wf.map(over="numbers", after=["first"])(lambda ctx, item: item)
    wf.submit(own_engine, 1)
    plans = claim_plans(own_engine, wf, 303)
    assert_upstream_read_from_the_steps_index(plans)


def test_a_sleep_after_a_map_reads_when_its_upstream_ended_from_the_steps_index(
    own_engine: sa.Engine,
) -> None:
    """A sleep node counts its duration from when its upstream steps ended: the latest
    ``finalized_at`` of its run's jobs by ``kind = ANY(deps)`` and ``item IS NULL``.
    Without ``item IS NULL`` the read could not use ``ix_cyclone_jobs_run_id_kind``
    (partial on it), and read every item of an upstream map node: a map of 5,000 items
    was a sequential scan of the jobs, 1.5 ms against 0.03."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow("napping")

    @wf.step()
    def numbers(ctx: cyclone.StepContext, value: int) -> list[int]:
        return list(range(300))

    @wf.map(over=numbers)
    def each(ctx: cyclone.StepContext, item: int) -> int:
        return item

    @wf.sleep(timedelta(hours=1), after=[each])
    def later(ctx: cyclone.StepContext, value: int) -> int:
        return value

    wf.submit(own_engine, 1)
    # The numbers, the 300 items and the map node run; the sleep node parks.
    plans = claim_plans(own_engine, wf, 302, marker="max(upstream.finalized_at)")
    assert_upstream_read_from_the_steps_index(plans)


def test_a_record_and_a_heartbeat_find_their_jobs_by_id_not_through_the_heartbeats_index(
    own_engine: sa.Engine,
) -> None:
    """The statements that find running jobs by id (a worker's record of its successes,
    its heartbeat, a hand-back) read the primary key, never the index of the heartbeats
    (cyclone_0028_heartbeat_index): every job that ran since the last vacuum leaves an
    entry there, which a bitmap scan reads whole. When it was partial on ``state =
    'running'``, the planner combined it with the lookup by id, or read it alone."""
    wf = _drained_once_then_submitted(own_engine, "beating")
    plans = claim_plans(own_engine, wf, 600, marker="done AS")
    leases = '[{"id": 1, "lease": 1}, {"id": 2, "lease": 1}]'
    with own_engine.connect() as conn:
        for build in (_rescue.heartbeat_stmt, _rescue.hand_back_stmt):
            compiled = _executor.Compiled(build())
            plans.append(generic_plan(conn, compiled.sql, {**compiled.defaults, "leases": leases}))
    for plan in plans:
        assert "ix_cyclone_jobs_heartbeat_at" not in plan, plan
        assert "Seq Scan on cyclone_jobs" not in plan, plan


def test_a_limited_claim_probes_a_key_for_its_first_due_job_not_every_job_waiting(
    own_engine: sa.Engine,
) -> None:
    """The claim of limited jobs finds the keys with a due job by probing each key's range
    of ``ix_cyclone_jobs_gated`` up to its first due job. Planned while few jobs waited,
    the ``EXISTS`` became a join that read every job waiting under the limit in each
    claim (and in its count of contended keys): a key with 10,000 jobs waiting was claimed
    from at under 300 jobs a second."""
    step = cyclone.step("probed", concurrency=cyclone.Concurrency(2))(lambda ctx, args: None)
    with own_engine.begin() as conn:
        for i in range(20):
            step.enqueue_tx(conn, i)
    sent: dict[str, Any] = {}

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "locked_front AS" in statement:
            sent[statement] = parameters

    sa.event.listen(own_engine, "before_cursor_execute", capture)
    try:
        assert cyclone.Worker(own_engine, steps=[step], concurrency=2).drain() == 20
    finally:
        sa.event.remove(own_engine, "before_cursor_execute", capture)
    assert sent
    with own_engine.begin() as conn:
        for i in range(400):
            step.enqueue_tx(conn, i)
    for statement, parameters in sent.items():
        with own_engine.connect() as conn:
            plan = generic_plan(conn, statement, parameters, analyze=True)
            conn.rollback()
        assert_probes(plan, r"cyclone_jobs [ae]")


def test_an_admission_probes_a_key_for_its_first_held_run_not_every_run_held(
    own_engine: sa.Engine,
) -> None:
    """The admission of runs held by their workflow's limit locks the keys with a held run
    due by probing each key's range of ``ix_cyclone_runs_held`` up to its first run (the
    ``EXISTS`` fenced as the limited claim's is): planned while few runs were held, it was
    a join that read every held run of the limit in each admission."""
    wf: cyclone.Workflow[Any] = cyclone.Workflow(
        "admitted", input=dict, concurrency=cyclone.Concurrency(1, key=lambda inp: "one")
    )
    wf.step("only")(lambda ctx, value: None)
    wf.submit_once_many(own_engine, [(f"a{i}", {"i": i}) for i in range(300)])
    compiled = _executor.Compiled(_limits.lock_held_keys_stmt(("workflow:admitted",), 32))
    with own_engine.connect() as conn:
        held = conn.execute(
            sa.text("SELECT count(*) FROM cyclone_runs WHERE start_at = 'infinity'")
        ).scalar_one()
        assert held >= 299
        plan = generic_plan(conn, compiled.sql, dict(compiled.defaults), analyze=True)
        conn.rollback()
    assert_probes(plan, r"cyclone_runs h")


def test_a_childs_delivery_probes_the_node_of_each_ended_child_not_every_parked_node(
    own_engine: sa.Engine,
) -> None:
    """The delivery that wakes the nodes of ended children, and the look for ended
    children whose node no longer waits, find each child's node (a map's item) by its key
    in ``ix_cyclone_jobs_run_id_kind_item`` or ``ix_cyclone_jobs_run_id_kind``. Their
    join on "the item is the child's, or both are NULL" (an OR) could use neither: the
    wake compared every parked item with every ended child, and the look scanned every
    waiting item once per child. A map of 3,000 children did not drain in ten minutes
    (the wake 0.6 to 1.2 s a call, the look up to 0.2 s)."""
    kid: cyclone.Workflow[Any] = cyclone.Workflow("kid")
    kid.step("only")(lambda ctx, value: None)
    parent: cyclone.Workflow[Any] = cyclone.Workflow("parent")
    parent.step("src")(lambda ctx, value: list(range(300)))
    parent.child(kid, over="src")(lambda ctx, item: item)
    parent.submit(own_engine, 1)
    # The items submit their children and park; the children run and end, unseen by
    # their items (the worker serving them serves no child node).
    cyclone.Worker(own_engine, workflows=[parent]).drain()
    assert cyclone.Worker(own_engine, workflows=[kid]).drain() == 300
    with own_engine.connect() as conn:
        for stmt in (_children.wake_stmt(), _children.forget_stmt()):
            compiled = _executor.Compiled(stmt)
            plan = generic_plan(conn, compiled.sql, dict(compiled.defaults), analyze=True)
            conn.rollback()
            # Each node probed by its key (a read of an alias of cyclone_jobs). The nodes
            # found are then updated by id (on a table this small, the planner may read
            # it whole for that).
            assert_probes(plan, r"cyclone_jobs \w+")


def assert_probes(plan: str, read: str) -> None:
    """Every node of ``plan`` (EXPLAIN ANALYZE) that reads ``read`` (a table and its alias,
    a pattern) returns at most one row a loop, as a probe that stops at its first row
    does, and there is at least one."""
    probes = re.findall(rf"on {read} .*actual rows=(\d+) loops=\d+", plan)
    assert probes, plan
    assert all(int(rows) <= 1 for rows in probes), plan


def claim_plans(
    engine: sa.Engine, wf: cyclone.Workflow[Any], steps: int, *, marker: str = "claimed"
) -> list[str]:
    """The generic plans of the statements holding ``marker`` (the claims) that a worker
    sends to drain ``wf``'s runs (``steps`` steps), after a ``VACUUM ANALYZE`` as
    autovacuum would make."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE cyclone_runs, cyclone_jobs"))
    sent: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if marker in statement and not statement.startswith("EXPLAIN"):
            sent.append((statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", capture)
    try:
        assert cyclone.Worker(engine, workflows=[wf]).drain() == steps
    finally:
        sa.event.remove(engine, "before_cursor_execute", capture)
    assert sent
    with engine.connect() as conn:
        return [generic_plan(conn, statement, parameters) for statement, parameters in sent]


def assert_upstream_read_from_the_steps_index(plans: list[str]) -> None:
    """Every read of ``upstream`` jobs in ``plans`` (there is one) goes through
    ``ix_cyclone_jobs_run_id_kind``: a run's steps, not its map items."""
    upstream = [
        line for plan in plans for line in plan.splitlines() if "on cyclone_jobs upstream" in line
    ]
    assert upstream, plans
    assert all("using ix_cyclone_jobs_run_id_kind on" in line for line in upstream), upstream


def cte_plan(plan: str, name: str) -> str:
    """The part of ``plan`` that computes the CTE ``name``: its line and those indented
    deeper that follow it."""
    lines = plan.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.strip() == f"CTE {name}"]
    depth = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and len(lines[end]) - len(lines[end].lstrip()) > depth:
        end += 1
    return "\n".join(lines[start:end])


_SQL_TYPES = {
    bool: "boolean",
    int: "bigint",
    float: "double precision",
    str: "text",
    type(None): "unknown",
    timedelta: "interval",
}


def generic_plan(
    conn: sa.Connection, statement: str, parameters: dict[str, Any], *, analyze: bool = False
) -> str:
    """The plan PostgreSQL keeps for ``statement`` prepared and planned generically, as a
    worker's own connection runs it (:class:`cyclone._store.executor.Held`), not the plan
    for these values that ``EXPLAIN`` of the statement gives. With ``analyze``, run in the
    caller's transaction, with the rows each node read."""
    names: list[str] = []

    def numbered(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", numbered, statement).replace("%%", "%")
    conn.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
    types = [_SQL_TYPES[type(parameters[name])] for name in names]
    typed = f" ({', '.join(types)})" if types else ""
    conn.exec_driver_sql(f"PREPARE generic{typed} AS {text}")
    driver = conn.connection.driver_connection
    args = ", ".join(
        f"CAST({psycopg.sql.Literal(parameters[name]).as_string(driver)} AS {t})"
        for name, t in zip(names, types, strict=True)
    )
    try:
        explain = "EXPLAIN (ANALYZE, TIMING OFF)" if analyze else "EXPLAIN"
        execute = f"EXECUTE generic({args})" if args else "EXECUTE generic"
        return "\n".join(conn.exec_driver_sql(f"{explain} {execute}").scalars())
    finally:
        conn.exec_driver_sql("DEALLOCATE generic")
