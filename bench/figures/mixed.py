"""Figure i: paced submitters and serving workers together for a minute, from empty
tables: submits/s, steps/s, and submit -> finished as the server's clock saw it.

The tables grow from empty while the workers run, so they are ANALYZEd every 10 s as
autovacuum would (it is off on the bench server): a worker's generic plans made on the
empty tables would otherwise read whole tables for the rest of the run.
"""

from __future__ import annotations

import contextlib
import queue
import time
from typing import Any

from bench import measure, procs
from bench.harness import Bench

MIXED_SUBMITTERS = 4
MIXED_WORKERS = 2
MIXED_ANALYZE_EVERY = 10.0
"""Seconds between figure i's ANALYZEs of its growing tables."""

OUTCOME = """
WITH w AS (SELECT min(created_at) AS lo, max(created_at) AS hi FROM cyclone_runs)
SELECT
    (SELECT count(*) FROM cyclone_jobs, w WHERE finalized_at BETWEEN w.lo AND w.hi)
        / extract(epoch FROM (SELECT hi - lo FROM w)),
    percentile_cont(0.5) WITHIN GROUP (
        ORDER BY extract(epoch FROM finalized_at - created_at)),
    percentile_cont(0.99) WITHIN GROUP (
        ORDER BY extract(epoch FROM finalized_at - created_at)),
    count(*) FILTER (WHERE finalized_at IS NULL),
    count(*) FILTER (WHERE state <> 'completed')
FROM cyclone_runs
"""
"""Steps/s while submits ran, p50 and p99 of submit -> finished, runs unfinished, not completed."""


def fig_i(bench: Bench) -> None:
    """Submitters and workers together: submits/s, steps/s, p50/p99 submit -> finished."""
    seconds = bench.sizes.mixed_seconds
    rate = bench.sizes.mixed_rate
    label = f"{MIXED_SUBMITTERS} submitters at {rate:,.0f}/s total + {MIXED_WORKERS} workers"
    subs = bench.fig("i-submits", f"mixed {seconds:g} s: submits", "submits/s", True, raw_label="")
    steps = bench.fig("i-steps", f"mixed {seconds:g} s: steps", "steps/s", True, raw_label="")
    p50 = bench.fig("i-p50", "mixed: submit -> finished, median", "ms", False, raw_label="")
    p99 = bench.fig("i-p99", "mixed: submit -> finished, p99", "ms", False, raw_label="")
    for f in (subs, steps, p50, p99):
        f.extra["setup"] = label
    bench.reset()
    start = bench.mp.Event()
    stop = bench.mp.Event()
    wout: Any = bench.mp.Queue()
    workers = [
        bench.mp.Process(
            target=procs.serving_worker, args=(bench.sa_url, bench.concurrency, start, stop, wout)
        )
        for _ in range(MIXED_WORKERS)
    ]
    sout: Any = bench.mp.Queue()
    submitters = [
        bench.mp.Process(
            target=procs.paced_submitter,
            args=(bench.sa_url, f"i-{p}", rate / MIXED_SUBMITTERS, seconds, start, sout),
        )
        for p in range(MIXED_SUBMITTERS)
    ]
    for p in (*workers, *submitters):
        p.start()
    try:
        measure.ready(wout, len(workers))
        measure.ready(sout, len(submitters))
        start.set()
        analyzed = time.monotonic()

        def autovacuum() -> None:
            nonlocal analyzed
            if time.monotonic() - analyzed >= MIXED_ANALYZE_EVERY:
                bench.analyze()
                analyzed = time.monotonic()

        results: list[Any] = []
        deadline = time.monotonic() + seconds + 600
        while len(results) < len(submitters):
            if time.monotonic() > deadline:
                raise TimeoutError("figure i: the submitters did not report")
            with contextlib.suppress(queue.Empty):
                results.append(sout.get(timeout=1.0)[1])
            autovacuum()
        total = sum(res[2] for res in results)
        deadline = time.monotonic() + 600
        with bench.raw_conn() as conn:
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT count(*) FROM cyclone_runs WHERE finalized_at IS NULL"
                ).fetchone()
                if row is not None and row[0] == 0:
                    break
                time.sleep(0.5)
                autovacuum()
    finally:
        stop.set()
        measure.stop((*workers, *submitters), timeout=60)
    t0 = min(res[0] for res in results)
    t1 = max(res[1] for res in results)
    subs.cyclone.append(total / (t1 - t0))
    with bench.raw_conn() as conn:
        row = conn.execute(OUTCOME).fetchone()
    assert row is not None
    steps.cyclone.append(float(row[0]))
    p50.cyclone.append(float(row[1]) * 1000)
    p99.cyclone.append(float(row[2]) * 1000)
    subs.extra["runs"] = total
    subs.extra["unfinished"] = int(row[3])
    subs.extra["not_completed"] = int(row[4])
    print(
        f"  i: {subs.cyclone[-1]:,.0f} submits/s, {steps.cyclone[-1]:,.0f} steps/s, "
        f"p50 {p50.cyclone[-1]:.1f} ms, p99 {p99.cyclone[-1]:.1f} ms ({total:,} runs)"
    )
