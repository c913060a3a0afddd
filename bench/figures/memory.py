"""Figure j: one Worker process's resident memory after 10k, after 100k no-op jobs, and
after 10k failing jobs more (each an error record and a logged traceback)."""

from __future__ import annotations

from typing import Any

from bench import db, measure, procs
from bench.harness import Bench


def fig_j(bench: Bench) -> None:
    """A worker's RSS after 10k no-op jobs, after 100k, and after 10k failing ones more."""
    n = bench.sizes.memory_jobs
    first = bench.fig("j-10k", f"worker RSS after {n:,} no-op jobs", "MB", False, raw_label="")
    goal: dict[str, Any] = {"goal": 1.1, "goal_text": f"<= 1.1x RSS after {n:,}"}
    many = bench.fig(
        "j-100k", f"worker RSS after {10 * n:,} no-op jobs", "MB", False, raw_label="", **goal
    )
    failing = bench.fig("j-fail", f"  + {n:,} failing jobs", "MB", False, raw_label="", **goal)
    many.goal_base = failing.goal_base = first.cyclone
    bench.reset()
    commands: Any = bench.mp.Queue()
    out: Any = bench.mp.Queue()
    proc = bench.mp.Process(
        target=procs.memory_worker, args=(bench.sa_url, bench.concurrency, commands, out)
    )
    proc.start()

    def drain(kind: str, attempts: int) -> float:
        db.enqueue_noops(bench.dsn, n, kind=kind, max_attempts=attempts)
        bench.analyze()
        commands.put("drain")
        what, (_done, rss) = out.get(timeout=1200)
        assert what == "rss"
        db.truncate(bench.dsn, db.CYCLONE_TABLES)
        return float(rss)

    try:
        (start_rss,) = measure.ready(out, 1)
        first.extra["rss_at_start"] = start_rss
        rss = drain("bench.noop", 3)
        first.cyclone.append(rss)
        trail = [rss]
        for _ in range(9):
            rss = drain("bench.noop", 3)
            trail.append(rss)
        many.cyclone.append(rss)
        many.extra["after_each_10k"] = trail
        failing.cyclone.append(drain("bench.fail", 1))
        commands.put("stop")
    finally:
        measure.stop([proc], timeout=60)
    print(
        f"  j: RSS start {start_rss:.1f} MB, after {n:,} {first.cyclone[-1]:.1f}, "
        f"after {10 * n:,} {many.cyclone[-1]:.1f}, + {n:,} failing {failing.cyclone[-1]:.1f}"
    )
