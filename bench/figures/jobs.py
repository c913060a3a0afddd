"""Figures d and h: a Worker draining pre-enqueued no-op jobs and workflow steps, in
spawned processes, beside the raw SKIP LOCKED loop (``bench.procs.raw_drain``).

Each bulk load is ANALYZEd before its drain, as autovacuum would (it is off on the bench
server; without statistics the claim's cached plan reads and sorts the whole backlog).
"""

from __future__ import annotations

from bench import db, measure, procs, workloads
from bench.harness import Bench

RAW_LABEL = "raw SKIP LOCKED, 10/claim"
FOREIGN = 25_000
"""Queued jobs of a kind no worker serves, ahead of figure d's reference drain."""
WORKER_COUNTS = (1, 2, 4)
"""Figure h's worker processes."""


def raw_rate(bench: Bench, n: int, nproc: int) -> float:
    """Jobs/s of the raw loop in ``nproc`` processes over ``n`` freshly inserted jobs."""
    db.enqueue_raw_noops(bench.dsn, n)
    bench.analyze()
    rate, done = bench.drain(procs.raw_drain, (bench.dsn, 10), nproc)
    measure.expect(done, n, "raw drain")
    return rate


def cyclone_rate(bench: Bench, what: str, wanted: int, nproc: int) -> float:
    """Jobs/s of ``nproc`` Worker processes draining ``what`` ("jobs" or "workflow")."""
    bench.analyze()
    rate, done = bench.drain(procs.cyclone_drain, (bench.sa_url, what, bench.concurrency), nproc)
    measure.expect(done, wanted, f"cyclone {what} drain")
    return rate


def submit_three_step(bench: Bench, prefix: str, steps: int) -> int:
    """Submit enough 3-step runs for ``steps`` steps (keys ``prefix-i``, in batches of
    1,000); how many runs."""
    runs = (steps + 2) // 3
    items = [(f"{prefix}-{i}", workloads.payload(i)) for i in range(runs)]
    for start in range(0, runs, 1000):
        workloads.three_step.submit_once_many(bench.engine, items[start : start + 1000])
    return runs


def fig_d(bench: Bench, r: int) -> None:
    """5,000 no-op jobs, and 3-step runs, drained by 1 and 2 processes; one reference
    drain behind a foreign backlog."""
    n = bench.sizes.jobs
    for nproc in (1, 2):
        jobs = bench.fig(
            f"d-jobs-{nproc}p",
            f"worker, no-op jobs, {nproc} proc",
            "jobs/s",
            True,
            raw_label=RAW_LABEL,
            goal=1.0 if nproc == 1 else None,
            goal_text=">= 1.0x raw" if nproc == 1 else "",
        )
        steps = bench.fig(
            f"d-wf-{nproc}p",
            f"worker, 3-step wf steps, {nproc} proc",
            "steps/s",
            True,
            raw_label=RAW_LABEL,
            goal=0.8 if nproc == 1 else None,
            goal_text=">= 0.8x raw" if nproc == 1 else "",
        )
        jobs.raw.append(raw_rate(bench, n, nproc))
        steps.raw = jobs.raw
        db.enqueue_noops(bench.dsn, n)
        jobs.cyclone.append(cyclone_rate(bench, "jobs", n, nproc))
        runs = submit_three_step(bench, f"d{nproc}-{r}", n)
        steps.cyclone.append(cyclone_rate(bench, "workflow", runs * 3, nproc))
    # Reference (no goal): the same 1-process drain behind a backlog of another kind.
    behind = bench.fig(
        "d-jobs-foreign",
        f"  ref: no-op jobs, 1 proc, {FOREIGN:,} others' jobs queued",
        "jobs/s",
        True,
        raw_label=RAW_LABEL,
    )
    behind.raw = bench.figures["d-jobs-1p"].raw
    db.enqueue_noops(bench.dsn, FOREIGN, kind="bench.foreign")
    db.enqueue_noops(bench.dsn, n)
    behind.cyclone.append(cyclone_rate(bench, "jobs", n, 1))


def fig_h(bench: Bench) -> None:
    """Worker throughput with 1, 2 and 4 processes on a backlog of no-op jobs; and one
    process on a backlog of 3-step runs as many steps, beside the 1-process raw loop:
    figure d's 5,001 steps in a fresh process weigh its start (compiling, planning, the
    maintenance passes) against a drain of a third of a second; here it weighs little."""
    n = bench.sizes.backlog
    for nproc in WORKER_COUNTS:
        f = bench.fig(
            f"h-{nproc}p",
            f"worker, {n:,} no-op jobs backlog, {nproc} proc",
            "jobs/s",
            True,
            raw_label=RAW_LABEL,
        )
        bench.reset()
        f.raw.append(raw_rate(bench, n, nproc))
        db.enqueue_noops(bench.dsn, n)
        f.cyclone.append(cyclone_rate(bench, "jobs", n, nproc))
        print(f"  h {nproc} proc: cyclone {f.cyclone[-1]:,.0f}, raw {f.raw[-1]:,.0f} jobs/s")
    bench.reset()
    runs = submit_three_step(bench, "h", n)
    steps = bench.fig(
        "h-wf-1p",
        f"worker, {runs * 3:,} steps backlog (3-step runs), 1 proc",
        "steps/s",
        True,
        raw_label=RAW_LABEL,
    )
    steps.raw = bench.figures["h-1p"].raw
    steps.cyclone.append(cyclone_rate(bench, "workflow", runs * 3, 1))
    print(f"  h workflow steps, 1 proc: cyclone {steps.cyclone[-1]:,.0f} steps/s")
