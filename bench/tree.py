"""Cancelling, retrying and purging a large tree of child runs (docs/children.md).

Run by hand: ``python -m bench.tree [--width N] [--depth 1|2] [--running N] [--how H]
[--submitters N] [--url URL]``. It creates a throwaway database and builds the tree the
way an operator meets it: a root run whose map of children (``@wf.child(..., over=)``)
submits one child run per item, ``--width`` items (``--depth 2``: each child is itself a
map of ``--width2`` children), by a Worker serving the root's (and the middle) workflow.
The leaves' one step is served by another Worker, ``--running`` steps of it running (held
on an event) when the root is cancelled; the other leaves' steps wait, available.

With ``--submitters`` threads submitting new keys (``submit_once``) and a Worker running
their one-step runs all along, it times the cancel of the root (``--how``: ``handle``,
``run.cancel()`` as ``cyclone runs cancel RUN_ID`` calls it, or ``bulk``,
``Client.cancel_runs(workflow=root)`` as ``cyclone runs cancel --all --workflow`` does),
counting its statements and transactions at the driver and its Python allocations
(tracemalloc's peak), and reports the submits' latency and the unrelated runs' latency
from submit to end (``finalized_at - created_at``) before and during it. Then it releases
the held steps, checks that no run of the tree is left running and that no finished run
keeps a job available, blocked or running, and times ``run.retry()`` of the root, a
second cancel, and ``Client.purge_terminal_runs`` of the tree. The result is written to
``tree.json`` in ``bench/results`` (or ``CYCLONE_BENCH_RESULTS``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.engine import make_url

import cyclone
from bench import db, workloads
from bench.purge import Submitters
from bench.results import RESULTS
from bench.statements import counted_engine, counting

RELEASE = threading.Event()
"""Set to let the leaves' held steps end."""

leaf: cyclone.Workflow[int] = cyclone.Workflow("bench_tree_leaf", input=int)


@leaf.step()
def hold(ctx: cyclone.StepContext, value: int) -> None:
    RELEASE.wait(600)


middle: cyclone.Workflow[int] = cyclone.Workflow("bench_tree_middle", input=int)


@middle.step()
def middle_items(ctx: cyclone.StepContext, width: int) -> list[int]:
    return list(range(width))


@middle.child(leaf, over=middle_items)
def middle_leaves(ctx: cyclone.StepContext, item: int) -> int:
    return item


root1: cyclone.Workflow[dict[str, int]] = cyclone.Workflow("bench_tree_root1", input=dict)


@root1.step()
def root1_items(ctx: cyclone.StepContext, shape: dict[str, int]) -> list[int]:
    return list(range(shape["width"]))


@root1.child(leaf, over=root1_items)
def root1_leaves(ctx: cyclone.StepContext, item: int) -> int:
    return item


root2: cyclone.Workflow[dict[str, int]] = cyclone.Workflow("bench_tree_root2", input=dict)


@root2.step()
def root2_items(ctx: cyclone.StepContext, shape: dict[str, int]) -> list[dict[str, int]]:
    return [{"width": shape["width2"]} for _ in range(shape["width"])]


@root2.child(middle, over=root2_items)
def root2_middles(ctx: cyclone.StepContext, item: dict[str, int]) -> int:
    return item["width"]


TREE = """
    WITH RECURSIVE tree AS (
        SELECT id FROM cyclone_runs WHERE id = %(root)s
        UNION ALL
        SELECT r.id FROM cyclone_runs r JOIN tree ON r.parent_id = tree.id
    )
"""


def tree_states(dsn: str, root: str) -> dict[str, int]:
    """The runs of the tree by state."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            TREE + "SELECT r.state, count(*) FROM cyclone_runs r JOIN tree USING (id) "
            "GROUP BY r.state",
            {"root": root},
        ).fetchall()
    return {str(state): int(n) for state, n in rows}


def live_jobs_of_finished_runs(dsn: str) -> int:
    """Jobs available, blocked or running in a finished run: the invariants of
    tests/support/invariants.py, none of which may hold once the workers stopped."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM cyclone_runs r JOIN cyclone_jobs j ON j.run_id = r.id "
            "WHERE r.state IN ('completed', 'failed', 'cancelled') "
            "AND j.state IN ('available', 'blocked', 'running')"
        ).fetchone()
    assert row is not None
    return int(row[0])


def count(dsn: str, statement: str, **params: Any) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(statement, params or None).fetchone()
    assert row is not None
    return int(row[0])


def until(predicate: Callable[[], bool], what: str, timeout: float = 600) -> float:
    """Poll the database until ``predicate`` holds; seconds waited."""
    t0 = time.perf_counter()
    while not predicate():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(what)
        time.sleep(0.05)
    return time.perf_counter() - t0


class Analyzing:
    """ANALYZE the runs and jobs tables every few seconds while the tree grows: a server
    without autovacuum (a test server) would plan the tree's statements on the statistics
    of empty tables."""

    def __init__(self, dsn: str, every: float = 5.0) -> None:
        self.dsn, self.every = dsn, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.analyze, daemon=True)

    def analyze(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.wait(self.every):
                conn.execute("ANALYZE cyclone_runs")
                conn.execute("ANALYZE cyclone_jobs")

    def __enter__(self) -> Analyzing:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def serve(worker: cyclone.Worker) -> threading.Thread:
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return thread


def unrelated_latency(dsn: str, t0: float, t1: float, wall0: float) -> dict[str, float]:
    """Submit-to-end latency (ms) of the unrelated runs submitted in [t0, t1) (perf_counter
    times, ``wall0`` the epoch time of perf_counter's 0)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT extract(epoch FROM finalized_at - created_at) FROM cyclone_runs "
            "WHERE workflow = 'bench_one' AND finalized_at IS NOT NULL "
            "AND created_at >= to_timestamp(%(a)s) AND created_at < to_timestamp(%(b)s) "
            "ORDER BY 1",
            {"a": wall0 + t0, "b": wall0 + t1},
        ).fetchall()
    lat = [float(r[0]) for r in rows]
    if not lat:
        return {"runs": 0}
    return {
        "runs": len(lat),
        "end_p50_ms": lat[len(lat) // 2] * 1e3,
        "end_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3,
        "end_max_ms": lat[-1] * 1e3,
    }


def timed(engine: sa.Engine, action: Callable[[], object]) -> tuple[dict[str, float], object]:
    """Run ``action`` counting statements, transactions and Python allocations."""
    tracemalloc.start()
    t0 = time.perf_counter()
    with counting(engine) as c:
        got = action()
    took = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "seconds": took,
        "statements": float(sum(c.kinds.values())),
        "transactions": float(c.commits),
        "python_peak_kb": peak / 1024,
        **{f"  {kind}": float(n) for kind, n in sorted(c.kinds.items())},
    }, got


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.tree", description=__doc__)
    p.add_argument("--width", type=int, default=10_000, help="children of the root")
    p.add_argument("--depth", type=int, choices=(1, 2), default=1)
    p.add_argument("--width2", type=int, default=100, help="children of each child (depth 2)")
    p.add_argument("--running", type=int, default=4, help="leaf steps running at the cancel")
    p.add_argument("--how", choices=("handle", "bulk"), default="handle")
    p.add_argument("--submitters", type=int, default=2, help="threads submitting meanwhile")
    p.add_argument("--phase", type=float, default=3.0, help="seconds measured before")
    p.add_argument("--url", default=os.environ.get("CYCLONE_DATABASE_URL", db.DEFAULT_URL))
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    args = parse_args(argv)
    admin = make_url(args.url)
    url = db.create_database(admin, "cyclone_tree")
    result: dict[str, Any] = {"args": vars(args)}
    try:
        db.upgrade(url)
        dsn = db.conninfo(url)
        engine = counted_engine(url, pool_size=12)
        plain = sa.create_engine(url, pool_size=args.submitters + args.running + 8)
        root_wf = root1 if args.depth == 1 else root2
        served: list[cyclone.Workflow[Any]] = [root_wf] if args.depth == 1 else [root_wf, middle]
        size = args.width * (1 if args.depth == 1 else args.width2 + 1)
        # The tree, made by a worker as in production.
        t0 = time.perf_counter()
        run = root_wf.submit(engine, {"width": args.width, "width2": args.width2})
        builder = cyclone.Worker(engine, workflows=served, concurrency=4, sweep=False)
        with Analyzing(dsn):
            builder.drain()
        result["build_s"] = time.perf_counter() - t0
        made = count(dsn, "SELECT count(*) FROM cyclone_runs WHERE workflow = 'bench_tree_leaf'")
        print(f"built a tree of {made:,} leaves ({size + 1:,} runs) in {result['build_s']:.0f} s")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE cyclone_runs")
            conn.execute("VACUUM ANALYZE cyclone_jobs")
        # Leaves running on a worker.
        holder = cyclone.Worker(plain, workflows=[leaf], concurrency=args.running, sweep=False)
        holding = serve(holder)
        until(
            lambda: (
                count(dsn, "SELECT count(*) FROM cyclone_jobs WHERE state = 'running'")
                >= args.running
            ),
            "leaf steps running",
        )
        # Unrelated work all along: submitters and a worker running their runs.
        other = cyclone.Worker(plain, workflows=[workloads.one_step], concurrency=2, sweep=False)
        other_thread = serve(other)
        wall0 = time.time() - time.perf_counter()
        client = cyclone.Client(engine)
        with Submitters(plain, args.submitters) as live:
            b0 = time.perf_counter()
            live.stop.wait(args.phase)
            b1 = time.perf_counter()
            if args.how == "handle":
                figures, _ = timed(engine, run.cancel)
            else:
                figures, _ = timed(engine, lambda: client.cancel_runs(workflow=root_wf))
            c1 = time.perf_counter()
            live.stop.wait(1.0)
        until(
            lambda: (
                count(
                    dsn,
                    "SELECT count(*) FROM cyclone_runs WHERE workflow = "
                    "'bench_one' AND state = 'running'",
                )
                == 0
            ),
            "unrelated runs",
        )
        phases = {
            "before": {**live.between(b0, b1), **unrelated_latency(dsn, b0, b1, wall0)},
            "cancel": {**live.between(b1, c1), **unrelated_latency(dsn, b1, c1, wall0)},
        }
        result["cancel"] = figures
        result["phases"] = phases
        print(
            f"cancel ({args.how}) of a tree of {size + 1:,} runs: {figures['seconds']:.2f} s, "
            f"{figures['statements']:.0f} statements, {figures['transactions']:.0f} "
            f"transactions, Python peak {figures['python_peak_kb']:,.0f} KiB"
        )
        print("  statements:", {k.strip(): v for k, v in figures.items() if k.startswith(" ")})
        for name, phase in phases.items():
            print(
                f"  {name:>7}: submits/s {phase['submits_per_s']:7,.0f}  "
                f"p50 {phase['p50_ms']:6.2f} ms  p99 {phase['p99_ms']:7.2f} ms  "
                f"max {phase['max_ms']:8.1f} ms; unrelated runs' submit to end: "
                f"{phase.get('runs', 0)} runs, p50 {phase.get('end_p50_ms', 0):.1f} ms, "
                f"max {phase.get('end_max_ms', 0):.1f} ms"
            )
        states = tree_states(dsn, str(run.id))
        RELEASE.set()
        holder.stop()
        holding.join()
        other.stop()
        other_thread.join()
        result["after_cancel"] = {
            "tree": states,
            "live_jobs_in_finished_runs": live_jobs_of_finished_runs(dsn),
        }
        print(
            f"  tree after the cancel: {states}; live jobs in finished runs: "
            f"{result['after_cancel']['live_jobs_in_finished_runs']}"
        )
        # Retry the root: the items retry their children as a worker claims them.
        figures, _ = timed(engine, run.retry)
        result["retry"] = figures
        print(
            f"retry of the root: {figures['seconds']:.3f} s, {figures['statements']:.0f} statements"
        )
        t0 = time.perf_counter()
        with Analyzing(dsn):
            cyclone.Worker(engine, workflows=served, concurrency=4, sweep=False).drain()
        result["retry_drain_s"] = time.perf_counter() - t0
        states = tree_states(dsn, str(run.id))
        print(f"  a worker re-parked the items in {result['retry_drain_s']:.0f} s; tree: {states}")
        figures, _ = timed(engine, run.cancel)
        result["cancel_again"] = figures
        print(
            f"cancel again: {figures['seconds']:.2f} s, {figures['statements']:.0f} "
            f"statements; tree: {tree_states(dsn, str(run.id))}; live jobs in finished "
            f"runs: {live_jobs_of_finished_runs(dsn)}"
        )
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM cyclone_runs WHERE workflow = 'bench_one'")
        figures, purged = timed(engine, lambda: client.purge_terminal_runs(older_than=timedelta(0)))
        result["purge"] = {**figures, "purged": purged}
        left = count(dsn, "SELECT count(*) FROM cyclone_runs WHERE workflow LIKE 'bench_tree%%'")
        print(
            f"purge: {figures['seconds']:.2f} s, {figures['statements']:.0f} statements, "
            f"{purged} runs counted, {left} runs of the tree left"
        )
        engine.dispose()
        plain.dispose()
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "tree.json").write_text(json.dumps(result, indent=2))
    finally:
        RELEASE.set()
        db.drop_database(admin, url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
