"""A Worker's drain: ``bench.profile drain`` and ``drain-wf`` (pyinstrument of
``Worker.drain()``), and ``bench.profile start`` (a drain's fixed cost)."""

from __future__ import annotations

import statistics
import time

import sqlalchemy as sa

import cyclone
from bench import db, workloads


def profile_drain(engine: sa.Engine, n: int, what: str, concurrency: int) -> None:
    """A pyinstrument profile of ``Worker.drain()``'s loop thread (the caller's)."""
    from pyinstrument import Profiler

    if what == "jobs":
        db.enqueue_noops(engine.url, n)
        w = cyclone.Worker(engine, steps=[workloads.noop], concurrency=concurrency, sweep=False)
    else:
        items = [(f"p{i}", workloads.payload(i)) for i in range(n // 3)]
        workloads.three_step.submit_once_many(engine, items)
        w = cyclone.Worker(
            engine, workflows=[workloads.three_step], concurrency=concurrency, sweep=False
        )
    db.analyze(engine.url, "cyclone_jobs, cyclone_runs")  # as autovacuum would after a bulk load
    profiler = Profiler(interval=0.0002)
    profiler.start()
    t0 = time.perf_counter()
    ran = w.drain()
    wall = time.perf_counter() - t0
    profiler.stop()
    print(f"wall {wall:.3f} s for {ran} jobs: {wall / ran * 1e6:.0f} us each; {w.stats}")
    print(profiler.output_text(unicode=False, color=False, show_all=False))


def start(engine: sa.Engine, n: int) -> None:
    """A drain's fixed cost, which figure d's 5,000-job drains include, against its rate.

    ``drain()`` of an empty queue ``n`` times (the maintenance passes before and after,
    the worker's own connections), then drains of 5,000 and of 50,000 no-op jobs (inserted
    with ``generate_series``, then ANALYZEd as in figure d), twice each, in one process.
    """
    worker = cyclone.Worker(engine, steps=[workloads.noop], concurrency=4, sweep=False)
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        assert worker.drain() == 0
        took.append(time.perf_counter() - t0)
    print(f"drain() of an empty queue: median {statistics.median(took) * 1e3:.1f} ms of {n}")
    for jobs in (5_000, 50_000, 5_000, 50_000):
        db.truncate(engine.url, "cyclone_jobs, cyclone_runs CASCADE")
        db.enqueue_noops(engine.url, jobs)
        db.analyze(engine.url, "cyclone_jobs, cyclone_runs")
        t0 = time.perf_counter()
        assert worker.drain() == jobs
        wall = time.perf_counter() - t0
        print(f"drain() of {jobs:,} jobs: {wall * 1e3:,.0f} ms, {jobs / wall:,.0f} jobs/s")
