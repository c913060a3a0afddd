"""Figure f: the cost of a new key and of the worker's record-and-claim statement with
10k and with 1M completed runs in the tables, for cyclone and for raw.

It runs last: its million-row ``VACUUM ANALYZE`` leaves statistics (TRUNCATE keeps them)
that would misplan the rounds' statements.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import sqlalchemy as sa

import cyclone
from bench import capture, db, workloads
from bench.harness import Bench
from bench.report import human

CYCLES = 50
"""Claims timed per measure of the worker's statement."""

Captured = tuple[tuple[str, dict[str, Any]], tuple[str, dict[str, Any]]]
"""A worker's claim and record-and-claim statements, with their parameters."""

FILL_CYCLONE = """
WITH d AS (
    INSERT INTO cyclone_definitions (id, workflow, graph)
    VALUES (%(definition)s::uuid, 'bench_one', %(graph)s::jsonb) ON CONFLICT DO NOTHING
), r AS (
    INSERT INTO cyclone_runs (workflow, submit_key, input, definition, state,
        steps_remaining, created_at, finalized_at)
    SELECT 'bench_one', 'filler-' || g,
        jsonb_build_object('order', g, 'amount', 4200, 'currency', 'EUR'),
        %(definition)s::uuid, 'completed', 0,
        now() - interval '1 day', now() - interval '1 day'
    FROM generate_series(%(lo)s::int, %(hi)s::int) g
    RETURNING id, workflow, input, created_at, finalized_at
)
INSERT INTO cyclone_jobs (run_id, workflow, kind, queue, priority, state, deps,
    pending_deps, attempt, max_attempts, output, created_at, scheduled_at,
    attempted_at, finalized_at)
SELECT id, workflow, 'only', 'default', 0, 'completed', '{}', 0, 1, 3, 'null',
    created_at, created_at, created_at, finalized_at
FROM r
"""

FILL_RAW = """
WITH r AS (
    INSERT INTO raw_runs (workflow, submit_key, input, state, created_at)
    SELECT 'bench_one', 'filler-' || g,
        jsonb_build_object('order', g, 'amount', 4200, 'currency', 'EUR'),
        'completed', now() - interval '1 day'
    FROM generate_series(%(lo)s::int, %(hi)s::int) g
    RETURNING input
)
INSERT INTO raw_jobs (kind, state, args, output, attempt, finalized_at)
SELECT 'noop', 'completed', input, 'null', 1, now() FROM r
"""


def fig_f(bench: Bench) -> None:
    """Each measure ``rounds`` times at each size; the goal compares 1M with 10k."""
    small, large = bench.sizes.small, bench.sizes.large
    label_s, label_l = human(small), human(large)
    bench.reset()
    measured: dict[int, dict[str, list[float]]] = {}
    claim: Captured | None = None
    have = 0
    for size in (small, large):
        t0 = time.perf_counter()
        fill(bench, have, size)
        have = size
        bench.sql("VACUUM ANALYZE")
        print(f"  f: filled to {human(size)} runs in {time.perf_counter() - t0:.0f} s")
        got: dict[str, list[float]] = {k: [] for k in ("sub", "raw_sub", "claim", "raw_claim")}
        for r in range(bench.rounds):
            if claim is None:
                claim = capture_claim(bench)
            got["claim"].append(claim_us(bench, claim))
            got["raw_claim"].append(raw_claim_us(bench))
            got["sub"].append(submit_us(bench, f"f{size}-{r}"))
            got["raw_sub"].append(raw_submit_us(bench, f"fr{size}-{r}"))
            settle_submitted(bench)
        measured[size] = got
    for what, title, unit in (
        ("sub", "submit_once new key", "us/call"),
        ("claim", "worker claim+complete, 10 jobs", "us/batch"),
    ):
        at_small = bench.fig(f"f-{what}-small", f"{title} @ {label_s} runs", unit, False)
        at_small.cyclone = measured[small][what]
        at_small.raw = measured[small][f"raw_{what}"]
        at_large = bench.fig(
            f"f-{what}-large",
            f"{title} @ {label_l} runs",
            unit,
            False,
            goal=1.3,
            goal_text=f"<= 1.3x cyclone @ {label_s}",
        )
        at_large.cyclone = measured[large][what]
        at_large.raw = measured[large][f"raw_{what}"]
        at_large.goal_base = at_small.cyclone


def fill(bench: Bench, lo: int, hi: int) -> None:
    """Completed runs ``lo`` to ``hi`` (one completed job each), cyclone's and raw's."""
    plan = workloads.one_step.plan()
    chunk = 200_000
    for start in range(lo, hi, chunk):
        end = min(hi, start + chunk)
        bench.sql(
            FILL_CYCLONE, graph=plan.graph, definition=str(plan.definition), lo=start, hi=end - 1
        )
        bench.sql(FILL_RAW, lo=start, hi=end - 1)


def settle_submitted(bench: Bench) -> None:
    """Finish the runs :func:`submit_us` made, as a worker serving them would.

    Left waiting, they would sit in the index of runs to start (or, as jobs, at the
    head of the claim index) for the next figures; the raw submits leave nothing
    behind.
    """
    bench.sql(
        "UPDATE cyclone_jobs SET state = 'completed', attempt = 1, finalized_at = now() "
        "WHERE workflow = 'bench_one' AND state IN ('available', 'blocked')"
    )
    bench.sql(
        "UPDATE cyclone_runs SET start_at = NULL, state = 'completed', steps_remaining = 0, "
        "finalized_at = now() WHERE workflow = 'bench_one' AND start_at IS NOT NULL"
    )


def submit_us(bench: Bench, prefix: str) -> float:
    """Microseconds per new-key ``submit_once``, after 20 untimed."""
    n = bench.sizes.grow_ops
    for i in range(20):
        workloads.one_step.submit_once(bench.engine, f"{prefix}-w{i}", workloads.payload(i))
    t0 = time.perf_counter()
    for i in range(n):
        workloads.one_step.submit_once(bench.engine, f"{prefix}-{i}", workloads.payload(i))
    return (time.perf_counter() - t0) / n * 1e6


def raw_submit_us(bench: Bench, prefix: str) -> float:
    """Microseconds per raw new-key insert, after 20 untimed."""
    n = bench.sizes.grow_ops
    with bench.raw_conn() as conn:
        for i in range(20):
            conn.execute(workloads.RAW_INSERT_ONCE, ("bench_one", f"{prefix}-w{i}", "{}"))
        t0 = time.perf_counter()
        for i in range(n):
            conn.execute(
                workloads.RAW_INSERT_ONCE,
                ("bench_one", f"{prefix}-{i}", json.dumps(workloads.payload(i))),
            ).fetchone()
        return (time.perf_counter() - t0) / n * 1e6


def capture_claim(bench: Bench) -> Captured:
    """The statements a Worker sends, captured through SQLAlchemy's cursor events from a
    drain of 20 jobs with ``concurrency=10`` (see bench/capture.py)."""
    db.enqueue_noops(bench.dsn, 20)
    probe = sa.create_engine(bench.engine.url, poolclass=sa.NullPool)
    try:
        with capture.captured(probe) as seen:
            cyclone.Worker(probe, steps=[workloads.noop], concurrency=10).drain()
        return capture.first(seen, capture.CLAIM), capture.first(seen, capture.RECORD_AND_CLAIM)
    finally:
        probe.dispose()


def claim_us(bench: Bench, claim: Captured) -> float:
    """The worker's cycle: one statement records the last batch's outcomes and claims 10;
    its median in microseconds."""
    (claim_sql, claim_params), (record_sql, record_params) = claim
    db.enqueue_noops(bench.dsn, CYCLES * 10 + 10)
    me = f"bench-{os.getpid()}"
    rows: list[Any] = []
    times = []
    with bench.raw_conn() as conn:
        for i in range(CYCLES + 1):
            t0 = time.perf_counter()
            if i == 0:
                rows = conn.execute(claim_sql, {**claim_params, "me": me}).fetchall()
            else:
                params = {**record_params, "me": me, "items": capture.items(rows)}
                rows = conn.execute(record_sql, params).fetchall()
            times.append(time.perf_counter() - t0)
        params = {**record_params, "me": me, "items": capture.items(rows)}
        conn.execute(record_sql.replace("LIMIT 10", "LIMIT 0"), params).fetchall()
    return statistics.median(times[1:]) * 1e6


def raw_claim_us(bench: Bench) -> float:
    """Raw's cycle (claim 10, mark them done); its median in microseconds."""
    db.enqueue_raw_noops(bench.dsn, CYCLES * 10)
    times = []
    with bench.raw_conn() as conn:
        for _ in range(CYCLES):
            t0 = time.perf_counter()
            rows = conn.execute(workloads.RAW_CLAIM, (10,)).fetchall()
            conn.execute(workloads.RAW_COMPLETE, ([row[0] for row in rows],))
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6
